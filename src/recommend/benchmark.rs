//! `arc-rec bench bandit`: policies against the synthetic world's hidden truth.
//!
//! Every policy sees the same sequence of failure contexts and the same candidate sets (arc-rec's
//! own heuristics over the world's history); people's answers come from the world's acceptance
//! model with a random stream per policy. Thompson sampling learns from its own feedback only,
//! delivered in batches (as a service gets it) after which its posterior draws are refreshed.
//!
//! Peers ([`PeerPolicies`]: Vowpal Wabbit, MABWiser, run outside this crate) rank the same
//! candidate lists from what the platform sends (failures, configuration, user; each candidate's
//! type and diff), get their answers from the same world and learn in the same batches; each
//! round they say which candidates they scored, so a report proves they saw arc-rec's lists.
//! Every policy is also scored by the world's true acceptance probability of what it showed
//! (noise-free), over the first rounds (cold start) and the last quarter.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bandit::{Observation, PolicyConfig, ThompsonPolicy};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use serde_json::Value;

use super::engine::{Evidence, RecommendError, RecommendInput, prepare, rank};
use super::features::layout;
use super::warm_start::{LoggedDecision, WarmStartCounts, match_decision};
use crate::candidates::{CandidateIndex, FailureObservation};
use crate::world::{Context, Environment};

/// How to run the benchmark.
#[derive(Debug, Clone)]
pub struct BanditBenchConfig {
    pub rounds: usize,
    /// Seeds the stream of contexts (with the world, the same for every policy).
    pub seed: u64,
    /// Seeds the policies' own draws and their people's answers: runs that differ only here
    /// see the same contexts and lists, so their spread is the policies' own.
    pub policy_seed: u64,
    /// Rounds whose results are reported (the last ones: what the policy learned).
    pub report_last: usize,
    /// Feedback is applied (and the posterior bank refreshed) every this many rounds.
    pub feedback_batch: usize,
    /// Thompson-sampling variants to run, by name.
    pub thompson: Vec<(String, PolicyConfig)>,
    /// The first this many rounds are reported as the cold start.
    pub cold_start: usize,
    /// Also run "full information (linear)": the shared linear model on arc-rec's features,
    /// learning each round the true acceptance probability of *every* candidate and showing
    /// the best by its posterior mean. No policy can learn that way; how close it gets to the
    /// oracle is what the features can tell apart, with exploration out of the question.
    pub full_information: bool,
    /// What every learner knows before round 1: the platform's logged decisions (see
    /// [`warm_start`]); `None` starts every learner from nothing.
    pub warm_start: Option<WarmStart>,
}

/// The logged decisions a warm start learns from: those whose diff arc-rec's generator proposes
/// again in the same context, as the features each learner would have seen.
#[derive(Debug, Clone, Default)]
pub struct WarmStart {
    /// How much one logged answer counts against one answer of the benchmark's own (0, 1]: the
    /// log was collected by another recommender on other lists, so it may be worth less.
    pub weight: f64,
    /// For arc-rec's policies: each matched decision as features, in log order.
    pub decisions: Vec<WarmDecision>,
    /// For the peers: the same decisions, each with the list it was regenerated in.
    pub peers: Vec<PeerWarm>,
    /// Whether each decision is also weighed by its age ([`WarmDecision::age_s`]).
    pub by_age: bool,
    /// Logged decisions read, matched, and matched by lever, as serving counts them.
    pub counts: WarmStartCounts,
}

/// One matched decision as arc-rec's policies learn it.
#[derive(Debug, Clone, Default)]
pub struct WarmDecision {
    /// z and c, as a request in its context would have ranked the logged diff.
    pub context: Vec<f64>,
    pub candidate: Vec<f64>,
    pub approved: bool,
    /// How long before the log's newest decision it was made (0 when ages are not counted, as
    /// in serving, which counts the log alike).
    pub age_s: f64,
}

/// One logged decision as a peer learns it: the context, the regenerated list and which of its
/// candidates was shown (probability unknown: the log's recommender did not record one).
#[derive(Debug, Clone, Serialize)]
pub struct PeerWarm {
    pub context: PeerContext,
    pub candidates: Vec<PeerCandidate>,
    pub index: usize,
    pub accepted: bool,
}

/// Builds the warm start of `logged`: each decision's context goes through the candidate
/// generator of its organization's index (as a request would), and the decision counts when one
/// generated candidate leads to the same configuration as the logged diff, or else pulls the
/// same lever (see `lever_of`: the logged diff is then featurized in that candidate's place, with
/// its type and statistics); the others are left out (their candidate features — type, expected
/// gain, evidence — are undefined). `weight` is [`WarmStart::weight`]; with `by_age`, each
/// decision is also as old as it is against the log's newest ([`WarmDecision::age_s`]; serving,
/// `recommend::warm_start::observations`, counts the log alike).
pub fn warm_start(
    indexes: &HashMap<String, CandidateIndex>,
    logged: &[LoggedDecision],
    weight: f64,
    by_age: bool,
) -> WarmStart {
    let mut warm = WarmStart {
        weight,
        by_age,
        counts: WarmStartCounts {
            logged: logged.len() as u64,
            ..WarmStartCounts::default()
        },
        ..WarmStart::default()
    };
    let newest = logged.iter().map(|d| d.created_at).max();
    for decision in logged {
        let Some(index) = indexes.get(&decision.org) else {
            continue;
        };
        let Some(matched) = match_decision(index, decision) else {
            continue;
        };
        let (prepared, position) = (matched.prepared, matched.position);
        warm.counts.lever_matched += u64::from(matched.by_lever);
        warm.counts.matched += 1;
        warm.decisions.push(WarmDecision {
            context: prepared.context.clone(),
            candidate: prepared.candidates[position].1.clone(),
            approved: decision.approved,
            age_s: match newest {
                Some(newest) if by_age => (newest - decision.created_at).as_seconds_f64(),
                _ => 0.0,
            },
        });
        let round = peer_round(0, &decision.input, &prepared);
        warm.peers.push(PeerWarm {
            context: round.context,
            candidates: round.candidates,
            index: position,
            accepted: decision.approved,
        });
    }
    warm
}

