//! One recommendation, without IO: generate candidates for a failure context, build the bandit's
//! features, rank with one posterior draw, and return what to show and what to log.

use bandit::{ExplorationFloor, FeatureLayout, Observation, Ranking, ScoreOffset, ThompsonPolicy};
use serde_json::Value;

use super::features::{candidate_vector, context_vector};
use crate::candidates::{
    CandidateIndex, CandidateRequest, ConfigView, FailureObservation, SignalProfile,
    candidate_features, config_features, generate,
};
use crate::domain::{Candidate, CandidatePrior};

/// A failure context to recommend for.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RecommendInput {
    pub current_config: Value,
    pub failures: Vec<FailureObservation>,
    /// The failure cluster's id, when the context was placed in one.
    pub cluster_key: Option<String>,
    /// The cluster embedding reduced by the organization's clustering model.
    pub reduced_embedding: Option<Vec<f64>>,
    pub user_role: Option<String>,
    pub domain: Option<String>,
    /// How many recommendations to show.
    pub k: usize,
    pub max_cost_increase_usd_per_run: Option<f64>,
    /// Candidates from the recommender model, ranked alongside the heuristics'.
    pub model_candidates: Vec<Candidate>,
}

/// One shown recommendation.
#[derive(Debug, Clone, PartialEq)]
pub struct Shown {
    pub candidate: Candidate,
    pub item: bandit::RankedItem,
    /// The candidate block c it was ranked with.
    pub features: Vec<f64>,
    /// For a priced model candidate: what the shared model and its prior predicted, its mean
    /// score less its corrections (logged with the decision, so an analyst can see how far the
    /// answers fell from it).
    pub predicted: Option<f64>,
}

/// Everything a recommendation produced.
#[derive(Debug, Clone, PartialEq)]
pub struct RecommendOutput {
    /// The context vector z.
    pub context: Vec<f64>,
    /// Every candidate considered, in generation order, with its features c.
    pub candidates: Vec<(Candidate, Vec<f64>)>,
    pub ranking: Ranking,
    /// The shown recommendations, best first.
    pub shown: Vec<Shown>,
    /// The model version whose ideas the exploration floor could put first in this decision
    /// (`None`: no floor asked, or none of its ideas on the menu still wanting answers);
    /// `ranking.floor_pick` says whether it did.
    pub floor_version: Option<String>,
}

/// The exploration floor asked of one ranking (`arc-rec serve --explore-share`): `share` of the
/// decisions put one of `model_version_id`'s ideas on the menu first, among those with fewer than
/// `answers_per_idea` answers, drawn uniformly (see [`bandit::ExplorationFloor`]).
#[derive(Debug, Clone, PartialEq)]
pub struct FloorRequest {
    pub share: f64,
    pub model_version_id: String,
    pub answers_per_idea: u32,
}

impl FloorRequest {
    /// The bandit's floor over `candidates`: the version's ideas still wanting answers
    /// (`evidence` counts each idea's, by candidate id). `None` when there is none.
    fn over(
        &self,
        candidates: &[(Candidate, Vec<f64>)],
        evidence: &Evidence,
    ) -> Option<ExplorationFloor> {
        let eligible: Vec<usize> = candidates
            .iter()
            .enumerate()
            .filter(|(_, (c, _))| {
                c.source.model_version_id() == Some(self.model_version_id.as_str())
                    && evidence.get(&c.candidate_id).map_or(0, |e| e.answers)
                        < self.answers_per_idea
            })
            .map(|(i, _)| i)
            .collect();
        (self.share > 0.0 && !eligible.is_empty()).then_some(ExplorationFloor {
            share: self.share,
            eligible,
        })
    }
}

