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

/// Bernoulli variance bound: one answer is worth at most 1/0.25 of precision about a candidate.
const ANSWER_VARIANCE: f64 = 0.25;

/// A priced model candidate's score offset after `answers` answers about it: its prior mean,
/// and its prior sd shrunk as a normal mean's would be by that many answers of variance ≤ 0.25,
/// s / sqrt(1 + n·s²/0.25). The mean stays (the shared model learns the residual, see
/// `recommend::service`); the exploration the prior's uncertainty buys fades with the
/// candidate's own evidence.
pub fn prior_offset(prior: CandidatePrior, answers: u32) -> ScoreOffset {
    let variance = prior.sd * prior.sd;
    ScoreOffset {
        mean: prior.mean,
        sd: prior.sd / (1.0 + f64::from(answers) * variance / ANSWER_VARIANCE).sqrt(),
    }
}

/// The offsets to rank `candidates` with: [`prior_offset`] for each priced model candidate
/// (`answers` counts the answers about a candidate id), zero for the others; empty when none
/// is priced, which ranks exactly as before priors existed.
pub fn offsets_for(
    candidates: &[(Candidate, Vec<f64>)],
    answers: impl Fn(&str) -> u32,
) -> Vec<ScoreOffset> {
    if candidates.iter().all(|(c, _)| c.source.prior().is_none()) {
        return Vec::new();
    }
    candidates
        .iter()
        .map(|(c, _)| {
            c.source.prior().map_or_else(ScoreOffset::default, |prior| {
                prior_offset(prior, answers(&c.candidate_id))
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
/// `answers` counts the answers already learned about a candidate id (what shrinks a priced
/// candidate's prior, see [`offsets_for`]).
pub fn rank(
    policy: &ThompsonPolicy,
    prepared: Prepared,
    k: usize,
    seed: u64,
    answers: impl Fn(&str) -> u32,
) -> Result<RecommendOutput, RecommendError> {
    let Prepared {
        context,
        candidates,
    } = prepared;
    let offsets = offsets_for(&candidates, answers);
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
        .map(|item| Shown {
            candidate: candidates[item.candidate].0.clone(),
            item: item.clone(),
            features: candidates[item.candidate].1.clone(),
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
    rank(policy, prepare(index, input), input.k, seed, |_| 0)
}
