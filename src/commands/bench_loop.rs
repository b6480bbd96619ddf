//! `arc-rec bench loop`: the loop's headline through the front door. A synthetic world plays only
//! one organization's users against a real `arc-rec serve` over HTTP (`traffic`); phase 0 is
//! heuristics alone, and between phases only `arc-rec round` runs (its own data, the learned
//! grader, never the world). Every phase replays the same contexts, so phases compare context
//! by context; each is scored by the world's true acceptance (`recommend::loop_bench`).

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;
use serde::Serialize;

use super::parse_org;
use super::round::{RoundArgs, check_options};
use super::server_process::{ServerProcess, arc_rec_on};
use crate::plot::{Panel, Series, write_png};
use crate::recommend::loop_bench::{Logged, Mean, PhaseScore, score};
use crate::recommend::service::MODEL_CANDIDATES_RELOAD_BOUND;
use crate::storage::{Database, decisions, model_versions, rounds};
use crate::traffic::{self, Endpoint};
use crate::world::{Environment, World, WorldParams};

/// Arguments of `arc-rec bench loop`.
#[derive(Debug, Args)]
pub struct BenchLoopArgs {
    /// Seed of the world whose history the database holds (`arc-rec simulate --seed`).
    #[arg(long, default_value_t = 1)]
    pub world_seed: u64,
    /// Its outcomes (`arc-rec simulate --outcomes`).
    #[arg(long, default_value_t = WorldParams::default().outcomes)]
    pub world_outcomes: usize,
    /// The organization whose users the world plays (default: the world's first).
    #[arg(long)]
    pub org: Option<String>,
    /// Learning rounds after phase 0 (heuristics only); each is followed by a phase.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub rounds: u32,
    /// Decisions per phase (the same contexts every phase).
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u32).range(10..=100_000))]
    pub decisions: u32,
    /// Recommendations per request.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=50))]
    pub k: u32,
    /// Seeds the traffic (contexts) and the drawn answers.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Base checkpoint every round trains from (`round run --model`).
    #[arg(long)]
    pub model: PathBuf,
    /// Directory of the rounds (`round run --dir`).
    #[arg(long, default_value = "bench-loop")]
    pub dir: PathBuf,
    /// A second embedded cluster's directory holding the same world's history (`arc-rec
    /// --data-dir DIR simulate --seed S --outcomes N`): served the same traffic and answer
    /// streams by a server of its own that never gets a round, so each phase is also compared
    /// with heuristics that learned from as many answers (the model's part of the gain).
    #[arg(long, value_name = "DIR")]
    pub control_data_dir: Option<PathBuf>,
    /// Candidates per context of each new version (`round run --candidates-k`).
    #[arg(long, default_value_t = 8)]
    pub candidates_k: usize,
    /// One JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Write served top-1 true acceptance by phase (with 95% intervals) to this PNG.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// `arc-rec train` options for every round, after `--` (`round run`'s).
    #[arg(last = true, value_name = "TRAIN_OPTION")]
    pub train_options: Vec<String>,
}

/// The whole run.
#[derive(Debug, Serialize)]
pub struct LoopReport {
    pub world_seed: u64,
    pub org: String,
    pub decisions: u32,
    pub phases: Vec<PhaseReport>,
}

/// One phase and the round that preceded it.
#[derive(Debug, Serialize)]
pub struct PhaseReport {
    #[serde(flatten)]
    pub score: PhaseScore,
    /// The round before this phase: its verdict and version (none before phase 0).
    pub round_status: Option<String>,
    pub model_version_id: Option<String>,
    pub live_versions: usize,
    /// The control's phase (`--control-data-dir`): heuristics that learn from their answers,
    /// never a round.
    pub control: Option<ControlScore>,
}

/// The control server's phase on the same contexts and answer stream.
#[derive(Debug, Serialize)]
pub struct ControlScore {
    pub top1: Option<Mean>,
    /// This phase's top-1 true acceptance less the control's, context by context.
    pub gain_over_control: Option<Mean>,
}

/// Runs the benchmark.
pub async fn run(args: &BenchLoopArgs, database: &Database) -> anyhow::Result<()> {
    let world = World::new(WorldParams {
        seed: args.world_seed,
        outcomes: args.world_outcomes,
        ..WorldParams::default()
    })
    .context("--world-seed / --world-outcomes")?;
    let org = match &args.org {
        Some(org) => parse_org(org)?.as_str().to_owned(),
        None => world
            .params()
            .orgs
            .first()
            .cloned()
            .context("the world has no organization")?,
    };
    let report = run_on(args, database, &world, &org).await?;
    if let Some(path) = &args.plot {
        plot(&report, path)?;
    }
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_table(&report);
    }
    Ok(())
}

