//! Application metrics: one recording path that feeds both the Prometheus
//! scrape endpoint (`GET /metrics`) and, when configured, OTLP export.
//!
//! # Design
//!
//! Instruments are created on an OpenTelemetry [`SdkMeterProvider`] that has a
//! Prometheus reader ([`opentelemetry_prometheus`], backed by a
//! [`prometheus::Registry`]) and, when an OTLP endpoint is configured, a
//! periodic OTLP reader too. Application code therefore records each
//! measurement once and it reaches both backends. We chose this over a plain
//! `prometheus` registry because `opentelemetry-prometheus` 0.33 is
//! maintained again and cheap to add, and because two recording paths would
//! drift apart.
//!
//! # Recording
//!
//! Use the typed helpers for the ready-made families:
//!
//! ```ignore
//! let metrics = guard.metrics(); // or telemetry::Metrics::new("arc_rec")?
//! metrics.record_http_request("GET", "/v1/arms/{id}", 200, started.elapsed());
//! metrics.record_ingested("trajectory", 128);
//! metrics.record_export_rows(10_000);
//! ```
//!
//! For anything else, create an instrument once from [`Metrics::meter`] and
//! keep it; instruments are cheap to clone and safe to share across threads:
//!
//! ```ignore
//! let drops = metrics.meter().u64_counter("bandit.arm.drops").build();
//! drops.add(1, &[opentelemetry::KeyValue::new("arm.id", id.to_string())]);
//! ```
//!
//! OpenTelemetry names use dots; the Prometheus exporter turns them into
//! `<namespace>_<name with _>` plus `_total` for counters and a unit suffix
//! such as `_seconds`. Attribute values become label values, so keep them
//! low-cardinality: the route *pattern*, never the raw path or an id.

use std::{sync::Arc, time::Duration};

use opentelemetry::{
    InstrumentationScope, KeyValue,
    metrics::{Counter, Histogram, Meter, MeterProvider as _},
};
use opentelemetry_sdk::{
    Resource,
    metrics::{PeriodicReader, SdkMeterProvider},
};
use prometheus::TextEncoder;

use crate::TelemetryError;

/// Latency bucket boundaries in seconds, as recommended by the OpenTelemetry
/// HTTP semantic conventions for `http.server.request.duration`.
const LATENCY_BOUNDARIES_S: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];

/// Rows-per-export bucket boundaries: exports range from a handful of rows to
/// millions, so decades are more useful than the SDK's latency-shaped default.
const EXPORT_ROWS_BOUNDARIES: [f64; 8] = [0.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e6, 1e7];

/// Methods kept as-is in the `http.request.method` attribute; anything else
/// becomes `_OTHER`, as the semantic conventions ask, so that a client sending
/// made-up methods cannot create unbounded label values.
const KNOWN_METHODS: [&str; 9] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
];

/// The service's metrics: a Prometheus registry plus the instruments the
/// service records into.
///
/// Cloning is cheap (one `Arc`), so hand clones to request handlers and
/// background tasks freely.
#[derive(Debug, Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    registry: prometheus::Registry,
    provider: SdkMeterProvider,
    meter: Meter,
    http_requests: Counter<u64>,
    http_duration: Histogram<f64>,
    ingested_records: Counter<u64>,
    export_rows: Histogram<u64>,
}

impl Metrics {
    /// Content type of [`Metrics::render`]'s output.
    pub const CONTENT_TYPE: &'static str = "text/plain; version=0.0.4; charset=utf-8";

    /// Metrics exposed through Prometheus only, with every metric name
    /// prefixed by `namespace` (e.g. `arc_rec`).
    ///
    /// [`crate::init`] builds its own instance, which also exports over OTLP
    /// when configured; use [`crate::TelemetryGuard::metrics`] to get it.
    ///
    /// # Errors
    ///
    /// `namespace` is not of the form `[a-zA-Z_][a-zA-Z0-9_]*`.
    pub fn new(namespace: &str) -> Result<Self, TelemetryError> {
        Self::build(namespace, Resource::builder().build(), None)
    }

    /// Builds the meter provider with a Prometheus reader and, if given, a
    /// periodic reader pushing to `otlp`.
    pub(crate) fn build(
        namespace: &str,
        resource: Resource,
        otlp: Option<opentelemetry_otlp::MetricExporter>,
    ) -> Result<Self, TelemetryError> {
        validate_namespace(namespace)?;
        let registry = prometheus::Registry::new();
        let prometheus_reader = opentelemetry_prometheus::exporter()
            .with_registry(registry.clone())
            .with_namespace(namespace)
            // `otel_scope_*` labels on every series would only repeat the
            // namespace; the resource still appears once in `target_info`.
            .scope_info_enabled(false)
            .build()
            .map_err(TelemetryError::Prometheus)?;

        let mut builder = SdkMeterProvider::builder()
            .with_resource(resource)
            .with_reader(prometheus_reader);
        if let Some(exporter) = otlp {
            // The periodic reader runs on its own thread, so it works the same
            // inside and outside a tokio runtime.
            builder = builder.with_reader(PeriodicReader::builder(exporter).build());
        }
        let provider = builder.build();

        let meter = provider.meter_with_scope(
            InstrumentationScope::builder(namespace.to_owned())
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
        );
        let http_requests = meter
            .u64_counter("http.server.requests")
            .with_description("HTTP requests served, by method, route pattern and status code")
            .build();
        let http_duration = meter
            .f64_histogram("http.server.request.duration")
            .with_description("Time from receiving a request to sending the response")
            .with_unit("s")
            .with_boundaries(LATENCY_BOUNDARIES_S.to_vec())
            .build();
        let ingested_records = meter
            .u64_counter("ingest.records")
            .with_description("Records accepted by ingestion, by record kind")
            .build();
        let export_rows = meter
            .u64_histogram("export.rows")
            .with_description("Rows written per export run")
            .with_boundaries(EXPORT_ROWS_BOUNDARIES.to_vec())
            .build();

        Ok(Self {
            inner: Arc::new(Inner {
                registry,
                provider,
                meter,
                http_requests,
                http_duration,
                ingested_records,
                export_rows,
            }),
        })
    }

