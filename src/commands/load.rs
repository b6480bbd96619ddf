//! `arc-rec bench load`: an open-loop HTTP load generator, run as its own process by
//! `arc-rec bench serve` so client and server do not share a runtime or CPU accounting.
//!
//! Requests are sent on a fixed schedule (one every 1/rate seconds) whatever the server does,
//! and each latency is measured from the request's *scheduled* send time: a server that falls
//! behind shows its queueing delay instead of silently slowing the client down (no coordinated
//! omission).
//!
//! With `--mix` the slots are shared out among endpoints (recommendations, feedback on this
//! run's earlier answers, trajectories, analytics) by weight, for a soak of mixed traffic with
//! figures per endpoint.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use serde::Serialize;

/// Arguments of `arc-rec bench load`.
#[derive(Debug, Args)]
pub struct LoadArgs {
    /// Full URL to POST to; with `--mix`, the server's base URL (`http://host:port`).
    #[arg(long)]
    pub url: String,
    /// API key sent as a bearer token.
    #[arg(long, env = "ARC_REC_LOAD_KEY", hide_env_values = true)]
    pub key: String,
    /// JSON-lines file of request bodies, used round-robin (with `--mix`: the recommendation
    /// requests').
    #[arg(long)]
    pub bodies: PathBuf,
    /// Mixed traffic: comma-separated `ENDPOINT=WEIGHT` with ENDPOINT one of `recommendations`
    /// (POST --bodies), `feedback` (an answer, accepted or rejected in turn, to the first
    /// recommendation of an earlier 2xx answer of this run; a recommendation while none is
    /// waiting), `trajectories` (POST --trajectory-bodies, re-sent round-robin: stored again as
    /// unchanged or updated) and `analytics` (GET /v1/analytics/acceptance with
    /// --analytics-key), e.g. `recommendations=60,feedback=25,trajectories=12,analytics=3`.
    #[arg(long, value_parser = parse_mix)]
    pub mix: Option<Mix>,
    /// JSON-lines file of `POST /v1/trajectories` bodies (for `--mix` with trajectories).
    #[arg(long)]
    pub trajectory_bodies: Option<PathBuf>,
    /// An analyst (or admin) key for the analytics requests of `--mix`.
    #[arg(long, env = "ARC_REC_LOAD_ANALYTICS_KEY", hide_env_values = true)]
    pub analytics_key: Option<String>,
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

/// An endpoint of mixed traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Endpoint {
    Recommendations,
    Feedback,
    Trajectories,
    Analytics,
}

impl Endpoint {
    const ALL: [Endpoint; 4] = [
        Endpoint::Recommendations,
        Endpoint::Feedback,
        Endpoint::Trajectories,
        Endpoint::Analytics,
    ];

    fn name(self) -> &'static str {
        match self {
            Endpoint::Recommendations => "recommendations",
            Endpoint::Feedback => "feedback",
            Endpoint::Trajectories => "trajectories",
            Endpoint::Analytics => "analytics",
        }
    }
}

/// The endpoints of `--mix` and their weights, as a repeating schedule of slots.
#[derive(Debug, Clone, PartialEq)]
pub struct Mix {
    weights: Vec<(Endpoint, u32)>,
    /// One cycle of slots, endpoints interleaved in proportion to their weights.
    cycle: Vec<Endpoint>,
}

impl Mix {
    fn uses(&self, endpoint: Endpoint) -> bool {
        self.weights.iter().any(|(e, w)| *e == endpoint && *w > 0)
    }
}

/// Parses `ENDPOINT=WEIGHT[,...]`; the error names the bad part.
fn parse_mix(text: &str) -> Result<Mix, String> {
    let mut weights: Vec<(Endpoint, u32)> = Vec::new();
    for part in text.split(',') {
        let (name, weight) = part
            .split_once('=')
            .ok_or_else(|| format!("`{part}` is not ENDPOINT=WEIGHT"))?;
        let endpoint = Endpoint::ALL
            .into_iter()
            .find(|e| e.name() == name.trim())
            .ok_or_else(|| {
                format!(
                    "unknown endpoint `{name}` (one of {})",
                    Endpoint::ALL.map(Endpoint::name).join(", ")
                )
            })?;
        let weight: u32 = weight
            .trim()
            .parse()
            .ok()
            .filter(|w| *w <= 1000)
            .ok_or_else(|| format!("weight of {name} must be an integer 0–1000, got `{weight}`"))?;
        if weights.iter().any(|(e, _)| *e == endpoint) {
            return Err(format!("{name} is given twice"));
        }
        weights.push((endpoint, weight));
    }
    let total: u32 = weights.iter().map(|(_, w)| w).sum();
    if total == 0 {
        return Err("the weights add up to 0".into());
    }
    // Smooth weighted round-robin: each slot goes to the endpoint furthest behind its share.
    let mut credit = vec![0i64; weights.len()];
    let cycle = (0..total)
        .map(|_| {
            for (c, (_, w)) in credit.iter_mut().zip(&weights) {
                *c += i64::from(*w);
            }
            let (best, _) = credit
                .iter()
                .enumerate()
                .max_by_key(|(i, c)| (**c, std::cmp::Reverse(*i)))
                .unwrap_or((0, &0));
            credit[best] -= i64::from(total);
            weights[best].0
        })
        .collect();
    Ok(Mix { weights, cycle })
}

