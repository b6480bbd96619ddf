//! `arc-rec simulate`: generate the synthetic Arc-Eval world's history and load it through the
//! same writer as `arc-rec ingest`, or write it as ingest JSON lines.

use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Args;

use crate::domain::records::RecordKind;
use crate::progress;
use crate::storage::Database;
use crate::storage::record_writer::RecordWriter;
use crate::world::{World, WorldParams};

/// Arguments of `arc-rec simulate`.
#[derive(Debug, Args)]
pub struct SimulateArgs {
    /// Seed of the generator: the same seed and options give the same history, byte for byte.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Number of outcomes (scenario runs with trajectories) to generate.
    #[arg(long, default_value_t = 20_000)]
    pub outcomes: usize,
    /// Organizations to generate, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "acme,globex,initech")]
    pub orgs: Vec<String>,
    /// Give failure patterns synthetic error embeddings of this dimension (the platform uses 1536).
    #[arg(long)]
    pub embedding_dim: Option<usize>,
    /// Write the history as ingest JSON lines to this file instead of loading it.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

impl SimulateArgs {
    fn world(&self) -> anyhow::Result<World> {
        let params = WorldParams {
            seed: self.seed,
            outcomes: self.outcomes,
            orgs: self.orgs.clone(),
            embedding_dim: self.embedding_dim,
            ..WorldParams::default()
        };
        World::new(params).context("invalid simulation parameters")
    }
}

/// Loads the generated history into the database, in one transaction.
pub async fn run(args: &SimulateArgs, database: &Database) -> anyhow::Result<()> {
    let world = args.world()?;
    let started = Instant::now();
    let bar = progress::bar(args.outcomes as u64, "outcomes", false);
    let mut writer = RecordWriter::begin(database.pool()).await?;
    for record in world.history() {
        writer.push(&record).await?;
        if record.kind() == RecordKind::Outcome {
            bar.inc(1);
        }
    }
    let stats = writer.commit().await?;
    bar.finish_and_clear();
    println!(
        "simulated seed {} in {:.1} s: {} rows inserted, {} updated",
        args.seed,
        started.elapsed().as_secs_f64(),
        stats.by_kind.values().map(|c| c.inserted).sum::<u64>(),
        stats.by_kind.values().map(|c| c.updated).sum::<u64>(),
    );
    super::print_write_stats(&stats);
    Ok(())
}

/// Writes the generated history to `--out` atomically (temporary file, then rename).
pub fn write_file(args: &SimulateArgs) -> anyhow::Result<()> {
    let out = args
        .out
        .as_ref()
        .context("--out is required to write a file")?;
    let world = args.world()?;
    let dir = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    let tmp = tempfile::Builder::new()
        .prefix(".arc-rec-simulate-")
        .tempfile_in(dir)
        .with_context(|| format!("cannot create a file in {}", dir.display()))?;
    let bar = progress::bar(args.outcomes as u64, "outcomes", false);
    let mut writer = BufWriter::with_capacity(1 << 20, tmp);
    let mut lines = 0u64;
    for record in world.history() {
        writer.write_all(record.to_line().as_bytes())?;
        writer.write_all(b"\n")?;
        lines += 1;
        if record.kind() == RecordKind::Outcome {
            bar.inc(1);
        }
    }
    let tmp = writer
        .into_inner()
        .map_err(|e| e.into_error())
        .context("cannot write the history")?;
    tmp.as_file().sync_all()?;
    tmp.persist(out)
        .with_context(|| format!("cannot write {}", out.display()))?;
    bar.finish_and_clear();
    println!("wrote {lines} records to {}", out.display());
    Ok(())
}
