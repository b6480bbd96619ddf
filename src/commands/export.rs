//! `arc-rec export --out FILE`: write Configuration→Outcome training examples as JSON lines, or
//! (`--format verl`) the RFT prompts they make as verl's dataset rows.

use std::path::PathBuf;

use anyhow::Context;
use chrono::{DateTime, NaiveDate, Utc};
use clap::Args;

use crate::export::{
    ExportFormat, ExportOptions, ExportSummary, Holdout, Split, export_to_file, export_to_writer,
};
use crate::progress;
use crate::rft::RftDataset;
use crate::rft::verl_rows::{self, WorldOrigin};
use crate::storage::Database;
use crate::storage::export_rows::ExportFilter;

/// Arguments of `arc-rec export`.
#[derive(Debug, Args)]
pub struct ExportArgs {
    /// Output file (written to a temporary file and renamed when complete); `-` for stdout.
    #[arg(long)]
    pub out: PathBuf,
    /// Line format.
    #[arg(long, value_enum, default_value_t = FormatArg::Arc)]
    pub format: FormatArg,
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
    /// Only this split (with --format verl: the prompts of this split, a prompt's split being
    /// that of its smallest example id, as `arc-rec train` reads it).
    #[arg(long, value_enum)]
    pub split: Option<Split>,
    /// Percentage of examples held out for validation (by a hash of the example id): what
    /// choices between checkpoints and settings look at.
    #[arg(long, default_value_t = Holdout::DEFAULT.validation_percent, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub validation_percent: u8,
    /// Percentage of examples held out for test (the next buckets of the same hash): what `eval`
    /// reports on, which nothing was chosen on.
    #[arg(long, default_value_t = Holdout::DEFAULT.test_percent, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub test_percent: u8,
    /// Only accepted recommendations (always so for --format chat).
    #[arg(long)]
    pub accepted_only: bool,
    /// With --format verl: the seed of the synthetic world the history was simulated from
    /// (`simulate --seed`), written into each row's `extra_info.world_seed`.
    #[arg(long, requires = "world_outcomes")]
    pub world_seed: Option<u64>,
    /// With --format verl: that world's `simulate --outcomes` (`extra_info.world_outcomes`).
    #[arg(long, requires = "world_seed")]
    pub world_outcomes: Option<usize>,
    /// Print the summary as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// `--format`: the library's line formats, and verl's rows of RFT prompts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FormatArg {
    /// arc-rec's full record: context, recommendation, outcome, reward breakdown, split, origin
    /// (`platform`: a decided config diff; `served`: an answer to a recommendation arc-rec
    /// served, with how it was served).
    Arc,
    /// `{"prompt", "completion", "label", "origin"}`: Hugging Face TRL's prompt-completion
    /// shape; `label` (accepted or not) makes it TRL's unpaired-preference format (KTO).
    PromptCompletion,
    /// `{"messages": [system, user, assistant], "origin"}` as TRL's conversational format and
    /// OpenAI fine-tuning accept; accepted recommendations only (supervised warm-up).
    Chat,
    /// verl's RL dataset rows (jsonl, which verl's RLHFDataset reads): one per RFT prompt
    /// (organization, configuration, user turn) as `arc-rec train` groups the examples, with
    /// `data_source`, `prompt` (system and user messages, rendered by the model's chat template
    /// as arc-rec's rollouts are), `ability`, `reward_model {style, ground_truth}` and
    /// `extra_info` (prompt id, organization, configuration id, split, cluster, current
    /// configuration, origin, world seed) that `arc-rec grade serve` checks. See docs/SCALE-OUT.md.
    Verl,
}

impl FormatArg {
    /// The library's line format; verl's rows are made from the `arc` lines.
    fn lines(self) -> ExportFormat {
        match self {
            FormatArg::Arc | FormatArg::Verl => ExportFormat::Arc,
            FormatArg::PromptCompletion => ExportFormat::PromptCompletion,
            FormatArg::Chat => ExportFormat::Chat,
        }
    }
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
            format: self.format.lines(),
            // verl's rows group every example of a context into one prompt first.
            split: self.split.filter(|_| self.format != FormatArg::Verl),
            holdout: Holdout {
                validation_percent: self.validation_percent,
                test_percent: self.test_percent,
            },
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
    anyhow::ensure!(
        u16::from(args.validation_percent) + u16::from(args.test_percent) <= 100,
        "--validation-percent ({}) and --test-percent ({}) hold out more than 100 percent together",
        args.validation_percent,
        args.test_percent
    );
    if args.format == FormatArg::Verl {
        return run_verl(args, database, metrics).await;
    }
    anyhow::ensure!(
        args.world_seed.is_none(),
        "--world-seed and --world-outcomes go with --format verl only"
    );
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

/// `--format verl`: the examples as `arc` lines in memory, read into prompts as `train` reads
/// its data file, written as verl rows.
async fn run_verl(
    args: &ExportArgs,
    database: &Database,
    metrics: &telemetry::Metrics,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        !args.accepted_only,
        "--accepted-only does not go with --format verl: RL prompts keep every logged decision (the logged grader needs the rejections)"
    );
    let bar = progress::counter("exporting");
    let mut lines = Vec::new();
    let summary = export_to_writer(database, &args.options(), &mut lines, &bar)
        .await
        .context("cannot read the examples")?;
    let source = if args.out.as_os_str() == "-" {
        std::path::Path::new("stdout")
    } else {
        args.out.as_path()
    };
    let dataset = RftDataset::read(lines.as_slice(), source)
        .with_context(|| format!("cannot export to {}", args.out.display()))?;
    drop(lines);
    let world = args
        .world_seed
        .zip(args.world_outcomes)
        .map(|(seed, outcomes)| WorldOrigin { seed, outcomes });
    let mut rows = Vec::new();
    let written = verl_rows::write_rows(&dataset, args.split, world, &mut rows)?;
    if args.out.as_os_str() == "-" {
        use std::io::Write as _;
        let mut stdout = std::io::stdout().lock();
        stdout.write_all(&rows)?;
        stdout.flush()?;
    } else {
        crate::atomic_file::write_atomically(&args.out, &rows)
            .with_context(|| format!("cannot export to {}", args.out.display()))?;
    }
    metrics.record_export_rows(written.rows);
    if args.json {
        eprintln!(
            "{}",
            serde_json::json!({
                "examples_read": summary.examples_written,
                "prompts_written": written.rows,
                "bytes_written": written.bytes,
            })
        );
    } else {
        eprintln!(
            "wrote {} verl rows (RFT prompts{}) from {} examples ({:.1} MB) to {}",
            written.rows,
            args.split
                .map(|s| format!(", {s:?} split").to_lowercase())
                .unwrap_or_default(),
            summary.examples_written,
            written.bytes as f64 / 1e6,
            args.out.display()
        );
    }
    Ok(())
}

fn print_summary(args: &ExportArgs, summary: &ExportSummary) -> anyhow::Result<()> {
    if args.json {
        eprintln!("{}", serde_json::to_string(summary)?);
    } else {
        eprintln!(
            "wrote {} examples ({} train, {} validation, {} test; {} accepted, {} rejected; {} of them answers to served recommendations; {:.1} MB) to {}",
            summary.examples_written,
            summary.train,
            summary.validation,
            summary.test,
            summary.accepted,
            summary.rejected,
            summary.served,
            summary.bytes_written as f64 / 1e6,
            args.out.display()
        );
    }
    Ok(())
}