/// Why no ranking could be made.
#[derive(Debug, thiserror::Error)]
pub enum RecommendError {
    /// The bandit refused the features (a bug in their construction, or a corrupt state).
    #[error(transparent)]
    Bandit(#[from] bandit::BanditError),
}

/// A context's features and candidate set, before ranking.
#[derive(Debug, Clone, PartialEq)]
pub struct Prepared {
    /// The context vector z.
    pub context: Vec<f64>,
    /// Every candidate, in generation order (highest expected reliability gain first), with c.
    pub candidates: Vec<(Candidate, Vec<f64>)>,
}

/// Generates the candidates and builds the features.
pub fn prepare(index: &CandidateIndex, input: &RecommendInput) -> Prepared {
    let request = CandidateRequest {
        failures: input.failures.clone(),
        cluster_key: input.cluster_key.clone(),
        max_cost_increase_usd_per_run: input.max_cost_increase_usd_per_run,
        model_candidates: input.model_candidates.clone(),
        ..CandidateRequest::new(input.current_config.clone())
    };
    let context = context_for(
        index,
        &request,
        input.reduced_embedding.as_deref(),
        input.user_role.as_deref(),
        input.domain.as_deref(),
    );
    let candidates = generate(index, &request)
        .into_iter()
        .map(|c| {
            let features = candidate_vector_for(&c, &input.current_config);
            (c, features)
        })
        .collect();
    Prepared {
        context,
        candidates,
    }
}

/// The context vector z of a request (its configuration, failures and cluster key) for a user:
/// what serving ranks with, and what the learned grader (`rft::learned_grader`) scores with.
pub fn context_for(
    index: &CandidateIndex,
    request: &CandidateRequest,
    reduced_embedding: Option<&[f64]>,
    user_role: Option<&str>,
    domain: Option<&str>,
) -> Vec<f64> {
    let signals = SignalProfile::of(request, &ConfigView::of(&request.current_config));
    context_vector(
        &signals,
        reduced_embedding,
        &config_features(&request.current_config, index),
        user_role,
        domain,
    )
}

/// The candidate vector c of `candidate` over `current_config`.
pub fn candidate_vector_for(candidate: &Candidate, current_config: &Value) -> Vec<f64> {
    candidate_vector(&candidate_features(candidate, current_config))
}

/// Seconds since the Unix epoch, to the millisecond: the bandit's clock in serving (feedback is
/// stamped at its decision, a logged decision at its proposal).
pub fn timestamp_s(t: chrono::DateTime<chrono::Utc>) -> f64 {
    t.timestamp() as f64 + f64::from(t.timestamp_subsec_millis()) / 1000.0
}

/// What serving has learned about one priced model candidate (or, pooled, one model version)
/// from its answers: the sums of the shared model's observations of it, so that how far its
/// answers fall from the prior and the shared model is measured against the shared model as it
/// is *now* ([`CandidateEvidence::surprise`]), not as it was at each answer.
///
/// Why not a running sum of surprises against each answer's prediction: the shared model learns
/// the same residual from the same answers, so a surprise recorded before the shared model had
/// learned it stays in the sum after it has — a double correction that sinks a version's ideas
/// long after the shared model stopped overrating them (measured in `bench pipeline` once the
/// warm start taught the shared model raw acceptance:
/// docs/experiments/pipeline-corrections-recentred.md).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CandidateEvidence {
    pub answers: u32,
    /// Σ (answer − prior mean): the sum of the shared model's rewards for these answers
    /// ([`learning_reward`]).
    pub residual: f64,
    /// Σ x over the answers (x = z ⊗ c, the shared model's interaction vector of each answer's
    /// context and candidate); empty before the first answer.
    pub interactions: Vec<f64>,
}

impl CandidateEvidence {
    fn add(&mut self, reward: f64, x: &[f64]) {
        if self.interactions.is_empty() {
            self.interactions = vec![0.0; x.len()];
        }
        for (sum, v) in self.interactions.iter_mut().zip(x) {
            *sum += v;
        }
        self.answers = self.answers.saturating_add(1);
        self.residual += reward;
    }

    /// Σ (answer − prior mean − x·μ) under `policy`'s posterior mean μ now: how far the answers
    /// fell from what the prior and the shared model as it is now predict of them.
    pub fn surprise(&self, policy: &ThompsonPolicy) -> Result<Surprise, bandit::BanditError> {
        Ok(Surprise {
            answers: self.answers,
            total: self.residual - policy.mean_score_of_sum(&self.interactions)?,
        })
    }
}

/// A candidate's (or a version's) answers, measured against its current prediction
/// ([`CandidateEvidence::surprise`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Surprise {
    pub answers: u32,
    /// Σ (answer − predicted).
    pub total: f64,
}

/// The key of a model version's pooled evidence in an [`Evidence`] map (candidate ids start
/// `c-`).
pub fn version_key(model_version_id: &str) -> String {
    format!("version:{model_version_id}")
}

/// What serving has learned about each priced model candidate, by candidate id, and pooled by
/// model version ([`version_key`]).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct Evidence(std::collections::HashMap<String, CandidateEvidence>);