async fn run_on(
    args: &BenchLoopArgs,
    database: &Database,
    world: &World,
    org: &str,
) -> anyhow::Result<LoopReport> {
    check_options(&round_args(args, org))?;
    let exe = std::env::current_exe().context("cannot find the arc-rec binary")?;
    let (_server, endpoint) = open_side(args, &exe, database, org).await?;
    let control_database = open_control(args).await?;
    let control = match &control_database {
        Some(control) => Some(open_side(args, &exe, control, org).await?),
        None => None,
    };
    let environment = Environment::new(world);
    let contexts = traffic::contexts(
        &environment,
        org,
        usize::try_from(args.decisions)?,
        args.seed,
    )?;
    let traffic = Traffic {
        client: reqwest::Client::new(),
        environment: &environment,
        contexts: &contexts,
        k: args.k as usize,
        seed: args.seed,
    };
    let mut phases: Vec<PhaseReport> = Vec::new();
    let mut baseline = None;
    for phase in 0..=args.rounds as usize {
        let (round_status, model_version_id) = if phase == 0 {
            (None, None)
        } else {
            let round = learn(args, &exe, database, org).await?;
            (Some(round.0), round.1)
        };
        let played = traffic.play(&endpoint, phase, "").await?;
        let logged = logged(database, org, &played).await?;
        let score = score(phase, &played, &logged, baseline.as_deref());
        let control = match &control {
            Some((_, control)) => Some(traffic.against(control, phase, &played, &logged).await?),
            None => None,
        };
        let live_versions = live_versions(database, org).await?;
        eprintln!("{}", phase_line(&score, control.as_ref()));
        if phase == 0 {
            baseline = Some(played);
        }
        phases.push(PhaseReport {
            score,
            round_status,
            model_version_id,
            live_versions,
            control,
        });
    }
    if let Some(control) = control_database {
        control.close().await?;
    }
    Ok(LoopReport {
        world_seed: args.world_seed,
        org: org.to_owned(),
        decisions: args.decisions,
        phases,
    })
}

/// The control's database (`--control-data-dir`): the same history in a cluster of its own,
/// served the same traffic and answer streams, never given a round.
async fn open_control(args: &BenchLoopArgs) -> anyhow::Result<Option<Database>> {
    let Some(dir) = &args.control_data_dir else {
        return Ok(None);
    };
    let database = super::open_database(&super::DatabaseArgs {
        database_url: None,
        data_dir: dir.clone(),
    })
    .await
    .context("--control-data-dir")?;
    Ok(Some(database))
}

async fn live_versions(database: &Database, org: &str) -> anyhow::Result<usize> {
    Ok(model_versions::list(database.pool(), Some(org))
        .await?
        .iter()
        .filter(|v| v.status == model_versions::VersionStatus::Live)
        .count())
}

/// The phases' traffic: the same contexts each phase, the answers drawn from a stream per phase.
struct Traffic<'a> {
    client: reqwest::Client,
    environment: &'a Environment,
    contexts: &'a [crate::world::Context],
    k: usize,
    seed: u64,
}

impl Traffic<'_> {
    async fn play(
        &self,
        endpoint: &Endpoint,
        phase: usize,
        label: &str,
    ) -> anyhow::Result<Vec<traffic::Played>> {
        let bar = crate::progress::bar(
            self.contexts.len() as u64,
            &format!("phase {phase}{label}"),
            false,
        );
        let answer_seed = self.seed.wrapping_mul(1_000).wrapping_add(phase as u64);
        let played = traffic::play(
            &self.client,
            endpoint,
            self.environment,
            self.contexts,
            self.k,
            answer_seed,
            |done| bar.set_position(done as u64),
        )
        .await?;
        bar.finish_and_clear();
        Ok(played)
    }

    /// The control's phase and this side's gain over it, context by context.
    async fn against(
        &self,
        control: &Endpoint,
        phase: usize,
        played: &[traffic::Played],
        logged: &HashMap<uuid::Uuid, Logged>,
    ) -> anyhow::Result<ControlScore> {
        let theirs = self.play(control, phase, " (control)").await?;
        Ok(ControlScore {
            top1: score(phase, &theirs, &HashMap::new(), None).top1,
            gain_over_control: score(phase, played, logged, Some(theirs.as_slice())).paired_gain,
        })
    }
}

