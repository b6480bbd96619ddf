//! Off-policy evaluation of the recommendation log: how often would the top recommendation have
//! been accepted under another policy, estimated from decisions the Thompson sampler logged
//! (IPS and SNIPS with the logged position-0 propensities, bootstrap intervals, effective
//! sample size).
//!
//! Target policies are the ones analysts ask about and that can be recomputed from what the log
//! holds (the full candidate set of every decision).

use bandit::{BootstrapConfig, LoggedRecord, OpeReport};

use crate::domain::RecommendationType;
use crate::recommend::candidate_log::{LoggedCandidate, decode_stored};
use crate::storage::analytics::LoggedTop;

/// One logged decision, reduced to its top position.
#[derive(Debug, Clone, PartialEq)]
pub struct LoggedDecision {
    /// Every candidate considered, in generation order.
    pub candidates: Vec<LoggedCandidate>,
    /// The candidate shown first.
    pub shown: String,
    /// The logging policy's probability of showing it first.
    pub propensity: f64,
    /// Whether it was accepted (or applied).
    pub accepted: bool,
}

/// A policy to evaluate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetPolicy {
    /// The heuristics' own order: the highest expected reliability gain first.
    Heuristic,
    /// The cheapest change first.
    LowestCost,
    /// A uniformly random candidate.
    Uniform,
    /// The first candidate of this type (the heuristic choice when there is none).
    Type(RecommendationType),
}

impl TargetPolicy {
    /// Parses `heuristic`, `lowest_cost`, `uniform` or `type:<recommendation type>`.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "heuristic" => Some(Self::Heuristic),
            "lowest_cost" => Some(Self::LowestCost),
            "uniform" => Some(Self::Uniform),
            other => other
                .strip_prefix("type:")
                .and_then(RecommendationType::parse)
                .map(Self::Type),
        }
    }

    /// The probability this policy shows `candidate_id` first among `candidates`.
    pub fn probability(self, candidates: &[LoggedCandidate], candidate_id: &str) -> f64 {
        if candidates.is_empty() {
            return 0.0;
        }
        let pick = match self {
            Self::Uniform => {
                let present = candidates.iter().any(|c| c.candidate_id == candidate_id);
                return if present {
                    1.0 / candidates.len() as f64
                } else {
                    0.0
                };
            }
            Self::Heuristic => candidates.first(),
            Self::LowestCost => candidates.iter().min_by(|a, b| {
                a.expected_cost_delta_usd
                    .total_cmp(&b.expected_cost_delta_usd)
            }),
            Self::Type(kind) => candidates
                .iter()
                .find(|c| c.kind == kind)
                .or(candidates.first()),
        };
        f64::from(u8::from(
            pick.is_some_and(|c| c.candidate_id == candidate_id),
        ))
    }
}

/// The log's position-0 rows as decisions to evaluate. A candidate set that cannot be read
/// leaves its decision out (logged once per row, not failing the estimate of all the others).
pub fn decisions_of(rows: Vec<LoggedTop>) -> Vec<LoggedDecision> {
    rows.into_iter()
        .filter_map(|row| {
            let candidates = decode_stored(row.candidate_set.as_deref(), row.candidates)
                .inspect_err(|e| tracing::warn!(error = %e, "unreadable logged candidate set"))
                .ok()?;
            Some(LoggedDecision {
                candidates,
                shown: format!("c-{}", row.recommendation_id.trim_start_matches("r-")),
                propensity: row.propensity,
                accepted: row.accepted,
            })
        })
        .collect()
}