impl Evidence {
    /// Records one answer about a priced model candidate, learned by the shared model as
    /// `observation`: under its candidate id and, when it has one, pooled under its model
    /// version's [`version_key`]. On an error (features that do not fit `layout`) nothing
    /// changed.
    pub fn record(
        &mut self,
        layout: &FeatureLayout,
        candidate_id: &str,
        model_version_id: Option<&str>,
        observation: &Observation,
    ) -> Result<(), bandit::BanditError> {
        let x = layout.interaction(&observation.context, &observation.candidate)?;
        let keys =
            std::iter::once(candidate_id.to_owned()).chain(model_version_id.map(version_key));
        for key in keys {
            self.0.entry(key).or_default().add(observation.reward, &x);
        }
        Ok(())
    }

    /// The evidence under a candidate id or a [`version_key`].
    pub fn get(&self, key: &str) -> Option<&CandidateEvidence> {
        self.0.get(key)
    }

    /// Checks evidence read from storage fits a policy of dimension `dim`: every sum finite,
    /// and Σx empty exactly when nothing was answered, else of length `dim`. The error names the
    /// first key that does not (in key order, so the same state names the same key).
    pub fn check(&self, dim: usize) -> Result<(), String> {
        let mut keys: Vec<&String> = self.0.keys().collect();
        keys.sort();
        for key in keys {
            let e = &self.0[key];
            let length_ok = if e.answers == 0 {
                e.interactions.is_empty()
            } else {
                e.interactions.len() == dim
            };
            if !length_ok {
                return Err(format!(
                    "evidence {key}: {} answers but {} summed interactions (the policy has {dim})",
                    e.answers,
                    e.interactions.len()
                ));
            }
            if !e.residual.is_finite() || e.interactions.iter().any(|v| !v.is_finite()) {
                return Err(format!("evidence {key}: a sum is not finite"));
            }
        }
        Ok(())
    }

    fn surprise(
        &self,
        key: &str,
        policy: &ThompsonPolicy,
    ) -> Result<Surprise, bandit::BanditError> {
        self.get(key)
            .map_or(Ok(Surprise::default()), |e| e.surprise(policy))
    }
}

/// Bernoulli variance bound: one answer is worth at most 1/0.25 of precision about a candidate.
const ANSWER_VARIANCE: f64 = 0.25;

/// The least prior sd a priced candidate is ranked with: no prior from another model is worth
/// more than 0.25 / 0.1² = 25 answers about the candidate itself. The learned grader's sd is
/// its parameter uncertainty only, not its error where it was never right (ideas the recommender
/// model learned to please it with), and an overconfident prior would keep a bad idea on top for
/// hundreds of answers.
pub const MIN_PRIOR_SD: f64 = 0.1;

/// A priced model candidate's offset: its prior mean m plus the corrections its answers make,
/// as random intercepts at two levels: its model version's, b = S_v/(25 + N_v) over the N_v
/// answers to all of the version's candidates (no prior worth more than 25 answers), and its own
/// beyond the version's, (S − n·b)/(n₀ + n) with the prior worth n₀ = 0.25/max(s,
/// [`MIN_PRIOR_SD`])² answers (S: the sum of answer − predicted, [`Surprise`]); and its prior sd
/// s shrunk by its n answers, s/√(1 + n·s²/0.25).
///
/// The shared model learns every answer (less m), so what a model idea teaches about its
/// features carries over to the candidates that share them; the corrections are what only this
/// version's and this candidate's answers say beyond it — a recommender model tuned against a
/// grader over those very features proposes exactly the ideas the features overrate, so its
/// version's answers pull all its ideas down, the unanswered ones too, and each idea's own
/// answers pull it further; a version whose ideas beat their prediction lifts them all.
pub fn prior_offset(prior: CandidatePrior, version: Surprise, own: Surprise) -> ScoreOffset {
    let floor = prior.sd.max(MIN_PRIOR_SD);
    let version_shift = version.total
        / (ANSWER_VARIANCE / (MIN_PRIOR_SD * MIN_PRIOR_SD) + f64::from(version.answers));
    let n = f64::from(own.answers);
    let variance = prior.sd * prior.sd;
    ScoreOffset {
        mean: prior.mean
            + version_shift
            + (own.total - n * version_shift) / (ANSWER_VARIANCE / (floor * floor) + n),
        sd: prior.sd / (1.0 + n * variance / ANSWER_VARIANCE).sqrt(),
    }
}

