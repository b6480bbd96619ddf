//! `arc-rec bench ...`: performance measurements anyone can rerun. Every bench prints a human
//! table, or one JSON object with `--json`.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::Context;
use clap::{Args, Subcommand};
use serde::Serialize;

use super::peak_memory::peak_rss_mb_of;
use crate::export::{ExportFormat, ExportOptions, export_to_file};
use crate::storage::Database;
use crate::storage::export_rows::{ExportFilter, export_sql};

/// The benchmarks.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Export throughput against `psql \copy` of the same rows from the same database.
    Export(BenchExportArgs),
    /// Thompson sampling against random, heuristic order and the oracle in the synthetic world.
    Bandit(BenchBanditArgs),
    /// The paper's bandit (Tang et al. 2025, Fig. 1): exact mean reward, pass@k and KL of mean,
    /// pass@k and biased pass@k policy gradients over seeds, as tables and a PNG (no database).
    PaperBandit(crate::commands::bench_paper_bandit::BenchPaperBanditArgs),
    /// p50/p99 latency of POST /v1/recommendations at fixed request rates (server and load in
    /// separate processes), the highest sustained rate and the server's peak memory.
    Serve(crate::commands::bench_serve::BenchServeArgs),
    /// The platform plan's headline on the synthetic world: served top-1 true acceptance with
    /// heuristic candidates alone and with each model's candidates beside them (`--arm
    /// NAME=FILE` from `arc-rec candidates --out`), against random order of the heuristic
    /// candidates and the menu oracles; the first rounds (cold start) and the last quarter.
    Pipeline(crate::commands::bench_pipeline::BenchPipelineArgs),
    /// Open-loop HTTP load at a fixed rate against a running server (one JSON line of results).
    Load(crate::commands::load::LoadArgs),
    /// Generation (batch 1, k samples), LoRA training-step and RL-step (generate k + one
    /// policy-gradient step) tokens/s of the tch model, as ratios to PyTorch + transformers +
    /// peft doing the same work on the same device.
    #[cfg(feature = "rft")]
    Model(crate::commands::bench_model::BenchModelArgs),
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

