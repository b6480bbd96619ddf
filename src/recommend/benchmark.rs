//! `arc-rec bench bandit`: policies against the synthetic world's hidden truth.
//!
//! Every policy sees the same sequence of failure contexts and the same candidate sets (arc-rec's
//! own heuristics over the world's history); people's answers come from the world's acceptance
//! model with a random stream per policy. Thompson sampling learns from its own feedback only,
//! delivered in batches (as a service gets it) after which its posterior draws are refreshed.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bandit::{Observation, PolicyConfig, ThompsonPolicy};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::engine::{RecommendError, RecommendInput, no_evidence, prepare, rank};
use super::features::layout;
use crate::candidates::{CandidateIndex, FailureObservation};
use crate::world::{Context, Environment};

/// How to run the benchmark.
#[derive(Debug, Clone)]
pub struct BanditBenchConfig {
    pub rounds: usize,
    pub seed: u64,
    /// Rounds whose results are reported (the last ones: what the policy learned).
    pub report_last: usize,
    /// Feedback is applied (and the posterior bank refreshed) every this many rounds.
    pub feedback_batch: usize,
    /// Thompson-sampling variants to run, by name.
    pub thompson: Vec<(String, PolicyConfig)>,
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
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct BanditBenchReport {
    pub rounds: usize,
    pub reported_rounds: usize,
    pub seed: u64,
    pub mean_candidates: f64,
    pub policies: Vec<PolicyResult>,
    /// Rankings per second of the first Thompson variant alone (rank calls only).
    pub thompson_decisions_per_s: f64,
}

enum Strategy {
    Thompson {
        policy: Box<ThompsonPolicy>,
        pending: Vec<Observation>,
    },
    Random,
    Heuristic,
    Oracle,
}

struct Runner {
    name: String,
    strategy: Strategy,
    rng: ChaCha8Rng,
    accepted: Vec<bool>,
    gains: Vec<f64>,
    rank_time: Duration,
}

/// Runs the benchmark; `indexes` holds each organization's candidate statistics.
pub fn run(
    environment: &Environment,
    indexes: &HashMap<String, CandidateIndex>,
    config: &BanditBenchConfig,
) -> Result<BanditBenchReport, RecommendError> {
    let mut runners = Vec::new();
    for (i, (name, policy_config)) in config.thompson.iter().enumerate() {
        let mut policy = ThompsonPolicy::new(layout(), *policy_config)?;
        policy.refresh_bank_seeded(config.seed ^ 0x5eed);
        runners.push(runner(
            name,
            Strategy::Thompson {
                policy: Box::new(policy),
                pending: vec![],
            },
            config.seed,
            i,
        ));
    }
    let base = runners.len();
    runners.push(runner(
        "uniform random",
        Strategy::Random,
        config.seed,
        base,
    ));
    runners.push(runner(
        "heuristic order",
        Strategy::Heuristic,
        config.seed,
        base + 1,
    ));
    runners.push(runner("oracle", Strategy::Oracle, config.seed, base + 2));

    let mut contexts = ChaCha8Rng::seed_from_u64(config.seed);
    let mut candidate_total = 0usize;
    for round in 0..config.rounds {
        let ctx = environment.next_context(&mut contexts);
        let Some(index) = indexes.get(&ctx.org) else {
            continue;
        };
        let input = input_of(&ctx);
        let prepared = prepare(index, &input);
        let diffs: Vec<_> = prepared
            .candidates
            .iter()
            .map(|(c, _)| c.diff.clone())
            .collect();
        candidate_total += diffs.len();
        for r in &mut runners {
            let started = Instant::now();
            let (choice, features) = match &mut r.strategy {
                Strategy::Thompson { policy, .. } => {
                    let output = rank(
                        policy,
                        prepared.clone(),
                        input.k,
                        r.rng.random(),
                        no_evidence,
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
                    environment.best_of(&ctx, &diffs).map(|i| diffs[i].clone()),
                    None,
                ),
                Strategy::Random => (None, None),
            };
            r.rank_time += started.elapsed();
            let Some(diff) = choice else {
                r.accepted.push(false);
                r.gains.push(0.0);
                continue;
            };
            let feedback = environment.feedback(&ctx, &diff, &mut r.rng);
            r.accepted.push(feedback.accepted);
            r.gains.push(if feedback.accepted {
                feedback.reliability_delta
            } else {
                0.0
            });
            if let (Strategy::Thompson { policy, pending }, Some((z, c))) =
                (&mut r.strategy, features)
            {
                pending.push(Observation::binary(
                    format!("{round}"),
                    round as f64 * 60.0,
                    z,
                    c,
                    feedback.accepted,
                ));
                if pending.len() >= config.feedback_batch {
                    for observation in pending.drain(..) {
                        policy.update(&observation)?;
                    }
                    policy.refresh_bank_seeded(config.seed.wrapping_add(round as u64));
                }
            }
        }
    }
    let last = config.report_last.min(config.rounds);
    let policies = runners
        .iter()
        .map(|r| {
            let tail = r.accepted.len().saturating_sub(last);
            let mean = |xs: &[f64]| {
                if xs.is_empty() {
                    0.0
                } else {
                    xs.iter().sum::<f64>() / xs.len() as f64
                }
            };
            let rate = |xs: &[bool]| {
                mean(
                    &xs.iter()
                        .map(|a| f64::from(u8::from(*a)))
                        .collect::<Vec<_>>(),
                )
            };
            PolicyResult {
                policy: r.name.clone(),
                acceptance_rate: rate(&r.accepted[tail..]),
                reliability_gain: mean(&r.gains[tail..]),
                acceptance_rate_all: rate(&r.accepted),
            }
        })
        .collect();
    let thompson_decisions_per_s = runners
        .first()
        .filter(|r| matches!(r.strategy, Strategy::Thompson { .. }))
        .map_or(0.0, |r| {
            r.accepted.len() as f64 / r.rank_time.as_secs_f64().max(1e-9)
        });
    Ok(BanditBenchReport {
        rounds: config.rounds,
        reported_rounds: last,
        seed: config.seed,
        mean_candidates: candidate_total as f64 / config.rounds.max(1) as f64,
        policies,
        thompson_decisions_per_s,
    })
}

fn runner(name: &str, strategy: Strategy, seed: u64, i: usize) -> Runner {
    Runner {
        name: name.to_owned(),
        strategy,
        rng: ChaCha8Rng::seed_from_u64(seed.wrapping_mul(31).wrapping_add(i as u64 + 1)),
        accepted: Vec::new(),
        gains: Vec::new(),
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