/// The offsets to rank `candidates` with under `policy`: [`prior_offset`] for each priced model
/// candidate, its answers and its version's measured against `policy` now, zero for the others;
/// empty when none is priced, which ranks exactly as before priors existed.
pub fn offsets_for(
    policy: &ThompsonPolicy,
    candidates: &[(Candidate, Vec<f64>)],
    evidence: &Evidence,
) -> Result<Vec<ScoreOffset>, bandit::BanditError> {
    if candidates.iter().all(|(c, _)| c.source.prior().is_none()) {
        return Ok(Vec::new());
    }
    candidates
        .iter()
        .map(|(c, _)| {
            let Some(prior) = c.source.prior() else {
                return Ok(ScoreOffset::default());
            };
            let version = match c.source.model_version_id() {
                Some(v) => evidence.surprise(&version_key(v), policy)?,
                None => Surprise::default(),
            };
            Ok(prior_offset(
                prior,
                version,
                evidence.surprise(&c.candidate_id, policy)?,
            ))
        })
        .collect()
}

/// What the learner learns from an answer about a shown candidate: 1 for accepted, 0 for
/// rejected, less the prior mean a priced model candidate was ranked with. The shared model
/// learns the residual: the prior already holds what the learned grader expected, so the answer
/// is news only in how far it differs (a GLM offset).
pub fn learning_reward(accepted: bool, prior_mean: Option<f64>) -> f64 {
    f64::from(u8::from(accepted)) - prior_mean.unwrap_or(0.0)
}

/// Ranks prepared candidates with one posterior draw; `seed` makes it reproducible (logged).
/// `evidence`: the answers already learned about priced candidates (see [`offsets_for`]);
/// `floor`: the exploration floor, if one is asked.
pub fn rank(
    policy: &ThompsonPolicy,
    prepared: Prepared,
    k: usize,
    seed: u64,
    evidence: &Evidence,
    floor: Option<&FloorRequest>,
) -> Result<RecommendOutput, RecommendError> {
    let Prepared {
        context,
        candidates,
    } = prepared;
    let offsets = offsets_for(policy, &candidates, evidence)?;
    let floor =
        floor.and_then(|f| Some((f.model_version_id.clone(), f.over(&candidates, evidence)?)));
    let vectors: Vec<&[f64]> = candidates.iter().map(|(_, f)| f.as_slice()).collect();
    let ranking = if vectors.is_empty() {
        Ranking {
            items: vec![],
            explored: false,
            floor_pick: false,
            draw: 0,
            bank_seed: 0,
            propensities: vec![],
        }
    } else {
        policy.rank_with_floor(
            &context,
            &vectors,
            &offsets,
            floor.as_ref().map(|(_, f)| f),
            k,
            &mut <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(seed),
        )?
    };
    let shown = ranking
        .items
        .iter()
        .map(|item| {
            let candidate = &candidates[item.candidate].0;
            let predicted = candidate.source.prior().map(|prior| {
                let offset = offsets.get(item.candidate).copied().unwrap_or_default();
                item.mean_score - offset.mean + prior.mean
            });
            Shown {
                candidate: candidate.clone(),
                item: item.clone(),
                features: candidates[item.candidate].1.clone(),
                predicted,
            }
        })
        .collect();
    Ok(RecommendOutput {
        context,
        candidates,
        ranking,
        shown,
        floor_version: floor.map(|(version, _)| version),
    })
}