impl WarmStart {
    /// The observations a policy with `config` is rebuilt from at clock 0: each stamped its age
    /// before 0 and weighted by [`WarmStart::weight`] through its timestamp (a half-life's decay
    /// of log₂(1/weight)).
    fn observations(&self, config: &PolicyConfig) -> Result<Vec<Observation>, BanditBenchError> {
        let offset = if self.weight == 1.0 {
            0.0
        } else {
            match config.half_life_s {
                Some(h) if self.weight > 0.0 && self.weight < 1.0 => h * self.weight.log2(),
                _ => return Err(BanditBenchError::WarmWeight(self.weight)),
            }
        };
        Ok(self
            .decisions
            .iter()
            .enumerate()
            .map(|(i, d)| {
                Observation::binary(
                    format!("log:{i:09}"),
                    offset - d.age_s,
                    d.context.clone(),
                    d.candidate.clone(),
                    d.approved,
                )
            })
            .collect())
    }
}

/// A candidate as a peer sees it: its stable id, type and diff.
#[derive(Debug, Clone, Serialize)]
pub struct PeerCandidate {
    pub key: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub diff: Value,
}

/// One failure as the platform reports it.
#[derive(Debug, Clone, Serialize)]
pub struct PeerFailure {
    pub category: String,
    pub message: String,
    pub tool: Option<String>,
}

/// What the platform sends about a failing configuration.
#[derive(Debug, Clone, Serialize)]
pub struct PeerContext {
    pub failures: Vec<PeerFailure>,
    pub current_config: Value,
    pub user_role: Option<String>,
    pub domain: Option<String>,
}

/// One round for the peers: the context and the candidate list arc-rec ranks, in its order.
#[derive(Debug, Clone, Serialize)]
pub struct PeerRound {
    pub round: usize,
    pub context: PeerContext,
    pub candidates: Vec<PeerCandidate>,
}

/// A peer's pick in one round.
#[derive(Debug, Clone, PartialEq)]
pub struct PeerChoice {
    pub policy: String,
    /// Index into the round's candidates.
    pub index: usize,
    /// The keys of the candidates the policy scored, in order.
    pub seen: Vec<String>,
}

/// An answer delivered to a peer.
#[derive(Debug, Clone, Serialize)]
pub struct PeerFeedback {
    pub round: usize,
    pub policy: String,
    pub index: usize,
    pub accepted: bool,
}

/// Policies outside arc-rec, driven round by round (`commands::bench_peers` runs them in a
/// Python process).
pub trait PeerPolicies {
    /// The policies' names, in report order.
    fn names(&self) -> Vec<String>;
    /// Each policy's pick for `round` (one per name).
    fn choose(&mut self, round: &PeerRound) -> Result<Vec<PeerChoice>, String>;
    /// Answers to earlier picks.
    fn learn(&mut self, feedback: &[PeerFeedback]) -> Result<(), String>;
    /// The platform's logged decisions, before round 1 (see [`WarmStart`]).
    fn warm(&mut self, decisions: &[PeerWarm]) -> Result<(), String>;
    /// Seconds each policy spent choosing and learning.
    fn seconds(&mut self) -> Result<HashMap<String, f64>, String>;
}

/// Why the benchmark stopped.
#[derive(Debug, thiserror::Error)]
pub enum BanditBenchError {
    #[error(transparent)]
    Recommend(#[from] RecommendError),
    #[error("the peer policies failed: {0}")]
    Peers(String),
    #[error(
        "warm start weight: must be in (0, 1] (below 1 it needs the policy's half-life), got {0}"
    )]
    WarmWeight(f64),
}

/// One policy's results.
#[derive(Debug, Clone, Serialize)]
pub struct PolicyResult {
    pub policy: String,
    /// Acceptance rate over the reported rounds.
    pub acceptance_rate: f64,
    /// Mean true reliability gain per round over the reported rounds (0 when rejected).
    pub reliability_gain: f64,
    /// Acceptance rate over all rounds (includes learning).
    pub acceptance_rate_all: f64,
    /// Mean true acceptance probability of what it showed in the first `cold_start` rounds.
    pub cold_start_true_acceptance: f64,
    /// The same over the last quarter of the rounds.
    pub last_quarter_true_acceptance: f64,
    /// `last_quarter_true_acceptance` over the oracle's (the best of the same lists).
    pub last_quarter_oracle_ratio: f64,
    /// Decisions per second of its own choosing and learning (`null` for the baselines).
    pub decisions_per_s: Option<f64>,
    /// Cumulative regret against the oracle in true acceptance, at up to 200 rounds.
    pub regret_curve: Vec<(usize, f64)>,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct BanditBenchReport {
    pub rounds: usize,
    pub reported_rounds: usize,
    pub seed: u64,
    pub policy_seed: u64,
    pub mean_candidates: f64,
    pub policies: Vec<PolicyResult>,
    /// Rankings per second of the first Thompson variant alone (rank calls only).
    pub thompson_decisions_per_s: f64,
    pub cold_start_rounds: usize,
    pub last_quarter_rounds: usize,
    /// Rounds in which a peer scored other candidates than arc-rec's list (0: every policy saw
    /// identical lists).
    pub peer_list_mismatches: usize,
    /// What the learners knew before round 1 (`null`: nothing).
    pub warm_start: Option<WarmStartSummary>,
}

/// A warm start as reported: how it weighed the log, and its counts.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct WarmStartSummary {
    pub weight: f64,
    pub by_age: bool,
    #[serde(flatten)]
    pub counts: WarmStartCounts,
}

