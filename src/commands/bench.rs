//! `arc-rec bench ...`: performance measurements anyone can rerun. Every bench prints a human
//! table, or one JSON object with `--json`.

use std::collections::HashMap;
use std::time::Instant;

use clap::{Args, Subcommand};
use serde::Serialize;

use super::bench_peers;
use super::peak_memory::peak_rss_mb_of;
use crate::candidates::CandidateIndex;
use crate::export::bench::ExportBench;
use crate::recommend::bench_data::{self, BANDIT_WORLD_OUTCOMES};
use crate::recommend::benchmark::{BanditBenchConfig, BanditBenchReport, PeerPolicies, WarmStart};
use crate::storage::Database;
use crate::world::{Environment, World, WorldParams};

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
    /// The loop through the front door: the synthetic world plays one organization's users
    /// against a real `arc-rec serve` over HTTP; phase 0 is heuristics alone, and before each
    /// later phase `arc-rec round` runs (never given the world). Per phase: served top-1 true
    /// acceptance with its interval and its gain over phase 0 on the same contexts, the model's
    /// share of first items, model against heuristic picks, the exploration floor's cost and
    /// the learned grader's priors against the truth.
    #[cfg(feature = "rft")]
    Loop(crate::commands::bench_loop::BenchLoopArgs),
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
        #[cfg(feature = "rft")]
        BenchCommand::Loop(args) => crate::commands::bench_loop::run(args, database).await,
    }
}

/// What `bench export --json` prints: the measurement and this process's peak memory.
#[derive(Debug, Serialize)]
struct ExportReport {
    #[serde(flatten)]
    figures: ExportBench,
    peak_rss_mb: f64,
}

async fn bench_export(args: &BenchExportArgs, database: &Database) -> anyhow::Result<()> {
    let figures = crate::export::bench::measure(database, args.repeat).await?;
    let report = ExportReport {
        figures,
        peak_rss_mb: peak_rss_mb_of("self"),
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_export(&report);
    }
    Ok(())
}

fn print_export(report: &ExportReport) {
    let figures = &report.figures;
    println!(
        "export of {} rows (median of {} runs)",
        figures.rows, figures.repeat
    );
    println!(
        "{:<14} {:>10} {:>12} {:>10} {:>12}",
        "", "seconds", "rows/s", "MB/s", "bytes"
    );
    println!(
        "{:<14} {:>10.3} {:>12.0} {:>10.1} {:>12}",
        "arc-rec",
        figures.arc_rec_seconds,
        figures.arc_rec_rows_per_s,
        figures.arc_rec_mb_per_s,
        figures.arc_rec_bytes
    );
    println!(
        "{:<14} {:>10.3} {:>12.0} {:>10.1} {:>12}",
        "psql \\copy",
        figures.psql_copy_seconds,
        figures.psql_copy_rows_per_s,
        figures.psql_copy_bytes as f64 / 1e6 / figures.psql_copy_seconds,
        figures.psql_copy_bytes
    );
    println!(
        "time ratio arc-rec / psql \\copy: {:.2} (goal <= 1.5)",
        figures.time_ratio
    );
    println!("peak RSS of this process: {:.1} MB", report.peak_rss_mb);
}

async fn bench_bandit(args: &BenchBanditArgs, database: &Database) -> anyhow::Result<()> {
    if !(0.0..=1.0).contains(&args.warm_start_weight) {
        anyhow::bail!(
            "--warm-start-weight: must be in [0, 1], got {}",
            args.warm_start_weight
        );
    }
    let world = World::new(WorldParams {
        seed: args.seed,
        outcomes: usize::try_from(args.outcomes)?,
        orgs: args.orgs.clone(),
        ..WorldParams::default()
    })?;
    let (indexes, warm_start) = bandit_world(args, &world, database).await?;
    let config = bandit_config(args, warm_start)?;
    let started = Instant::now();
    let report = run_bandit(args, &world, indexes, config).await?;
    if let Some(path) = &args.plot {
        crate::plot::write_png(path, &[regret_panel(&report)], 1)?;
    }
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    print_bandit(&report, started.elapsed().as_secs_f64());
    print_true_acceptance(&report);
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

/// The world's history in a database of its own on the same server (loaded on first use), each
/// organization's candidate index from it and, unless its weight is 0, the warm start.
async fn bandit_world(
    args: &BenchBanditArgs,
    world: &World,
    database: &Database,
) -> anyhow::Result<(HashMap<String, CandidateIndex>, Option<WarmStart>)> {
    let name = bench_data::world_database_name(args.seed, &args.orgs, args.outcomes);
    let world_db = bench_data::open_world_database(database, &name).await?;
    if !bench_data::holds_history(&world_db).await? {
        eprintln!(
            "loading the world's history (seed {}) into database {name}...",
            args.seed
        );
        bench_data::load_history(&world_db, world).await?;
    }
    let indexes = bench_data::candidate_indexes(world_db.pool(), &world.params().orgs).await?;
    let warm_start = if args.warm_start_weight > 0.0 {
        let logged = bench_data::logged_decisions(&world_db).await?;
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
    world_db.close().await?;
    Ok((indexes, warm_start))
}

/// The run the arguments ask for: two Thompson variants (linear and logistic) with the given
/// exploration.
fn bandit_config(
    args: &BenchBanditArgs,
    warm_start: Option<WarmStart>,
) -> anyhow::Result<BanditBenchConfig> {
    let thompson = |model| bandit::PolicyConfig {
        model,
        noise_scale: args.noise_scale,
        epsilon: args.epsilon,
        ..crate::recommend::features::policy_config()
    };
    Ok(BanditBenchConfig {
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
    })
}

/// Runs the rounds on a blocking thread, with the `--peers` in their Python process.
async fn run_bandit(
    args: &BenchBanditArgs,
    world: &World,
    indexes: HashMap<String, CandidateIndex>,
    config: BanditBenchConfig,
) -> anyhow::Result<BanditBenchReport> {
    let peer_policies = bench_peers::expand_peers(&args.peers)?;
    let python = args
        .python
        .clone()
        .unwrap_or_else(bench_peers::default_python);
    let seed = args.policy_seed.unwrap_or(args.seed);
    let environment = Environment::new(world);
    tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        let mut peers = if peer_policies.is_empty() {
            None
        } else {
            Some(bench_peers::PythonPeers::start(
                &python,
                peer_policies,
                seed,
            )?)
        };
        let peers = peers.as_mut().map(|p| p as &mut dyn PeerPolicies);
        Ok(crate::recommend::benchmark::run(
            &environment,
            &indexes,
            &config,
            peers,
        )?)
    })
    .await?
}

/// The acceptance table: each policy over the reported rounds, against random and the oracle.
fn print_bandit(report: &BanditBenchReport, seconds: f64) {
    println!(
        "{} rounds, seed {} (policies {}), {:.1} candidates per context; last {} rounds ({:.0} s)",
        report.rounds,
        report.seed,
        report.policy_seed,
        report.mean_candidates,
        report.reported_rounds,
        seconds
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
}

/// The noise-free table: the true acceptance of what each policy showed, cold and late.
fn print_true_acceptance(report: &BanditBenchReport) {
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
}

/// Each policy's cumulative regret against the oracle over the rounds.
fn regret_panel(report: &BanditBenchReport) -> crate::plot::Panel {
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