/// Estimates the target policy's top-1 acceptance rate from the log.
pub fn evaluate(
    log: &[LoggedDecision],
    target: TargetPolicy,
    config: &BootstrapConfig,
) -> bandit::Result<OpeReport> {
    let records: Vec<LoggedRecord> = log
        .iter()
        .map(|d| LoggedRecord {
            reward: f64::from(u8::from(d.accepted)),
            logging_propensity: d.propensity,
            target_probability: target.probability(&d.candidates, &d.shown),
        })
        .collect();
    bandit::ope::evaluate(&records, config)
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;
    use crate::candidates::CandidateIndex;
    use crate::recommend::benchmark::input_of;
    use crate::recommend::engine::{Evidence, prepare, rank};
    use crate::recommend::features::{layout, policy_config};
    use crate::world::{Environment, World, WorldParams};

    #[test]
    fn policies_parse_and_assign_probabilities() {
        let candidates: Vec<LoggedCandidate> = [
            ("a", "retry_policy", 0.2, 0.01),
            ("b", "temperature", 0.1, 0.0),
        ]
        .iter()
        .map(|(id, kind, r, c)| LoggedCandidate {
            candidate_id: (*id).into(),
            kind: RecommendationType::parse(kind).unwrap(),
            expected_reliability_delta: *r,
            expected_cost_delta_usd: *c,
        })
        .collect();
        assert_eq!(
            TargetPolicy::parse("heuristic")
                .unwrap()
                .probability(&candidates, "a"),
            1.0
        );
        assert_eq!(
            TargetPolicy::parse("lowest_cost")
                .unwrap()
                .probability(&candidates, "b"),
            1.0
        );
        assert_eq!(
            TargetPolicy::parse("uniform")
                .unwrap()
                .probability(&candidates, "b"),
            0.5
        );
        assert_eq!(
            TargetPolicy::parse("type:temperature")
                .unwrap()
                .probability(&candidates, "b"),
            1.0
        );
        assert_eq!(
            TargetPolicy::parse("type:model_switch")
                .unwrap()
                .probability(&candidates, "a"),
            1.0
        );
        assert!(TargetPolicy::parse("type:nonsense").is_none());
        assert!(TargetPolicy::parse("best").is_none());
    }

    /// Log decisions under Thompson sampling in the synthetic world, then estimate another
    /// policy's acceptance rate off-line: the truth (its mean acceptance probability on the same
    /// contexts) must fall inside the SNIPS interval.
    #[test]
    fn snips_of_another_policy_covers_its_true_rate() {
        let world = World::new(WorldParams {
            seed: 11,
            outcomes: 0,
            ..WorldParams::default()
        })
        .unwrap();
        let environment = Environment::new(&world);
        let index = CandidateIndex::empty("acme");
        let mut policy = bandit::ThompsonPolicy::new(layout(), policy_config()).unwrap();
        policy.refresh_bank_seeded(1);
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let mut log = Vec::new();
        let mut truth = Vec::new();
        let target = TargetPolicy::Type(RecommendationType::RetryPolicy);
        for round in 0..3000 {
            let ctx = environment.next_context(&mut rng);
            let prepared = prepare(&index, &input_of(&ctx));
            if prepared.candidates.is_empty() {
                continue;
            }
            let candidates: Vec<LoggedCandidate> = prepared
                .candidates
                .iter()
                .map(|(c, _)| LoggedCandidate {
                    candidate_id: c.candidate_id.clone(),
                    kind: c.recommendation_type,
                    expected_reliability_delta: c.expected_reliability_delta,
                    expected_cost_delta_usd: c.expected_cost_delta_usd,
                })
                .collect();
            // The truth: the target's choice, scored by the world's acceptance model.
            let chosen = prepared
                .candidates
                .iter()
                .find(|(c, _)| target.probability(&candidates, &c.candidate_id) == 1.0)
                .map(|(c, _)| c.diff.clone());
            truth.push(chosen.map_or(0.0, |diff| environment.acceptance_probability(&ctx, &diff)));
            let output = rank(
                &policy,
                prepared,
                1,
                rng.random(),
                &Evidence::default(),
                None,
            )
            .unwrap();
            let shown = &output.shown[0];
            let feedback = environment.feedback(&ctx, &shown.candidate.diff, &mut rng);
            let observation = bandit::Observation::binary(
                format!("{round}"),
                round as f64,
                output.context.clone(),
                shown.features.clone(),
                feedback.accepted,
            );
            policy.update(&observation).unwrap();
            if round % 50 == 49 {
                policy.refresh_bank_seeded(round);
            }
            log.push(LoggedDecision {
                candidates,
                shown: shown.candidate.candidate_id.clone(),
                propensity: shown.item.propensity,
                accepted: feedback.accepted,
            });
        }
        let true_rate = truth.iter().sum::<f64>() / truth.len() as f64;
        let report = evaluate(
            &log,
            target,
            &BootstrapConfig {
                resamples: 500,
                level: 0.95,
                seed: 3,
            },
        )
        .unwrap();
        assert!(
            report.snips.lower <= true_rate && true_rate <= report.snips.upper,
            "true {true_rate:.3} outside SNIPS [{:.3}, {:.3}] (estimate {:.3}, ESS {:.0})",
            report.snips.lower,
            report.snips.upper,
            report.snips.estimate,
            report.effective_sample_size
        );
        assert!(
            report.effective_sample_size > 50.0,
            "ESS {}",
            report.effective_sample_size
        );
    }
}
