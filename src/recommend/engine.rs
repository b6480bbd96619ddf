//! One recommendation, without IO: generate candidates for a failure context, build the bandit's
//! features, rank with one posterior draw, and return what to show and what to log.

use bandit::{Ranking, ScoreOffset, ThompsonPolicy};
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
    /// score less its own correction (logged, so every replica replays the same
    /// [`CandidateEvidence`]).
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

/// Bernoulli variance bound: one answer is worth at most 1/0.25 of precision about a candidate.
const ANSWER_VARIANCE: f64 = 0.25;

/// The least prior sd a priced candidate is ranked with: no prior from another model is worth
/// more than 0.25 / 0.1² = 25 answers about the candidate itself. The learned grader's sd is
/// its parameter uncertainty only, not its error where it was never right (ideas the recommender
/// model learned to please it with), and an overconfident prior would keep a bad idea on top for
/// hundreds of answers.
pub const MIN_PRIOR_SD: f64 = 0.1;

/// What serving has learned about one priced model candidate from its own answers.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CandidateEvidence {
    pub answers: u32,
    /// Σ (answer − what the shared model and the prior predicted when it was shown).
    pub surprise: f64,
}

impl CandidateEvidence {
    /// Adds one answer about a candidate shown when the shared model and its prior predicted
    /// `predicted` (its mean score less its own correction).
    pub fn record(&mut self, accepted: bool, predicted: f64) {
        self.answers = self.answers.saturating_add(1);
        self.surprise += f64::from(u8::from(accepted)) - predicted;
    }
}

/// The key of a model version's pooled evidence in an evidence map (candidate ids start `c-`).
pub fn version_key(model_version_id: &str) -> String {
    format!("version:{model_version_id}")
}

/// Records one answer about a priced model candidate shown when `predicted` was predicted of it
/// (see [`CandidateEvidence::record`]): under its candidate id and, when it has one, pooled under
/// its model version's [`version_key`].
pub fn record_evidence(
    evidence: &mut std::collections::HashMap<String, CandidateEvidence>,
    candidate_id: &str,
    model_version_id: Option<&str>,
    accepted: bool,
    predicted: f64,
) {
    let keys = std::iter::once(candidate_id.to_owned()).chain(model_version_id.map(version_key));
    for key in keys {
        evidence.entry(key).or_default().record(accepted, predicted);
    }
}

/// A priced model candidate's offset: its prior mean m plus the corrections its answers make,
/// as random intercepts at two levels: its model version's, b = S_v/(25 + N_v) over the N_v
/// answers to all of the version's candidates (no prior worth more than 25 answers), and its own
/// beyond the version's, (S − n·b)/(n₀ + n) with the prior worth n₀ = 0.25/max(s,
/// [`MIN_PRIOR_SD`])² answers (S: the sum of answer − predicted); and its prior sd s shrunk by
/// its n answers, s/√(1 + n·s²/0.25).
///
/// The shared model learns every answer (less m), so what a model idea teaches about its
/// features carries over to the candidates that share them; the corrections are what only this
/// version's and this candidate's answers say — a recommender model tuned against a grader over
/// those very features proposes exactly the ideas the features overrate, so its version's
/// answers pull all its ideas down, the unanswered ones too, and each idea's own answers pull it
/// further; a version whose ideas beat their prediction lifts them all.
pub fn prior_offset(
    prior: CandidatePrior,
    version: CandidateEvidence,
    own: CandidateEvidence,
) -> ScoreOffset {
    let floor = prior.sd.max(MIN_PRIOR_SD);
    let version_shift = version.surprise
        / (ANSWER_VARIANCE / (MIN_PRIOR_SD * MIN_PRIOR_SD) + f64::from(version.answers));
    let n = f64::from(own.answers);
    let variance = prior.sd * prior.sd;
    ScoreOffset {
        mean: prior.mean
            + version_shift
            + (own.surprise - n * version_shift) / (ANSWER_VARIANCE / (floor * floor) + n),
        sd: prior.sd / (1.0 + n * variance / ANSWER_VARIANCE).sqrt(),
    }
}

/// No evidence about any candidate: what [`rank`] is given where nothing is priced or learned per
/// candidate (benches of the heuristics alone, [`recommend`]).
pub fn no_evidence(_candidate_id: &str) -> CandidateEvidence {
    CandidateEvidence::default()
}

