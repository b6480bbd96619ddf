//! `arc-rec serve`: the HTTP API.

use anyhow::Context;
use clap::Args;

use crate::api::request_schemas::RequestSchemas;
use crate::api::state::AppState;
use crate::api::{
    Application, DEFAULT_BODY_LIMIT, DEFAULT_HANDLING_TIMEOUT, DEFAULT_KEEP_ALIVE, ServerSettings,
};
use crate::auth::{KeyCache, RoleQuota, RoleQuotas, RoleRateLimit, RoleRateLimits};
use crate::quota::QuotaLedger;
use crate::recommend::exposure::{ExplorationFloorOptions, ExposureCap};
use crate::recommend::service::{Serving, ServingOptions};
use crate::storage::{Database, api_keys};

/// Arguments of `arc-rec serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "ARC_REC_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// HTTP worker threads (default: one per core).
    #[arg(long)]
    pub workers: Option<usize>,
    /// Largest accepted request body in bytes (larger bodies get 413).
    #[arg(long, default_value_t = DEFAULT_BODY_LIMIT)]
    pub body_limit: usize,
    /// Until a model version has --new-version-feedbacks answers, its candidates head at most
    /// this share of an organization's decisions (0–1; 1 turns the cap off); a version over its
    /// share sits a decision out, and the decision logs it in `capped_versions`.
    #[arg(long, default_value_t = ExposureCap::default().share)]
    pub new_version_share: f64,
    /// Answers after which a model version is no longer new (see --new-version-share and
    /// --explore-share).
    #[arg(long, default_value_t = ExposureCap::default().feedbacks)]
    pub new_version_feedbacks: u64,
    /// The exploration floor: while the newest live model version is new, this share (0–1; 0
    /// turns it off) of the decisions whose menu holds one of its ideas with fewer than
    /// --explore-answers answers put one of those ideas first, drawn uniformly. Logged
    /// propensities stay exact; the decision logs `floor_version` and `floor_pick`, and
    /// `arc-rec models list` reports the acceptance the floor gave up.
    #[arg(long, default_value_t = ExplorationFloorOptions::default().share)]
    pub explore_share: f64,
    /// Answers after which an idea no longer needs the exploration floor.
    #[arg(long, default_value_t = ExplorationFloorOptions::default().answers_per_idea)]
    pub explore_answers: u32,
    /// A role's request rate limit per key, ROLE=RATE/BURST (requests per second / at once) or
    /// ROLE=off; repeat for each role. Defaults: platform=1000/2000, analyst=20/40,
    /// admin=20/40. A key's own limit (`keys set-rate-limit`) wins. Over it: 429 with
    /// Retry-After. Each replica limits on its own.
    #[arg(long = "rate-limit", value_name = "ROLE=RATE/BURST")]
    pub rate_limits: Vec<RoleRateLimit>,
    /// A role's daily request quota per key, ROLE=REQUESTS (per UTC day) or ROLE=off; repeat
    /// for each role. Default: off for every role. A key's own quota (`keys set-quota`) wins.
    /// Over it: 429 `quota_exceeded` with Retry-After to the next 00:00 UTC. Replicas share the
    /// count through the database (each adds its requests every second).
    #[arg(long = "daily-quota", value_name = "ROLE=REQUESTS")]
    pub daily_quotas: Vec<RoleQuota>,
    /// Seconds a request may take to handle before it is answered 503 (nothing it was writing
    /// was acknowledged).
    #[arg(long, default_value_t = DEFAULT_HANDLING_TIMEOUT.as_secs_f64(), value_parser = parse_timeout)]
    pub handling_timeout: f64,
    /// Seconds an idle client connection is kept open. Keep it longer than the idle timeout of
    /// the load balancer or client pool in front (AWS ALB: 60 s), so that they close idle
    /// connections, never the server under a request they are sending.
    #[arg(long, default_value_t = DEFAULT_KEEP_ALIVE.as_secs_f64(), value_parser = parse_timeout)]
    pub keep_alive: f64,
}

fn parse_timeout(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(seconds) if seconds.is_finite() && seconds > 0.0 && seconds <= 3600.0 => Ok(seconds),
        _ => Err(format!(
            "{text:?}: expected seconds, more than 0 and at most 3600"
        )),
    }
}

