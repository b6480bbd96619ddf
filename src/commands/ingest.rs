//! `arc-rec ingest FILE`: load platform records from JSON lines.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use crate::ingest::{BadLinePolicy, FileSource, IngestError, IngestReport, ingest};
use crate::progress;
use crate::storage::Database;

/// Arguments of `arc-rec ingest`.
#[derive(Debug, Args)]
pub struct IngestArgs {
    /// JSON-lines file, one `{"kind", "org", "data"}` record per line; `-` reads stdin.
    pub file: PathBuf,
    /// Skip bad lines (and lines that depend on them) instead of rejecting the whole file.
    #[arg(long)]
    pub skip_bad_lines: bool,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Runs the command; an error exit means nothing was written.
pub async fn run(
    args: &IngestArgs,
    database: &Database,
    metrics: &telemetry::Metrics,
) -> anyhow::Result<()> {
    // Ingest reads its input twice; stdin is spooled to a temporary file first.
    let spooled;
    let path = if args.file.as_os_str() == "-" {
        let mut tmp =
            tempfile::NamedTempFile::new().context("cannot create a temporary file for stdin")?;
        std::io::copy(&mut std::io::stdin().lock(), &mut tmp).context("cannot read stdin")?;
        tmp.flush()?;
        spooled = tmp;
        spooled.path().to_path_buf()
    } else {
        args.file.clone()
    };
    let policy = if args.skip_bad_lines {
        BadLinePolicy::Skip
    } else {
        BadLinePolicy::RejectAll
    };
    let bar = progress::bar(0, "checking", true);
    let result = ingest(database.pool(), &FileSource(path), policy, &bar).await;
    bar.finish_and_clear();
    match result {
        Ok(report) => {
            for (kind, counts) in &report.stats.by_kind {
                metrics.record_ingested(kind.as_str(), counts.inserted + counts.updated);
            }
            print_report(&report, args.json)?;
            Ok(())
        }
        Err(IngestError::Rejected { lines, bad, errors }) => {
            if args.json {
                let body = serde_json::json!({"rejected": true, "lines": lines, "bad_lines": bad, "errors": errors});
                println!("{body}");
            } else {
                for error in &errors {
                    eprintln!("{error}");
                }
                if bad > errors.len() {
                    eprintln!("... and {} more bad lines", bad - errors.len());
                }
            }
            anyhow::bail!(
                "{bad} of {lines} lines in {} rejected; nothing was written (use --skip-bad-lines to load the rest)",
                args.file.display()
            )
        }
        Err(other) => Err(other).with_context(|| format!("cannot ingest {}", args.file.display())),
    }
}

fn print_report(report: &IngestReport, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(report)?);
        return Ok(());
    }
    for error in &report.skipped_lines {
        eprintln!("skipped {error}");
    }
    println!(
        "read {} lines: {} loaded, {} skipped",
        report.lines, report.loaded, report.skipped
    );
    super::print_write_stats(&report.stats);
    Ok(())
}
