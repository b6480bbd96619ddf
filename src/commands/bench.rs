//! `arc-rec bench ...`: performance measurements anyone can rerun. Every bench prints a human
//! table, or one JSON object with `--json`.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::Context;
use clap::{Args, Subcommand};
use serde::Serialize;

use crate::export::{ExportFormat, ExportOptions, export_to_file};
use crate::storage::Database;
use crate::storage::export_rows::{ExportFilter, export_sql};

/// The benchmarks.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Export throughput against `psql \copy` of the same rows from the same database.
    Export(BenchExportArgs),
    /// Open-loop HTTP load at a fixed rate against a running server (one JSON line of results).
    Load(crate::commands::load::LoadArgs),
}

/// Arguments of `arc-rec bench export`.
#[derive(Debug, Args)]
pub struct BenchExportArgs {
    /// Timed repetitions of each side (the median is reported).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=50))]
    pub repeat: u32,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Runs a benchmark.
pub async fn run(command: &BenchCommand, database: &Database) -> anyhow::Result<()> {
    match command {
        BenchCommand::Export(args) => bench_export(args, database).await,
        // A pure client; `main` runs it without opening a database.
        BenchCommand::Load(_) => anyhow::bail!("`bench load` needs no database"),
    }
}

#[derive(Debug, Serialize)]
struct ExportBench {
    rows: u64,
    repeat: u32,
    arc_rec_seconds: f64,
    arc_rec_rows_per_s: f64,
    arc_rec_mb_per_s: f64,
    arc_rec_bytes: u64,
    psql_copy_seconds: f64,
    psql_copy_rows_per_s: f64,
    psql_copy_bytes: u64,
    /// arc-rec time / psql \copy time; the goal is ≤ 1.5.
    time_ratio: f64,
    peak_rss_mb: f64,
}

async fn bench_export(args: &BenchExportArgs, database: &Database) -> anyhow::Result<()> {
    let dir = tempfile::tempdir().context("cannot create a scratch directory")?;
    let ours = dir.path().join("export.jsonl");
    let theirs = dir.path().join("copy.txt");
    let options = ExportOptions {
        filter: ExportFilter::default(),
        format: ExportFormat::Arc,
        split: None,
        validation_percent: 10,
        accepted_only: false,
    };
    let mut ours_times = Vec::new();
    let mut theirs_times = Vec::new();
    let mut summary = None;
    // Alternate the two sides so caching and background load affect both alike.
    for _ in 0..args.repeat {
        let started = Instant::now();
        let hidden = indicatif::ProgressBar::hidden();
        summary = Some(export_to_file(database, &options, &ours, &hidden).await?);
        ours_times.push(started.elapsed().as_secs_f64());
        theirs_times.push(psql_copy(database, &theirs)?);
    }
    let summary = summary.context("no repetition ran")?;
    let ours_s = median(&mut ours_times);
    let theirs_s = median(&mut theirs_times);
    let copy_bytes = std::fs::metadata(&theirs).map(|m| m.len()).unwrap_or(0);
    let copy_rows = std::fs::read_to_string(&theirs)
        .map(|t| t.lines().count() as u64)
        .unwrap_or(0);
    anyhow::ensure!(
        copy_rows == summary.rows_read,
        "psql copied {copy_rows} rows but arc-rec read {}: not the same rows",
        summary.rows_read
    );
    let report = ExportBench {
        rows: summary.rows_read,
        repeat: args.repeat,
        arc_rec_seconds: ours_s,
        arc_rec_rows_per_s: summary.rows_read as f64 / ours_s,
        arc_rec_mb_per_s: summary.bytes_written as f64 / 1e6 / ours_s,
        arc_rec_bytes: summary.bytes_written,
        psql_copy_seconds: theirs_s,
        psql_copy_rows_per_s: copy_rows as f64 / theirs_s,
        psql_copy_bytes: copy_bytes,
        time_ratio: ours_s / theirs_s,
        peak_rss_mb: peak_rss_mb(),
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "export of {} rows (median of {} runs)",
            report.rows, report.repeat
        );
        println!(
            "{:<14} {:>10} {:>12} {:>10} {:>12}",
            "", "seconds", "rows/s", "MB/s", "bytes"
        );
        println!(
            "{:<14} {:>10.3} {:>12.0} {:>10.1} {:>12}",
            "arc-rec",
            report.arc_rec_seconds,
            report.arc_rec_rows_per_s,
            report.arc_rec_mb_per_s,
            report.arc_rec_bytes
        );
        println!(
            "{:<14} {:>10.3} {:>12.0} {:>10.1} {:>12}",
            "psql \\copy",
            report.psql_copy_seconds,
            report.psql_copy_rows_per_s,
            copy_bytes as f64 / 1e6 / theirs_s,
            copy_bytes
        );
        println!(
            "time ratio arc-rec / psql \\copy: {:.2} (goal <= 1.5)",
            report.time_ratio
        );
        println!("peak RSS of this process: {:.1} MB", report.peak_rss_mb);
    }
    Ok(())
}

/// Times `psql -c "\copy (export query) TO file"` against the same database.
fn psql_copy(database: &Database, out: &Path) -> anyhow::Result<f64> {
    let sql = export_sql(&ExportFilter::default())
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let command = format!(
        "\\copy ({sql}) TO '{}'",
        out.display().to_string().replace('\'', "''")
    );
    let started = Instant::now();
    let output = Command::new(database.psql())
        .arg(database.libpq_url())
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-c", &command])
        .output()
        .with_context(|| format!("cannot run {}", database.psql().display()))?;
    let elapsed = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        output.status.success(),
        "psql failed: {}",
        String::from_utf8_lossy(&output.stderr).trim()
    );
    Ok(elapsed)
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Peak resident set size of this process (VmHWM), in MB; 0 where /proc is unavailable.
pub fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}