/// Serves until SIGINT or SIGTERM, then drains in-flight requests.
pub async fn run(
    args: &ServeArgs,
    database: &Database,
    metrics: &telemetry::Metrics,
) -> anyhow::Result<()> {
    let workers = args
        .workers
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, usize::from));
    // Held until the server has drained: the pacer thread stops when it is dropped.
    let _pacer = match database.pace_writeback() {
        Some(Ok(pacer)) => Some(pacer),
        Some(Err(err)) => {
            tracing::warn!(error = %err, "cannot pace writeback of the embedded cluster");
            None
        }
        None => None,
    };
    let exposure_cap = ExposureCap {
        share: args.new_version_share,
        feedbacks: args.new_version_feedbacks,
    };
    exposure_cap.validate().map_err(anyhow::Error::msg)?;
    let exploration = ExplorationFloorOptions {
        share: args.explore_share,
        answers_per_idea: args.explore_answers,
    };
    exploration.validate().map_err(anyhow::Error::msg)?;
    // Boxed: loading the state (snapshots, the replay) is a large future.
    let serving = Box::pin(Serving::start_with(
        database.pool().clone(),
        ServingOptions {
            exposure_cap,
            exploration,
        },
    ))
    .await
    .context("cannot load the serving state")?;
    let quota_ledger = std::sync::Arc::new(QuotaLedger::default());
    let state = app_state(
        args,
        database,
        metrics,
        serving.clone(),
        quota_ledger.clone(),
    )?;
    let settings = ServerSettings {
        listen: args.listen.clone(),
        workers,
        keep_alive: std::time::Duration::from_secs_f64(args.keep_alive),
    };
    let app = Application::build(&settings, state)
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let handle = app.handle();
    tracing::info!(listen = %args.listen, port = app.port(), workers, "serving");
    eprintln!("arc-rec listening on {} (port {})", args.listen, app.port());
    let server = tokio::spawn(app.run_until_stopped());
    let folding = tokio::spawn(fold_acceptance_counts(database.pool().clone()));
    let usage = tokio::spawn(store_quota_usage(
        database.pool().clone(),
        quota_ledger.clone(),
    ));
    shutdown_signal().await;
    folding.abort();
    usage.abort();
    tracing::info!("shutting down: draining in-flight requests");
    handle.stop(true).await;
    server
        .await
        .context("server task failed")?
        .context("server failed")?;
    store_at_shutdown(database, &serving, &quota_ledger).await;
    Ok(())
}

/// The handlers' shared state: the serving state, pools, limits and quotas from the arguments.
fn app_state(
    args: &ServeArgs,
    database: &Database,
    metrics: &telemetry::Metrics,
    serving: std::sync::Arc<Serving>,
    quota_ledger: std::sync::Arc<QuotaLedger>,
) -> anyhow::Result<AppState> {
    let mut rate_limits = RoleRateLimits::default();
    for setting in &args.rate_limits {
        rate_limits.apply(setting);
    }
    let mut quotas = RoleQuotas::default();
    for setting in &args.daily_quotas {
        quotas.apply(setting);
    }
    Ok(AppState {
        serving,
        pool: database.pool().clone(),
        analytics_pool: database.analytics_pool(),
        keys: KeyCache::default(),
        metrics: metrics.clone(),
        body_limit: args.body_limit,
        handling_timeout: std::time::Duration::from_secs_f64(args.handling_timeout),
        rate_limits,
        limiter: Default::default(),
        quotas,
        quota_ledger,
        request_schemas: RequestSchemas::served().map_err(anyhow::Error::msg)?,
    })
}

/// After the drain: the last second's requests count against their keys' quotas (retried past
/// connections the stopped workers left dead, `storage::SHUTDOWN_ATTEMPTS`), and what the
/// learners learned is stored, so the next start replays nothing. Failures are logged: the
/// server has stopped either way.
async fn store_at_shutdown(database: &Database, serving: &Serving, quota_ledger: &QuotaLedger) {
    for attempt in 1..=crate::storage::SHUTDOWN_ATTEMPTS {
        match api_keys::store_usage(database.pool(), quota_ledger).await {
            Ok(_) => break,
            Err(err) if err.is_unavailable() && attempt < crate::storage::SHUTDOWN_ATTEMPTS => {}
            Err(err) => {
                tracing::warn!(
                    error = %telemetry::error_chain(&err),
                    "cannot store the keys' request counts at shutdown"
                );
                break;
            }
        }
    }
    match serving.snapshot_all().await {
        Ok(orgs) => tracing::info!(orgs, "bandit snapshots stored"),
        Err(err) => tracing::warn!(
            error = %telemetry::error_chain(&err),
            "cannot store bandit snapshots at shutdown"
        ),
    }
}

/// How often the acceptance deltas written by serving are folded into the counts analysts read.
const FOLD_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// Folds acceptance deltas into `acceptance_counts` every [`FOLD_INTERVAL`] (sql/0015), so
/// analyst queries sum a few rows per group and day whatever the traffic. Readers add the
/// pending deltas, so a late or failed fold makes queries slower, never wrong.
async fn fold_acceptance_counts(pool: sqlx::PgPool) {
    every(FOLD_INTERVAL, "fold acceptance deltas", || {
        crate::storage::analytics::compact_acceptance(&pool)
    })
    .await;
}

/// How often each server adds the requests it admitted to the keys' stored daily usage.
const QUOTA_FLUSH_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// Stores the keys' request counts every [`QUOTA_FLUSH_INTERVAL`], learning the other replicas'
/// from the totals read back.
async fn store_quota_usage(pool: sqlx::PgPool, ledger: std::sync::Arc<QuotaLedger>) {
    every(
        QUOTA_FLUSH_INTERVAL,
        "store the keys' request counts",
        || api_keys::store_usage(&pool, &ledger),
    )
    .await;
}

/// Runs `task` every `interval` until aborted. A failure is logged once per run of failures
/// (the database may be down for a while), and the recovery once.
async fn every<T, F, Fut>(interval: std::time::Duration, what: &'static str, mut task: F)
where
    T: std::fmt::Debug,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, crate::storage::StorageError>>,
{
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        ticks.tick().await;
        match task().await {
            Ok(done) => {
                if failing {
                    tracing::info!(task = what, "working again");
                }
                failing = false;
                tracing::debug!(task = what, ?done, "done");
            }
            Err(err) if !failing => {
                failing = true;
                tracing::warn!(task = what, error = %telemetry::error_chain(&err), "cannot {what}; will retry");
            }
            Err(_) => {}
        }
    }
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let Ok(mut terminate) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        else {
            let _ = interrupt.await;
            return;
        };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
}
