//! The crate's error type: everything that can go wrong while configuring,
//! installing or shutting down telemetry.

use opentelemetry_otlp::ExporterBuildError;
use opentelemetry_sdk::error::OTelSdkError;

/// Why telemetry could not be configured, installed or shut down.
///
/// Bad operator input (environment variables, endpoint URLs, filter
/// directives) always ends up here rather than in a panic, so that the binary
/// can report it and exit cleanly.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TelemetryError {
    /// An environment variable holds a value this crate does not understand.
    #[error("invalid value `{value}` for {var}: {reason}")]
    InvalidEnv {
        /// The variable's name.
        var: &'static str,
        /// The offending value.
        value: String,
        /// What values would have been accepted.
        reason: &'static str,
    },

    /// The OTLP endpoint is not an absolute `http://host[:port][/path]` URL.
    #[error("invalid otlp endpoint `{endpoint}`: {reason}")]
    InvalidEndpoint {
        /// The endpoint as given.
        endpoint: String,
        /// Why it was rejected.
        reason: String,
    },

    /// `RUST_LOG` or the configured default filter is not a valid
    /// `tracing_subscriber::EnvFilter` directive list.
    #[error("invalid log filter `{filter}` (from {origin})")]
    InvalidFilter {
        /// The directive string.
        filter: String,
        /// Where it came from: `RUST_LOG` or the configured default.
        origin: &'static str,
        /// The parser's complaint.
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },

    /// The Prometheus metric namespace is not of the form `[a-zA-Z_][a-zA-Z0-9_]*`.
    #[error(
        "invalid metrics namespace `{0}`: expected letters, digits and `_`, not starting with a digit"
    )]
    InvalidNamespace(String),

    /// An OTLP exporter could not be built.
    #[error("could not build the otlp {signal} exporter")]
    Exporter {
        /// `traces` or `metrics`.
        signal: &'static str,
        /// The exporter's complaint.
        #[source]
        source: ExporterBuildError,
    },

    /// The Prometheus exporter could not be attached to its registry.
    #[error("could not build the prometheus exporter")]
    Prometheus(#[source] OTelSdkError),

    /// A global `tracing` subscriber (or `log` logger) is already installed,
    /// typically because `init` was called twice.
    #[error("a global tracing subscriber is already installed")]
    AlreadyInitialised(#[source] tracing_subscriber::util::TryInitError),

    /// Flushing or shutting down a provider failed; some telemetry may be lost.
    #[error("could not shut down the {signal} provider")]
    Shutdown {
        /// `traces` or `metrics`.
        signal: &'static str,
        /// The SDK's complaint.
        #[source]
        source: OTelSdkError,
    },
}
