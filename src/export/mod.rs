//! Export: Configuration→Outcome training examples from the JSONB store, one JSON line each.
//!
//! Every decided past recommendation (an approved or rejected config diff) becomes an example:
//! the prompt context (failure summary from trajectories and failure patterns, the current
//! config, the user), the recommendation (type, diff, rationale), the reward by the plan's rules
//! and a deterministic train/validation/test split; then every answered recommendation arc-rec
//! served, from its logged request, with how it was served (origin `served`). Rows stream from a
//! server-side cursor into a temporary file that is renamed over the target only when complete.

pub mod bench;
pub mod example;
pub mod rewards;
pub mod tokenizer_corpus;

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use indicatif::ProgressBar;

pub use example::{ExportFormat, Holdout, Origin, ServedDecision, Split, TrainingExample};

use crate::storage::export_rows::{self, ExportFilter};
use crate::storage::{Database, StorageError};

/// What to export and how.
#[derive(Debug, Clone)]
pub struct ExportOptions {
    pub filter: ExportFilter,
    pub format: ExportFormat,
    /// Only this split.
    pub split: Option<Split>,
    /// How many examples in a hundred the validation and test splits take.
    pub holdout: Holdout,
    /// Only accepted recommendations (implied by the chat format).
    pub accepted_only: bool,
}

/// What an export wrote.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ExportSummary {
    /// Rows the queries returned: the platform's decided diffs and the answered recommendations
    /// arc-rec served.
    pub rows_read: u64,
    /// Lines written from served answers (origin `served`), of `examples_written`.
    pub served: u64,
    /// Lines written.
    pub examples_written: u64,
    pub bytes_written: u64,
    pub train: u64,
    pub validation: u64,
    pub test: u64,
    pub accepted: u64,
    pub rejected: u64,
}

/// Why an export failed (nothing is left at the target path).
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Streams examples into `out`, atomically (temp file in the same directory, then rename).
pub async fn export_to_file(
    database: &Database,
    options: &ExportOptions,
    out: &Path,
    progress: &ProgressBar,
) -> Result<ExportSummary, ExportError> {
    let write_err = |source| ExportError::Write {
        path: out.to_path_buf(),
        source,
    };
    let dir = match out.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    };
    // `--out out/examples.jsonl` on a fresh checkout: the directory is made, as `train --out` does.
    std::fs::create_dir_all(&dir).map_err(write_err)?;
    let tmp = tempfile::Builder::new()
        .prefix(".arc-rec-export-")
        .suffix(".tmp")
        .tempfile_in(&dir)
        .map_err(write_err)?;
    let mut writer = BufWriter::with_capacity(1 << 20, tmp);
    let summary = export_to_writer(database, options, &mut writer, progress)
        .await
        .map_err(|e| match e {
            ExportError::Write { source, .. } => write_err(source),
            other => other,
        })?;
    let tmp = writer.into_inner().map_err(|e| write_err(e.into_error()))?;
    tmp.as_file().sync_all().map_err(write_err)?;
    tmp.persist(out).map_err(|e| write_err(e.error))?;
    Ok(summary)
}

/// Streams examples into any writer (stdout, a buffer in tests).
pub async fn export_to_writer<W: Write>(
    database: &Database,
    options: &ExportOptions,
    writer: &mut W,
    progress: &ProgressBar,
) -> Result<ExportSummary, ExportError> {
    let mut summary = ExportSummary::default();
    let mut line = Vec::with_capacity(8192);
    let mut each = |row| {
        progress.inc(1);
        write_example(
            TrainingExample::from_row(row, options.holdout),
            options,
            &mut line,
            writer,
            &mut summary,
        )
    };
    // The platform's own decisions, then the answers to what arc-rec served.
    let platform = export_rows::for_each_row(database, &options.filter, &mut each).await?;
    let served = export_rows::for_each_served_row(database, &options.filter, &mut each).await?;
    writer.flush().map_err(|source| ExportError::Write {
        path: PathBuf::from("output"),
        source,
    })?;
    summary.rows_read = platform + served;
    progress.finish_and_clear();
    Ok(summary)
}

/// Writes `example` unless the options leave it out, counting it in `summary`.
fn write_example<W: Write>(
    example: TrainingExample,
    options: &ExportOptions,
    line: &mut Vec<u8>,
    writer: &mut W,
    summary: &mut ExportSummary,
) -> Result<(), ExportError> {
    let accepted_only = options.accepted_only || options.format == ExportFormat::Chat;
    if options.split.is_some_and(|s| s != example.split) || (accepted_only && !example.accepted()) {
        return Ok(());
    }
    line.clear();
    example.write_json(options.format, line);
    line.push(b'\n');
    writer
        .write_all(line)
        .map_err(|source| ExportError::Write {
            path: PathBuf::from("output"),
            source,
        })?;
    summary.examples_written += 1;
    summary.bytes_written += line.len() as u64;
    if example.origin == Origin::Served {
        summary.served += 1;
    }
    match example.split {
        Split::Train => summary.train += 1,
        Split::Validation => summary.validation += 1,
        Split::Test => summary.test += 1,
    }
    if example.accepted() {
        summary.accepted += 1;
    } else {
        summary.rejected += 1;
    }
    Ok(())
}
