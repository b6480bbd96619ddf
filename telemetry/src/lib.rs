//! Tracing, OpenTelemetry and Prometheus initialisation for arc-rec.
//!
//! One call at startup wires everything:
//!
//! ```ignore
//! let mut guard = telemetry::init(telemetry::TelemetryConfig::from_env("arc-rec")?)?;
//! let metrics = guard.metrics().clone(); // serve `metrics.render()` at GET /metrics
//! // ... run the service ...
//! guard.shutdown()?; // flush spans and metrics before exiting
//! ```
//!
//! - [`init`] installs the global `tracing` subscriber: an `EnvFilter`
//!   (`RUST_LOG`, else [`TelemetryConfig::default_filter`]), a stderr
//!   formatter ([`LogFormat`]) and, when [`TelemetryConfig::otlp_endpoint`]
//!   is set, a `tracing-opentelemetry` layer exporting spans over OTLP/HTTP.
//!   It also installs the global OpenTelemetry meter and tracer providers and
//!   the W3C trace-context propagator.
//! - [`Metrics`] holds the Prometheus registry and the service's instruments;
//!   every measurement reaches both Prometheus and, when configured, OTLP.
//! - [`TelemetryGuard`] flushes and shuts the providers down, explicitly via
//!   [`TelemetryGuard::shutdown`] or on drop.
//!
//! Export uses OTLP over HTTP with protobuf bodies and a blocking HTTP client
//! driven from the SDK's own background threads, so it behaves the same inside
//! and outside a tokio runtime.

mod config;
mod error;
mod metrics;

use std::io::IsTerminal as _;

use opentelemetry::{KeyValue, trace::TracerProvider as _};
use opentelemetry_otlp::{Protocol, WithExportConfig as _};
use opentelemetry_sdk::{Resource, propagation::TraceContextPropagator, trace::SdkTracerProvider};
use tracing::Subscriber;
use tracing_subscriber::{
    EnvFilter, Layer, filter::filter_fn, fmt::MakeWriter, layer::SubscriberExt as _,
    registry::LookupSpan, util::SubscriberInitExt as _,
};

pub use config::{LOG_FORMAT_ENV, LogFormat, OTLP_ENDPOINT_ENV, TelemetryConfig};
pub use error::TelemetryError;
pub use metrics::Metrics;

/// Targets whose spans and events never reach the OpenTelemetry layer: the
/// exporters' own HTTP stack and the SDK itself. Without this, exporting a
/// batch would create spans that need exporting ("telemetry-induced
/// telemetry"). They still reach the log formatter, subject to the filter.
/// The OpenTelemetry crates log under their package names, hyphens included.
const OTEL_EXCLUDED_TARGETS: [&str; 11] = [
    "hyper",
    "hyper_util",
    "h2",
    "reqwest",
    "tonic",
    "tower",
    "opentelemetry",
    "opentelemetry_sdk",
    "opentelemetry-otlp",
    "opentelemetry-http",
    "opentelemetry-prometheus",
];

/// An error with its causes, `outer: cause: root cause`, for a log field: a `thiserror` error's
/// `Display` names only its own level (e.g. "database query failed: store a bandit snapshot"),
/// and a warning that drops the cause cannot be acted on.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        cause = inner.source();
    }
    text
}

/// Installs the global `tracing` subscriber and OpenTelemetry providers.
///
/// Logs go to stderr. Keep the returned guard alive for the life of the
/// process and call [`TelemetryGuard::shutdown`] before exiting so that the
/// last spans and metrics are exported.
///
/// # Errors
///
/// An invalid endpoint, filter or namespace, an exporter that cannot be
/// built, or [`TelemetryError::AlreadyInitialised`] when a global subscriber
/// is already installed (nothing global is changed in that case).
pub fn init(config: TelemetryConfig) -> Result<TelemetryGuard, TelemetryError> {
    let (subscriber, guard) = build_subscriber(config, std::io::stderr)?;
    // On failure the guard is dropped here, shutting down the providers that
    // were built for nothing; the already-installed globals stay untouched.
    subscriber
        .try_init()
        .map_err(TelemetryError::AlreadyInitialised)?;

    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    opentelemetry::global::set_meter_provider(guard.metrics.provider().clone());
    if let Some(tracer_provider) = &guard.tracer_provider {
        opentelemetry::global::set_tracer_provider(tracer_provider.clone());
    }
    Ok(guard)
}