/// One endpoint's figures in a mixed run.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct EndpointReport {
    pub sent: u64,
    pub ok: u64,
    pub errors: u64,
    /// The errors by kind: the HTTP status, `timeout`, `no response (CAUSE)` or `not sent` (over
    /// `--max-in-flight`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub errors_by_kind: BTreeMap<String, u64>,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
}

/// What one load run measured (printed as one JSON line).
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct LoadReport {
    pub target_rate: u32,
    pub sent: u64,
    pub ok: u64,
    pub errors: u64,
    /// The errors by kind, as [`EndpointReport::errors_by_kind`].
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub errors_by_kind: BTreeMap<String, u64>,
    /// Completed requests per second over the measured window.
    pub achieved_rate: f64,
    /// Latency quantiles of the successful requests; `None` when none succeeded.
    pub p50_ms: Option<f64>,
    pub p90_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
    /// Per endpoint, with `--mix`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub endpoints: BTreeMap<String, EndpointReport>,
}

/// Sorted latencies' quantile (`None` when empty).
fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    (!sorted.is_empty()).then(|| sorted[((sorted.len() - 1) as f64 * q).round() as usize])
}

/// Reads a JSON-lines file of request bodies.
fn read_bodies(path: &std::path::Path) -> anyhow::Result<Arc<Vec<bytes::Bytes>>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let bodies: Vec<bytes::Bytes> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| bytes::Bytes::from(l.to_owned()))
        .collect();
    anyhow::ensure!(
        !bodies.is_empty(),
        "{} holds no request bodies",
        path.display()
    );
    Ok(Arc::new(bodies))
}

