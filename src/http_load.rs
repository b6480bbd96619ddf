//! An open-loop HTTP load generator, the library side of `arc-rec bench load` (which
//! `arc-rec bench serve` and the soak run as a process of its own, so client and server share no
//! runtime or CPU accounting). A pure client: it imports no other room.
//!
//! Requests are sent on a fixed schedule (one every 1/rate seconds) whatever the server does,
//! and each latency is measured from the request's *scheduled* send time: a server that falls
//! behind shows its queueing delay instead of silently slowing the client down (no coordinated
//! omission).
//!
//! With a [`Mix`] the slots are shared out among endpoints (recommendations, feedback on this
//! run's earlier answers, trajectories, analytics) by weight, for a soak of mixed traffic with
//! figures per endpoint.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

/// An endpoint of mixed traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Endpoint {
    Recommendations,
    Feedback,
    Trajectories,
    Analytics,
}

impl Endpoint {
    pub const ALL: [Endpoint; 4] = [
        Endpoint::Recommendations,
        Endpoint::Feedback,
        Endpoint::Trajectories,
        Endpoint::Analytics,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Endpoint::Recommendations => "recommendations",
            Endpoint::Feedback => "feedback",
            Endpoint::Trajectories => "trajectories",
            Endpoint::Analytics => "analytics",
        }
    }
}

/// The endpoints of a mixed load and their weights, as a repeating schedule of slots.
#[derive(Debug, Clone, PartialEq)]
pub struct Mix {
    weights: Vec<(Endpoint, u32)>,
    /// One cycle of slots, endpoints interleaved in proportion to their weights.
    cycle: Vec<Endpoint>,
}

impl Mix {
    /// Whether any slot goes to `endpoint`.
    pub fn uses(&self, endpoint: Endpoint) -> bool {
        self.weights.iter().any(|(e, w)| *e == endpoint && *w > 0)
    }

    /// The endpoint of slot `i`.
    fn slot(&self, i: u64) -> Endpoint {
        self.cycle[(i as usize) % self.cycle.len()]
    }
}

/// Parses `ENDPOINT=WEIGHT[,...]`; the error names the bad part.
pub fn parse_mix(text: &str) -> Result<Mix, String> {
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
    let cycle = interleave(&weights, total);
    Ok(Mix { weights, cycle })
}