/// Arguments of `arc-rec bench bandit`.
#[derive(Debug, Args)]
pub struct BenchBanditArgs {
    /// Decision rounds (one failure context, one shown recommendation, one answer each).
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub rounds: u64,
    /// Seed of the world (its history and its contexts) and, without --policy-seed, of the
    /// policies.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Seed of the policies' own draws and of their people's answers (default: --seed): runs
    /// that differ only here rank the same contexts and lists, so their spread is the
    /// policies' own (intervals over policy seeds).
    #[arg(long)]
    pub policy_seed: Option<u64>,
    /// The world's organizations, comma-separated (a world of another shape: more
    /// organizations, each with its own users, scenarios and history).
    #[arg(long, value_delimiter = ',', default_value = "acme,globex,initech")]
    pub orgs: Vec<String>,
    /// Outcomes in the world's history (the log the candidates' statistics and the warm start
    /// come from).
    #[arg(long, default_value_t = BANDIT_WORLD_OUTCOMES, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub outcomes: u64,
    /// Warm start: every learner (arc-rec's policies and the peers) first learns the world's
    /// logged approvals and rejections of past diffs that arc-rec's generator proposes again in
    /// the same context (or another amount of the same change), each counted as this fraction
    /// of one answer of its own; 0 starts every learner from nothing. The log's own recommender
    /// recorded no propensities, so none are used.
    #[arg(long, default_value_t = 1.0)]
    pub warm_start_weight: f64,
    /// Also weigh each logged decision by its age: its time before the log's newest, under the
    /// policy's half-life (an ablation; serving, like the default, counts the log alike).
    #[arg(long)]
    pub warm_start_by_age: bool,
    /// Also run "full information (linear)", a diagnostic no policy can be: arc-rec's linear
    /// model learning every round the true acceptance probability of every candidate, showing
    /// the best by its mean; its distance to the oracle is what arc-rec's features cannot tell
    /// apart.
    #[arg(long)]
    pub full_information: bool,
    /// Rounds reported (the last ones).
    #[arg(long, default_value_t = 5_000)]
    pub last: u64,
    /// Posterior scale v of the Thompson draws (smaller explores less).
    #[arg(long, default_value_t = crate::recommend::features::NOISE_SCALE)]
    pub noise_scale: f64,
    /// Share of requests ranked uniformly at random (the propensity floor).
    #[arg(long, default_value_t = bandit::PolicyConfig::default().epsilon)]
    pub epsilon: f64,
    /// Feedback is applied in batches of this many rounds.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub feedback_batch: u64,
    /// Rounds reported as the cold start (the first ones), by true acceptance.
    #[arg(long, default_value_t = 500)]
    pub cold_start: u64,
    /// Other engines on the same rounds, candidate lists and information, comma-separated: `vw`
    /// (Vowpal Wabbit's `--cb_explore_adf` with quadratic context × action features: SquareCB,
    /// epsilon-greedy 0.05 and RegCB-opt; or one of vw-squarecb, vw-epsilon, vw-regcb, vw-bag)
    /// and `mabwiser` (MABWiser's LinTS, one arm per distinct candidate). They run in a Python
    /// process (`--python`; scripts/setup.sh installs vowpalwabbit and mabwiser into .venv).
    #[arg(long, value_delimiter = ',')]
    pub peers: Vec<String>,
    /// The Python interpreter of the peers (default: .venv/bin/python when it exists, else
    /// python3).
    #[arg(long)]
    pub python: Option<std::path::PathBuf>,
    /// Also draw each policy's cumulative regret against the oracle (true acceptance) over the
    /// rounds to this PNG.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<std::path::PathBuf>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Runs a benchmark.
pub async fn run(command: &BenchCommand, database: &Database) -> anyhow::Result<()> {
    match command {
        BenchCommand::Export(args) => bench_export(args, database).await,
        BenchCommand::Bandit(args) => bench_bandit(args, database).await,
        BenchCommand::Serve(args) => crate::commands::bench_serve::run(args, database).await,
        BenchCommand::Pipeline(args) => crate::commands::bench_pipeline::run(args, database).await,
        // A pure client; `main` runs it without opening a database.
        BenchCommand::Load(_) => anyhow::bail!("`bench load` needs no database"),
        BenchCommand::PaperBandit(_) => anyhow::bail!("`bench paper-bandit` needs no database"),
        #[cfg(feature = "rft")]
        BenchCommand::Model(_) => anyhow::bail!("`bench model` needs no database"),
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
        peak_rss_mb: peak_rss_mb_of("self"),
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

/// Outcomes in the benchmark world's history (what the candidate statistics are computed from).
const BANDIT_WORLD_OUTCOMES: u64 = 20_000;

/// Every decided diff of the world's log, as the warm start reads it: the export's view (the
/// before-version's failure groups, its configuration, the owner's segment), never the world's
/// truth.
async fn logged_decisions(
    database: &Database,
) -> anyhow::Result<Vec<crate::recommend::warm_start::LoggedDecision>> {
    use crate::recommend::warm_start::LoggedDecision;

    let mut logged = Vec::new();
    crate::storage::export_rows::for_each_row(
        database,
        &crate::storage::export_rows::ExportFilter::default(),
        |row| -> anyhow::Result<()> {
            logged.push(LoggedDecision::of_export_row(row));
            Ok(())
        },
    )
    .await?;
    Ok(logged)
}

async fn bench_bandit(args: &BenchBanditArgs, database: &Database) -> anyhow::Result<()> {
    use std::collections::HashMap;

    use crate::candidates::CandidateIndex;
    use crate::recommend::benchmark::{BanditBenchConfig, run};
    use crate::world::{Environment, World, WorldParams};

    if !(0.0..=1.0).contains(&args.warm_start_weight) {
        anyhow::bail!(
            "--warm-start-weight: must be in [0, 1], got {}",
            args.warm_start_weight
        );
    }
    let params = WorldParams {
        seed: args.seed,
        outcomes: usize::try_from(args.outcomes)?,
        orgs: args.orgs.clone(),
        ..WorldParams::default()
    };
    let default_shape =
        params.orgs == WorldParams::default().orgs && args.outcomes == BANDIT_WORLD_OUTCOMES;
    let world = World::new(params)?;
    // The world's history lives in a database of its own on the same server, made once per
    // world (seed and shape).
    let name = if default_shape {
        format!("arc_rec_bench_world_{}", args.seed)
    } else {
        let shape = format!("{}|{}", args.orgs.join(","), args.outcomes);
        let digest = <sha2::Sha256 as sha2::Digest>::digest(shape.as_bytes());
        format!(
            "arc_rec_bench_world_{}_{}",
            args.seed,
            hex::encode(&digest[..4])
        )
    };
    let admin = database.connect_options().clone().database("postgres");
    crate::storage::create_database_if_missing(&admin, &name).await?;
    let bench_db = Database::open_with(
        database.connect_options().clone().database(&name),
        String::new(),
        database.psql().to_path_buf(),
    )
    .await?;
    bench_db.migrate().await?;
    let outcomes: i64 = crate::storage::record_writer::table_counts(bench_db.pool())
        .await?
        .get(&crate::domain::RecordKind::Outcome)
        .copied()
        .unwrap_or(0);
    if outcomes == 0 {
        eprintln!(
            "loading the world's history (seed {}) into database {name}...",
            args.seed
        );
        let mut writer =
            crate::storage::record_writer::RecordWriter::begin(bench_db.pool()).await?;
        for record in world.history() {
            writer.push(&record).await?;
        }
        writer.commit().await?;
    }
    let mut indexes = HashMap::new();
    for org in &world.params().orgs {
        indexes.insert(
            org.clone(),
            CandidateIndex::load(bench_db.pool(), org).await?,
        );
    }
    let warm_start = if args.warm_start_weight > 0.0 {
        let logged = logged_decisions(&bench_db).await?;
        let warm = crate::recommend::benchmark::warm_start(
            &indexes,
            &logged,
            args.warm_start_weight,
            args.warm_start_by_age,
        );
        eprintln!(
            "warm start: {} of {} logged decisions matched to a generated candidate ({:.1} %; {} of them pulling the same lever by another amount), each weighted {}{}",
            warm.counts.matched,
            warm.counts.logged,
            100.0 * warm.counts.matched as f64 / warm.counts.logged.max(1) as f64,
            warm.counts.lever_matched,
            args.warm_start_weight,
            if args.warm_start_by_age {
                " and by its age"
            } else {
                ""
            }
        );
        Some(warm)
    } else {
        None
    };
    bench_db.close().await?;

    let thompson = |model| bandit::PolicyConfig {
        model,
        noise_scale: args.noise_scale,
        epsilon: args.epsilon,
        ..crate::recommend::features::policy_config()
    };
    let config = BanditBenchConfig {
        rounds: usize::try_from(args.rounds)?,
        seed: args.seed,
        policy_seed: args.policy_seed.unwrap_or(args.seed),
        report_last: usize::try_from(args.last)?,
        feedback_batch: usize::try_from(args.feedback_batch)?,
        thompson: vec![
            (
                "thompson (linear)".to_owned(),
                thompson(bandit::ModelKind::Linear),
            ),
            (
                "thompson (logistic)".to_owned(),
                thompson(bandit::ModelKind::Logistic),
            ),
        ],
        cold_start: usize::try_from(args.cold_start)?,
        full_information: args.full_information,
        warm_start,
    };
    let peer_policies = crate::commands::bench_peers::expand_peers(&args.peers)?;
    let python = args
        .python
        .clone()
        .unwrap_or_else(crate::commands::bench_peers::default_python);
    let seed = args.policy_seed.unwrap_or(args.seed);
    let environment = Environment::new(&world);
    let started = Instant::now();
    let report = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        let mut peers = if peer_policies.is_empty() {
            None
        } else {
            Some(crate::commands::bench_peers::PythonPeers::start(
                &python,
                peer_policies,
                seed,
            )?)
        };
        let peers = peers
            .as_mut()
            .map(|p| p as &mut dyn crate::recommend::benchmark::PeerPolicies);
        Ok(run(&environment, &indexes, &config, peers)?)
    })
    .await??;
    if let Some(path) = &args.plot {
        crate::plot::write_png(path, &[regret_panel(&report)], 1)?;
    }
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    println!(
        "{} rounds, seed {} (policies {}), {:.1} candidates per context; last {} rounds ({:.0} s)",
        report.rounds,
        report.seed,
        report.policy_seed,
        report.mean_candidates,
        report.reported_rounds,
        started.elapsed().as_secs_f64()
    );
    let baseline = |name: &str| {
        report
            .policies
            .iter()
            .find(|p| p.policy == name)
            .map_or(f64::NAN, |p| p.acceptance_rate)
    };
    let (random, oracle) = (baseline("uniform random"), baseline("oracle"));
    println!(
        "{:<26} {:>11} {:>12} {:>10} {:>10} {:>14}",
        "policy", "acceptance", "reliability", "x random", "x oracle", "acceptance(all)"
    );
    for p in &report.policies {
        println!(
            "{:<26} {:>11.3} {:>12.4} {:>10.2} {:>10.2} {:>14.3}",
            p.policy,
            p.acceptance_rate,
            p.reliability_gain,
            p.acceptance_rate / random,
            p.acceptance_rate / oracle,
            p.acceptance_rate_all
        );
    }
    println!("goal: thompson >= 2x random and >= 0.85x oracle");
    println!(
        "bandit alone: {:.0} decisions/s (rank of ~{:.0} candidates)",
        report.thompson_decisions_per_s, report.mean_candidates
    );
    println!("\ntrue acceptance of what each showed (the world's probability, no draw noise):");
    println!(
        "{:<26} {:>12} {:>14} {:>10} {:>13}",
        "policy",
        format!("first {}", report.cold_start_rounds),
        format!("last {}", report.last_quarter_rounds),
        "x oracle",
        "decisions/s"
    );
    for p in &report.policies {
        println!(
            "{:<26} {:>12.3} {:>14.3} {:>10.3} {:>13}",
            p.policy,
            p.cold_start_true_acceptance,
            p.last_quarter_true_acceptance,
            p.last_quarter_oracle_ratio,
            p.decisions_per_s
                .map_or_else(|| "-".to_owned(), |d| format!("{d:.0}"))
        );
    }
    if !args.peers.is_empty() {
        println!(
            "peers saw arc-rec's candidate lists: {} (rounds with a different list: {})",
            if report.peer_list_mismatches == 0 {
                "every round"
            } else {
                "NOT every round"
            },
            report.peer_list_mismatches
        );
    }
    if let Some(path) = &args.plot {
        println!("regret curves in {}", path.display());
    }
    Ok(())
}

/// Each policy's cumulative regret against the oracle over the rounds.
fn regret_panel(report: &crate::recommend::benchmark::BanditBenchReport) -> crate::plot::Panel {
    crate::plot::Panel {
        title: format!(
            "bench bandit, seed {}: cumulative regret vs the oracle (true acceptance)",
            report.seed
        ),
        x_label: "round".to_owned(),
        y_label: "regret".to_owned(),
        series: report
            .policies
            .iter()
            .filter(|p| p.policy != "oracle")
            .map(|p| crate::plot::Series {
                name: p.policy.clone(),
                points: p
                    .regret_curve
                    .iter()
                    .map(|&(round, regret)| (round as f64, regret))
                    .collect(),
            })
            .collect(),
    }
}