/// Builds the subscriber [`init`] would install, writing logs to `writer`,
/// without installing anything globally.
///
/// Tests use this with `tracing::subscriber::set_default` to capture logs or
/// to run several configurations in one process. [`LogFormat::Auto`] and the
/// choice of ANSI colours still look at stderr, where [`init`] writes.
///
/// # Errors
///
/// As [`init`], except that nothing is installed so nothing can clash.
pub fn build_subscriber<W>(
    config: TelemetryConfig,
    writer: W,
) -> Result<(impl Subscriber + Send + Sync + 'static, TelemetryGuard), TelemetryError>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    build(config, writer, std::env::var("RUST_LOG").ok())
}

/// [`build_subscriber`] with `RUST_LOG`'s value passed in, so that unit tests
/// do not depend on the environment they run in.
fn build<W>(
    config: TelemetryConfig,
    writer: W,
    rust_log: Option<String>,
) -> Result<(impl Subscriber + Send + Sync + 'static, TelemetryGuard), TelemetryError>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let TelemetryConfig {
        service_name,
        log_format,
        default_filter,
        otlp_endpoint,
        metrics_namespace,
    } = config;

    // Validate everything before building exporters, so that bad input fails
    // fast and without spawning background threads.
    let endpoint = otlp_endpoint
        .as_deref()
        .map(config::validate_endpoint)
        .transpose()?;
    let env_filter = env_filter(rust_log, &default_filter)?;

    let resource = Resource::builder()
        .with_service_name(service_name.clone())
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build();

    let (tracer_provider, metric_exporter) = match &endpoint {
        Some(endpoint) => {
            let span_exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpBinary)
                .with_endpoint(format!("{endpoint}/v1/traces"))
                .build()
                .map_err(|source| TelemetryError::Exporter {
                    signal: "traces",
                    source,
                })?;
            let metric_exporter = opentelemetry_otlp::MetricExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpBinary)
                .with_endpoint(format!("{endpoint}/v1/metrics"))
                .build()
                .map_err(|source| TelemetryError::Exporter {
                    signal: "metrics",
                    source,
                })?;
            // The batch processor exports from a dedicated thread, so span
            // creation never blocks on the network.
            let tracer_provider = SdkTracerProvider::builder()
                .with_batch_exporter(span_exporter)
                .with_resource(resource.clone())
                .build();
            (Some(tracer_provider), Some(metric_exporter))
        }
        None => (None, None),
    };
    let metrics = Metrics::build(&metrics_namespace, resource, metric_exporter)?;

    let otel_layer = tracer_provider.as_ref().map(|provider| {
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer(service_name))
            .with_filter(filter_fn(|metadata| {
                !is_excluded_from_otel(metadata.target())
            }))
    });
    let subscriber = tracing_subscriber::registry()
        .with(env_filter)
        .with(fmt_layer(log_format, writer))
        .with(otel_layer);

    let guard = TelemetryGuard {
        tracer_provider,
        metrics,
        shut_down: false,
    };
    Ok((subscriber, guard))
}

/// `RUST_LOG` when set and non-empty, else the configured default.
fn env_filter(rust_log: Option<String>, default_filter: &str) -> Result<EnvFilter, TelemetryError> {
    let (filter, origin) = match rust_log.filter(|v| !v.trim().is_empty()) {
        Some(rust_log) => (rust_log, "RUST_LOG"),
        None => (default_filter.to_owned(), "the default filter"),
    };
    EnvFilter::try_new(&filter).map_err(|source| TelemetryError::InvalidFilter {
        filter,
        origin,
        source,
    })
}

fn fmt_layer<S, W>(format: LogFormat, writer: W) -> Box<dyn Layer<S> + Send + Sync>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let format = match format {
        LogFormat::Auto if std::io::stderr().is_terminal() => LogFormat::Pretty,
        LogFormat::Auto => LogFormat::Json,
        explicit => explicit,
    };
    let layer = tracing_subscriber::fmt::layer().with_writer(writer);
    match format {
        LogFormat::Json => layer
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .boxed(),
        LogFormat::Pretty | LogFormat::Auto => {
            layer.with_ansi(std::io::stderr().is_terminal()).boxed()
        }
    }
}

/// Whether `target` is one of [`OTEL_EXCLUDED_TARGETS`] or a module inside one.
fn is_excluded_from_otel(target: &str) -> bool {
    OTEL_EXCLUDED_TARGETS.iter().any(|excluded| {
        target
            .strip_prefix(excluded)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
    })
}

/// Keeps the OpenTelemetry providers alive and flushes them on shutdown.
///
/// Dropping the guard shuts down too, but cannot report errors; prefer an
/// explicit [`TelemetryGuard::shutdown`] at the end of `main`.
#[derive(Debug)]
#[must_use = "dropping the guard shuts telemetry down immediately"]
pub struct TelemetryGuard {
    tracer_provider: Option<SdkTracerProvider>,
    metrics: Metrics,
    shut_down: bool,
}