/// The offsets to rank `candidates` with: [`prior_offset`] for each priced model candidate
/// (`evidence` looks up what was learned about a candidate id or a [`version_key`]), zero for the
/// others; empty when none is priced, which ranks exactly as before priors existed.
pub fn offsets_for(
    candidates: &[(Candidate, Vec<f64>)],
    evidence: impl Fn(&str) -> CandidateEvidence,
) -> Vec<ScoreOffset> {
    if candidates.iter().all(|(c, _)| c.source.prior().is_none()) {
        return Vec::new();
    }
    candidates
        .iter()
        .map(|(c, _)| {
            c.source.prior().map_or_else(ScoreOffset::default, |prior| {
                let version = c
                    .source
                    .model_version_id()
                    .map_or_else(CandidateEvidence::default, |v| evidence(&version_key(v)));
                prior_offset(prior, version, evidence(&c.candidate_id))
            })
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
/// `evidence` looks up the answers already learned about a priced candidate id (see
/// [`offsets_for`]).
pub fn rank(
    policy: &ThompsonPolicy,
    prepared: Prepared,
    k: usize,
    seed: u64,
    evidence: impl Fn(&str) -> CandidateEvidence,
) -> Result<RecommendOutput, RecommendError> {
    let Prepared {
        context,
        candidates,
    } = prepared;
    let offsets = offsets_for(&candidates, evidence);
    let vectors: Vec<&[f64]> = candidates.iter().map(|(_, f)| f.as_slice()).collect();
    let ranking = if vectors.is_empty() {
        Ranking {
            items: vec![],
            explored: false,
            draw: 0,
            bank_seed: 0,
            propensities: vec![],
        }
    } else {
        policy.rank_with_offsets(
            &context,
            &vectors,
            &offsets,
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
    })
}

/// [`prepare`] then [`rank`].
pub fn recommend(
    policy: &ThompsonPolicy,
    index: &CandidateIndex,
    input: &RecommendInput,
    seed: u64,
) -> Result<RecommendOutput, RecommendError> {
    rank(policy, prepare(index, input), input.k, seed, no_evidence)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn evidence(answers: u32, surprise: f64) -> CandidateEvidence {
        CandidateEvidence { answers, surprise }
    }

    #[test]
    fn an_unanswered_idea_is_drawn_from_its_prior() {
        let prior = CandidatePrior { mean: 0.7, sd: 0.2 };
        let offset = prior_offset(
            prior,
            CandidateEvidence::default(),
            CandidateEvidence::default(),
        );
        assert!((offset.mean - 0.7).abs() < 1e-12);
        assert!((offset.sd - 0.2).abs() < 1e-12);
    }

    #[test]
    fn evidence_records_the_surprise_of_each_answer() {
        let mut e = CandidateEvidence::default();
        e.record(true, 0.75);
        e.record(false, 0.5);
        assert_eq!(e.answers, 2);
        assert!((e.surprise - (0.25 - 0.5)).abs() < 1e-12);
    }

    #[test]
    fn an_ideas_own_surprise_corrects_its_prior_at_the_priors_weight() {
        // sd 0.5 is worth one answer: 4 answers 2.0 below prediction move it by 2/5.
        let prior = CandidatePrior { mean: 0.6, sd: 0.5 };
        let offset = prior_offset(prior, CandidateEvidence::default(), evidence(4, -2.0));
        assert!((offset.mean - (0.6 - 2.0 / 5.0)).abs() < 1e-12);
        assert!((offset.sd - 0.5 / 5.0f64.sqrt()).abs() < 1e-12);
        // Many answers: the correction is the mean surprise.
        let offset = prior_offset(
            prior,
            CandidateEvidence::default(),
            evidence(10_000, -3_000.0),
        );
        assert!((offset.mean - 0.3).abs() < 1e-3);
    }

    #[test]
    fn no_prior_is_worth_more_than_twenty_five_answers_of_correction() {
        let confident = CandidatePrior {
            mean: 0.9,
            sd: 0.001,
        };
        // 25 answers averaging 0.9 below prediction take half of it off.
        let offset = prior_offset(confident, CandidateEvidence::default(), evidence(25, -22.5));
        assert!((offset.mean - 0.45).abs() < 1e-12);
        // An out-of-support idea (prior 0 ± 0) is corrected too, and never explored by its prior.
        let none = CandidatePrior { mean: 0.0, sd: 0.0 };
        let offset = prior_offset(none, CandidateEvidence::default(), evidence(25, 5.0));
        assert!((offset.mean - 0.1).abs() < 1e-12);
        assert_eq!(offset.sd, 0.0);
    }

    #[test]
    fn a_versions_answers_correct_its_unanswered_ideas_and_its_answered_ones_beyond() {
        let prior = CandidatePrior { mean: 0.6, sd: 0.1 };
        // 75 answers to the version, 0.4 below prediction on average: b = −30/(25 + 75).
        let version = evidence(75, -30.0);
        let unanswered = prior_offset(prior, version, CandidateEvidence::default());
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
        let mut map = std::collections::HashMap::new();
        record_evidence(&mut map, "c-1", Some("v1"), true, 0.5);
        record_evidence(&mut map, "c-2", Some("v1"), false, 0.5);
        record_evidence(&mut map, "c-3", None, false, 0.5);
        assert_eq!(map["c-1"].answers, 1);
        assert_eq!(map[&version_key("v1")].answers, 2);
        assert_eq!(map[&version_key("v1")].surprise, 0.0);
        assert_eq!(map.len(), 4);
    }

    #[test]
    fn the_learner_learns_the_residual_from_the_prior() {
        assert_eq!(learning_reward(true, None), 1.0);
        assert_eq!(learning_reward(false, None), 0.0);
        assert!((learning_reward(true, Some(0.7)) - 0.3).abs() < 1e-12);
        assert!((learning_reward(false, Some(0.7)) + 0.7).abs() < 1e-12);
    }
}