enum Strategy {
    Thompson {
        policy: Box<ThompsonPolicy>,
        pending: Vec<Observation>,
    },
    Random,
    Heuristic,
    Oracle,
    /// A policy of the [`PeerPolicies`], by name.
    Peer,
    /// See [`BanditBenchConfig::full_information`].
    FullInformation(Box<ThompsonPolicy>),
}

struct Runner {
    name: String,
    strategy: Strategy,
    rng: ChaCha8Rng,
    accepted: Vec<bool>,
    gains: Vec<f64>,
    /// The true acceptance probability of what it showed (0 when nothing).
    truth: Vec<f64>,
    rank_time: Duration,
}

/// One round as every policy sees it: the world's context, what arc-rec is shown of it, and the
/// candidate list arc-rec prepared (the diffs in its order).
struct Round {
    number: usize,
    ctx: Context,
    input: RecommendInput,
    prepared: super::engine::Prepared,
    diffs: Vec<Value>,
}

impl Round {
    fn new(number: usize, ctx: Context, index: &CandidateIndex) -> Self {
        let input = input_of(&ctx);
        let prepared = prepare(index, &input);
        let diffs = prepared
            .candidates
            .iter()
            .map(|(c, _)| c.diff.clone())
            .collect();
        Self {
            number,
            ctx,
            input,
            prepared,
            diffs,
        }
    }
}

/// A policy's pick: the diff it showed (`None`: nothing) and, for Thompson sampling, the
/// features (z, c) it ranked it with, which its answer teaches.
type Pick = (Option<Value>, Option<(Vec<f64>, Vec<f64>)>);

/// What the rounds add up beside the runners' own records.
#[derive(Default)]
struct Tally {
    /// Candidates over all rounds (for the mean list length).
    candidates: usize,
    /// Rounds in which a peer scored another list than arc-rec's.
    peer_list_mismatches: usize,
    /// Answers not yet delivered to the peers.
    peer_feedback: Vec<PeerFeedback>,
}

/// Runs the benchmark; `indexes` holds each organization's candidate statistics; `peers`, when
/// given, rank every round's list beside arc-rec's policies.
pub fn run(
    environment: &Environment,
    indexes: &HashMap<String, CandidateIndex>,
    config: &BanditBenchConfig,
    mut peers: Option<&mut dyn PeerPolicies>,
) -> Result<BanditBenchReport, BanditBenchError> {
    let peer_names = peers.as_ref().map(|p| p.names()).unwrap_or_default();
    let mut runners = runners(config, &peer_names)?;
    if let (Some(peers), Some(warm)) = (peers.as_deref_mut(), &config.warm_start) {
        peers.warm(&warm.peers).map_err(BanditBenchError::Peers)?;
    }
    let mut tally = Tally::default();
    let mut contexts = ChaCha8Rng::seed_from_u64(config.seed);
    for number in 0..config.rounds {
        let ctx = environment.next_context(&mut contexts);
        let Some(index) = indexes.get(&ctx.org) else {
            continue;
        };
        let round = Round::new(number, ctx, index);
        tally.candidates += round.diffs.len();
        let peer_choices = ask_peers(peers.as_deref_mut(), &round, &peer_names, &mut tally)?;
        for r in &mut runners {
            play(r, environment, &round, &peer_choices, config, &mut tally)?;
        }
        // The peers learn in the same batches as arc-rec's policies.
        if let Some(peers) = peers.as_deref_mut()
            && tally.peer_feedback.len() >= config.feedback_batch * peer_names.len().max(1)
        {
            peers
                .learn(&tally.peer_feedback)
                .map_err(BanditBenchError::Peers)?;
            tally.peer_feedback.clear();
        }
    }
    let peer_seconds = match peers {
        Some(peers) => peers.seconds().map_err(BanditBenchError::Peers)?,
        None => HashMap::new(),
    };
    Ok(summarize(&runners, config, &peer_seconds, &tally))
}

