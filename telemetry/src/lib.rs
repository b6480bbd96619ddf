//! Tracing, OpenTelemetry and Prometheus initialisation.
