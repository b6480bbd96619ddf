//! `arc-rec round`: one learning round of an organization, on its own data only — export its
//! history with the answers to what was served → `train --grader learned` → the checkpoint
//! gate → `candidates` (the new version goes live under the exposure cap and the exploration
//! floor) — recorded in the `rounds` table, resumable, one at a time per organization.
//! `arc-rec round list` shows the rounds.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use chrono::Utc;
use clap::Subcommand;

use super::candidates::CandidatesArgs;
use super::train::TrainArgs;
use super::{DatabaseArgs, open_database, parse_org};
use crate::export::{ExportFormat, ExportOptions, Holdout, export_to_file};
use crate::storage::Database;
use crate::storage::export_rows::ExportFilter;
use crate::storage::rounds::{self, Round, RoundLock, RoundStatus};
use crate::training::run_dir::{LEARNED_GRADER_FILE, SUMMARY_FILE, read_run_id};
use crate::training::selection::read_choice;

/// `arc-rec round ...`.
#[derive(Debug, Subcommand)]
pub enum RoundCommand {
    /// Run the organization's next round (or finish its interrupted one).
    Run(RoundArgs),
    /// The rounds so far, newest first: window, new answers, verdict, version, figures.
    List {
        /// Only this organization's rounds.
        #[arg(long)]
        org: Option<String>,
        /// One JSON object per round instead of the table.
        #[arg(long)]
        json: bool,
    },
}

/// Arguments of `arc-rec round run`.
#[derive(Debug, clap::Args)]
pub struct RoundArgs {
    /// The organization whose round it is.
    #[arg(long)]
    pub org: String,
    /// Base checkpoint every round trains from (Hugging Face layout).
    #[arg(long)]
    pub model: PathBuf,
    /// Directory of the rounds; round N works in DIR/round-NNN (export, run directory).
    #[arg(long, default_value = "rounds")]
    pub dir: PathBuf,
    /// Candidates per context written for the new version (`candidates --k`).
    #[arg(long, default_value_t = 8)]
    pub candidates_k: usize,
    /// Write the new version's ideas even when RL did not beat its warm-up (`candidates
    /// --force`); without it such a round ends `refused` and the live versions stay as they are.
    #[arg(long)]
    pub force: bool,
    /// Further `arc-rec train` options after `--`, e.g. `-- --steps 100 --eval-every 25`
    /// (`--data`, `--model`, `--out` and `--grader` are the round's own; `--seed` defaults to
    /// the round's number).
    #[arg(last = true, value_name = "TRAIN_OPTION")]
    pub train_options: Vec<String>,
}

/// Runs the command.
pub async fn run(command: &RoundCommand, database_args: &DatabaseArgs) -> anyhow::Result<()> {
    match command {
        RoundCommand::Run(args) => run_round(args, database_args).await,
        RoundCommand::List { org, json } => {
            let org = org.as_deref().map(parse_org).transpose()?;
            let database = open_database(database_args).await?;
            let listed = rounds::list(database.pool(), org.as_ref().map(|o| o.as_str())).await;
            database.close().await?;
            print_rounds(&listed?, *json)
        }
    }
}

async fn run_round(args: &RoundArgs, database_args: &DatabaseArgs) -> anyhow::Result<()> {
    let org = parse_org(&args.org)?;
    check_options(args)?;
    let database = open_database(database_args).await?;
    let result = locked_round(args, database_args, &database, org.as_str()).await;
    database.close().await?;
    result
}

/// Everything that can be checked before a row or a directory exists.
pub(crate) fn check_options(args: &RoundArgs) -> anyhow::Result<()> {
    if !args.model.join("config.json").is_file() {
        bail!(
            "--model {}: no config.json (a Hugging Face checkpoint directory; `arc-rec model init` writes one)",
            args.model.display()
        );
    }
    for own in ["--data", "--model", "--out", "--grader", "--resume"] {
        if args
            .train_options
            .iter()
            .any(|o| o == own || o.starts_with(&format!("{own}=")))
        {
            bail!("train option {own} after `--` is the round's own; leave it out");
        }
    }
    // The options parse now, not after the export.
    train_args(
        &args.train_options,
        Path::new("x"),
        Path::new("x"),
        Path::new("x"),
        1,
    )?;
    Ok(())
}

async fn locked_round(
    args: &RoundArgs,
    database_args: &DatabaseArgs,
    database: &Database,
    org: &str,
) -> anyhow::Result<()> {
    let pool = database.pool();
    if !rounds::organization_exists(pool, org).await? {
        bail!("--org {org}: no such organization in the database (ingest its history first)");
    }
    let Some(lock) = RoundLock::try_take(pool, org).await? else {
        bail!(
            "a round of organization {org} is running in another process; wait for it to finish (`arc-rec round list --org {org}` shows it)"
        );
    };
    let result = async {
        let round = match rounds::open_round(pool, org).await? {
            Some(round) => {
                println!(
                    "round {} of {org}: resuming (started {})",
                    round.round_no, round.started_at
                );
                round
            }
            None => match start_round(args, database, org).await? {
                Some(round) => round,
                None => return Ok(()),
            },
        };
        finish_round(args, database_args, database, &round).await
    }
    .await;
    lock.release().await?;
    result
}

