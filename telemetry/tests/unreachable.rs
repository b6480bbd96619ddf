//! A collector that refuses connections must cost a bounded delay at
//! shutdown, not a hang or a panic: the service has to exit on SIGTERM even
//! when the collector is down.
//!
//! One test per file, because `init` installs process-wide globals.

use std::{
    net::TcpListener,
    time::{Duration, Instant},
};

use telemetry::{LogFormat, TelemetryConfig};

#[test]
fn shutdown_is_bounded_when_the_collector_is_down() {
    // Bind then drop to get a port that (almost certainly) refuses connections.
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("free port")
        .port();
    let config = TelemetryConfig {
        otlp_endpoint: Some(format!("http://127.0.0.1:{port}")),
        log_format: LogFormat::Json,
        ..TelemetryConfig::new("arc-rec-down")
    };
    let mut guard = telemetry::init(config).expect("init does not contact the collector");
    tracing::info_span!("export_run").in_scope(|| tracing::info!("exporting"));
    guard.metrics().record_export_rows(1);

    let started = Instant::now();
    // Export failures are logged by the SDK, not reported by shutdown, so the
    // result itself is not asserted; only that it returns promptly.
    let _ = guard.shutdown();
    let elapsed = started.elapsed();
    assert!(
        elapsed < Duration::from_secs(12),
        "shutdown took {elapsed:?}"
    );
}
