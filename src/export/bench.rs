//! `arc-rec bench export`'s measurement: arc-rec's export against `psql \copy` of the same query
//! from the same database, the two timed in turn.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde::Serialize;

use super::{ExportError, ExportFormat, ExportOptions, Holdout, export_to_file};
use crate::storage::Database;
use crate::storage::export_rows::{ExportFilter, export_sql};

/// The medians of both sides, and the ratio the goal is set on.
#[derive(Debug, Serialize)]
pub struct ExportBench {
    pub rows: u64,
    pub repeat: u32,
    pub arc_rec_seconds: f64,
    pub arc_rec_rows_per_s: f64,
    pub arc_rec_mb_per_s: f64,
    pub arc_rec_bytes: u64,
    pub psql_copy_seconds: f64,
    pub psql_copy_rows_per_s: f64,
    pub psql_copy_bytes: u64,
    /// arc-rec time / psql \copy time; the goal is ≤ 1.5.
    pub time_ratio: f64,
}

/// Why the measurement stopped.
#[derive(Debug, thiserror::Error)]
pub enum ExportBenchError {
    #[error("cannot create a scratch directory")]
    Scratch(#[source] std::io::Error),
    #[error(transparent)]
    Export(#[from] ExportError),
    #[error("cannot run {}", psql.display())]
    Psql {
        psql: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("psql failed: {0}")]
    PsqlFailed(String),
    #[error("no repetition ran")]
    NoRepetition,
    #[error("psql copied {copied} rows but arc-rec read {read}: not the same rows")]
    NotTheSameRows { copied: u64, read: u64 },
}

/// Exports every row `repeat` times each way, alternating the two sides so caching and
/// background load affect both alike, and reports the medians.
pub async fn measure(database: &Database, repeat: u32) -> Result<ExportBench, ExportBenchError> {
    let dir = tempfile::tempdir().map_err(ExportBenchError::Scratch)?;
    let ours = dir.path().join("export.jsonl");
    let theirs = dir.path().join("copy.txt");
    let options = ExportOptions {
        filter: ExportFilter::default(),
        format: ExportFormat::Arc,
        split: None,
        holdout: Holdout::DEFAULT,
        accepted_only: false,
    };
    let mut ours_times = Vec::new();
    let mut theirs_times = Vec::new();
    let mut summary = None;
    for _ in 0..repeat {
        let started = Instant::now();
        let hidden = indicatif::ProgressBar::hidden();
        summary = Some(export_to_file(database, &options, &ours, &hidden).await?);
        ours_times.push(started.elapsed().as_secs_f64());
        theirs_times.push(psql_copy(database, &theirs)?);
    }
    let summary = summary.ok_or(ExportBenchError::NoRepetition)?;
    let ours_s = median(&mut ours_times);
    let theirs_s = median(&mut theirs_times);
    let copy_bytes = std::fs::metadata(&theirs).map(|m| m.len()).unwrap_or(0);
    let copy_rows = std::fs::read_to_string(&theirs)
        .map(|t| t.lines().count() as u64)
        .unwrap_or(0);
    if copy_rows != summary.rows_read {
        return Err(ExportBenchError::NotTheSameRows {
            copied: copy_rows,
            read: summary.rows_read,
        });
    }
    Ok(ExportBench {
        rows: summary.rows_read,
        repeat,
        arc_rec_seconds: ours_s,
        arc_rec_rows_per_s: summary.rows_read as f64 / ours_s,
        arc_rec_mb_per_s: summary.bytes_written as f64 / 1e6 / ours_s,
        arc_rec_bytes: summary.bytes_written,
        psql_copy_seconds: theirs_s,
        psql_copy_rows_per_s: copy_rows as f64 / theirs_s,
        psql_copy_bytes: copy_bytes,
        time_ratio: ours_s / theirs_s,
    })
}

/// Times `psql -c "\copy (export query) TO file"` against the same database.
fn psql_copy(database: &Database, out: &Path) -> Result<f64, ExportBenchError> {
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
        .map_err(|source| ExportBenchError::Psql {
            psql: database.psql().to_path_buf(),
            source,
        })?;
    let elapsed = started.elapsed().as_secs_f64();
    if !output.status.success() {
        return Err(ExportBenchError::PsqlFailed(
            String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        ));
    }
    Ok(elapsed)
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
