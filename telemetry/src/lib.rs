//! Tracing, OpenTelemetry and Prometheus initialisation for arc-rec.

mod config;
mod error;

pub use config::{LOG_FORMAT_ENV, LogFormat, OTLP_ENDPOINT_ENV, TelemetryConfig};
pub use error::TelemetryError;
