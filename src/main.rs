//! The `arc-rec` binary: parses the command line, sets up telemetry and the database, runs one
//! command, and shuts the embedded Postgres down cleanly, also on Ctrl-C.

use std::process::ExitCode;

use clap::Parser;

use arc_rec::cli::{Cli, Command, DbCommand};
use arc_rec::commands;
use arc_rec::commands::bench::BenchCommand;
use arc_rec::storage::EmbeddedPostgres;

/// mimalloc rather than glibc malloc: serving allocates and frees many small JSON values per
/// request (see `mimalloc` in Cargo.toml).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let mut telemetry = telemetry::init(telemetry::TelemetryConfig {
        default_filter: "warn,arc_rec=info".to_owned(),
        ..telemetry::TelemetryConfig::from_env("arc-rec")?
    })?;
    let result = run_command(&cli, telemetry.metrics()).await;
    // Flush spans and metrics before exit; a failing exporter must not hide the command's result.
    if let Err(err) = telemetry.shutdown() {
        eprintln!("warning: telemetry shutdown: {err}");
    }
    result
}

async fn run_command(cli: &Cli, metrics: &telemetry::Metrics) -> anyhow::Result<()> {
    // Commands that need no database return before one is started.
    match &cli.command {
        Command::Db(db) => return manage_embedded(db, &cli.database.data_dir),
        Command::Simulate(args) if args.out.is_some() => {
            return commands::simulate::write_file(args);
        }
        Command::Bench(BenchCommand::Load(args)) => return commands::load::run(args).await,
        Command::Bench(BenchCommand::PaperBandit(args)) => {
            return tokio::task::block_in_place(|| commands::bench_paper_bandit::run(args));
        }
        // Minutes of libtorch work: off the async runtime's worker threads.
        #[cfg(feature = "rft")]
        Command::Bench(BenchCommand::Model(args)) => {
            return tokio::task::block_in_place(|| commands::bench_model::run(args));
        }
        #[cfg(feature = "rft")]
        Command::Model(model) => return commands::model::run(model),
        // Opens the database itself, only around the training (and not with --no-record); its
        // checkpoints make an interrupt safe, so Ctrl-C keeps its default meaning.
        #[cfg(feature = "rft")]
        Command::Train(args) => return commands::train::run(args, &cli.database).await,
        #[cfg(feature = "rft")]
        Command::Eval(args) => {
            return tokio::task::block_in_place(|| commands::eval::run(args));
        }
        // Opens the database itself, only around its checks and its write (the generation in
        // between runs off the async runtime's worker threads).
        #[cfg(feature = "rft")]
        Command::Candidates(args) => {
            return commands::candidates::run(args, &cli.database).await;
        }
        // Opens the database itself (for its lock and its row) and lets train and candidates
        // open theirs.
        #[cfg(feature = "rft")]
        Command::Round(round) => return commands::round::run(round, &cli.database).await,
        #[cfg(feature = "rft")]
        Command::Grade(grade) => {
            return tokio::task::block_in_place(|| commands::grade::run(grade));
        }
        _ => {}
    }
    let database = commands::open_database(&cli.database).await?;
    let result = match &cli.command {
        // The server handles SIGINT/SIGTERM itself and drains requests first.
        Command::Serve(args) => commands::serve::run(args, &database, metrics).await,
        command => tokio::select! {
            result = dispatch(command, &database, metrics) => result,
            _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        },
    };
    // Stop the embedded cluster whether the command succeeded or not.
    let closed = database.close().await;
    result?;
    closed?;
    Ok(())
}

fn manage_embedded(command: &DbCommand, data_dir: &std::path::Path) -> anyhow::Result<()> {
    match command {
        DbCommand::Status => {
            let running = EmbeddedPostgres::is_cluster_running(data_dir)?;
            println!(
                "embedded cluster under {}: {}",
                data_dir.display(),
                if running { "running" } else { "stopped" }
            );
        }
        DbCommand::Url => match EmbeddedPostgres::running_url(data_dir)? {
            Some(url) => println!("{url}"),
            None => anyhow::bail!(
                "the embedded cluster under {} is not running (any command that opens the database starts it, e.g. `arc-rec migrate`)",
                data_dir.display()
            ),
        },
        DbCommand::Stop => {
            let stopped = EmbeddedPostgres::stop_cluster(data_dir)?;
            println!(
                "embedded cluster under {}: {}",
                data_dir.display(),
                if stopped {
                    "stopped"
                } else {
                    "was not running"
                }
            );
        }
    }
    Ok(())
}

async fn dispatch(
    command: &Command,
    database: &arc_rec::storage::Database,
    metrics: &telemetry::Metrics,
) -> anyhow::Result<()> {
    match command {
        Command::Migrate => {
            println!("schema is up to date");
            Ok(())
        }
        Command::Simulate(args) => commands::simulate::run(args, database).await,
        Command::Ingest(args) => commands::ingest::run(args, database, metrics).await,
        Command::Export(args) => commands::export::run(args, database, metrics).await,
        Command::Keys(keys) => commands::keys::run(keys, database).await,
        Command::Models(models) => commands::models::run(models, database).await,
        Command::Analytics(analytics) => commands::analytics::run(analytics, database).await,
        Command::Report(args) => commands::report::run(args, database).await,
        Command::Cluster(args) => commands::cluster::run(args, database).await,
        Command::Bench(bench) => commands::bench::run(bench, database).await,
        // These are run by `run_command` itself (no database, or their own signal handling).
        Command::Serve(_) | Command::Db(_) => anyhow::bail!("not dispatched here"),
        #[cfg(feature = "rft")]
        Command::Model(_)
        | Command::Train(_)
        | Command::Eval(_)
        | Command::Candidates(_)
        | Command::Round(_)
        | Command::Grade(_) => {
            anyhow::bail!("not dispatched here")
        }
    }
}
