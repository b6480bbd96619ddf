//! Graders: the reward of one completion for one prompt, by the platform plan's simple binary
//! rule (+1 accepted, −1 rejected, −1 for a completion that is not a well-formed
//! recommendation, optionally +0.1 for a well-formed one).
//!
//! - [`Grader::Logged`]: accepted means an exact canonical match with a diff people approved in
//!   that context; anything else (rejected there, or never proposed) counts as rejected. Logged
//!   data only grades what someone once proposed.
//! - [`Grader::World`]: the synthetic world's hidden truth: the configuration owner accepts with
//!   the world's acceptance probability (drawn per verdict from a seeded stream, so equal answers
//!   in one group get one verdict), and the verdict carries that probability and the diff's
//!   true reliability gain, which is how evaluation measures real quality. The world judges the
//!   completion's minimal patch (what it actually changes), the same thing the verdict's draw is
//!   keyed by, so two completions with one canonical answer always get one probability. With
//!   [`WorldReward::Expected`] the reward is the verdict's expectation instead of its draw,
//!   `p·(+1) + (1 − p)·(−1)`: the same objective in expectation with none of the draw's noise, for
//!   measuring how much of RL's difficulty is that noise (the `accepted` flag, and so every
//!   pass@k figure, still comes from the draw).
//! - [`Grader::Learned`]: a reward model fitted on the logged approvals and rejections
//!   (`rft::learned_grader`), for real data: the owner accepts with its pessimistic probability
//!   σ(μ − κ·s), drawn or in expectation as `--world-reward` says. When the data comes from a
//!   world, that world's truth rides along in the verdict (never in the reward), so a run can
//!   show its learned reward against true acceptance.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::completion::{FormatError, parse_recommendation};
use super::dataset::RftPrompt;
use super::learned_grader::{LearnedGrader, LearnedGraderError};
use super::world_truths::{WorldTruthError, WorldTruths};
use crate::export::rewards::{ACCEPTED, FORMAT_VALID, REJECTED};
use crate::world::WorldParams;

/// Where verdicts come from (`--grader`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum GraderKind {
    /// Exact (canonical) matches with past approved diffs of the same context.
    Logged,
    /// The synthetic world's ground truth (the data must come from that world).
    World,
    /// A reward model fitted on the logged approvals and rejections of the train split.
    Learned,
}

impl GraderKind {
    /// The `--grader` value.
    pub fn as_str(self) -> &'static str {
        match self {
            GraderKind::Logged => "logged",
            GraderKind::World => "world",
            GraderKind::Learned => "learned",
        }
    }
}

/// `--world-reward`: what the world and learned graders' reward is made of.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum WorldReward {
    /// The plan's binary reward of one acceptance draw: +1 accepted, −1 rejected.
    #[default]
    Sampled,
    /// Its expectation under the acceptance probability p (the world's true one, the learned
    /// grader's lower bound): 2p − 1.
    Expected,
}

/// What a grader says about one completion.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    /// The RL reward.
    pub reward: f64,
    /// Whether the completion is a well-formed recommendation.
    pub format_valid: bool,
    /// Why not, when it is not ([`FormatError::kind`]).
    pub format_error: Option<&'static str>,
    /// The parser's message saying where, when it is not (e.g. the field and the rule broken),
    /// and the completion (its first 400 characters).
    pub format_error_message: Option<String>,
    /// The canonical answer (majority voting's key); `None` when not well formed.
    pub answer: Option<String>,
    /// Whether the recommendation counts as accepted.
    pub accepted: bool,
    /// Data from a world (the world grader, or its truth beside a learned grader): the true
    /// probability that the owner accepts it.
    pub acceptance_probability: Option<f64>,
    /// Data from a world: the true change in expected reliability if applied.
    pub reliability_gain: Option<f64>,
    /// Learned only: the reward model's posterior-mean acceptance probability σ(μ).
    pub learned_probability: Option<f64>,
    /// Learned only: its pessimistic probability σ(μ − κ·s), which the reward is made of.
    pub learned_lower_bound: Option<f64>,
}

