//! `arc-rec export --out FILE`: write Configuration→Outcome training examples as JSON lines.

use std::path::PathBuf;

use anyhow::Context;
use chrono::{DateTime, NaiveDate, Utc};
use clap::Args;

use crate::export::{
    ExportFormat, ExportOptions, ExportSummary, Split, export_to_file, export_to_writer,
};
use crate::progress;
use crate::storage::Database;
use crate::storage::export_rows::ExportFilter;

/// Arguments of `arc-rec export`.
#[derive(Debug, Args)]
pub struct ExportArgs {
    /// Output file (written to a temporary file and renamed when complete); `-` for stdout.
    #[arg(long)]
    pub out: PathBuf,
    /// Line format.
    #[arg(long, value_enum, default_value_t = ExportFormat::Arc)]
    pub format: ExportFormat,
    /// Only recommendations made at or after this time (RFC 3339 or YYYY-MM-DD).
    #[arg(long, value_parser = parse_time)]
    pub since: Option<DateTime<Utc>>,
    /// Only recommendations made before this time (RFC 3339 or YYYY-MM-DD).
    #[arg(long, value_parser = parse_time)]
    pub until: Option<DateTime<Utc>>,
    /// Only this organization.
    #[arg(long)]
    pub org: Option<String>,
    /// Only examples whose dominant failure cluster is this (pattern_cluster_id or failure category).
    #[arg(long)]
    pub cluster: Option<String>,
    /// Only this split.
    #[arg(long, value_enum)]
    pub split: Option<Split>,
    /// Percentage of examples held out for validation (by a hash of the example id).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub validation_percent: u8,
    /// Only accepted recommendations (always so for --format chat).
    #[arg(long)]
    pub accepted_only: bool,
    /// Print the summary as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Parses `2026-11-01` (midnight UTC) or a full RFC 3339 timestamp.
pub fn parse_time(raw: &str) -> Result<DateTime<Utc>, String> {
    if let Ok(t) = DateTime::parse_from_rfc3339(raw) {
        return Ok(t.with_timezone(&Utc));
    }
    NaiveDate::parse_from_str(raw, "%Y-%m-%d")
        .ok()
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map(|t| t.and_utc())
        .ok_or_else(|| format!("expected YYYY-MM-DD or an RFC 3339 timestamp, got {raw:?}"))
}

impl ExportArgs {
    /// The library options these arguments describe.
    pub fn options(&self) -> ExportOptions {
        ExportOptions {
            filter: ExportFilter {
                since: self.since,
                until: self.until,
                org: self.org.clone(),
                cluster: self.cluster.clone(),
            },
            format: self.format,
            split: self.split,
            validation_percent: self.validation_percent,
            accepted_only: self.accepted_only,
        }
    }
}

/// Runs the command.
pub async fn run(
    args: &ExportArgs,
    database: &Database,
    metrics: &telemetry::Metrics,
) -> anyhow::Result<()> {
    if let (Some(since), Some(until)) = (args.since, args.until) {
        anyhow::ensure!(
            since < until,
            "--since ({since}) must be before --until ({until})"
        );
    }
    let options = args.options();
    let bar = progress::counter("exporting");
    let summary = if args.out.as_os_str() == "-" {
        let stdout = std::io::stdout();
        let mut lock = std::io::BufWriter::new(stdout.lock());
        export_to_writer(database, &options, &mut lock, &bar).await
    } else {
        export_to_file(database, &options, &args.out, &bar).await
    }
    .with_context(|| format!("cannot export to {}", args.out.display()))?;
    metrics.record_export_rows(summary.examples_written);
    print_summary(args, &summary)
}

fn print_summary(args: &ExportArgs, summary: &ExportSummary) -> anyhow::Result<()> {
    if args.json {
        eprintln!("{}", serde_json::to_string(summary)?);
    } else {
        eprintln!(
            "wrote {} examples ({} train, {} validation; {} accepted, {} rejected; {:.1} MB) to {}",
            summary.examples_written,
            summary.train,
            summary.validation,
            summary.accepted,
            summary.rejected,
            summary.bytes_written as f64 / 1e6,
            args.out.display()
        );
    }
    Ok(())
}
