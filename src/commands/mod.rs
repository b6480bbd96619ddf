//! The CLI commands: each parses its arguments, calls library code and prints a summary.
//! `anyhow` lives here and in `main`, not in the library.

pub mod analytics;
pub mod bench;
#[cfg(feature = "rft")]
pub mod bench_loop;
#[cfg(feature = "rft")]
pub mod bench_model;
pub mod bench_paper_bandit;
pub mod bench_peers;
pub mod bench_pipeline;
pub mod bench_serve;
#[cfg(feature = "rft")]
pub mod candidates;
pub mod cluster;
#[cfg(feature = "rft")]
pub mod eval;
pub mod export;
#[cfg(feature = "rft")]
pub mod grade;
pub mod ingest;
pub mod keys;
pub mod load;
#[cfg(feature = "rft")]
pub mod model;
pub mod models;
pub mod peak_memory;
pub mod report;
#[cfg(feature = "rft")]
pub mod round;
pub mod serve;
pub mod server_process;
pub mod simulate;
#[cfg(feature = "rft")]
pub mod train;

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use crate::storage::record_writer::WriteStats;
use crate::storage::{Database, DatabaseTarget, EmbeddedOptions};

/// The `--org` flag's value as an organization id, or an error naming the flag.
pub(crate) fn parse_org(raw: &str) -> anyhow::Result<crate::domain::OrgId> {
    crate::domain::OrgId::parse(raw).map_err(|m| anyhow::anyhow!("--org: {m}"))
}

/// Where the data lives.
#[derive(Debug, Args)]
pub struct DatabaseArgs {
    /// Postgres server to use (libpq URL). Without it, arc-rec runs its own embedded cluster.
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    pub database_url: Option<String>,
    /// Directory of the embedded cluster (created on first use; ignored with --database-url).
    #[arg(
        long,
        env = "ARC_REC_DATA_DIR",
        default_value = ".arc-rec",
        global = true
    )]
    pub data_dir: PathBuf,
}

/// Opens the database the arguments name and brings its schema up to date.
pub async fn open_database(args: &DatabaseArgs) -> anyhow::Result<Database> {
    let target = match &args.database_url {
        Some(url) => DatabaseTarget::Url(url.clone()),
        None => DatabaseTarget::Embedded {
            root: args.data_dir.clone(),
            options: EmbeddedOptions::default(),
        },
    };
    let database = Database::open(&target)
        .await
        .context("cannot open the database")?;
    database
        .migrate()
        .await
        .context("cannot migrate the database")?;
    Ok(database)
}

/// Fits the learned grader (`training::learned_grader_fit`) over the database `args` name and
/// prints what it was fitted on: what `train --grader learned` and `candidates` share.
#[cfg(feature = "rft")]
pub async fn fit_learned_grader(
    args: &DatabaseArgs,
    settings: &crate::training::TrainSettings,
    dataset: &crate::rft::RftDataset,
    on: crate::training::learned_grader_fit::FitOn,
) -> anyhow::Result<crate::training::learned_grader_fit::FittedGrader> {
    let fitted = with_database(args, |pool| async move {
        crate::training::learned_grader_fit::fit_learned_grader(&pool, settings, dataset, on).await
    })
    .await?;
    println!("{}", fitted.summary);
    Ok(fitted)
}

/// Opens the database, runs `work` on its pool and closes it again, for commands that spend
/// minutes on a model and need the database only around a few reads and writes (an embedded
/// cluster is not held open meanwhile).
pub async fn with_database<T, F, Fut>(args: &DatabaseArgs, work: F) -> anyhow::Result<T>
where
    F: FnOnce(sqlx::PgPool) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    let database = open_database(args).await?;
    let result = work(database.pool().clone()).await;
    let closed = database.close().await;
    let value = result?;
    closed?;
    Ok(value)
}

/// Prints what a load did, one row per record kind.
pub fn print_write_stats(stats: &WriteStats) {
    println!(
        "{:<16} {:>10} {:>10} {:>10}",
        "kind", "inserted", "updated", "unchanged"
    );
    for (kind, counts) in &stats.by_kind {
        let name = kind.as_str();
        println!(
            "{name:<16} {:>10} {:>10} {:>10}",
            counts.inserted, counts.updated, counts.unchanged
        );
    }
}
