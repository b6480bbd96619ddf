//! The `arc-rec` binary: parses the command line, sets up telemetry and the database, runs one
//! command, and shuts the embedded Postgres down cleanly, also on Ctrl-C.

use std::process::ExitCode;

use clap::Parser;

use arc_rec::cli::{Cli, Command};
use arc_rec::commands;

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
    // Commands that need no database return before one is started.
    if let Command::Simulate(args) = &cli.command
        && args.out.is_some()
    {
        return commands::simulate::write_file(args);
    }
    let database = commands::open_database(&cli.database).await?;
    let result = tokio::select! {
        result = dispatch(&cli, &database) => result,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
    };
    // Stop the embedded cluster whether the command succeeded or not.
    let closed = database.close().await;
    result?;
    closed?;
    Ok(())
}

async fn dispatch(cli: &Cli, database: &arc_rec::storage::Database) -> anyhow::Result<()> {
    match &cli.command {
        Command::Migrate => {
            println!("schema is up to date");
            Ok(())
        }
        Command::Simulate(args) => commands::simulate::run(args, database).await,
        Command::Ingest(args) => commands::ingest::run(args, database).await,
        Command::Export(args) => commands::export::run(args, database).await,
        Command::Bench(bench) => commands::bench::run(bench, database).await,
    }
}