/// A grader that cannot be built for a data set.
#[derive(Debug, thiserror::Error)]
pub enum GraderError {
    #[error(
        "--grader world: the data does not fit the world (give the --world-seed and --world-outcomes the data was simulated with; for a platform's own data, --grader learned)"
    )]
    World(#[from] WorldTruthError),
    #[error(transparent)]
    Learned(#[from] LearnedGraderError),
    #[error(
        "--grader learned: the run has no fitted grader (grader.json); it trained with another --grader"
    )]
    NoLearnedModel,
}

/// Grades completions.
#[derive(Debug, Clone)]
pub struct Grader {
    /// +0.1 for a well-formed recommendation.
    format_bonus: bool,
    source: Source,
}

#[derive(Debug, Clone)]
enum Source {
    Logged,
    World {
        truths: WorldTruths,
        reward: WorldReward,
    },
    Learned {
        model: std::sync::Arc<LearnedGrader>,
        reward: WorldReward,
        /// The world the data came from, when it came from one: true acceptance for the
        /// verdict, never for the reward.
        shadow: Option<WorldTruths>,
    },
}

impl Grader {
    /// The logged-data grader.
    pub fn logged(format_bonus: bool) -> Self {
        Grader {
            format_bonus,
            source: Source::Logged,
        }
    }

    /// The world grader for `prompts`, whose configurations must all be in the world `params`
    /// draws.
    pub fn world<'a>(
        params: WorldParams,
        prompts: impl IntoIterator<Item = &'a RftPrompt>,
        reward: WorldReward,
        format_bonus: bool,
    ) -> Result<Self, GraderError> {
        let truths = WorldTruths::new(params, prompts)?;
        Ok(Grader {
            format_bonus,
            source: Source::World { truths, reward },
        })
    }

    /// The learned grader `model` for `prompts` (every one's organization must be in it). With
    /// `shadow`, the world the data came from, verdicts also carry true acceptance.
    pub fn learned<'a>(
        model: std::sync::Arc<LearnedGrader>,
        prompts: impl IntoIterator<Item = &'a RftPrompt>,
        shadow: Option<WorldTruths>,
        reward: WorldReward,
        format_bonus: bool,
    ) -> Result<Self, GraderError> {
        model.check_orgs(prompts)?;
        Ok(Grader {
            format_bonus,
            source: Source::Learned {
                model,
                reward,
                shadow,
            },
        })
    }

    /// The world's truths this grader judges with (`None` for the logged grader), or that ride
    /// along in a learned grader's verdicts.
    pub fn world_truths(&self) -> Option<&WorldTruths> {
        match &self.source {
            Source::World { truths, .. } => Some(truths),
            Source::Learned { shadow, .. } => shadow.as_ref(),
            Source::Logged => None,
        }
    }

    pub fn kind(&self) -> GraderKind {
        match self.source {
            Source::Logged => GraderKind::Logged,
            Source::World { .. } => GraderKind::World,
            Source::Learned { .. } => GraderKind::Learned,
        }
    }

    /// Grades `completion` for `prompt`. `draw` keys the world's acceptance draw (the trainer
    /// passes its seed and step): the same key, prompt and answer give the same verdict.
    pub fn grade(&self, prompt: &RftPrompt, completion: &str, draw: u64) -> Verdict {
        let parsed = match parse_recommendation(completion, &prompt.current_config) {
            Ok(parsed) => parsed,
            Err(err) => return invalid(&err, completion),
        };
        let truth = self.world_truths().and_then(|truths| {
            match (
                truths.acceptance_probability(prompt, &parsed.patch),
                truths.effect(prompt, &parsed.patch),
            ) {
                (Ok(probability), Ok(effect)) => Some((probability, effect.reliability_delta)),
                // `Grader::world` checked its prompts; one it never saw gets no credit.
                _ => None,
            }
        });
        let (acceptance_probability, reliability_gain) = truth.unzip();
        let learned = match &self.source {
            Source::Learned { model, .. } => model.score(prompt, &parsed.patch).ok(),
            Source::Logged | Source::World { .. } => None,
        };
        // The probability the verdict's draw and expected reward use.
        let (probability, reward) = match &self.source {
            Source::Logged => (None, WorldReward::Sampled),
            Source::World { reward, .. } => (acceptance_probability, *reward),
            Source::Learned { reward, .. } => (learned.map(|l| l.lower_bound), *reward),
        };
        let accepted = match (&self.source, probability) {
            (Source::Logged, _) => prompt
                .logged
                .get(&parsed.canonical)
                .is_some_and(|v| v.accepted()),
            (_, Some(p)) => verdict_rng(draw, &prompt.id, &parsed.canonical).random::<f64>() < p,
            (_, None) => false,
        };
        let base = match (reward, probability) {
            (WorldReward::Expected, Some(p)) => p * ACCEPTED + (1.0 - p) * REJECTED,
            _ if accepted => ACCEPTED,
            _ => REJECTED,
        };
        Verdict {
            reward: base + if self.format_bonus { FORMAT_VALID } else { 0.0 },
            format_valid: true,
            format_error: None,
            format_error_message: None,
            answer: Some(parsed.canonical),
            accepted,
            acceptance_probability,
            reliability_gain,
            learned_probability: learned.map(|l| l.probability),
            learned_lower_bound: learned.map(|l| l.lower_bound),
        }
    }
}