/// Every policy of a run, each with its own random stream: the Thompson variants, the three
/// baselines, the peers and, last, full information.
fn runners(
    config: &BanditBenchConfig,
    peer_names: &[String],
) -> Result<Vec<Runner>, BanditBenchError> {
    let seed = config.policy_seed;
    let mut runners = Vec::new();
    for (i, (name, policy_config)) in config.thompson.iter().enumerate() {
        let strategy = thompson(config, policy_config)?;
        runners.push(runner(name, strategy, seed, i));
    }
    let base = runners.len();
    let baselines = [
        ("uniform random", Strategy::Random),
        ("heuristic order", Strategy::Heuristic),
        ("oracle", Strategy::Oracle),
    ];
    for (i, (name, strategy)) in baselines.into_iter().enumerate() {
        runners.push(runner(name, strategy, seed, base + i));
    }
    for (i, name) in peer_names.iter().enumerate() {
        runners.push(runner(name, Strategy::Peer, seed, base + 3 + i));
    }
    if config.full_information {
        // After every other runner, so their random streams stay those of a run without it.
        let policy = ThompsonPolicy::new(
            layout(),
            PolicyConfig {
                epsilon: 0.0,
                ..super::features::policy_config()
            },
        )
        .map_err(RecommendError::from)?;
        let i = runners.len();
        runners.push(runner(
            "full information (linear)",
            Strategy::FullInformation(Box::new(policy)),
            seed,
            i,
        ));
    }
    Ok(runners)
}

/// A Thompson-sampling policy with `policy_config`, warm-started when the run is, its posterior
/// draws seeded from the policy seed.
fn thompson(
    config: &BanditBenchConfig,
    policy_config: &PolicyConfig,
) -> Result<Strategy, BanditBenchError> {
    let mut policy = ThompsonPolicy::new(layout(), *policy_config).map_err(RecommendError::from)?;
    if let Some(warm) = &config.warm_start {
        policy
            .rebuild(&warm.observations(policy_config)?, 0.0)
            .map_err(RecommendError::from)?;
    }
    policy.refresh_bank_seeded(config.policy_seed ^ 0x5eed);
    Ok(Strategy::Thompson {
        policy: Box::new(policy),
        pending: vec![],
    })
}