/// [`prepare`] then [`rank`].
pub fn recommend(
    policy: &ThompsonPolicy,
    index: &CandidateIndex,
    input: &RecommendInput,
    seed: u64,
) -> Result<RecommendOutput, RecommendError> {
    rank(
        policy,
        prepare(index, input),
        input.k,
        seed,
        &Evidence::default(),
        None,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn evidence(answers: u32, total: f64) -> Surprise {
        Surprise { answers, total }
    }

    #[test]
    fn an_unanswered_idea_is_drawn_from_its_prior() {
        let prior = CandidatePrior { mean: 0.7, sd: 0.2 };
        let offset = prior_offset(prior, Surprise::default(), Surprise::default());
        assert!((offset.mean - 0.7).abs() < 1e-12);
        assert!((offset.sd - 0.2).abs() < 1e-12);
    }

    /// One answer about candidate `c` (its block's first entry 1) in the context with only z's
    /// constant: the shared model's observation of a rejection of an idea priced `prior_mean`.
    fn rejection(layout: &FeatureLayout, i: usize, prior_mean: f64) -> Observation {
        let mut context = vec![0.0; layout.context_dims()];
        context[0] = 1.0;
        let mut candidate = vec![0.0; layout.candidate_dims];
        candidate[0] = 1.0;
        Observation {
            id: i.to_string(),
            timestamp_s: 0.0,
            context,
            candidate,
            reward: learning_reward(false, Some(prior_mean)),
        }
    }

    #[test]
    fn answers_are_measured_against_the_shared_model_as_it_is_now() {
        let layout = super::super::features::layout();
        let mut policy =
            ThompsonPolicy::new(layout, super::super::features::policy_config()).unwrap();
        let mut evidence = Evidence::default();
        for i in 0..40 {
            let answer = rejection(&layout, i, 0.6);
            evidence
                .record(&layout, "c-1", Some("v1"), &answer)
                .unwrap();
            policy.update(&answer).unwrap();
        }
        let own = evidence.get("c-1").unwrap();
        assert_eq!(own.answers, 40);
        assert!((own.residual + 24.0).abs() < 1e-9, "{}", own.residual);
        // The shared model has learned most of the 0.6 by which the prior overrated the idea:
        // what is left of the surprise is only what it has not learned, Σ (r − x·μ) now, not the
        // 24 it would have been against the predictions made at each answer.
        let answer = rejection(&layout, 0, 0.6);
        let now = policy
            .mean_score(&answer.context, &answer.candidate)
            .unwrap();
        let surprise = own.surprise(&policy).unwrap();
        assert_eq!(surprise.answers, 40);
        assert!((surprise.total - 40.0 * (-0.6 - now)).abs() < 1e-9);
        assert!(surprise.total.abs() < 2.0, "{}", surprise.total);
        // An untaught shared model predicts nothing: the whole residual is surprise.
        let untaught =
            ThompsonPolicy::new(layout, super::super::features::policy_config()).unwrap();
        assert!((own.surprise(&untaught).unwrap().total + 24.0).abs() < 1e-9);
        // So a priced idea is corrected once: by the shared model, and by its offset only for
        // what the shared model has not learned.
        let prior = CandidatePrior { mean: 0.6, sd: 0.1 };
        let offset = prior_offset(
            prior,
            evidence
                .get(&version_key("v1"))
                .unwrap()
                .surprise(&policy)
                .unwrap(),
            surprise,
        );
        assert!(offset.mean > 0.6 - 0.1, "{}", offset.mean);
        assert!((offset.mean + now).abs() < 0.1, "{} + {now}", offset.mean);
    }

    #[test]
    fn evidence_that_does_not_fit_the_layout_is_refused_whole() {
        let layout = super::super::features::layout();
        let mut evidence = Evidence::default();
        let mut answer = rejection(&layout, 0, 0.5);
        answer.candidate.pop();
        assert!(
            evidence
                .record(&layout, "c-1", Some("v1"), &answer)
                .is_err()
        );
        assert_eq!(evidence, Evidence::default());
    }

    #[test]
    fn an_ideas_own_surprise_corrects_its_prior_at_the_priors_weight() {
        // sd 0.5 is worth one answer: 4 answers 2.0 below prediction move it by 2/5.
        let prior = CandidatePrior { mean: 0.6, sd: 0.5 };
        let offset = prior_offset(prior, Surprise::default(), evidence(4, -2.0));
        assert!((offset.mean - (0.6 - 2.0 / 5.0)).abs() < 1e-12);
        assert!((offset.sd - 0.5 / 5.0f64.sqrt()).abs() < 1e-12);
        // Many answers: the correction is the mean surprise.
        let offset = prior_offset(prior, Surprise::default(), evidence(10_000, -3_000.0));
        assert!((offset.mean - 0.3).abs() < 1e-3);
    }

    #[test]
    fn no_prior_is_worth_more_than_twenty_five_answers_of_correction() {
        let confident = CandidatePrior {
            mean: 0.9,
            sd: 0.001,
        };
        // 25 answers averaging 0.9 below prediction take half of it off.
        let offset = prior_offset(confident, Surprise::default(), evidence(25, -22.5));
        assert!((offset.mean - 0.45).abs() < 1e-12);
        // An out-of-support idea (prior 0 ± 0) is corrected too, and never explored by its prior.
        let none = CandidatePrior { mean: 0.0, sd: 0.0 };
        let offset = prior_offset(none, Surprise::default(), evidence(25, 5.0));
        assert!((offset.mean - 0.1).abs() < 1e-12);
        assert_eq!(offset.sd, 0.0);
    }

    #[test]
    fn a_versions_answers_correct_its_unanswered_ideas_and_its_answered_ones_beyond() {
        let prior = CandidatePrior { mean: 0.6, sd: 0.1 };
        // 75 answers to the version, 0.4 below prediction on average: b = −30/(25 + 75).
        let version = evidence(75, -30.0);
        let unanswered = prior_offset(prior, version, Surprise::default());
        assert!((unanswered.mean - 0.3).abs() < 1e-12);
        // An idea answered 25 times as its version's ideas were gets b; one answered as
        // predicted gets half of b back (its prior is worth 25 answers).
        let as_version = prior_offset(prior, version, evidence(25, -7.5));
        assert!((as_version.mean - 0.3).abs() < 1e-12);
        let as_predicted = prior_offset(prior, version, evidence(25, 0.0));
        assert!((as_predicted.mean - 0.45).abs() < 1e-12);
    }

    #[test]
    fn evidence_is_recorded_per_candidate_and_pooled_per_version() {
        let layout = super::super::features::layout();
        let mut evidence = Evidence::default();
        let answer = |i: usize, accepted: bool| Observation {
            reward: learning_reward(accepted, Some(0.5)),
            ..rejection(&layout, i, 0.5)
        };
        for (id, version, accepted) in [
            ("c-1", Some("v1"), true),
            ("c-2", Some("v1"), false),
            ("c-3", None, false),
        ] {
            evidence
                .record(&layout, id, version, &answer(0, accepted))
                .unwrap();
        }
        assert_eq!(evidence.get("c-1").unwrap().answers, 1);
        let pooled = evidence.get(&version_key("v1")).unwrap();
        assert_eq!(pooled.answers, 2);
        assert_eq!(pooled.residual, 0.0);
        assert_eq!(pooled.interactions[0], 2.0);
        assert_eq!(evidence.0.len(), 4);
    }

    #[test]
    fn the_learner_learns_the_residual_from_the_prior() {
        assert_eq!(learning_reward(true, None), 1.0);
        assert_eq!(learning_reward(false, None), 0.0);
        assert!((learning_reward(true, Some(0.7)) - 0.3).abs() < 1e-12);
        assert!((learning_reward(false, Some(0.7)) + 0.7).abs() < 1e-12);
    }

    #[test]
    fn the_floor_covers_the_asked_version_s_ideas_still_wanting_answers() {
        use crate::domain::{CandidateSource, RecommendationType};
        let idea = |i: u32, version: Option<&str>| {
            let diff = serde_json::json!({ "temperature": f64::from(i) / 10.0 });
            let kind = RecommendationType::Temperature;
            let candidate = Candidate {
                candidate_id: Candidate::id_for(kind, &diff),
                recommendation_type: kind,
                diff,
                description: String::new(),
                expected_reliability_delta: 0.0,
                expected_cost_delta_usd: 0.0,
                evidence_count: 0,
                source: match version {
                    None => CandidateSource::Heuristic,
                    Some(v) => CandidateSource::Model {
                        model_version_id: v.to_owned(),
                        prior: Some(CandidatePrior { mean: 0.2, sd: 0.1 }),
                    },
                },
            };
            (candidate, vec![0.0])
        };
        let menu = vec![
            idea(1, None),
            idea(2, Some("v1")),
            idea(3, Some("v2")),
            idea(4, Some("v2")),
        ];
        let layout = FeatureLayout::new(0, 0, 0, 1).unwrap();
        let observation = Observation::binary("a", 0.0, vec![1.0], vec![1.0], false);
        let mut evidence = Evidence::default();
        for _ in 0..2 {
            evidence
                .record(&layout, &menu[3].0.candidate_id, Some("v2"), &observation)
                .unwrap();
        }
        let request = |share, answers_per_idea| FloorRequest {
            share,
            model_version_id: "v2".to_owned(),
            answers_per_idea,
        };
        let floor = request(0.1, 2).over(&menu, &evidence).unwrap();
        assert_eq!(
            floor.eligible,
            [2],
            "v1's idea and the answered one are not eligible"
        );
        assert_eq!(
            request(0.1, 3).over(&menu, &evidence).unwrap().eligible,
            [2, 3]
        );
        assert_eq!(request(0.0, 3).over(&menu, &evidence), None, "share 0: off");
        let answered = FloorRequest {
            model_version_id: "v1".to_owned(),
            ..request(0.1, 1)
        };
        assert_eq!(
            answered.over(&menu[..1], &evidence),
            None,
            "none on the menu"
        );
    }
}
