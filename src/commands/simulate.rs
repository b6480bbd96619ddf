//! `arc-rec simulate`: generate the synthetic Arc-Eval world's history.

use std::path::PathBuf;

use clap::Args;

use crate::storage::Database;

/// Arguments of `arc-rec simulate`.
#[derive(Debug, Args)]
pub struct SimulateArgs {
    /// Seed of the generator: the same seed gives the same history, byte for byte.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Approximate number of outcomes (scenario runs with trajectories) to generate.
    #[arg(long, default_value_t = 20_000)]
    pub outcomes: usize,
    /// Write the history as ingest JSON lines to this file instead of loading it.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Loads the generated history into the database.
pub async fn run(_args: &SimulateArgs, _database: &Database) -> anyhow::Result<()> {
    anyhow::bail!("the synthetic world is being merged")
}

/// Writes the generated history to `--out`.
pub fn write_file(_args: &SimulateArgs) -> anyhow::Result<()> {
    anyhow::bail!("the synthetic world is being merged")
}
