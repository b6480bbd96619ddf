//! End to end inside a multi-threaded tokio runtime, as the service runs:
//! initialising, exporting, shutting down and dropping the guard on a runtime
//! worker must neither panic (blocking HTTP client) nor hang.
//!
//! One test per file, because `init` installs process-wide globals.

mod common;

use std::time::Duration;

use common::Collector;
use telemetry::{LogFormat, TelemetryConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exports_from_inside_a_tokio_runtime() {
    let collector = Collector::start();
    let config = TelemetryConfig {
        otlp_endpoint: Some(collector.endpoint()),
        log_format: LogFormat::Json,
        ..TelemetryConfig::new("arc-rec-tokio")
    };
    let mut guard = telemetry::init(config).expect("init inside tokio");

    let handle = tokio::spawn(async {
        let _span = tracing::info_span!("ingest_batch").entered();
        tracing::info!("ingesting");
    });
    handle.await.unwrap();
    guard.metrics().record_ingested("trajectory", 2);

    guard.shutdown().expect("clean shutdown inside tokio");
    drop(guard);

    let received = collector.wait_for(Duration::from_secs(5), |r| {
        r.span_names.contains("ingest_batch") && r.metric_names.contains("ingest.records")
    });
    assert!(
        received.span_names.contains("ingest_batch"),
        "{received:#?}"
    );
    assert!(
        received.metric_names.contains("ingest.records"),
        "{received:#?}"
    );
    assert!(received.errors.is_empty(), "{received:#?}");
}