/// One cycle of `total` slots by smooth weighted round-robin: each slot goes to the endpoint
/// furthest behind its share.
fn interleave(weights: &[(Endpoint, u32)], total: u32) -> Vec<Endpoint> {
    let mut credit = vec![0i64; weights.len()];
    (0..total)
        .map(|_| {
            for (c, (_, w)) in credit.iter_mut().zip(weights) {
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
        .collect()
}

/// One endpoint's figures in a mixed run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct EndpointReport {
    pub sent: u64,
    pub ok: u64,
    pub errors: u64,
    /// The errors by kind: the HTTP status, `timeout`, `no response (CAUSE)` or `not sent` (over
    /// the most requests in flight).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub errors_by_kind: BTreeMap<String, u64>,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
}

/// What one load run measured (printed as one JSON line).
#[derive(Debug, Clone, Serialize, Deserialize)]
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
    /// Per endpoint, with a mix.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub endpoints: BTreeMap<String, EndpointReport>,
}

/// Why the load could not run or be recorded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} holds no request bodies", path.display())]
    NoBodies { path: PathBuf },
    #[error(transparent)]
    Client(#[from] reqwest::Error),
    #[error("cannot create {}", path.display())]
    Create {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("cannot write {}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What to send, where and how fast.
#[derive(Debug, Clone)]
pub struct LoadPlan {
    /// The full URL to POST to; with a mix, the server's base URL (`http://host:port`).
    pub url: String,
    /// The API key sent as a bearer token.
    pub key: String,
    /// Request bodies, used round-robin (with a mix: the recommendation requests').
    pub bodies: Arc<Vec<Bytes>>,
    pub mix: Option<Mix>,
    /// `POST /v1/trajectories` bodies (a mix with trajectories; else `bodies` are sent).
    pub trajectory_bodies: Option<Arc<Vec<Bytes>>>,
    /// The key of the analytics requests of a mix.
    pub analytics_key: Option<String>,
    /// Requests per second.
    pub rate: u32,
    /// Seconds measured (after a one-second warm-up that is not).
    pub duration: u32,
    /// Most requests in flight; beyond it requests count as errors (the server is saturated).
    pub max_in_flight: usize,
    /// Keep every answer (and a 2xx body's `event_id`) for [`LoadRun::write_latency_log`].
    pub keep_answers: bool,
}

/// Reads a JSON-lines file of request bodies.
pub fn read_bodies(path: &Path) -> Result<Arc<Vec<Bytes>>, LoadError> {
    let text = std::fs::read_to_string(path).map_err(|source| LoadError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let bodies: Vec<Bytes> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| Bytes::from(l.to_owned()))
        .collect();
    if bodies.is_empty() {
        return Err(LoadError::NoBodies {
            path: path.to_path_buf(),
        });
    }
    Ok(Arc::new(bodies))
}

/// The send times: one slot every `interval`, the first `warmup` slots (one second) unmeasured.
#[derive(Debug, Clone, Copy)]
struct Schedule {
    interval: Duration,
    warmup: u64,
    total: u64,
}

impl Schedule {
    fn of(plan: &LoadPlan) -> Self {
        let warmup = u64::from(plan.rate); // one second
        Self {
            interval: Duration::from_secs_f64(1.0 / f64::from(plan.rate)),
            warmup,
            total: warmup + u64::from(plan.rate) * u64::from(plan.duration),
        }
    }
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
    /// The `event_id` of a 2xx body (when answers are kept).
    event_id: Option<String>,
    /// Why no response came: `timeout`, `no response (CAUSE)` or `not sent`.
    failure: Option<String>,
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

/// Answers waiting for feedback: (event id, recommendation id).
type Waiting = Arc<Mutex<VecDeque<(String, String)>>>;

/// A finished run: its report and, when kept, every answer.
#[derive(Debug)]
pub struct LoadRun {
    pub report: LoadReport,
    answers: Vec<(u64, Answer)>,
    schedule: Schedule,
}

/// Sends the plan's load and measures it.
pub async fn run(plan: &LoadPlan) -> Result<LoadRun, LoadError> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(plan.max_in_flight)
        // Below `serve --keep-alive` (75 s by default), as a client should be: a pooled
        // connection reused at the moment the server closes it gets no answer.
        .pool_idle_timeout(Duration::from_secs(30))
        .timeout(Duration::from_secs(10))
        .build()?;
    let schedule = Schedule::of(plan);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<(u64, Answer)>();
    let start = Instant::now();
    send_all(plan, &client, schedule, start, tx).await;
    let tally = collect(rx, schedule.warmup, plan.keep_answers).await;
    let measured = start.elapsed().as_secs_f64() - 1.0;
    let answers = tally.log;
    Ok(LoadRun {
        report: report(
            plan,
            tally.latencies,
            tally.by_endpoint,
            tally.errors_by_kind,
            measured,
        ),
        answers,
        schedule,
    })
}

/// Sends every slot of the schedule at its time, each answer to `tx` (a slot over the most in
/// flight is answered `not sent` at once).
async fn send_all(
    plan: &LoadPlan,
    client: &reqwest::Client,
    schedule: Schedule,
    start: Instant,
    tx: UnboundedSender<(u64, Answer)>,
) {
    let waiting: Waiting = Arc::default();
    let in_flight = Arc::new(tokio::sync::Semaphore::new(plan.max_in_flight));
    let mut sent_to = [0usize; Endpoint::ALL.len()];
    for i in 0..schedule.total {
        let scheduled = start + schedule.interval.mul_f64(i as f64);
        tokio::time::sleep_until(scheduled.into()).await;
        let mut endpoint = plan
            .mix
            .as_ref()
            .map_or(Endpoint::Recommendations, |m| m.slot(i));
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
        let request = request(plan, client, endpoint, slot, i, answered);
        // Recommendation answers are read for their event and first recommendation when
        // feedback will need them.
        let feed = plan
            .mix
            .as_ref()
            .filter(|m| m.uses(Endpoint::Feedback) && endpoint == Endpoint::Recommendations)
            .map(|_| waiting.clone());
        let tx = tx.clone();
        let keep_events = plan.keep_answers;
        tokio::spawn(async move {
            let answer = answer_of(request, scheduled, endpoint, keep_events, feed).await;
            drop(permit);
            let _ = tx.send((i, answer));
        });
    }
}

/// Slot `i`'s request to `endpoint`, its `slot`-th there; `answered` is the earlier answer a
/// feedback request refers to.
fn request(
    plan: &LoadPlan,
    client: &reqwest::Client,
    endpoint: Endpoint,
    slot: usize,
    i: u64,
    answered: Option<(String, String)>,
) -> reqwest::RequestBuilder {
    let base = plan.url.trim_end_matches('/');
    let bodies = &plan.bodies;
    let request = match (&plan.mix, endpoint) {
        (None, _) => client
            .post(&plan.url)
            .body(bodies[slot % bodies.len()].clone()),
        (Some(_), Endpoint::Recommendations) => client
            .post(format!("{base}/v1/recommendations"))
            .body(bodies[slot % bodies.len()].clone()),
        (Some(_), Endpoint::Feedback) => {
            let (event_id, recommendation_id) = answered.unwrap_or_default();
            let outcome = if i.is_multiple_of(2) {
                "accepted"
            } else {
                "rejected"
            };
            client.post(format!("{base}/v1/feedback")).body(
                serde_json::json!({"event_id": event_id, "recommendation_id": recommendation_id, "outcome": outcome})
                    .to_string(),
            )
        }
        (Some(_), Endpoint::Trajectories) => {
            let bodies = plan.trajectory_bodies.as_ref().unwrap_or(bodies);
            client
                .post(format!("{base}/v1/trajectories"))
                .body(bodies[slot % bodies.len()].clone())
        }
        (Some(_), Endpoint::Analytics) => client
            .get(format!("{base}/v1/analytics/acceptance?group_by=type"))
            .bearer_auth(plan.analytics_key.as_deref().unwrap_or_default()),
    };
    if endpoint == Endpoint::Analytics {
        request
    } else {
        request
            .bearer_auth(&plan.key)
            .header("content-type", "application/json")
    }
}

/// Sends `request` and reads what came back; a recommendation answer goes to `feed` (when given)
/// for a later feedback request.
async fn answer_of(
    request: reqwest::RequestBuilder,
    scheduled: Instant,
    endpoint: Endpoint,
    keep_events: bool,
    feed: Option<Waiting>,
) -> Answer {
    let response = match request.send().await {
        Ok(response) => response,
        Err(err) => {
            return Answer {
                endpoint,
                failure: Some(if err.is_timeout() {
                    "timeout".to_owned()
                } else {
                    format!("no response ({})", innermost_cause(&err))
                }),
                ..Answer::default()
            };
        }
    };
    let status = response.status();
    let latency = Some(scheduled.elapsed());
    let body = if (keep_events || feed.is_some()) && status.is_success() {
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
        event_id: event_id.filter(|_| keep_events),
        endpoint,
        failure: None,
    }
}

/// The answers of the measured slots, counted.
#[derive(Debug, Default)]
struct Tally {
    /// Milliseconds of every 2xx answer.
    latencies: Vec<f64>,
    /// Per endpoint: its counts and its 2xx latencies.
    by_endpoint: BTreeMap<Endpoint, (EndpointReport, Vec<f64>)>,
    /// Every answer, warm-up included (when kept).
    log: Vec<(u64, Answer)>,
    errors_by_kind: BTreeMap<String, u64>,
}

/// Receives every answer until the last sender is gone.
async fn collect(
    mut rx: UnboundedReceiver<(u64, Answer)>,
    warmup: u64,
    keep_answers: bool,
) -> Tally {
    let mut tally = Tally::default();
    while let Some((i, answer)) = rx.recv().await {
        let latency = answer
            .latency
            .filter(|_| answer.status.is_some_and(|s| (200..300).contains(&s)));
        let endpoint = answer.endpoint;
        let (status, failure) = (answer.status, answer.failure.clone());
        if keep_answers {
            tally.log.push((i, answer));
        }
        if i < warmup {
            continue;
        }
        let (figures, endpoint_latencies) = tally.by_endpoint.entry(endpoint).or_default();
        figures.sent += 1;
        match latency {
            Some(l) => {
                tally.latencies.push(l.as_secs_f64() * 1000.0);
                endpoint_latencies.push(l.as_secs_f64() * 1000.0);
                figures.ok += 1;
            }
            None => {
                figures.errors += 1;
                let kind = answer_kind(status, failure);
                *figures.errors_by_kind.entry(kind.clone()).or_default() += 1;
                *tally.errors_by_kind.entry(kind).or_default() += 1;
            }
        }
    }
    tally
}

/// The run's figures over `measured` seconds (per endpoint with a mix).
fn report(
    plan: &LoadPlan,
    mut latencies: Vec<f64>,
    by_endpoint: BTreeMap<Endpoint, (EndpointReport, Vec<f64>)>,
    errors_by_kind: BTreeMap<String, u64>,
    measured: f64,
) -> LoadReport {
    let sent = by_endpoint.values().map(|(figures, _)| figures.sent).sum();
    let errors = by_endpoint
        .values()
        .map(|(figures, _)| figures.errors)
        .sum();
    latencies.sort_by(f64::total_cmp);
    let endpoints = if plan.mix.is_some() {
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
    LoadReport {
        target_rate: plan.rate,
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
    }
}

/// Sorted latencies' quantile (`None` when empty).
fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    (!sorted.is_empty()).then(|| sorted[((sorted.len() - 1) as f64 * q).round() as usize])
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

impl LoadRun {
    /// Writes every kept answer as a line `sent_s,latency_ms,status,event_id`, in send order
    /// (`sent_s` counted from the end of the warm-up).
    pub fn write_latency_log(&mut self, path: &Path) -> Result<(), LoadError> {
        use std::io::Write;
        let Schedule {
            interval, warmup, ..
        } = self.schedule;
        self.answers.sort_unstable_by_key(|(i, _)| *i);
        let file = std::fs::File::create(path).map_err(|source| LoadError::Create {
            path: path.to_path_buf(),
            source,
        })?;
        let mut out = std::io::BufWriter::new(file);
        writeln!(out, "sent_s,latency_ms,status,event_id")?;
        for (i, answer) in &self.answers {
            let sent = interval.as_secs_f64() * (*i as f64 - warmup as f64);
            let latency = answer
                .latency
                .map(|l| format!("{:.3}", l.as_secs_f64() * 1000.0))
                .unwrap_or_default();
            let status = answer.status.map(|s| s.to_string()).unwrap_or_default();
            let event = answer.event_id.as_deref().unwrap_or_default();
            writeln!(out, "{sent:.4},{latency},{status},{event}")?;
        }
        out.flush().map_err(|source| LoadError::Write {
            path: path.to_path_buf(),
            source,
        })
    }
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
