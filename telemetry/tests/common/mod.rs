//! A minimal OTLP/HTTP collector for tests: accepts protobuf `POST`s to
//! `/v1/traces` and `/v1/metrics` on 127.0.0.1 and records what it saw.
//!
//! Hand-rolled on `std::net` so that the tests need no async runtime and
//! exercise the exporter's real HTTP client against a real socket.

use std::{
    collections::BTreeSet,
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::{Arc, Mutex},
    thread,
    time::{Duration, Instant},
};

use opentelemetry_proto::tonic::{
    collector::{metrics::v1::ExportMetricsServiceRequest, trace::v1::ExportTraceServiceRequest},
    common::v1::any_value,
    resource::v1::Resource,
};
use prost::Message as _;

/// What the collector has received so far.
#[derive(Debug, Default, Clone)]
pub struct Received {
    pub span_names: BTreeSet<String>,
    pub metric_names: BTreeSet<String>,
    pub service_names: BTreeSet<String>,
    /// Requests to paths other than the two signal paths, or undecodable bodies.
    pub errors: Vec<String>,
}

#[derive(Debug)]
pub struct Collector {
    pub addr: SocketAddr,
    received: Arc<Mutex<Received>>,
}

impl Collector {
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind test collector");
        let addr = listener.local_addr().expect("collector address");
        let received = Arc::new(Mutex::new(Received::default()));
        let state = Arc::clone(&received);
        // The accept loop never ends; the thread dies with the test process.
        thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let state = Arc::clone(&state);
                thread::spawn(move || serve(stream, &state));
            }
        });
        Self { addr, received }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Polls until `done` holds or `timeout` passes, then returns the
    /// snapshot either way so the caller's assertion shows what arrived.
    pub fn wait_for(&self, timeout: Duration, done: impl Fn(&Received) -> bool) -> Received {
        let deadline = Instant::now() + timeout;
        loop {
            let snapshot = self.received.lock().unwrap().clone();
            if done(&snapshot) || Instant::now() >= deadline {
                return snapshot;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Serves one keep-alive connection: HTTP/1.1 requests with a
/// `content-length` body, answered with an empty 200 (an empty protobuf
/// message is a valid, fully successful export response).
fn serve(stream: TcpStream, state: &Mutex<Received>) {
    // Bounded so that a half-written request cannot pin the thread forever.
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let path = request_line
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_owned();
        let mut content_length = 0;
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                content_length = value.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; content_length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let status = record(&path, &body, &mut state.lock().unwrap());
        let response = format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n"
        );
        if writer.write_all(response.as_bytes()).is_err() {
            return;
        }
    }
}

fn record(path: &str, body: &[u8], received: &mut Received) -> &'static str {
    match path {
        "/v1/traces" => match ExportTraceServiceRequest::decode(body) {
            Ok(request) => {
                for resource_spans in request.resource_spans {
                    received
                        .service_names
                        .extend(service_name(resource_spans.resource.as_ref()));
                    let spans = resource_spans.scope_spans.into_iter().flat_map(|s| s.spans);
                    received.span_names.extend(spans.map(|span| span.name));
                }
                "200 OK"
            }
            Err(e) => {
                received.errors.push(format!("bad trace body: {e}"));
                "400 Bad Request"
            }
        },
        "/v1/metrics" => match ExportMetricsServiceRequest::decode(body) {
            Ok(request) => {
                for resource_metrics in request.resource_metrics {
                    received
                        .service_names
                        .extend(service_name(resource_metrics.resource.as_ref()));
                    let metrics = resource_metrics
                        .scope_metrics
                        .into_iter()
                        .flat_map(|s| s.metrics);
                    received.metric_names.extend(metrics.map(|m| m.name));
                }
                "200 OK"
            }
            Err(e) => {
                received.errors.push(format!("bad metrics body: {e}"));
                "400 Bad Request"
            }
        },
        other => {
            received.errors.push(format!("unexpected path {other}"));
            "404 Not Found"
        }
    }
}

fn service_name(resource: Option<&Resource>) -> Option<String> {
    resource?
        .attributes
        .iter()
        .find(|kv| kv.key == "service.name")
        .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
            any_value::Value::StringValue(name) => Some(name.clone()),
            _ => None,
        })
}
