//! `arc-rec bench load`: an open-loop HTTP load generator (`crate::http_load`), run as its own
//! process by `arc-rec bench serve` so client and server do not share a runtime or CPU
//! accounting. Prints one `LoadReport` as a JSON line.

use std::path::PathBuf;

use clap::Args;

use crate::http_load::{Endpoint, LoadPlan, Mix, parse_mix, read_bodies};

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

/// Runs the load and prints its `LoadReport` as JSON on stdout.
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
    let plan = LoadPlan {
        url: args.url.clone(),
        key: args.key.clone(),
        bodies,
        mix: args.mix.clone(),
        trajectory_bodies,
        analytics_key: args.analytics_key.clone(),
        rate: args.rate,
        duration: args.duration,
        max_in_flight: args.max_in_flight,
        keep_answers: args.latency_log.is_some(),
    };
    let mut load = crate::http_load::run(&plan).await?;
    if let Some(path) = &args.latency_log {
        load.write_latency_log(path)?;
    }
    println!("{}", serde_json::to_string(&load.report)?);
    Ok(())
}
