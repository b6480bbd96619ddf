//! End to end: `telemetry::init` with an OTLP endpoint exports spans and
//! metrics to a local OTLP/HTTP collector, outside any async runtime.
//!
//! One test per file, because `init` installs process-wide globals.

mod common;

use std::time::Duration;

use common::Collector;
use telemetry::{LogFormat, TelemetryConfig, TelemetryError};

#[test]
fn exports_spans_and_metrics_over_otlp_http() {
    let collector = Collector::start();
    let config = TelemetryConfig {
        otlp_endpoint: Some(collector.endpoint()),
        log_format: LogFormat::Json,
        ..TelemetryConfig::new("arc-rec-test")
    };
    let mut guard = telemetry::init(config).expect("first init succeeds");

    tracing::info_span!("export_run", rows = 3).in_scope(|| {
        tracing::info!("exporting");
    });
    guard.metrics().record_export_rows(3);

    // A second global install is refused rather than panicking.
    let second = telemetry::init(TelemetryConfig::new("arc-rec-test"));
    assert!(
        matches!(second, Err(TelemetryError::AlreadyInitialised(_))),
        "{second:?}"
    );

    // Shutdown blocks until the final batches are exported, so the wait
    // below should succeed on its first poll; it is bounded either way.
    guard.shutdown().expect("clean shutdown");
    let received = collector.wait_for(Duration::from_secs(5), |r| {
        r.span_names.contains("export_run") && r.metric_names.contains("export.rows")
    });
    assert!(received.span_names.contains("export_run"), "{received:#?}");
    assert!(
        received.metric_names.contains("export.rows"),
        "{received:#?}"
    );
    assert!(
        received.service_names.contains("arc-rec-test"),
        "{received:#?}"
    );
    assert!(received.errors.is_empty(), "{received:#?}");

    // Idempotent: the second shutdown (and the drop) are no-ops.
    guard.shutdown().expect("second shutdown is a no-op");
}