/// The peers' picks for a round with candidates (none without peers or candidates), counting
/// the round in [`Tally::peer_list_mismatches`] when a peer scored another list.
fn ask_peers(
    peers: Option<&mut (dyn PeerPolicies + '_)>,
    round: &Round,
    peer_names: &[String],
    tally: &mut Tally,
) -> Result<Vec<PeerChoice>, BanditBenchError> {
    let Some(peers) = peers.filter(|_| !round.diffs.is_empty()) else {
        return Ok(Vec::new());
    };
    let request = peer_round(round.number, &round.input, &round.prepared);
    let choices = peers.choose(&request).map_err(BanditBenchError::Peers)?;
    let keys: Vec<&str> = request.candidates.iter().map(|c| c.key.as_str()).collect();
    if choices.len() != peer_names.len()
        || choices
            .iter()
            .any(|c| c.seen != keys || c.index >= keys.len())
    {
        tally.peer_list_mismatches += 1;
    }
    Ok(choices)
}

/// One policy's turn in a round: it picks (timed), the world answers, and it learns (a peer's
/// answer waits in the tally for the peers' next batch).
fn play(
    r: &mut Runner,
    environment: &Environment,
    round: &Round,
    peer_choices: &[PeerChoice],
    config: &BanditBenchConfig,
    tally: &mut Tally,
) -> Result<(), BanditBenchError> {
    let started = Instant::now();
    // A peer's pick, found once: it chooses the diff and is what its answer refers to.
    let peer_pick = match r.strategy {
        Strategy::Peer => peer_choices.iter().find(|c| c.policy == r.name),
        _ => None,
    };
    let (choice, features) = choose(r, environment, round, peer_pick)?;
    r.rank_time += started.elapsed();
    let Some(diff) = choice else {
        r.accepted.push(false);
        r.gains.push(0.0);
        r.truth.push(0.0);
        return Ok(());
    };
    r.truth
        .push(environment.acceptance_probability(&round.ctx, &diff));
    let feedback = environment.feedback(&round.ctx, &diff, &mut r.rng);
    r.accepted.push(feedback.accepted);
    r.gains.push(if feedback.accepted {
        feedback.reliability_delta
    } else {
        0.0
    });
    if let Some(choice) = peer_pick {
        tally.peer_feedback.push(PeerFeedback {
            round: round.number,
            policy: r.name.clone(),
            index: choice.index,
            accepted: feedback.accepted,
        });
    }
    learn(r, environment, round, features, feedback.accepted, config)
}

/// What a policy shows of the round's list.
fn choose(
    r: &mut Runner,
    environment: &Environment,
    round: &Round,
    peer_pick: Option<&PeerChoice>,
) -> Result<Pick, BanditBenchError> {
    let diffs = &round.diffs;
    Ok(match &mut r.strategy {
        Strategy::Thompson { policy, .. } => {
            let output = rank(
                policy,
                round.prepared.clone(),
                round.input.k,
                r.rng.random(),
                &Evidence::default(),
                None,
            )?;
            match output.shown.into_iter().next() {
                Some(shown) => (
                    Some(shown.candidate.diff),
                    Some((output.context, shown.features)),
                ),
                None => (None, None),
            }
        }
        Strategy::Random if !diffs.is_empty() => (
            Some(diffs[r.rng.random_range(0..diffs.len())].clone()),
            None,
        ),
        // Candidates come sorted by expected reliability gain.
        Strategy::Heuristic => (diffs.first().cloned(), None),
        Strategy::Oracle => (
            environment
                .best_of(&round.ctx, diffs)
                .map(|i| diffs[i].clone()),
            None,
        ),
        Strategy::Random => (None, None),
        Strategy::FullInformation(policy) => (
            best_by_mean(policy, &round.prepared)?.map(|i| diffs[i].clone()),
            None,
        ),
        Strategy::Peer => (peer_pick.and_then(|c| diffs.get(c.index).cloned()), None),
    })
}

/// The candidate of `prepared` with the highest posterior mean (the first of equals).
fn best_by_mean(
    policy: &ThompsonPolicy,
    prepared: &super::engine::Prepared,
) -> Result<Option<usize>, BanditBenchError> {
    let mut best: Option<(usize, f64)> = None;
    for (i, (_, c)) in prepared.candidates.iter().enumerate() {
        let score = policy
            .mean_score(&prepared.context, c)
            .map_err(RecommendError::from)?;
        if best.is_none_or(|(_, top)| score > top) {
            best = Some((i, score));
        }
    }
    Ok(best.map(|(i, _)| i))
}

/// What a policy learns from the round: full information every candidate's true acceptance,
/// Thompson sampling its answer (applied, and its draws refreshed, once a batch is full).
fn learn(
    r: &mut Runner,
    environment: &Environment,
    round: &Round,
    features: Option<(Vec<f64>, Vec<f64>)>,
    accepted: bool,
    config: &BanditBenchConfig,
) -> Result<(), BanditBenchError> {
    let number = round.number;
    match (&mut r.strategy, features) {
        (Strategy::FullInformation(policy), _) => {
            for (i, (candidate, c)) in round.prepared.candidates.iter().enumerate() {
                let observation = Observation {
                    id: format!("{number}/{i}"),
                    timestamp_s: number as f64 * 60.0,
                    context: round.prepared.context.clone(),
                    candidate: c.clone(),
                    reward: environment.acceptance_probability(&round.ctx, &candidate.diff),
                };
                policy.update(&observation).map_err(RecommendError::from)?;
            }
        }
        (Strategy::Thompson { policy, pending }, Some((z, c))) => {
            pending.push(Observation::binary(
                format!("{number}"),
                number as f64 * 60.0,
                z,
                c,
                accepted,
            ));
            if pending.len() >= config.feedback_batch {
                for observation in pending.drain(..) {
                    policy.update(&observation).map_err(RecommendError::from)?;
                }
                policy.refresh_bank_seeded(config.policy_seed.wrapping_add(number as u64));
            }
        }
        _ => {}
    }
    Ok(())
}

/// The rounds a report looks at: the last reported ones, the last quarter, the cold start.
#[derive(Debug, Clone, Copy)]
struct Windows {
    last: usize,
    quarter: usize,
    cold: usize,
}

/// The report of the runners after the last round.
fn summarize(
    runners: &[Runner],
    config: &BanditBenchConfig,
    peer_seconds: &HashMap<String, f64>,
    tally: &Tally,
) -> BanditBenchReport {
    let windows = Windows {
        last: config.report_last.min(config.rounds),
        quarter: (config.rounds / 4).max(1),
        cold: config.cold_start.min(config.rounds),
    };
    let oracle_truth = runners
        .iter()
        .find(|r| matches!(r.strategy, Strategy::Oracle))
        .map(|r| r.truth.clone())
        .unwrap_or_default();
    let policies = runners
        .iter()
        .map(|r| policy_result(r, windows, &oracle_truth, peer_seconds))
        .collect();
    let thompson_decisions_per_s = runners
        .first()
        .filter(|r| matches!(r.strategy, Strategy::Thompson { .. }))
        .map_or(0.0, |r| {
            r.accepted.len() as f64 / r.rank_time.as_secs_f64().max(1e-9)
        });
    BanditBenchReport {
        rounds: config.rounds,
        reported_rounds: windows.last,
        seed: config.seed,
        policy_seed: config.policy_seed,
        mean_candidates: tally.candidates as f64 / config.rounds.max(1) as f64,
        policies,
        thompson_decisions_per_s,
        cold_start_rounds: windows.cold,
        last_quarter_rounds: windows.quarter.min(config.rounds),
        peer_list_mismatches: tally.peer_list_mismatches,
        warm_start: config.warm_start.as_ref().map(|w| WarmStartSummary {
            weight: w.weight,
            by_age: w.by_age,
            counts: w.counts,
        }),
    }
}

/// One runner's results, against the oracle's true acceptance round by round.
fn policy_result(
    r: &Runner,
    windows: Windows,
    oracle_truth: &[f64],
    peer_seconds: &HashMap<String, f64>,
) -> PolicyResult {
    let rate = |xs: &[bool]| {
        mean(
            &xs.iter()
                .map(|a| f64::from(u8::from(*a)))
                .collect::<Vec<_>>(),
        )
    };
    let oracle_last_quarter = mean(tail(oracle_truth, windows.quarter));
    let last_quarter = mean(tail(&r.truth, windows.quarter));
    let decisions = r.truth.len() as f64;
    let decisions_per_s = match r.strategy {
        Strategy::Thompson { .. } => Some(decisions / r.rank_time.as_secs_f64().max(1e-9)),
        Strategy::Peer => peer_seconds.get(&r.name).map(|s| decisions / s.max(1e-9)),
        Strategy::Random
        | Strategy::Heuristic
        | Strategy::Oracle
        | Strategy::FullInformation(_) => None,
    };
    PolicyResult {
        policy: r.name.clone(),
        acceptance_rate: rate(tail(&r.accepted, windows.last)),
        reliability_gain: mean(tail(&r.gains, windows.last)),
        acceptance_rate_all: rate(&r.accepted),
        cold_start_true_acceptance: mean(&r.truth[..windows.cold.min(r.truth.len())]),
        last_quarter_true_acceptance: last_quarter,
        last_quarter_oracle_ratio: last_quarter / oracle_last_quarter.max(1e-12),
        decisions_per_s,
        regret_curve: regret_curve(&r.truth, oracle_truth),
    }
}

/// The last `n` values.
fn tail<T>(values: &[T], n: usize) -> &[T] {
    &values[values.len().saturating_sub(n)..]
}

fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        0.0
    } else {
        values.iter().sum::<f64>() / values.len() as f64
    }
}