/// One side of the comparison: its database checked fresh, a platform key, a server.
async fn open_side(
    args: &BenchLoopArgs,
    exe: &std::path::Path,
    database: &Database,
    org: &str,
) -> anyhow::Result<(ServerProcess, Endpoint)> {
    check_fresh(database, org, args.world_seed, args.world_outcomes).await?;
    let key = crate::auth::create_key(
        database.pool(),
        &crate::domain::OrgId::parse(org).map_err(anyhow::Error::msg)?,
        crate::auth::Role::Platform,
        None,
        Default::default(),
    )
    .await?
    .token;
    let server = ServerProcess::start(exe, database, &[])?;
    let endpoint = Endpoint {
        base_url: format!("http://127.0.0.1:{}", server.port),
        key,
    };
    Ok((server, endpoint))
}

/// The organization holds the world's history and nothing of an earlier loop.
async fn check_fresh(
    database: &Database,
    org: &str,
    world_seed: u64,
    outcomes: usize,
) -> anyhow::Result<()> {
    let pool = database.pool();
    if !rounds::organization_exists(pool, org).await? {
        bail!(
            "the database lacks organization {org}: load world {world_seed}'s history first (`arc-rec simulate --seed {world_seed} --outcomes {outcomes}`)"
        );
    }
    if !model_versions::list(pool, Some(org)).await?.is_empty()
        || !rounds::list(pool, Some(org)).await?.is_empty()
    {
        bail!(
            "organization {org} already has model versions or rounds: phase 0 must be heuristics alone, so run the loop on a fresh history (a new --data-dir, then `arc-rec simulate --seed {world_seed} --outcomes {outcomes}`)"
        );
    }
    Ok(())
}

/// One round — `arc-rec round run` as a process of its own, as a platform's scheduler would run
/// it, its output on our stderr (stdout stays the report's) — and a wait until running servers
/// serve its version.
async fn learn(
    args: &BenchLoopArgs,
    exe: &std::path::Path,
    database: &Database,
    org: &str,
) -> anyhow::Result<(String, Option<String>)> {
    let mut command = tokio::process::Command::from(arc_rec_on(exe, database));
    command
        .args(["round", "run", "--org", org, "--model"])
        .arg(&args.model)
        .arg("--dir")
        .arg(&args.dir)
        .args(["--candidates-k", &args.candidates_k.to_string()])
        .arg("--")
        .args(&args.train_options)
        .stdout(std::io::stderr());
    let status = command.status().await.context("cannot run arc-rec round")?;
    if !status.success() {
        bail!("arc-rec round run --org {org} failed ({status}); its output is above");
    }
    let last = rounds::last_finished(database.pool(), org)
        .await?
        .context("the round did not finish")?;
    tokio::time::sleep(MODEL_CANDIDATES_RELOAD_BOUND + std::time::Duration::from_secs(1)).await;
    Ok((last.status.as_str().to_owned(), last.model_version_id))
}

/// The rounds between phases: `round run` with the loop's model, directory and options.
fn round_args(args: &BenchLoopArgs, org: &str) -> RoundArgs {
    RoundArgs {
        org: org.to_owned(),
        model: args.model.clone(),
        dir: args.dir.clone(),
        candidates_k: args.candidates_k,
        force: false,
        train_options: args.train_options.clone(),
    }
}

/// What serving logged of the phase's decisions.
async fn logged(
    database: &Database,
    org: &str,
    played: &[traffic::Played],
) -> anyhow::Result<HashMap<uuid::Uuid, Logged>> {
    let events: Vec<uuid::Uuid> = played.iter().map(|p| p.event_id).collect();
    let mut logged: HashMap<uuid::Uuid, Logged> = HashMap::new();
    for (event, floor_pick, item, prior) in
        decisions::floor_and_priors(database.pool(), org, &events).await?
    {
        let entry = logged.entry(event).or_default();
        entry.floor_pick = floor_pick;
        if let Some(prior) = prior {
            entry.priors.insert(item, prior);
        }
    }
    Ok(logged)
}

fn interval(mean: Option<Mean>) -> String {
    mean.map_or("–".to_owned(), |m| {
        format!("{:.3} [{:.3}, {:.3}]", m.mean, m.ci95[0], m.ci95[1])
    })
}