impl TelemetryGuard {
    /// The service's metrics, exported to Prometheus and, when configured,
    /// OTLP. Clone it into request handlers.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Exports whatever is buffered and stops the background exporters.
    ///
    /// Blocks for up to a few seconds per provider while the last batches are
    /// sent. Idempotent: later calls, and the drop, do nothing. Spans and
    /// measurements recorded afterwards are discarded (Prometheus keeps
    /// serving the values it had).
    ///
    /// # Errors
    ///
    /// A provider failed to flush or shut down; both are still attempted.
    pub fn shutdown(&mut self) -> Result<(), TelemetryError> {
        if std::mem::replace(&mut self.shut_down, true) {
            return Ok(());
        }
        let traces = match &self.tracer_provider {
            Some(provider) => provider
                .shutdown()
                .map_err(|source| TelemetryError::Shutdown {
                    signal: "traces",
                    source,
                }),
            None => Ok(()),
        };
        let metrics =
            self.metrics
                .provider()
                .shutdown()
                .map_err(|source| TelemetryError::Shutdown {
                    signal: "metrics",
                    source,
                });
        traces.and(metrics)
    }
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Err(error) = self.shutdown() {
            // The subscriber may already be gone at this point, so write to
            // stderr directly rather than through `tracing`.
            eprintln!("telemetry shutdown failed: {error}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excluded_targets_match_whole_path_segments() {
        assert!(is_excluded_from_otel("hyper"));
        assert!(is_excluded_from_otel("hyper_util::client::legacy"));
        assert!(is_excluded_from_otel("h2::codec"));
        assert!(is_excluded_from_otel("opentelemetry_sdk::metrics"));
        assert!(is_excluded_from_otel("opentelemetry-otlp"));
        assert!(!is_excluded_from_otel("h2o"));
        assert!(!is_excluded_from_otel("hyperloop::engine"));
        assert!(!is_excluded_from_otel("arc_rec::routes"));
    }

    #[test]
    fn rust_log_overrides_default_filter() {
        let filter = env_filter(Some("arc_rec=trace".into()), "warn").unwrap();
        assert_eq!(filter.to_string(), "arc_rec=trace");
        let filter = env_filter(Some(" ".into()), "warn").unwrap();
        assert_eq!(filter.to_string(), "warn");
    }

    #[test]
    fn bad_filter_is_an_error() {
        let err = env_filter(Some("arc_rec=loud".into()), "info").unwrap_err();
        assert!(
            matches!(
                err,
                TelemetryError::InvalidFilter {
                    origin: "RUST_LOG",
                    ..
                }
            ),
            "{err:?}"
        );
    }

    #[test]
    fn malformed_endpoint_is_an_error_not_a_panic() {
        for endpoint in ["not a url", "localhost:4318", "https://collector:4318"] {
            let config = TelemetryConfig {
                otlp_endpoint: Some(endpoint.into()),
                ..TelemetryConfig::new("arc-rec")
            };
            // `build` rather than `init` so that a regression cannot install
            // a global subscriber under the other tests.
            let result = build(config, std::io::sink, None);
            assert!(
                matches!(result, Err(TelemetryError::InvalidEndpoint { .. })),
                "{endpoint:?} was accepted"
            );
        }
    }

    #[test]
    fn logs_reach_the_writer_as_json() {
        let sink = SharedBuf::default();
        let config = TelemetryConfig {
            log_format: LogFormat::Json,
            ..TelemetryConfig::new("arc-rec")
        };
        let (subscriber, _guard) = build(config, sink.clone(), None).unwrap();
        tracing::subscriber::with_default(subscriber, || {
            tracing::info_span!("export_run", run.id = 7).in_scope(|| {
                tracing::info!(rows = 3, "export finished");
            });
        });
        let line = sink.contents();
        let json: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
        assert_eq!(json["message"], "export finished");
        assert_eq!(json["rows"], 3);
        assert_eq!(json["span"]["name"], "export_run");
    }

    /// A `MakeWriter` collecting everything written into one buffer.
    #[derive(Debug, Clone, Default)]
    struct SharedBuf(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl SharedBuf {
        fn contents(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    impl std::io::Write for SharedBuf {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'w> MakeWriter<'w> for SharedBuf {
        type Writer = Self;

        fn make_writer(&'w self) -> Self::Writer {
            self.clone()
        }
    }
}