/// Σ (oracle − policy) true acceptance up to each round, at up to 200 evenly spaced rounds.
fn regret_curve(truth: &[f64], oracle: &[f64]) -> Vec<(usize, f64)> {
    let n = truth.len().min(oracle.len());
    let step = n.div_ceil(200).max(1);
    let mut total = 0.0;
    let mut curve = Vec::with_capacity(n / step + 1);
    for i in 0..n {
        total += oracle[i] - truth[i];
        if (i + 1) % step == 0 || i + 1 == n {
            curve.push((i + 1, total));
        }
    }
    curve
}

/// The round as the platform would send it, with the list arc-rec ranks.
fn peer_round(
    round: usize,
    input: &RecommendInput,
    prepared: &super::engine::Prepared,
) -> PeerRound {
    PeerRound {
        round,
        context: PeerContext {
            failures: input
                .failures
                .iter()
                .map(|f| PeerFailure {
                    category: f.failure_category.clone().unwrap_or_default(),
                    message: f.error_message.clone().unwrap_or_default(),
                    tool: f.tool_name.clone(),
                })
                .collect(),
            current_config: input.current_config.clone(),
            user_role: input.user_role.clone(),
            domain: input.domain.clone(),
        },
        candidates: prepared
            .candidates
            .iter()
            .map(|(c, _)| PeerCandidate {
                key: c.candidate_id.clone(),
                kind: c.recommendation_type.as_str().to_owned(),
                diff: c.diff.clone(),
            })
            .collect(),
    }
}

fn runner(name: &str, strategy: Strategy, seed: u64, i: usize) -> Runner {
    Runner {
        name: name.to_owned(),
        strategy,
        rng: ChaCha8Rng::seed_from_u64(seed.wrapping_mul(31).wrapping_add(i as u64 + 1)),
        accepted: Vec::new(),
        gains: Vec::new(),
        truth: Vec::new(),
        rank_time: Duration::ZERO,
    }
}

/// What arc-rec is shown of a world context: the failures, the config, the user's segment.
pub fn input_of(ctx: &Context) -> RecommendInput {
    RecommendInput {
        current_config: ctx.current_config.clone(),
        failures: ctx.failures.iter().map(FailureObservation::from).collect(),
        user_role: Some(ctx.user.role.clone()),
        domain: Some(ctx.user.domain.clone()),
        k: 1,
        ..RecommendInput::default()
    }
}