    /// Records one served HTTP request.
    ///
    /// `route` must be the matched route pattern (`/v1/arms/{id}`), not the
    /// request path, to keep the number of series bounded.
    pub fn record_http_request(&self, method: &str, route: &str, status: u16, elapsed: Duration) {
        let method = KNOWN_METHODS
            .iter()
            .find(|known| known.eq_ignore_ascii_case(method))
            .copied()
            .unwrap_or("_OTHER");
        let attributes = [
            KeyValue::new("http.request.method", method),
            KeyValue::new("http.route", route.to_owned()),
            KeyValue::new("http.response.status_code", i64::from(status)),
        ];
        self.inner.http_requests.add(1, &attributes);
        self.inner
            .http_duration
            .record(elapsed.as_secs_f64(), &attributes);
    }

    /// Counts `count` ingested records of `kind` (a small fixed set such as
    /// `trajectory` or `feedback`).
    pub fn record_ingested(&self, kind: &str, count: u64) {
        self.inner
            .ingested_records
            .add(count, &[KeyValue::new("record.kind", kind.to_owned())]);
    }

    /// Records the number of rows one export run wrote.
    pub fn record_export_rows(&self, rows: u64) {
        self.inner.export_rows.record(rows, &[]);
    }

    /// The meter behind the ready-made instruments, for creating more.
    pub fn meter(&self) -> &Meter {
        &self.inner.meter
    }

    /// The Prometheus registry the metrics are gathered from, for callers
    /// that want to register their own collectors or encode differently.
    pub fn registry(&self) -> &prometheus::Registry {
        &self.inner.registry
    }

    /// The current values in the Prometheus text exposition format (version
    /// 0.0.4), ready to serve with content type
    /// [`Metrics::CONTENT_TYPE`].
    ///
    /// A family appears once something has been recorded into it.
    pub fn render(&self) -> String {
        let families = self.inner.registry.gather();
        // `gather` drops empty and unnamed families, the only inputs the text
        // encoder rejects, so this cannot fail in practice; if it ever does,
        // an empty scrape plus a log line beats a panicking handler.
        TextEncoder::new()
            .encode_to_string(&families)
            .unwrap_or_else(|error| {
                tracing::warn!(%error, "could not encode prometheus metrics");
                String::new()
            })
    }

    /// The meter provider, to install as the global one and shut down.
    pub(crate) fn provider(&self) -> &SdkMeterProvider {
        &self.inner.provider
    }
}

fn validate_namespace(namespace: &str) -> Result<(), TelemetryError> {
    let mut chars = namespace.chars();
    let valid_start = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if valid_start && chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        Ok(())
    } else {
        Err(TelemetryError::InvalidNamespace(namespace.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_contains_recorded_families() {
        let metrics = Metrics::new("arc_rec").unwrap();
        metrics.record_http_request("get", "/v1/arms/{id}", 200, Duration::from_millis(30));
        metrics.record_http_request("BREW", "/v1/arms/{id}", 405, Duration::from_millis(1));
        metrics.record_ingested("trajectory", 3);
        metrics.record_ingested("trajectory", 4);
        metrics.record_export_rows(1_234);

        let text = metrics.render();
        for expected in [
            "# TYPE arc_rec_http_server_requests_total counter",
            "# TYPE arc_rec_http_server_request_duration_seconds histogram",
            "# TYPE arc_rec_ingest_records_total counter",
            "# TYPE arc_rec_export_rows histogram",
            r#"arc_rec_ingest_records_total{record_kind="trajectory"} 7"#,
            r#"arc_rec_http_server_requests_total{http_request_method="GET",http_response_status_code="200",http_route="/v1/arms/{id}"} 1"#,
            r#"http_request_method="_OTHER""#,
            r#"arc_rec_export_rows_bucket{le="10000"} 1"#,
            r#"arc_rec_http_server_request_duration_seconds_bucket{http_request_method="GET",http_response_status_code="200",http_route="/v1/arms/{id}",le="0.05"} 1"#,
        ] {
            assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
        }
    }

    #[test]
    fn families_appear_only_once_recorded() {
        let metrics = Metrics::new("quiet").unwrap();
        assert!(!metrics.render().contains("quiet_ingest_records_total"));
        metrics.record_ingested("feedback", 1);
        assert!(metrics.render().contains("quiet_ingest_records_total"));
    }

    #[test]
    fn clones_share_one_registry() {
        let metrics = Metrics::new("shared").unwrap();
        metrics.clone().record_export_rows(5);
        assert!(metrics.render().contains("shared_export_rows_count 1"));
    }

    #[test]
    fn custom_instruments_reach_the_registry() {
        let metrics = Metrics::new("custom").unwrap();
        metrics
            .meter()
            .u64_counter("bandit.arm.drops")
            .build()
            .add(2, &[]);
        assert!(
            metrics.render().contains("custom_bandit_arm_drops_total 2"),
            "{}",
            metrics.render()
        );
    }

    #[test]
    fn invalid_namespace_is_an_error() {
        for bad in ["", "9lives", "arc-rec", "a b"] {
            assert!(
                matches!(Metrics::new(bad), Err(TelemetryError::InvalidNamespace(_))),
                "{bad:?} was accepted"
            );
        }
    }
}
