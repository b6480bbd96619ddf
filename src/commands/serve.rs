//! `arc-rec serve`: the HTTP API.

use anyhow::Context;
use clap::Args;

use crate::api::state::AppState;
use crate::api::{Application, DEFAULT_BODY_LIMIT, ServerSettings};
use crate::auth::KeyCache;
use crate::recommend::exposure::ExposureCap;
use crate::recommend::service::{Serving, ServingOptions};
use crate::storage::Database;

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
    /// Answers after which a model version is no longer new (see --new-version-share).
    #[arg(long, default_value_t = ExposureCap::default().feedbacks)]
    pub new_version_feedbacks: u64,
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
    let serving = Serving::start_with(database.pool().clone(), ServingOptions { exposure_cap })
        .await
        .context("cannot load the serving state")?;
    let state = AppState {
        serving,
        pool: database.pool().clone(),
        keys: KeyCache::default(),
        metrics: metrics.clone(),
        body_limit: args.body_limit,
    };
    let settings = ServerSettings {
        listen: args.listen.clone(),
        workers,
    };
    let app = Application::build(&settings, state)
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let handle = app.handle();
    tracing::info!(listen = %args.listen, port = app.port(), workers, "serving");
    eprintln!("arc-rec listening on {} (port {})", args.listen, app.port());
    let server = tokio::spawn(app.run_until_stopped());
    shutdown_signal().await;
    tracing::info!("shutting down: draining in-flight requests");
    handle.stop(true).await;
    server
        .await
        .context("server task failed")?
        .context("server failed")?;
    Ok(())
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