/// Opens the next round, or says why there is nothing to do (no new answers since the last).
async fn start_round(
    args: &RoundArgs,
    database: &Database,
    org: &str,
) -> anyhow::Result<Option<Round>> {
    let pool = database.pool();
    let last = rounds::last_finished(pool, org).await?;
    let since = last.as_ref().map(|r| r.window_until);
    let until = Utc::now();
    let new_answers = rounds::answers_between(pool, org, since, until).await?;
    if let Some(last) = &last
        && new_answers == 0
    {
        println!(
            "no answers to served recommendations since round {} of {org} ({}): nothing new to learn, no round started",
            last.round_no, last.window_until
        );
        return Ok(None);
    }
    let dir = args.dir.clone();
    let round = rounds::start(pool, org, (since, until), new_answers, |n| {
        dir.join(format!("round-{n:03}")).display().to_string()
    })
    .await?;
    println!(
        "round {} of {org}: {new_answers} new answers to served recommendations since {}; working in {}",
        round.round_no,
        since.map_or("the beginning".to_owned(), |t| t.to_string()),
        round.dir
    );
    Ok(Some(round))
}

/// Export → train → gate → candidates, each skipped when a previous try of this round finished
/// it; then the round's row is closed with its figures.
async fn finish_round(
    args: &RoundArgs,
    database_args: &DatabaseArgs,
    database: &Database,
    round: &Round,
) -> anyhow::Result<()> {
    let dir = PathBuf::from(&round.dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let stopped = |step: &str| {
        format!(
            "round {} of {} stopped at its {step}; `arc-rec round run --org {}` resumes it",
            round.round_no, round.org_id, round.org_id
        )
    };
    let export = export_round(database, round, &dir)
        .await
        .with_context(|| stopped("export"))?;
    let run = dir.join("run");
    if !run.join(SUMMARY_FILE).is_file() {
        let data = dir.join("examples.jsonl");
        let train = if run.join("config.json").is_file() {
            resume_args(&run)?
        } else {
            let seed = u64::try_from(round.round_no).unwrap_or(1);
            train_args(&args.train_options, &data, &args.model, &run, seed)?
        };
        super::train::run(&train, database_args)
            .await
            .with_context(|| stopped("training"))?;
    }
    let choice = read_choice(&run)?;
    let mut figures = serde_json::json!({
        "export": export,
        "grader_held_out": read_grader_held_out(&run),
        "selection": choice,
    });
    if choice.as_ref().is_some_and(|c| !c.beats_warmup) && !args.force {
        println!(
            "round {}: RL did not beat its warm-up on the held-out criterion; no version written, the live versions stay (--force writes it anyway)",
            round.round_no
        );
        return close(database, round, RoundStatus::Refused, None, &figures).await;
    }
    let candidates = candidates_args(&run, args)?;
    super::candidates::run(&candidates, database_args)
        .await
        .with_context(|| stopped("candidates"))?;
    let version = read_run_id(&run, "round")?;
    figures["candidates_k"] = args.candidates_k.into();
    close(
        database,
        round,
        RoundStatus::Served,
        Some(&version),
        &figures,
    )
    .await
}

async fn close(
    database: &Database,
    round: &Round,
    status: RoundStatus,
    version: Option<&str>,
    figures: &serde_json::Value,
) -> anyhow::Result<()> {
    rounds::finish(
        database.pool(),
        &round.org_id,
        round.round_no,
        status,
        version,
        figures,
    )
    .await?;
    println!(
        "round {} of {}: {}{}",
        round.round_no,
        round.org_id,
        status.as_str(),
        version
            .map(|v| format!(", model version {v} live"))
            .unwrap_or_default()
    );
    Ok(())
}

/// The organization's examples before the window's end, once per round (kept with their
/// summary in the round's directory).
async fn export_round(
    database: &Database,
    round: &Round,
    dir: &Path,
) -> anyhow::Result<serde_json::Value> {
    let summary_path = dir.join("export.json");
    if let Ok(text) = std::fs::read(&summary_path) {
        return serde_json::from_slice(&text).context("export.json is not JSON");
    }
    let options = ExportOptions {
        filter: ExportFilter {
            since: None,
            until: Some(round.window_until),
            org: Some(round.org_id.clone()),
            cluster: None,
        },
        format: ExportFormat::Arc,
        split: None,
        // `export`'s defaults: the splits train, selection and the reports use.
        holdout: Holdout::DEFAULT,
        accepted_only: false,
    };
    let bar = crate::progress::counter("exporting");
    let summary = export_to_file(database, &options, &dir.join("examples.jsonl"), &bar).await?;
    println!(
        "exported {} examples ({} answers to served recommendations)",
        summary.examples_written, summary.served
    );
    let value = serde_json::to_value(&summary)?;
    crate::atomic_file::write_atomically(&summary_path, value.to_string().as_bytes())?;
    Ok(value)
}

/// `train` as the round runs it: the user's options and the round's own.
fn train_args(
    options: &[String],
    data: &Path,
    model: &Path,
    out: &Path,
    seed: u64,
) -> anyhow::Result<TrainArgs> {
    let mut argv: Vec<String> = Vec::new();
    // The round's number seeds its run unless the options name a seed.
    if !options
        .iter()
        .any(|o| o == "--seed" || o.starts_with("--seed="))
    {
        argv.extend(["--seed".into(), seed.to_string()]);
    }
    for (flag, path) in [("--data", data), ("--model", model), ("--out", out)] {
        argv.extend([flag.to_owned(), path.display().to_string()]);
    }
    argv.extend(["--grader".into(), "learned".into()]);
    argv.extend(options.iter().cloned());
    parse_as("train", argv).map_err(|e| anyhow::anyhow!("train options after `--`: {e}"))
}

fn resume_args(run: &Path) -> anyhow::Result<TrainArgs> {
    parse_as("train", vec!["--resume".into(), run.display().to_string()])
        .context("resume the round's training run")
}

/// `args` parsed as command `name`'s arguments, exactly as on the command line: the round runs
/// `train` and `candidates` with their own defaults and checks.
fn parse_as<T: clap::Args + clap::FromArgMatches>(
    name: &'static str,
    args: Vec<String>,
) -> Result<T, clap::Error> {
    let argv = std::iter::once(name.to_owned()).chain(args);
    let matches = T::augment_args(clap::Command::new(name)).try_get_matches_from(argv)?;
    T::from_arg_matches(&matches)
}

fn candidates_args(run: &Path, args: &RoundArgs) -> anyhow::Result<CandidatesArgs> {
    let mut argv = vec![
        "--run".to_owned(),
        run.display().to_string(),
        "--k".into(),
        args.candidates_k.to_string(),
    ];
    if args.force {
        argv.push("--force".into());
    }
    parse_as("candidates", argv).map_err(|e| anyhow::anyhow!("--candidates-k: {e}"))
}

/// The learned grader's held-out calibration as the run wrote it (`null` when absent).
fn read_grader_held_out(run: &Path) -> serde_json::Value {
    std::fs::read(run.join(LEARNED_GRADER_FILE))
        .ok()
        .and_then(|text| serde_json::from_slice::<serde_json::Value>(&text).ok())
        .and_then(|grader| grader.get("held_out").cloned())
        .unwrap_or(serde_json::Value::Null)
}

fn print_rounds(listed: &[Round], json: bool) -> anyhow::Result<()> {
    if json {
        for round in listed {
            println!("{}", serde_json::to_string(round)?);
        }
        return Ok(());
    }
    if listed.is_empty() {
        println!("no rounds (`arc-rec round run --org ORG --model DIR` runs one)");
        return Ok(());
    }
    println!(
        "{:<12} {:>5} {:<8} {:>11} {:<42} {:>9} {:>9}  window until",
        "org", "round", "status", "new answers", "model version", "examples", "served"
    );
    for r in listed {
        let count = |key: &str| {
            r.figures["export"][key]
                .as_u64()
                .map_or("–".to_owned(), |n| n.to_string())
        };
        println!(
            "{:<12} {:>5} {:<8} {:>11} {:<42} {:>9} {:>9}  {}",
            r.org_id,
            r.round_no,
            r.status.as_str(),
            r.new_answers,
            r.model_version_id.as_deref().unwrap_or("–"),
            count("examples_written"),
            count("served"),
            r.window_until.format("%Y-%m-%d %H:%M:%S")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn train(options: &[&str], round_seed: u64) -> anyhow::Result<TrainArgs> {
        let options: Vec<String> = options.iter().map(|o| (*o).to_owned()).collect();
        let path = Path::new("x");
        train_args(&options, path, path, path, round_seed)
    }

    #[test]
    fn a_round_trains_with_the_learned_grader_seeded_by_its_number_unless_told() {
        let args = train(&["--steps", "50"], 3).unwrap();
        assert_eq!((args.seed, args.steps), (3, 50));
        assert_eq!(args.grader, Some(crate::rft::grader::GraderKind::Learned));
        assert_eq!(train(&["--seed=9"], 3).unwrap().seed, 9);
        let error = train(&["--stepz", "1"], 1).unwrap_err().to_string();
        assert!(error.contains("train options after `--`"), "{error}");
    }

    #[test]
    fn the_round_s_own_train_options_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), "{}").unwrap();
        let args = |options: &[&str]| RoundArgs {
            org: "acme".into(),
            model: dir.path().to_path_buf(),
            dir: dir.path().join("rounds"),
            candidates_k: 8,
            force: false,
            train_options: options.iter().map(|o| (*o).to_owned()).collect(),
        };
        assert!(check_options(&args(&["--steps", "5"])).is_ok());
        for own in ["--grader", "--data=x", "--out"] {
            let error = check_options(&args(&[own, "y"])).unwrap_err().to_string();
            assert!(error.contains("is the round's own"), "{own}: {error}");
        }
        let missing = RoundArgs {
            model: dir.path().join("nothing"),
            ..args(&[])
        };
        assert!(
            check_options(&missing)
                .unwrap_err()
                .to_string()
                .contains("config.json")
        );
    }
}
