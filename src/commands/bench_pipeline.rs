//! `arc-rec bench pipeline`: served top-1 true acceptance on the synthetic world with heuristic
//! candidates alone and with each model's candidates beside them (`recommend::pipeline_bench`),
//! against random order of the heuristic candidates and the menu oracles. The database holds the
//! world's history (`arc-rec simulate` with the same seed and outcomes, clustered or not); each
//! arm's model candidates come from a file `arc-rec candidates --out` wrote. Every bandit arm
//! first learns the database's logged decisions, as serving's warm start of a new organization
//! reads them (`--no-warm-start` for the figures without).

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Args;

use crate::plot::{Panel, Series, write_png};
use crate::recommend::bench_data;
use crate::recommend::pipeline_bench::{
    ArmKind, ModelMenu, OrgData, PipelineConfig, PipelineReport, PipelineWarmStart, ReasonPicks,
    run as run_bench, warm_start,
};
use crate::rft::model_candidates::read_candidate_lines;
use crate::storage::Database;
use crate::world::{Environment, World, WorldParams};

/// Most model arms in one run.
const MAX_ARMS: usize = 6;

/// Arguments of `arc-rec bench pipeline`.
#[derive(Debug, Args)]
pub struct BenchPipelineArgs {
    /// Seed of the world whose history the database holds (`arc-rec simulate --seed`): its
    /// hidden truth answers and scores every arm.
    #[arg(long, default_value_t = 1)]
    pub world_seed: u64,
    /// Outcomes of that history (`arc-rec simulate --outcomes`).
    #[arg(long, default_value_t = 20_000)]
    pub world_outcomes: usize,
    /// A model arm, NAME=FILE: heuristics plus the candidates `arc-rec candidates --out FILE`
    /// wrote (repeat for several models, at most 6).
    #[arg(long = "arm", value_name = "NAME=FILE")]
    pub arms: Vec<String>,
    /// Rounds of simulated platform traffic (one context, one shown top-1, one answer each).
    #[arg(long, default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub rounds: u64,
    /// Seed of the traffic (contexts, answers, the bandits' draws).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The first rounds reported apart (cold start).
    #[arg(long, default_value_t = 500)]
    pub cold_start: u64,
    /// Feedback reaches the bandit in batches of this many rounds.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub feedback_batch: u64,
    /// Start every bandit from nothing instead of from the world's logged decisions (serving
    /// warm-starts a new organization from the platform's log; this measures what that is
    /// worth).
    #[arg(long)]
    pub no_warm_start: bool,
    /// Write a PNG of each arm's true acceptance over rounds here.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `NAME=FILE` arms, checked.
fn parse_arms(specs: &[String]) -> anyhow::Result<Vec<(String, PathBuf)>> {
    if specs.len() > MAX_ARMS {
        bail!("--arm: at most {MAX_ARMS} model arms, got {}", specs.len());
    }
    let mut arms: Vec<(String, PathBuf)> = Vec::new();
    for spec in specs {
        let Some((name, file)) = spec.split_once('=') else {
            bail!("--arm {spec:?}: expected NAME=FILE");
        };
        let name = name.trim();
        if name.is_empty() || file.trim().is_empty() {
            bail!("--arm {spec:?}: expected NAME=FILE with a name and a file");
        }
        if arms.iter().any(|(n, _)| n == name) {
            bail!("--arm {name}: the name is used twice");
        }
        arms.push((name.to_owned(), PathBuf::from(file.trim())));
    }
    Ok(arms)
}

/// Each arm's model candidates, read from its file.
fn read_menus(arms: &[(String, PathBuf)]) -> anyhow::Result<Vec<ModelMenu>> {
    let mut menus = Vec::with_capacity(arms.len());
    for (name, file) in arms {
        let candidates = read_candidate_lines(file).with_context(|| format!("--arm {name}"))?;
        menus.push(ModelMenu {
            name: name.clone(),
            candidates: candidates.into_iter().collect(),
        });
    }
    Ok(menus)
}

/// Runs `arc-rec bench pipeline`.
pub async fn run(args: &BenchPipelineArgs, database: &Database) -> anyhow::Result<()> {
    let menus = read_menus(&parse_arms(&args.arms)?)?;
    let world = World::new(WorldParams {
        seed: args.world_seed,
        outcomes: args.world_outcomes,
        ..WorldParams::default()
    })
    .context("--world-seed / --world-outcomes")?;
    let orgs_of_world = world.params().orgs.clone();
    let pool = database.pool();
    let unknown = crate::storage::training_runs::unknown_orgs(pool, &orgs_of_world).await?;
    if !unknown.is_empty() {
        bail!(
            "the database lacks organization(s) {} of world {}: load its history first (`arc-rec simulate --seed {} --outcomes {}`)",
            unknown.join(", "),
            args.world_seed,
            args.world_seed,
            args.world_outcomes
        );
    }
    let orgs = bench_data::org_data(pool, &orgs_of_world).await?;
    warn_of_strangers(&menus, &orgs, args.world_seed);
    let warm_start = if args.no_warm_start {
        None
    } else {
        Some(warm_start_from_log(database, &orgs_of_world, &orgs).await?)
    };
    let config = PipelineConfig {
        rounds: usize::try_from(args.rounds)?,
        seed: args.seed,
        feedback_batch: usize::try_from(args.feedback_batch)?,
        cold_start: usize::try_from(args.cold_start)?,
        policy: crate::recommend::features::policy_config(),
        curve_points: 50,
        warm_start,
    };
    let started = Instant::now();
    let report = tokio::task::spawn_blocking(move || {
        let environment = Environment::new(&world);
        run_bench(&environment, &orgs, &menus, &config)
    })
    .await??;
    if let Some(path) = &args.plot {
        plot(&report, path)?;
    }
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    print_table(&report, started.elapsed().as_secs_f64());
    if let Some(path) = &args.plot {
        println!("acceptance over rounds: {}", path.display());
    }
    Ok(())
}

/// Says which arms hold candidates of organizations outside the world (they go unused).
fn warn_of_strangers(menus: &[ModelMenu], orgs: &HashMap<String, OrgData>, world_seed: u64) {
    for menu in menus {
        let strangers = menu.strangers(orgs);
        if !strangers.is_empty() {
            eprintln!(
                "--arm {}: candidates of organization(s) {} outside world {} are not used",
                menu.name,
                strangers.join(", "),
                world_seed
            );
        }
    }
}

/// What every bandit arm learns before round 1: the organizations' logged decisions, as a
/// learner of each reads them at start-up.
async fn warm_start_from_log(
    database: &Database,
    orgs_of_world: &[String],
    orgs: &HashMap<String, OrgData>,
) -> anyhow::Result<PipelineWarmStart> {
    let logged = bench_data::serving_logged_decisions(database.pool(), orgs_of_world).await?;
    let warm = warm_start(orgs, &logged);
    eprintln!(
        "warm start: {} of {} logged decisions matched to a generated candidate ({} by lever), learned by every bandit arm before round 1",
        warm.counts.matched, warm.counts.logged, warm.counts.lever_matched
    );
    Ok(warm)
}

fn or_dash(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{v:.3}"))
}

fn signed_or_dash(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{v:+.3}"))
}

fn print_table(report: &PipelineReport, seconds: f64) {
    println!(
        "{} rounds (traffic seed {}), {:.1} heuristic candidates per context, {} rounds unplaced; true acceptance of the shown top-1 ({:.0} s)",
        report.rounds,
        report.seed,
        report.mean_heuristic_candidates,
        report.unplaced_rounds,
        seconds
    );
    match report.warm_start {
        Some(w) => println!(
            "every bandit arm first learned the world's log: {} of {} logged decisions matched ({} by lever)",
            w.matched, w.logged, w.lever_matched
        ),
        None => println!("no warm start: every bandit arm started from nothing"),
    }
    print_arms(report);
    print_reasons(report);
    print_paired(report);
    print_priced(report);
}

/// One line per arm: cold start, last quarter, against random and the heuristics-only bandit,
/// the model's share and picks.
fn print_arms(report: &PipelineReport) {
    let last_quarter_of = |kind: ArmKind| {
        report
            .arms
            .iter()
            .find(|a| a.kind == kind)
            .map_or(f64::NAN, |a| a.last_quarter)
    };
    let random = last_quarter_of(ArmKind::Random);
    let heuristics = last_quarter_of(ArmKind::Thompson);
    println!(
        "{:<30} {:>10} {:>12} {:>9} {:>9} {:>11} {:>11} {:>11} {:>6}",
        "arm",
        format!("first {}", report.cold_start_rounds),
        "last quarter",
        "x random",
        "vs (a)",
        "model share",
        "model picks",
        "heur. picks",
        "errors"
    );
    for a in &report.arms {
        println!(
            "{:<30} {:>10.3} {:>12.3} {:>9.2} {:>+9.3} {:>11.3} {:>11} {:>11} {:>6}",
            a.arm,
            a.cold_start,
            a.last_quarter,
            a.last_quarter / random,
            a.last_quarter - heuristics,
            a.model_share_last_quarter,
            or_dash(a.model_pick_acceptance),
            or_dash(a.heuristic_pick_acceptance),
            a.errors
        );
    }
    println!(
        "model share / picks: last quarter ({} rounds); vs (a): last quarter minus the heuristics-only bandit's",
        report.last_quarter_rounds
    );
}

/// Why each arm's model picks were picked, where it made any.
fn print_reasons(report: &PipelineReport) {
    let reasons: Vec<_> = report
        .arms
        .iter()
        .filter_map(|a| Some((a, a.model_picks_by_reason?)))
        .filter(|(_, by)| by.uniform.picks + by.mean.picks + by.draw.picks > 0)
        .collect();
    if reasons.is_empty() {
        return;
    }
    println!(
        "why the model's last-quarter picks were picked (picks: their acceptance / what they displaced, overrated by):"
    );
    let show = |r: ReasonPicks| {
        format!(
            "{} ({} / {}, {})",
            r.picks,
            or_dash(r.acceptance),
            or_dash(r.alternative_acceptance),
            signed_or_dash(r.overrating)
        )
    };
    for (a, by) in reasons {
        println!(
            "  {:<28} mean first {}; draw {}; ε-uniform {}",
            a.arm,
            show(by.mean),
            show(by.draw),
            show(by.uniform)
        );
    }
}

/// Each arm against the heuristics-only bandit in the same rounds, by its top-1's source.
fn print_paired(report: &PipelineReport) {
    let paired: Vec<_> = report
        .arms
        .iter()
        .filter_map(|a| Some((a, a.against_heuristics_arm?)))
        .collect();
    if paired.is_empty() {
        return;
    }
    println!(
        "last quarter against (a) in the same rounds, by the source of the arm's top-1 (rounds: mean gain):"
    );
    for (a, p) in paired {
        println!(
            "  {:<28} model {}: {}; heuristic {}: {}",
            a.arm,
            p.model_rounds,
            signed_or_dash(p.model_gain),
            p.heuristic_rounds,
            signed_or_dash(p.heuristic_gain)
        );
    }
}

/// How well each arm's priced ideas' priors told their worth.
fn print_priced(report: &PipelineReport) {
    let priced: Vec<_> = report
        .arms
        .iter()
        .filter_map(|a| Some((a, a.prior_quality?)))
        .collect();
    if priced.is_empty() {
        return;
    }
    println!(
        "how the priced ideas' priors told their worth, every round (prior / true acceptance; correlation; pairs ordered right; truth of the prior's first / of the best idea):"
    );
    for (a, q) in priced {
        println!(
            "  {:<28} {:.3} / {:.3}; r {}; {}; {:.3} / {:.3}",
            a.arm,
            q.mean_prior,
            q.mean_truth,
            signed_or_dash(q.correlation),
            or_dash(q.concordance),
            q.prior_first_truth,
            q.best_truth
        );
    }
}

/// Two panels: the bandit arms, and the menu oracles; random order in both, so each menu has
/// the same colour in both panels.
fn plot(report: &PipelineReport, path: &std::path::Path) -> anyhow::Result<()> {
    let series = |oracles: bool| {
        report
            .arms
            .iter()
            .filter(|a| a.kind == ArmKind::Random || (a.kind == ArmKind::Oracle) == oracles)
            .map(|a| Series {
                name: a.arm.clone(),
                points: a.curve.clone(),
            })
            .collect()
    };
    let panel = |title: &str, series| Panel {
        title: title.to_owned(),
        x_label: "round".into(),
        y_label: "true acceptance of the shown top-1".into(),
        series,
    };
    write_png(
        path,
        &[
            panel("served (Thompson sampling) and random order", series(false)),
            panel("menu oracles (and random order)", series(true)),
        ],
        2,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arms_are_name_equals_file_with_unique_names() {
        let arms = parse_arms(&["warm=a.jsonl".into(), "rl = b.jsonl".into()]).unwrap();
        assert_eq!(arms[1], ("rl".to_owned(), PathBuf::from("b.jsonl")));
        for (bad, message) in [
            (vec!["nofile".to_owned()], "expected NAME=FILE"),
            (vec!["=x".to_owned()], "with a name and a file"),
            (vec!["a=x".to_owned(), "a=y".to_owned()], "used twice"),
            (
                (0..7).map(|i| format!("a{i}=x")).collect(),
                "at most 6 model arms",
            ),
        ] {
            let error = parse_arms(&bad).unwrap_err().to_string();
            assert!(error.contains(message), "{bad:?}: {error}");
        }
    }
}
