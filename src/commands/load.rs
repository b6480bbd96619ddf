//! `arc-rec bench load`: an open-loop HTTP load generator, run as its own process by
//! `arc-rec bench serve` so client and server do not share a runtime or CPU accounting.
//!
//! Requests are sent on a fixed schedule (one every 1/rate seconds) whatever the server does,
//! and each latency is measured from the request's *scheduled* send time: a server that falls
//! behind shows its queueing delay instead of silently slowing the client down (no coordinated
//! omission).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use serde::Serialize;

/// Arguments of `arc-rec bench load`.
#[derive(Debug, Args)]
pub struct LoadArgs {
    /// Full URL to POST to.
    #[arg(long)]
    pub url: String,
    /// API key sent as a bearer token.
    #[arg(long, env = "ARC_REC_LOAD_KEY", hide_env_values = true)]
    pub key: String,
    /// JSON-lines file of request bodies, used round-robin.
    #[arg(long)]
    pub bodies: PathBuf,
    /// Requests per second.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub rate: u32,
    /// Seconds to send for (after a one-second warm-up that is not measured).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=600))]
    pub duration: u32,
    /// Most requests in flight; beyond it requests count as errors (the server is saturated).
    #[arg(long, default_value_t = 2000)]
    pub max_in_flight: usize,
    /// Also write every request as a CSV line `sent_s,latency_ms,status,event_id`: seconds after
    /// the warm-up (negative within it), the latency and HTTP status of its answer (both empty
    /// when none came), and the `event_id` of a 2xx body that has one — to see when in the
    /// window the slow ones fell, how fast errors came, and which answers acknowledged what.
    #[arg(long)]
    pub latency_log: Option<PathBuf>,
}

/// What one load run measured (printed as one JSON line).
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct LoadReport {
    pub target_rate: u32,
    pub sent: u64,
    pub ok: u64,
    pub errors: u64,
    /// Completed requests per second over the measured window.
    pub achieved_rate: f64,
    /// Latency quantiles of the successful requests; `None` when none succeeded.
    pub p50_ms: Option<f64>,
    pub p90_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
}

/// Runs the load and prints a [`LoadReport`] as JSON on stdout.
pub async fn run(args: &LoadArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.bodies)
        .with_context(|| format!("cannot read {}", args.bodies.display()))?;
    let bodies: Arc<Vec<bytes::Bytes>> = Arc::new(
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| bytes::Bytes::from(l.to_owned()))
            .collect(),
    );
    anyhow::ensure!(
        !bodies.is_empty(),
        "{} holds no request bodies",
        args.bodies.display()
    );
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(args.max_in_flight)
        .timeout(Duration::from_secs(10))
        .build()?;
    let interval = Duration::from_secs_f64(1.0 / f64::from(args.rate));
    let warmup = u64::from(args.rate); // one second
    let total = warmup + u64::from(args.rate) * u64::from(args.duration);
    let in_flight = Arc::new(tokio::sync::Semaphore::new(args.max_in_flight));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(u64, Answer)>();
    let want_events = args.latency_log.is_some();
    let start = Instant::now();
    for i in 0..total {
        let scheduled = start + interval.mul_f64(i as f64);
        tokio::time::sleep_until(scheduled.into()).await;
        let Ok(permit) = in_flight.clone().try_acquire_owned() else {
            let _ = tx.send((i, Answer::default()));
            continue;
        };
        let request = client
            .post(&args.url)
            .bearer_auth(&args.key)
            .header("content-type", "application/json")
            .body(bodies[(i as usize) % bodies.len()].clone());
        let tx = tx.clone();
        tokio::spawn(async move {
            let answer = match request.send().await {
                Ok(response) => {
                    let status = response.status();
                    let latency = Some(scheduled.elapsed());
                    let event_id = if want_events && status.is_success() {
                        response
                            .json::<serde_json::Value>()
                            .await
                            .ok()
                            .and_then(|body| body["event_id"].as_str().map(str::to_owned))
                    } else {
                        None
                    };
                    Answer {
                        latency,
                        status: Some(status.as_u16()),
                        event_id,
                    }
                }
                Err(_) => Answer::default(),
            };
            drop(permit);
            let _ = tx.send((i, answer));
        });
    }
    drop(tx);
    let mut latencies = Vec::with_capacity(total as usize);
    let mut log = Vec::new();
    let (mut sent, mut errors) = (0u64, 0u64);
    while let Some((i, answer)) = rx.recv().await {
        let latency = answer
            .latency
            .filter(|_| answer.status.is_some_and(|s| (200..300).contains(&s)));
        if args.latency_log.is_some() {
            log.push((i, answer));
        }
        if i < warmup {
            continue;
        }
        sent += 1;
        match latency {
            Some(l) => latencies.push(l.as_secs_f64() * 1000.0),
            None => errors += 1,
        }
    }
    let measured = start.elapsed().as_secs_f64() - 1.0;
    if let Some(path) = &args.latency_log {
        write_latency_log(path, &mut log, interval, warmup)?;
    }
    latencies.sort_by(f64::total_cmp);
    let quantile = |q: f64| {
        (!latencies.is_empty())
            .then(|| latencies[((latencies.len() - 1) as f64 * q).round() as usize])
    };
    let report = LoadReport {
        target_rate: args.rate,
        sent,
        ok: latencies.len() as u64,
        errors,
        achieved_rate: latencies.len() as f64 / measured.max(1e-9),
        p50_ms: quantile(0.50),
        p90_ms: quantile(0.90),
        p99_ms: quantile(0.99),
        max_ms: latencies.last().copied(),
    };
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

/// What one request got back.
#[derive(Debug, Default)]
struct Answer {
    /// From the scheduled send to the response's head; `None` without a response.
    latency: Option<Duration>,
    /// The HTTP status; `None` when no response came (or the request was never sent).
    status: Option<u16>,
    /// The `event_id` of a 2xx body (with `--latency-log` only).
    event_id: Option<String>,
}

/// Writes `sent_s,latency_ms,status,event_id` lines in send order (`sent_s` counted from the
/// end of the warm-up).
fn write_latency_log(
    path: &std::path::Path,
    log: &mut [(u64, Answer)],
    interval: Duration,
    warmup: u64,
) -> anyhow::Result<()> {
    use std::io::Write;
    log.sort_unstable_by_key(|(i, _)| *i);
    let file =
        std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let mut out = std::io::BufWriter::new(file);
    writeln!(out, "sent_s,latency_ms,status,event_id")?;
    for (i, answer) in log.iter() {
        let sent = interval.as_secs_f64() * (*i as f64 - warmup as f64);
        let latency = answer
            .latency
            .map(|l| format!("{:.3}", l.as_secs_f64() * 1000.0))
            .unwrap_or_default();
        let status = answer.status.map(|s| s.to_string()).unwrap_or_default();
        let event = answer.event_id.as_deref().unwrap_or_default();
        writeln!(out, "{sent:.4},{latency},{status},{event}")?;
    }
    out.flush()
        .with_context(|| format!("cannot write {}", path.display()))
}