/// Test data for warm starts: a log in which people approved, in each of the first `rounds`
/// contexts of traffic seed `seed`, the generated candidate the world likes best and rejected the
/// others, 20 times over.
#[cfg(test)]
pub(crate) fn oracle_log(
    environment: &Environment,
    indexes: &HashMap<String, CandidateIndex>,
    seed: u64,
    rounds: usize,
) -> Vec<LoggedDecision> {
    let mut contexts = ChaCha8Rng::seed_from_u64(seed);
    let mut logged = Vec::new();
    for _ in 0..rounds {
        let ctx = environment.next_context(&mut contexts);
        let input = input_of(&ctx);
        let prepared = prepare(&indexes[&ctx.org], &input);
        let diffs: Vec<Value> = prepared
            .candidates
            .iter()
            .map(|(c, _)| c.diff.clone())
            .collect();
        let Some(best) = environment.best_of(&ctx, &diffs) else {
            continue;
        };
        for _ in 0..20 {
            for (i, diff) in diffs.iter().enumerate() {
                logged.push(LoggedDecision {
                    org: ctx.org.clone(),
                    id: format!("d{}", logged.len()),
                    created_at: chrono::DateTime::UNIX_EPOCH,
                    input: input.clone(),
                    diff: diff.clone(),
                    approved: i == best,
                });
            }
        }
    }
    logged
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::world::{World, WorldParams};

    /// A peer that shows the first candidate, records every list it is sent and, from round
    /// `drop_from` on, claims to have scored one candidate fewer.
    #[derive(Default)]
    struct Recorder {
        lists: Vec<Vec<String>>,
        learned: Vec<PeerFeedback>,
        /// The warm start's lists, and how many rounds had been sent when it came.
        warmed: Vec<(Vec<String>, usize)>,
        drop_from: usize,
    }

    impl PeerPolicies for Recorder {
        fn names(&self) -> Vec<String> {
            vec!["recorder".to_owned()]
        }

        fn choose(&mut self, round: &PeerRound) -> Result<Vec<PeerChoice>, String> {
            let keys: Vec<String> = round.candidates.iter().map(|c| c.key.clone()).collect();
            self.lists.push(keys.clone());
            let scored = if round.round >= self.drop_from {
                keys.len() - 1
            } else {
                keys.len()
            };
            Ok(vec![PeerChoice {
                policy: "recorder".to_owned(),
                index: 0,
                seen: keys[..scored].to_vec(),
            }])
        }

        fn learn(&mut self, feedback: &[PeerFeedback]) -> Result<(), String> {
            self.learned.extend_from_slice(feedback);
            Ok(())
        }

        fn warm(&mut self, decisions: &[PeerWarm]) -> Result<(), String> {
            for d in decisions {
                let keys = d.candidates.iter().map(|c| c.key.clone()).collect();
                self.warmed.push((keys, self.lists.len()));
            }
            Ok(())
        }

        fn seconds(&mut self) -> Result<HashMap<String, f64>, String> {
            Ok(HashMap::from([("recorder".to_owned(), 0.5)]))
        }
    }

    fn setup() -> (World, HashMap<String, CandidateIndex>, BanditBenchConfig) {
        let world = World::new(WorldParams {
            seed: 3,
            outcomes: 0,
            ..WorldParams::default()
        })
        .unwrap();
        let indexes = world
            .params()
            .orgs
            .iter()
            .map(|org| (org.clone(), CandidateIndex::empty(org)))
            .collect();
        let config = BanditBenchConfig {
            rounds: 40,
            seed: 5,
            policy_seed: 5,
            report_last: 20,
            feedback_batch: 10,
            thompson: vec![(
                "thompson".to_owned(),
                crate::recommend::features::policy_config(),
            )],
            cold_start: 8,
            full_information: false,
            warm_start: None,
        };
        (world, indexes, config)
    }

    #[test]
    fn peers_are_sent_the_lists_arc_rec_ranks_and_every_answer_in_batches() {
        let (world, indexes, config) = setup();
        let environment = Environment::new(&world);
        let mut recorder = Recorder {
            drop_from: usize::MAX,
            ..Recorder::default()
        };
        let report = run(&environment, &indexes, &config, Some(&mut recorder)).unwrap();
        // The oracle: the same contexts replayed, each list as arc-rec's engine prepares it.
        let mut contexts = ChaCha8Rng::seed_from_u64(config.seed);
        let expected: Vec<Vec<String>> = (0..config.rounds)
            .map(|_| {
                let ctx = environment.next_context(&mut contexts);
                let prepared = prepare(&indexes[&ctx.org], &input_of(&ctx));
                prepared
                    .candidates
                    .iter()
                    .map(|(c, _)| c.candidate_id.clone())
                    .collect()
            })
            .filter(|keys: &Vec<String>| !keys.is_empty())
            .collect();
        assert!(!expected.is_empty());
        assert_eq!(recorder.lists, expected);
        assert_eq!(report.peer_list_mismatches, 0);
        // Every answer reached the peer, for the pick it made, in the order of the rounds.
        assert_eq!(recorder.learned.len(), expected.len());
        assert!(recorder.learned.windows(2).all(|w| w[0].round < w[1].round));
        let peer = report
            .policies
            .iter()
            .find(|p| p.policy == "recorder")
            .unwrap();
        // Always the first candidate: the heuristic order's picks, so the same true acceptance.
        let heuristic = report
            .policies
            .iter()
            .find(|p| p.policy == "heuristic order")
            .unwrap();
        assert_eq!(
            peer.last_quarter_true_acceptance,
            heuristic.last_quarter_true_acceptance
        );
        assert_eq!(peer.decisions_per_s, Some(config.rounds as f64 / 0.5));
        let oracle = report
            .policies
            .iter()
            .find(|p| p.policy == "oracle")
            .unwrap();
        assert!((oracle.last_quarter_oracle_ratio - 1.0).abs() < 1e-12);
        assert!(oracle.regret_curve.iter().all(|&(_, r)| r.abs() < 1e-12));
        assert!(heuristic.regret_curve.last().unwrap().1 >= 0.0);
    }

    #[test]
    fn a_peer_that_scored_another_list_is_counted() {
        let (world, indexes, config) = setup();
        let environment = Environment::new(&world);
        let mut recorder = Recorder {
            drop_from: 30,
            ..Recorder::default()
        };
        let report = run(&environment, &indexes, &config, Some(&mut recorder)).unwrap();
        assert_eq!(report.peer_list_mismatches, 10);
    }

    #[test]
    fn another_policy_seed_keeps_the_contexts_and_lists() {
        let (world, indexes, config) = setup();
        let environment = Environment::new(&world);
        let lists = |policy_seed| {
            let mut recorder = Recorder {
                drop_from: usize::MAX,
                ..Recorder::default()
            };
            let config = BanditBenchConfig {
                policy_seed,
                ..config.clone()
            };
            let report = run(&environment, &indexes, &config, Some(&mut recorder)).unwrap();
            let truth = |name: &str| {
                let p = report.policies.iter().find(|p| p.policy == name).unwrap();
                (p.cold_start_true_acceptance, p.last_quarter_true_acceptance)
            };
            (
                recorder.lists,
                truth("heuristic order"),
                truth("oracle"),
                report.policy_seed,
            )
        };
        let (first, second) = (lists(5), lists(6));
        assert_eq!(first.0, second.0, "the same contexts and lists");
        assert_eq!(first.1, second.1, "the heuristic shows the same candidates");
        assert_eq!(first.2, second.2, "so does the oracle");
        assert_eq!((first.3, second.3), (5, 6));
    }

    #[test]
    fn a_warm_start_teaches_the_policies_and_the_peers_the_log_before_round_one() {
        let (world, indexes, config) = setup();
        let environment = Environment::new(&world);
        let config = BanditBenchConfig {
            rounds: 20,
            cold_start: 20,
            thompson: vec![(
                "thompson".to_owned(),
                PolicyConfig {
                    epsilon: 0.0,
                    ..crate::recommend::features::policy_config()
                },
            )],
            ..config
        };
        let mut logged = oracle_log(&environment, &indexes, config.seed, config.rounds);
        // A diff no generated candidate pulls the lever of is left out.
        let mut stray = logged[0].clone();
        stray.diff = serde_json::json!({"system_prompt": "Be brief."});
        logged.push(stray);
        // Another amount of a generated change counts, featurized as itself.
        let temperature = logged
            .iter()
            .position(|d| {
                d.diff.as_object().is_some_and(|o| o.len() == 1)
                    && d.diff.get("temperature").is_some_and(Value::is_f64)
            })
            .expect("a temperature candidate");
        let mut nudged = logged[temperature].clone();
        let t = nudged.diff["temperature"].as_f64().unwrap();
        nudged.diff = serde_json::json!({ "temperature": t + 0.01 });
        logged.push(nudged);
        let warm = warm_start(&indexes, &logged, 1.0, false);
        assert_eq!(
            (
                warm.counts.logged as usize,
                warm.counts.matched as usize,
                warm.counts.lever_matched
            ),
            (logged.len(), logged.len() - 1, 1)
        );
        let exact = &warm.decisions[temperature].candidate;
        let other = &warm.decisions[warm.decisions.len() - 1].candidate;
        assert!(
            (other[17] - exact[17] - 0.01).abs() < 1e-9,
            "its own size of change"
        );
        assert_eq!(other[..17], exact[..17], "the lever's type and statistics");
        assert_eq!(warm.decisions.len(), warm.peers.len());
        let truth = |config: &BanditBenchConfig, recorder: &mut Recorder| {
            let report = run(&environment, &indexes, config, Some(recorder)).unwrap();
            let of = |name: &str| {
                report
                    .policies
                    .iter()
                    .find(|p| p.policy == name)
                    .unwrap()
                    .cold_start_true_acceptance
            };
            (of("thompson"), of("oracle"), report.warm_start)
        };
        let mut cold = Recorder {
            drop_from: usize::MAX,
            ..Recorder::default()
        };
        let (without, oracle, reported) = truth(&config, &mut cold);
        assert!(cold.warmed.is_empty());
        assert_eq!(reported, None);
        let warmed_config = BanditBenchConfig {
            warm_start: Some(warm.clone()),
            ..config.clone()
        };
        let mut recorder = Recorder {
            drop_from: usize::MAX,
            ..Recorder::default()
        };
        let (with, _, reported) = truth(&warmed_config, &mut recorder);
        assert_eq!(
            reported,
            Some(WarmStartSummary {
                weight: 1.0,
                by_age: false,
                counts: WarmStartCounts {
                    logged: logged.len() as u64,
                    matched: logged.len() as u64 - 1,
                    lever_matched: 1,
                },
            })
        );
        assert!(
            with > without && with >= 0.95 * oracle,
            "warm {with}, cold {without}, oracle {oracle}"
        );
        // The peers got every matched decision, with its list, before the first round.
        assert_eq!(recorder.warmed.len(), warm.decisions.len());
        assert!(recorder.warmed.iter().all(|(_, sent)| *sent == 0));
        assert_eq!(recorder.warmed[0].0, recorder.lists[0]);
    }

    #[test]
    fn a_warm_start_weight_and_a_decision_s_age_are_half_life_decays() {
        let config = crate::recommend::features::policy_config();
        let h = config.half_life_s.unwrap();
        let warm = |weight| WarmStart {
            weight,
            decisions: vec![
                WarmDecision {
                    context: vec![0.0],
                    candidate: vec![0.0],
                    approved: true,
                    age_s: 0.0,
                },
                WarmDecision {
                    context: vec![0.0],
                    candidate: vec![0.0],
                    approved: false,
                    age_s: h,
                },
            ],
            ..WarmStart::default()
        };
        let t = warm(0.25).observations(&config).unwrap()[0].timestamp_s;
        assert!((t / h - -2.0).abs() < 1e-12);
        let at = |w: f64| -> Vec<f64> {
            warm(w)
                .observations(&config)
                .unwrap()
                .iter()
                .map(|o| o.timestamp_s)
                .collect()
        };
        assert_eq!(
            at(1.0),
            [0.0, -h],
            "a decision a half-life older counts half"
        );
        for bad in [0.0, -0.5, 1.5, f64::NAN] {
            assert!(matches!(
                warm(bad).observations(&config),
                Err(BanditBenchError::WarmWeight(_))
            ));
        }
        let no_half_life = PolicyConfig {
            half_life_s: None,
            ..config
        };
        assert!(warm(0.5).observations(&no_half_life).is_err());
        assert!(warm(1.0).observations(&no_half_life).is_ok());
    }

    #[test]
    fn regret_accumulates_the_oracle_gap_at_up_to_200_points() {
        let oracle = vec![1.0; 1000];
        let policy = vec![0.5; 1000];
        let curve = regret_curve(&policy, &oracle);
        assert_eq!(curve.len(), 200);
        assert_eq!(curve[0], (5, 2.5));
        assert_eq!(curve.last().copied(), Some((1000, 500.0)));
    }
}
