//! Telemetry configuration and where it comes from in the environment.
//!
//! Environment variables read by [`TelemetryConfig::from_env`]:
//!
//! - `OTEL_EXPORTER_OTLP_ENDPOINT`: base URL of an OTLP/HTTP collector, e.g.
//!   `http://localhost:4318`. Unset or empty disables OTLP export. Traces go
//!   to `<endpoint>/v1/traces` and metrics to `<endpoint>/v1/metrics`.
//! - `ARC_REC_LOG_FORMAT`: `pretty`, `json` or `auto` (the default).
//!
//! Read later by [`crate::init`] and the OpenTelemetry SDK themselves:
//!
//! - `RUST_LOG`: overrides [`TelemetryConfig::default_filter`].
//! - `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_EXPORTER_OTLP_TIMEOUT`,
//!   `OTEL_METRIC_EXPORT_INTERVAL`, `OTEL_BSP_*`: exporter tuning, as
//!   documented by the OpenTelemetry specification.

use crate::TelemetryError;

/// Environment variable holding the OTLP collector's base URL.
pub const OTLP_ENDPOINT_ENV: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
/// Environment variable choosing the log format.
pub const LOG_FORMAT_ENV: &str = "ARC_REC_LOG_FORMAT";

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// [`LogFormat::Pretty`] when stderr is a terminal, [`LogFormat::Json`]
    /// otherwise, so that a developer's shell gets readable lines and a log
    /// shipper gets machine-readable ones without configuration.
    #[default]
    Auto,
    /// Human-readable single-line records, coloured on a terminal.
    Pretty,
    /// One JSON object per line, event fields flattened to the top level.
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = TelemetryError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "pretty" => Ok(Self::Pretty),
            "json" => Ok(Self::Json),
            _ => Err(TelemetryError::InvalidEnv {
                var: LOG_FORMAT_ENV,
                value: s.to_owned(),
                reason: "expected `auto`, `pretty` or `json`",
            }),
        }
    }
}

/// Everything [`crate::init`] needs to know.
///
/// Build it with [`TelemetryConfig::new`] or [`TelemetryConfig::from_env`]
/// and adjust fields as needed; all fields are public.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TelemetryConfig {
    /// The OpenTelemetry `service.name` resource attribute, e.g. `arc-rec`.
    pub service_name: String,
    /// How log lines are written to stderr.
    pub log_format: LogFormat,
    /// `EnvFilter` directives used when `RUST_LOG` is unset or empty,
    /// e.g. `info` or `info,sqlx=warn`.
    pub default_filter: String,
    /// Base URL of an OTLP/HTTP collector (`http://host:4318`); `None`
    /// disables OTLP export of traces and metrics. Prometheus metrics are
    /// available either way.
    pub otlp_endpoint: Option<String>,
    /// Prefix of every Prometheus metric name, e.g. `arc_rec` gives
    /// `arc_rec_http_server_requests_total`. Defaults to the service name
    /// with anything but ASCII letters and digits replaced by `_`.
    pub metrics_namespace: String,
}

impl TelemetryConfig {
    /// Defaults: automatic log format, `info` filter, no OTLP export.
    pub fn new(service_name: impl Into<String>) -> Self {
        let service_name = service_name.into();
        let metrics_namespace = namespace_from_service_name(&service_name);
        Self {
            service_name,
            log_format: LogFormat::Auto,
            default_filter: "info".to_owned(),
            otlp_endpoint: None,
            metrics_namespace,
        }
    }

    /// [`TelemetryConfig::new`] overridden by `OTEL_EXPORTER_OTLP_ENDPOINT`
    /// and `ARC_REC_LOG_FORMAT`.
    ///
    /// # Errors
    ///
    /// A log format other than `auto`, `pretty` or `json`, or an endpoint
    /// that is not an absolute `http://` URL.
    pub fn from_env(service_name: impl Into<String>) -> Result<Self, TelemetryError> {
        Self::from_lookup(service_name, |var| std::env::var(var).ok())
    }