fn phase_line(score: &PhaseScore, control: Option<&ControlScore>) -> String {
    let control = control.map_or(String::new(), |c| {
        format!(
            "; control {}, gain over it {}",
            interval(c.top1),
            signed_interval(c.gain_over_control)
        )
    });
    format!(
        "phase {}: top-1 true acceptance {}, model share {:.2}{control}",
        score.phase,
        interval(score.top1),
        score.model_top_share
    )
}

fn signed_interval(mean: Option<Mean>) -> String {
    mean.map_or("–".to_owned(), |g| {
        format!("{:+.3} [{:+.3}, {:+.3}]", g.mean, g.ci95[0], g.ci95[1])
    })
}

fn print_table(report: &LoopReport) {
    println!(
        "world {} · organization {} · {} decisions per phase (the same contexts each phase)",
        report.world_seed, report.org, report.decisions
    );
    println!(
        "{:>5} {:<8} {:>22} {:>25} {:>6} {:>7} {:>7} {:>11} {:>8} {:>12}",
        "phase",
        "round",
        "top-1 true acc [95%]",
        "vs phase 0 [95%]",
        "model",
        "model",
        "heur.",
        "floor",
        "floor",
        "prior |err|"
    );
    println!(
        "{:>5} {:<8} {:>22} {:>25} {:>6} {:>7} {:>7} {:>11} {:>8} {:>12}",
        "", "", "", "", "share", "picks", "picks", "picks", "cost", ""
    );
    for p in &report.phases {
        let s = &p.score;
        let gain = signed_interval(s.paired_gain.filter(|_| s.phase > 0));
        let mean = |m: Option<Mean>| m.map_or("–".to_owned(), |m| format!("{:.3}", m.mean));
        println!(
            "{:>5} {:<8} {:>22} {:>25} {:>6.2} {:>7} {:>7} {:>11} {:>8} {:>12}",
            s.phase,
            p.round_status.as_deref().unwrap_or("–"),
            interval(s.top1),
            gain,
            s.model_top_share,
            mean(s.model_picks),
            mean(s.heuristic_picks),
            format!("{}/{}", s.floor_picks, s.floor_eligible),
            s.exploration_cost
                .map_or("–".to_owned(), |c| format!("{c:+.3}")),
            s.prior_calibration
                .map_or("–".to_owned(), |c| format!("{:.3}", c.mean_abs_error)),
        );
    }
    if report.phases.iter().any(|p| p.control.is_some()) {
        println!("phase  control top-1 [95%]     this side less the control, paired [95%]");
        for p in &report.phases {
            if let Some(c) = &p.control {
                println!(
                    "{:>5}  {:>22}  {:>25}",
                    p.score.phase,
                    interval(c.top1),
                    signed_interval(c.gain_over_control)
                );
            }
        }
    }
    println!(
        "top-1: the world's acceptance probability of the served first item; model/heur. picks: of first items from a model's ideas / the heuristics; floor picks: decisions whose first item the exploration floor chose / could choose; floor cost: true acceptance given up per decision; prior |err|: the learned grader's priors of shown model items against their truth; control: heuristics on a copy of the history that learned from the same traffic, never given a round"
    );
}

fn plot(report: &LoopReport, path: &std::path::Path) -> anyhow::Result<()> {
    let line = |name: &str, pick: &dyn Fn(&PhaseScore) -> Option<f64>| Series {
        name: name.to_owned(),
        points: report
            .phases
            .iter()
            .filter_map(|p| Some((p.score.phase as f64, pick(&p.score)?)))
            .collect(),
    };
    let panel = Panel {
        title: format!(
            "served top-1 true acceptance by phase (world {}, {})",
            report.world_seed, report.org
        ),
        x_label: "phase (0: heuristics only; each after one round)".into(),
        y_label: "true acceptance of the served first item".into(),
        series: vec![
            line("mean", &|s| s.top1.map(|m| m.mean)),
            line("95% low", &|s| s.top1.map(|m| m.ci95[0])),
            line("95% high", &|s| s.top1.map(|m| m.ci95[1])),
            line("model picks", &|s| s.model_picks.map(|m| m.mean)),
            line("heuristic picks", &|s| s.heuristic_picks.map(|m| m.mean)),
        ],
    };
    write_png(path, &[panel], 1)?;
    Ok(())
}