/// Longest part of a malformed completion a verdict quotes, in characters.
const QUOTED_CHARS: usize = 400;

fn invalid(err: &FormatError, completion: &str) -> Verdict {
    let mut quoted: String = completion.chars().take(QUOTED_CHARS).collect();
    if quoted.len() < completion.len() {
        quoted.push('…');
    }
    Verdict {
        reward: REJECTED,
        format_valid: false,
        format_error: Some(err.kind()),
        format_error_message: Some(format!("{err}, in {quoted:?}")),
        answer: None,
        accepted: false,
        acceptance_probability: None,
        reliability_gain: None,
        learned_probability: None,
        learned_lower_bound: None,
    }
}

/// A generator seeded by (key, prompt, answer), so a verdict depends on nothing else.
fn verdict_rng(draw: u64, prompt: &str, answer: &str) -> ChaCha8Rng {
    let digest = Sha256::new()
        .chain_update(draw.to_le_bytes())
        .chain_update(prompt.as_bytes())
        .chain_update([0])
        .chain_update(answer.as_bytes())
        .finalize();
    let mut seed = [0u8; 32];
    seed.copy_from_slice(&digest);
    ChaCha8Rng::from_seed(seed)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::{Value, json};

    use super::*;
    use crate::export::Split;
    use crate::rft::dataset::LoggedVerdicts;
    use crate::world::World;

    fn prompt(config_id: &str, current: Value) -> RftPrompt {
        let mut logged = BTreeMap::new();
        logged.insert(
            r#"{"retry":{"max_attempts":3}}"#.to_owned(),
            LoggedVerdicts {
                approved: 2,
                rejected: 0,
            },
        );
        logged.insert(
            r#"{"temperature":1.5}"#.to_owned(),
            LoggedVerdicts {
                approved: 0,
                rejected: 1,
            },
        );
        RftPrompt {
            id: format!("acme/{config_id}/1"),
            org: "acme".into(),
            config_id: config_id.into(),
            split: Split::Train,
            user_turn: "x".into(),
            current_config: current,
            logged,
            accepted_completions: Vec::new(),
            logged_completions: Default::default(),
            cluster: None,
            facts: Default::default(),
        }
    }

    fn config() -> Value {
        json!({"model": "openai/gpt-4o-mini", "temperature": 0.7, "retry": {"max_attempts": 1}})
    }

    #[test]
    fn logged_grader_rewards_approved_matches_only() {
        let grader = Grader::logged(false);
        let p = prompt("c1", config());
        let approved =
            r#"{"type":"retry_policy","diff":{"retry":{"max_attempts":3}},"rationale":"Retry."}"#;
        let verdict = grader.grade(&p, approved, 0);
        assert_eq!(verdict.reward, 1.0);
        assert!(verdict.accepted && verdict.format_valid);
        let rejected = r#"{"type":"temperature","diff":{"temperature":1.5},"rationale":"Hotter."}"#;
        assert_eq!(grader.grade(&p, rejected, 0).reward, -1.0);
        let unseen = r#"{"type":"temperature","diff":{"temperature":0.2},"rationale":"Cooler."}"#;
        let verdict = grader.grade(&p, unseen, 0);
        assert_eq!((verdict.reward, verdict.format_valid), (-1.0, true));
        let garbage = grader.grade(&p, "{\"type\": \"retry", 0);
        assert_eq!(garbage.reward, -1.0);
        assert_eq!(garbage.format_error, Some("not_json"));
        assert_eq!(garbage.answer, None);
    }

    #[test]
    fn the_format_bonus_goes_to_well_formed_completions_only() {
        let grader = Grader::logged(true);
        let p = prompt("c1", config());
        let unseen = r#"{"type":"temperature","diff":{"temperature":0.2},"rationale":"Cooler."}"#;
        assert!((grader.grade(&p, unseen, 0).reward - (-0.9)).abs() < 1e-12);
        assert_eq!(grader.grade(&p, "nonsense", 0).reward, -1.0);
        let approved =
            r#"{"type":"retry_policy","diff":{"retry":{"max_attempts":3}},"rationale":"Retry."}"#;
        assert!((grader.grade(&p, approved, 0).reward - 1.1).abs() < 1e-12);
    }

    #[test]
    fn world_grader_uses_the_hidden_truth() {
        let params = WorldParams {
            seed: 3,
            outcomes: 400,
            ..WorldParams::default()
        };
        let world = World::new(params.clone()).unwrap();
        let truth = world.config_truths().next().unwrap();
        let p = prompt(&truth.config_id, truth.initial_config.clone());
        let grader = Grader::world(params.clone(), [&p], WorldReward::Sampled, false).unwrap();
        let completion = r#"{"type":"retry_policy","diff":{"retry":{"max_attempts":3,"backoff_s":2}},"rationale":"Retry."}"#;
        let verdict = grader.grade(&p, completion, 7);
        let probability = verdict.acceptance_probability.unwrap();
        assert!((0.01..=0.82).contains(&probability), "{probability}");
        assert!(verdict.reliability_gain.is_some());
        assert_eq!(verdict.reward, if verdict.accepted { 1.0 } else { -1.0 });
        // Deterministic per key; over many keys the acceptance rate is the probability.
        assert_eq!(grader.grade(&p, completion, 7), verdict);
        let accepted = (0..4000)
            .filter(|&key| grader.grade(&p, completion, key).accepted)
            .count() as f64
            / 4000.0;
        assert!(
            (accepted - probability).abs() < 0.03,
            "{accepted} vs {probability}"
        );

        // The expected reward is the draw's expectation, the same for every key; the verdict
        // itself is still drawn.
        let expected = Grader::world(params.clone(), [&p], WorldReward::Expected, true).unwrap();
        let smooth = expected.grade(&p, completion, 7);
        assert!((smooth.reward - (2.0 * probability - 1.0 + 0.1)).abs() < 1e-12);
        assert_eq!(smooth.accepted, verdict.accepted);
        assert_eq!(expected.grade(&p, completion, 8).reward, smooth.reward);
        assert_eq!(expected.grade(&p, "nonsense", 7).reward, -1.0);

        let stranger = prompt("not-a-config", config());
        // The CLI prints the chain (`{:#}`): the advice, then the unknown configuration once.
        let err = anyhow::Error::from(
            Grader::world(params, [&stranger], WorldReward::Sampled, false).unwrap_err(),
        );
        let err = format!("{err:#}");
        assert!(
            err.contains("--world-seed")
                && err.contains("configuration not-a-config")
                && err.matches("is not in the world").count() == 1,
            "{err}"
        );
    }

    /// The learned grader rewards its pessimistic probability (drawn or in expectation), and a
    /// world the data came from rides along in the verdict without touching the reward.
    #[test]
    fn learned_grader_rewards_its_lower_bound_and_shows_the_world_beside() {
        use crate::candidates::CandidateIndex;
        use crate::rft::dataset::LoggedDecision;

        let params = WorldParams {
            seed: 3,
            outcomes: 400,
            ..WorldParams::default()
        };
        let world = World::new(params.clone()).unwrap();
        let prompts: Vec<RftPrompt> = world
            .config_truths()
            .take(10)
            .map(|truth| {
                let mut p = prompt(&truth.config_id, truth.initial_config.clone());
                p.facts.decisions = (0..6)
                    .map(|i| LoggedDecision {
                        diff: json!({"retry": {"max_attempts": 3, "backoff_s": 2}}),
                        approved: i % 3 != 0,
                        served: None,
                    })
                    .collect();
                p
            })
            .collect();
        let model = std::sync::Arc::new(
            LearnedGrader::fit(
                &prompts,
                vec![CandidateIndex::empty("acme")],
                BTreeMap::new(),
                crate::rft::learned_grader::Pessimism::default(),
                "sha".into(),
            )
            .unwrap(),
        );
        let p = &prompts[0];
        let completion = r#"{"type":"retry_policy","diff":{"retry":{"max_attempts":3,"backoff_s":2}},"rationale":"Retry."}"#;
        assert!(Grader::logged(false).grade(p, completion, 0).format_valid);
        let shadow = WorldTruths::new(params, &prompts).unwrap();
        let expected = Grader::learned(
            model.clone(),
            &prompts,
            Some(shadow),
            WorldReward::Expected,
            true,
        )
        .unwrap();
        assert_eq!(expected.kind(), GraderKind::Learned);
        let verdict = expected.grade(p, completion, 7);
        let (mean, bound) = (
            verdict.learned_probability.unwrap(),
            verdict.learned_lower_bound.unwrap(),
        );
        assert!(bound < mean && mean > 0.5, "{mean} {bound}");
        assert!((verdict.reward - (2.0 * bound - 1.0 + 0.1)).abs() < 1e-12);
        assert!(verdict.acceptance_probability.is_some() && verdict.reliability_gain.is_some());
        // The change is judged, not its label: another declared type, one verdict.
        let relabelled = completion.replace("retry_policy", "balanced");
        assert_eq!(expected.grade(p, &relabelled, 7), verdict);

        let sampled =
            Grader::learned(model.clone(), &prompts, None, WorldReward::Sampled, false).unwrap();
        let drawn = sampled.grade(p, completion, 7);
        assert_eq!(drawn.reward, if drawn.accepted { 1.0 } else { -1.0 });
        assert_eq!(drawn.acceptance_probability, None);
        assert_eq!(sampled.grade(p, completion, 7), drawn);
        let rate = (0..4000)
            .filter(|&key| sampled.grade(p, completion, key).accepted)
            .count() as f64
            / 4000.0;
        assert!((rate - bound).abs() < 0.03, "{rate} vs {bound}");
        assert_eq!(sampled.grade(p, "nonsense", 7).learned_probability, None);

        let mut stranger = prompt("c9", config());
        stranger.org = "globex".into();
        let err = Grader::learned(model, [&stranger], None, WorldReward::Sampled, false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"globex\""), "{err}");
    }

    /// A diff that restates a current value has the same effect, canonical answer, probability
    /// and reward as the minimal one: the world judges what a completion changes, not how it is
    /// written (graded on the raw diff, 499 of 627 padded completions moved p, and `--objective
    /// majority` failed on answers that were equal but rewarded differently).
    #[test]
    fn world_grader_judges_the_minimal_patch() {
        let params = WorldParams {
            seed: 3,
            outcomes: 400,
            ..WorldParams::default()
        };
        let world = World::new(params.clone()).unwrap();
        let grader_prompts: Vec<RftPrompt> = world
            .config_truths()
            .take(20)
            .map(|truth| prompt(&truth.config_id, truth.initial_config.clone()))
            .collect();
        let grader = Grader::world(params, &grader_prompts, WorldReward::Expected, false).unwrap();
        let mut compared = 0;
        for p in &grader_prompts {
            let current = &p.current_config;
            let minimal = json!({"temperature": 0.05});
            let mut padded = minimal.clone();
            for key in ["model", "retry", "tools", "max_tokens", "timeout_s"] {
                if let Some(value) = current.get(key) {
                    padded[key] = value.clone();
                }
            }
            let completion = |diff: &Value| {
                json!({"type": "temperature", "diff": diff, "rationale": "Cooler."}).to_string()
            };
            let plain = grader.grade(p, &completion(&minimal), 11);
            let restated = grader.grade(p, &completion(&padded), 11);
            if !plain.format_valid {
                continue;
            }
            compared += 1;
            assert_eq!(plain.answer, restated.answer);
            assert_eq!(
                plain.acceptance_probability, restated.acceptance_probability,
                "{padded}"
            );
            assert_eq!(plain.reliability_gain, restated.reliability_gain);
            assert_eq!(plain.reward, restated.reward);
            assert_eq!(plain.accepted, restated.accepted);
        }
        assert!(compared >= 10, "only {compared} prompts compared");
    }
}