    /// [`TelemetryConfig::from_env`] with the environment abstracted, so that
    /// tests need not mutate the process environment (which is `unsafe` and
    /// racy under a multi-threaded test harness).
    pub(crate) fn from_lookup(
        service_name: impl Into<String>,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, TelemetryError> {
        let mut config = Self::new(service_name);
        if let Some(format) = lookup(LOG_FORMAT_ENV).filter(|v| !v.trim().is_empty()) {
            config.log_format = format.parse()?;
        }
        if let Some(endpoint) = lookup(OTLP_ENDPOINT_ENV).filter(|v| !v.trim().is_empty()) {
            // Validate now so that a typo fails at startup with the variable
            // named, rather than when the first batch is exported.
            validate_endpoint(&endpoint)?;
            config.otlp_endpoint = Some(endpoint);
        }
        Ok(config)
    }
}

/// Checks that `endpoint` is an absolute `http://` URL and returns it without
/// a trailing `/`, ready for `/v1/traces` or `/v1/metrics` to be appended.
pub(crate) fn validate_endpoint(endpoint: &str) -> Result<String, TelemetryError> {
    let invalid = |reason: &str| TelemetryError::InvalidEndpoint {
        endpoint: endpoint.to_owned(),
        reason: reason.to_owned(),
    };
    let uri: http::Uri = endpoint
        .trim()
        .parse()
        .map_err(|e: http::uri::InvalidUri| invalid(&e.to_string()))?;
    match uri.scheme_str() {
        Some("http") => {}
        // The exporter's HTTP client is built without a TLS stack (it would
        // pull in a C crypto library); failing here beats silently failing
        // every export later.
        Some("https") => {
            return Err(invalid(
                "https is not supported by this build; point it at a local collector over http",
            ));
        }
        _ => return Err(invalid("expected an absolute url starting with `http://`")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(invalid("missing host"));
    }
    if uri.query().is_some() {
        return Err(invalid(
            "a query string cannot be combined with the signal path",
        ));
    }
    Ok(uri.to_string().trim_end_matches('/').to_owned())
}

/// `arc-rec` becomes `arc_rec`; a leading digit gets a `_` prefix.
fn namespace_from_service_name(service_name: &str) -> String {
    let mut namespace: String = service_name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if namespace.is_empty() || namespace.starts_with(|c: char| c.is_ascii_digit()) {
        namespace.insert(0, '_');
    }
    namespace
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |key| vars.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
    }

    #[test]
    fn defaults_without_environment() {
        let config = TelemetryConfig::from_lookup("arc-rec", env(&[])).unwrap();
        assert_eq!(config, TelemetryConfig::new("arc-rec"));
        assert_eq!(config.log_format, LogFormat::Auto);
        assert_eq!(config.default_filter, "info");
        assert_eq!(config.otlp_endpoint, None);
        assert_eq!(config.metrics_namespace, "arc_rec");
    }

    #[test]
    fn reads_endpoint_and_format() {
        let config = TelemetryConfig::from_lookup(
            "arc-rec",
            env(&[
                (OTLP_ENDPOINT_ENV, "http://collector:4318"),
                (LOG_FORMAT_ENV, "JSON"),
            ]),
        )
        .unwrap();
        assert_eq!(
            config.otlp_endpoint.as_deref(),
            Some("http://collector:4318")
        );
        assert_eq!(config.log_format, LogFormat::Json);
    }

    #[test]
    fn empty_endpoint_disables_export() {
        let config =
            TelemetryConfig::from_lookup("arc-rec", env(&[(OTLP_ENDPOINT_ENV, "  ")])).unwrap();
        assert_eq!(config.otlp_endpoint, None);
    }

    #[test]
    fn bad_log_format_is_an_error() {
        let err =
            TelemetryConfig::from_lookup("arc-rec", env(&[(LOG_FORMAT_ENV, "yaml")])).unwrap_err();
        assert!(
            matches!(err, TelemetryError::InvalidEnv { var: LOG_FORMAT_ENV, ref value, .. } if value == "yaml"),
            "{err:?}"
        );
    }

    #[test]
    fn bad_endpoint_from_env_is_an_error() {
        let err = TelemetryConfig::from_lookup("arc-rec", env(&[(OTLP_ENDPOINT_ENV, "not a url")]))
            .unwrap_err();
        assert!(
            matches!(err, TelemetryError::InvalidEndpoint { .. }),
            "{err:?}"
        );
    }

    #[test]
    fn endpoint_validation() {
        assert_eq!(
            validate_endpoint("http://127.0.0.1:4318/").unwrap(),
            "http://127.0.0.1:4318"
        );
        assert_eq!(
            validate_endpoint("http://otel.example:4318/prefix").unwrap(),
            "http://otel.example:4318/prefix"
        );
        for bad in [
            "",
            "not a url",
            "localhost:4318",
            "/v1/traces",
            "ftp://host:21",
            "https://host:4318",
            "http://host:4318/?a=b",
            "http://:4318",
        ] {
            assert!(
                matches!(
                    validate_endpoint(bad),
                    Err(TelemetryError::InvalidEndpoint { .. })
                ),
                "{bad:?} was accepted"
            );
        }
    }

    #[test]
    fn namespace_is_sanitised() {
        assert_eq!(namespace_from_service_name("arc-rec"), "arc_rec");
        assert_eq!(namespace_from_service_name("9lives"), "_9lives");
        assert_eq!(namespace_from_service_name(""), "_");
    }
}