/// Runs the load and prints a [`LoadReport`] as JSON on stdout.
pub async fn run(args: &LoadArgs) -> anyhow::Result<()> {
    let bodies = read_bodies(&args.bodies)?;
    let trajectory_bodies = match (&args.mix, &args.trajectory_bodies) {
        (Some(mix), None) if mix.uses(Endpoint::Trajectories) => {
            anyhow::bail!("--mix with trajectories needs --trajectory-bodies")
        }
        (_, Some(path)) => Some(read_bodies(path)?),
        (_, None) => None,
    };
    if args
        .mix
        .as_ref()
        .is_some_and(|m| m.uses(Endpoint::Analytics))
        && args.analytics_key.is_none()
    {
        anyhow::bail!("--mix with analytics needs --analytics-key (an analyst or admin key)");
    }
    let base = args.url.trim_end_matches('/');
    // Answers waiting for feedback: (event id, recommendation id).
    let waiting: Arc<Mutex<VecDeque<(String, String)>>> = Arc::default();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(args.max_in_flight)
        // Below `serve --keep-alive` (75 s by default), as a client should be: a pooled
        // connection reused at the moment the server closes it gets no answer.
        .pool_idle_timeout(Duration::from_secs(30))
        .timeout(Duration::from_secs(10))
        .build()?;
    let interval = Duration::from_secs_f64(1.0 / f64::from(args.rate));
    let warmup = u64::from(args.rate); // one second
    let total = warmup + u64::from(args.rate) * u64::from(args.duration);
    let in_flight = Arc::new(tokio::sync::Semaphore::new(args.max_in_flight));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(u64, Answer)>();
    let want_events = args.latency_log.is_some();
    let mut sent_to = [0usize; Endpoint::ALL.len()];
    let start = Instant::now();
    for i in 0..total {
        let scheduled = start + interval.mul_f64(i as f64);
        tokio::time::sleep_until(scheduled.into()).await;
        let mut endpoint = args.mix.as_ref().map_or(Endpoint::Recommendations, |m| {
            m.cycle[(i as usize) % m.cycle.len()]
        });
        let Ok(permit) = in_flight.clone().try_acquire_owned() else {
            let answer = Answer {
                endpoint,
                failure: Some("not sent".to_owned()),
                ..Answer::default()
            };
            let _ = tx.send((i, answer));
            continue;
        };
        let answered = (endpoint == Endpoint::Feedback)
            .then(|| waiting.lock().ok().and_then(|mut w| w.pop_front()))
            .flatten();
        if endpoint == Endpoint::Feedback && answered.is_none() {
            endpoint = Endpoint::Recommendations;
        }
        // Each endpoint takes its bodies in file order (trajectories refer to earlier records).
        let slot = sent_to[endpoint as usize];
        sent_to[endpoint as usize] += 1;
        let request = match (&args.mix, endpoint) {
            (None, _) => client
                .post(&args.url)
                .body(bodies[slot % bodies.len()].clone()),
            (Some(_), Endpoint::Recommendations) => client
                .post(format!("{base}/v1/recommendations"))
                .body(bodies[slot % bodies.len()].clone()),
            (Some(_), Endpoint::Feedback) => {
                let (event_id, recommendation_id) = answered.unwrap_or_default();
                let outcome = if i % 2 == 0 { "accepted" } else { "rejected" };
                client.post(format!("{base}/v1/feedback")).body(
                    serde_json::json!({"event_id": event_id, "recommendation_id": recommendation_id, "outcome": outcome})
                        .to_string(),
                )
            }
            (Some(_), Endpoint::Trajectories) => {
                let bodies = trajectory_bodies.as_ref().unwrap_or(&bodies);
                client
                    .post(format!("{base}/v1/trajectories"))
                    .body(bodies[slot % bodies.len()].clone())
            }
            (Some(_), Endpoint::Analytics) => client
                .get(format!("{base}/v1/analytics/acceptance?group_by=type"))
                .bearer_auth(args.analytics_key.as_deref().unwrap_or_default()),
        };
        let request = if endpoint == Endpoint::Analytics {
            request
        } else {
            request
                .bearer_auth(&args.key)
                .header("content-type", "application/json")
        };
        // Recommendation answers are read for their event and first recommendation when
        // feedback will need them.
        let feed = args
            .mix
            .as_ref()
            .filter(|m| m.uses(Endpoint::Feedback) && endpoint == Endpoint::Recommendations)
            .map(|_| waiting.clone());
        let tx = tx.clone();
        tokio::spawn(async move {
            let answer = match request.send().await {
                Ok(response) => {
                    let status = response.status();
                    let latency = Some(scheduled.elapsed());
                    let body = if (want_events || feed.is_some()) && status.is_success() {
                        response.json::<serde_json::Value>().await.ok()
                    } else {
                        None
                    };
                    let event_id = body
                        .as_ref()
                        .and_then(|b| b["event_id"].as_str().map(str::to_owned));
                    if let (Some(feed), Some(event), Some(first)) = (
                        &feed,
                        &event_id,
                        body.as_ref()
                            .and_then(|b| b["recommendations"][0]["recommendation_id"].as_str()),
                    ) && let Ok(mut waiting) = feed.lock()
                    {
                        waiting.push_back((event.clone(), first.to_owned()));
                        // Bounded: answers are given to recent decisions only.
                        if waiting.len() > 10_000 {
                            waiting.pop_front();
                        }
                    }
                    Answer {
                        latency,
                        status: Some(status.as_u16()),
                        event_id: event_id.filter(|_| want_events),
                        endpoint,
                        failure: None,
                    }
                }
                Err(err) => Answer {
                    endpoint,
                    failure: Some(if err.is_timeout() {
                        "timeout".to_owned()
                    } else {
                        format!("no response ({})", innermost_cause(&err))
                    }),
                    ..Answer::default()
                },
            };
            drop(permit);
            let _ = tx.send((i, answer));
        });
    }
    drop(tx);
    let mut latencies = Vec::with_capacity(total as usize);
    let mut by_endpoint: BTreeMap<Endpoint, (EndpointReport, Vec<f64>)> = BTreeMap::new();
    let mut log = Vec::new();
    let (mut sent, mut errors) = (0u64, 0u64);
    let mut errors_by_kind: BTreeMap<String, u64> = BTreeMap::new();
    while let Some((i, answer)) = rx.recv().await {
        let latency = answer
            .latency
            .filter(|_| answer.status.is_some_and(|s| (200..300).contains(&s)));
        let endpoint = answer.endpoint;
        let (status, failure) = (answer.status, answer.failure.clone());
        if args.latency_log.is_some() {
            log.push((i, answer));
        }
        if i < warmup {
            continue;
        }
        sent += 1;
        let (figures, endpoint_latencies) = by_endpoint.entry(endpoint).or_default();
        figures.sent += 1;
        match latency {
            Some(l) => {
                latencies.push(l.as_secs_f64() * 1000.0);
                endpoint_latencies.push(l.as_secs_f64() * 1000.0);
                figures.ok += 1;
            }
            None => {
                errors += 1;
                figures.errors += 1;
                let kind = answer_kind(status, failure);
                *figures.errors_by_kind.entry(kind.clone()).or_default() += 1;
                *errors_by_kind.entry(kind).or_default() += 1;
            }
        }
    }
    let measured = start.elapsed().as_secs_f64() - 1.0;
    if let Some(path) = &args.latency_log {
        write_latency_log(path, &mut log, interval, warmup)?;
    }
    latencies.sort_by(f64::total_cmp);
    let endpoints = if args.mix.is_some() {
        by_endpoint
            .into_iter()
            .map(|(endpoint, (mut figures, mut sorted))| {
                sorted.sort_by(f64::total_cmp);
                figures.p50_ms = quantile(&sorted, 0.50);
                figures.p99_ms = quantile(&sorted, 0.99);
                figures.max_ms = sorted.last().copied();
                (endpoint.name().to_owned(), figures)
            })
            .collect()
    } else {
        BTreeMap::new()
    };
    let quantile = |q: f64| quantile(&latencies, q);
    let report = LoadReport {
        target_rate: args.rate,
        sent,
        ok: latencies.len() as u64,
        errors,
        errors_by_kind,
        achieved_rate: latencies.len() as f64 / measured.max(1e-9),
        p50_ms: quantile(0.50),
        p90_ms: quantile(0.90),
        p99_ms: quantile(0.99),
        max_ms: latencies.last().copied(),
        endpoints,
    };
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

/// What one request got back.
#[derive(Debug)]
struct Answer {
    /// Where it was sent.
    endpoint: Endpoint,
    /// From the scheduled send to the response's head; `None` without a response.
    latency: Option<Duration>,
    /// The HTTP status; `None` when no response came (or the request was never sent).
    status: Option<u16>,
    /// The `event_id` of a 2xx body (with `--latency-log` only).
    event_id: Option<String>,
    /// Why no response came: `timeout`, `no response (CAUSE)` or `not sent`.
    failure: Option<String>,
}

/// An unsuccessful answer's kind for [`EndpointReport::errors_by_kind`]: its status, else why
/// none came.
fn answer_kind(status: Option<u16>, failure: Option<String>) -> String {
    match status {
        Some(status) => status.to_string(),
        None => failure.unwrap_or_else(|| "no response".to_owned()),
    }
}

/// The last error of `err`'s source chain (e.g. "connection closed before message completed"),
/// which says more than reqwest's "error sending request".
fn innermost_cause(err: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = err;
    while let Some(inner) = cause.source() {
        cause = inner;
    }
    cause.to_string()
}

impl Default for Answer {
    fn default() -> Self {
        Self {
            endpoint: Endpoint::Recommendations,
            latency: None,
            status: None,
            event_id: None,
            failure: None,
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mix_shares_out_slots_by_weight_and_names_bad_parts() {
        let mix = parse_mix("recommendations=3,feedback=1,analytics=0").unwrap();
        assert_eq!(mix.cycle.len(), 4);
        let count = |e| mix.cycle.iter().filter(|c| **c == e).count();
        assert_eq!(count(Endpoint::Recommendations), 3);
        assert_eq!(count(Endpoint::Feedback), 1);
        assert!(!mix.uses(Endpoint::Analytics));
        // Interleaved, not in runs: 60/25/12/3 puts no two analytics slots side by side.
        let mix = parse_mix("recommendations=60,feedback=25,trajectories=12,analytics=3").unwrap();
        assert_eq!(mix.cycle.len(), 100);
        assert!(
            mix.cycle
                .windows(2)
                .all(|w| w != [Endpoint::Analytics, Endpoint::Analytics])
        );
        assert!(
            parse_mix("recommendations")
                .unwrap_err()
                .contains("ENDPOINT=WEIGHT")
        );
        assert!(
            parse_mix("search=1")
                .unwrap_err()
                .contains("unknown endpoint `search`")
        );
        assert!(
            parse_mix("feedback=x")
                .unwrap_err()
                .contains("weight of feedback")
        );
        assert!(parse_mix("feedback=0").unwrap_err().contains("add up to 0"));
        assert!(
            parse_mix("feedback=1,feedback=2")
                .unwrap_err()
                .contains("twice")
        );
    }
}
