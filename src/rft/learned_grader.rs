//! The learned grader (`--grader learned`): a reward model of P(accept) fitted on the platform's
//! logged approvals and rejections, for data with no world behind it.
//!
//! It is serving's own model, reused rather than copied: the bandit crate's Bayesian logistic
//! regression (Laplace approximation, [`bandit::ModelKind::Logistic`]) over the features serving
//! ranks with (`recommend::engine::context_for` ⊗ `candidate_vector_for`: failure signals and
//! cluster, configuration and price tier, role and domain × whether the model and provider
//! change, the size and direction of each change, the cost of the model switched to). So it
//! scores any well-formed diff, including ones nobody ever proposed, by what similar changes met
//! in similar contexts.
//!
//! The reward is pessimistic where the data is thin: the lower confidence bound
//! σ(μ − κ·s) of the posterior log-odds (μ the mean score, s its posterior standard deviation,
//! κ = `--learned-lcb-z`), so a diff far from anything logged earns little however its mean
//! extrapolates. Beyond it altogether (a model or tool the organization never ran, and by
//! default any feature past the range the logged decisions span) the reward is the floor,
//! p = 0; `--learned-floor models` keeps the floor for unknown names only and grades the rest
//! by the lower bound. Like every grader it judges the change (the minimal patch), not its label: the
//! recommendation-type one-hot is left out of c, so two completions with one canonical answer
//! always get one verdict (the objectives rely on it), whatever type each declares. So are
//! features a logged diff cannot have: the heuristics' expected reliability delta and evidence
//! (0 here, as for a model idea nobody has measured) and the model-source flag.
//!
//! A run keeps the fit in `grader.json` ([`LearnedGraderFile`]): the data file's SHA-256, the
//! organizations' candidate indexes it priced switches with, κ, the floor and the fitted
//! coefficients.
//! Eval and resume refit from the same data and indexes and check the coefficients, so they
//! grade with exactly the grader the run trained on and never touch the database.

use std::collections::BTreeMap;
use std::path::Path;

use bandit::{ModelKind, Observation, PolicyConfig, ThompsonPolicy};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::completion::minimal_patch;
use super::dataset::RftPrompt;
use crate::candidates::{CandidateIndex, CandidateRequest};
use crate::clustering::{ClusterModel, FailureText};
use crate::domain::{Candidate, CandidatePrior, CandidateSource, RecommendationType};
use crate::export::Origin;
use crate::export::example::FailureGroup;
use crate::recommend::engine::{candidate_vector_for, context_for};
use crate::recommend::features::layout;

/// The version of [`LearnedGraderFile`]'s layout and of the features it was fitted on.
pub const LEARNED_GRADER_VERSION: u32 = 2;

/// How far outside the fitted range a candidate feature may lie and still count as in support
/// (features are recomputed by the same code, so only rounding separates equal values).
const SUPPORT_SLACK: f64 = 1e-9;

/// κ by default: the reward is σ(μ − 1·s), one posterior standard deviation below the mean.
pub const DEFAULT_LCB_Z: f64 = 1.0;

/// Largest relative difference between refitted and stored coefficients that still counts as
/// the same fit (the refit is deterministic; this only absorbs a different libm).
const REFIT_TOLERANCE: f64 = 1e-9;

/// `--learned-floor`: which diffs the reward counts as p = 0 (the floor) rather than by the lower
/// bound σ(μ − κ·s). A serving prior ([`LearnedGrader::prior`]) keeps both floors whatever the
/// run trained with: a prior has no κ to temper an extrapolated mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum LearnedFloor {
    /// A diff bringing in a model or tool the organization has never run, and a diff with any
    /// feature beyond the range the logged decisions span.
    #[default]
    Ranges,
    /// Only a diff bringing in a model or tool the organization has never run (the name is kept
    /// from when it covered models only); beyond the logged range the lower bound applies, its s
    /// growing with the distance.
    Models,
}

impl LearnedFloor {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ranges => "ranges",
            Self::Models => "models",
        }
    }
}

/// How pessimistic the learned grader's reward is: κ, and what earns the floor; and how its fit
/// weighs the answers to served recommendations.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pessimism {
    /// κ: the reward is made of σ(μ − κ·s).
    pub lcb_z: f64,
    pub floor: LearnedFloor,
    pub served_weighting: ServedWeighting,
}

impl Default for Pessimism {
    fn default() -> Self {
        Self {
            lcb_z: DEFAULT_LCB_Z,
            floor: LearnedFloor::default(),
            served_weighting: ServedWeighting::default(),
        }
    }
}

/// `--learned-served-weighting`: how the grader's fit weighs an answer to a recommendation
/// arc-rec served. The grader models P(accept | context, diff); the logging policy chose which
/// diff was shown from the context, not from the answer, so unweighted answers already estimate
/// that conditional probability where the model holds (`none`). `ips` weighs each by
/// 1/propensity (self-normalised over the served answers, each at most [`MAX_IPS_WEIGHT`]
/// before normalising), fitting as if every candidate had been shown alike: what corrects a
/// misspecified model's bias toward what serving favoured, at the price of variance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum ServedWeighting {
    #[default]
    None,
    Ips,
}

/// Largest importance weight of one served answer (before self-normalising): a propensity of
/// ε/K or a floor's s/|U| can be tiny, and one answer should not outweigh a hundred.
pub const MAX_IPS_WEIGHT: f64 = 20.0;

impl ServedWeighting {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Ips => "ips",
        }
    }

    /// Each decision's weight in the fit, in order (empty: all 1).
    fn weights(self, decisions: &[Option<f64>]) -> Vec<f64> {
        if self == Self::None || decisions.iter().all(Option::is_none) {
            return Vec::new();
        }
        let raw: Vec<Option<f64>> = decisions
            .iter()
            .map(|p| p.map(|p| (1.0 / p.max(1e-12)).min(MAX_IPS_WEIGHT)))
            .collect();
        let served: Vec<f64> = raw.iter().flatten().copied().collect();
        let mean = served.iter().sum::<f64>() / served.len() as f64;
        raw.iter().map(|w| w.map_or(1.0, |w| w / mean)).collect()
    }
}

/// A learned grader that cannot be fitted or loaded.
#[derive(Debug, thiserror::Error)]
pub enum LearnedGraderError {
    #[error("--grader learned: the train split holds no logged decision to learn from")]
    NoDecisions,
    #[error(
        "--grader learned: organization {org:?} of the data has no candidate index in the grader (it was fitted on other organizations)"
    )]
    UnknownOrg { org: String },
    #[error(
        "--grader learned: the grader was fitted on data with SHA-256 {fitted}, but {} has {found}",
        path.display()
    )]
    DataChanged {
        path: std::path::PathBuf,
        fitted: String,
        found: String,
    },
    #[error(
        "--grader learned: grader.json has layout version {found}; this arc-rec reads version {LEARNED_GRADER_VERSION}"
    )]
    Version { found: u32 },
    #[error(
        "--grader learned: refitting on the same data gave other coefficients (largest relative difference {difference:.3e}); grader.json was written by another version of arc-rec"
    )]
    Refit { difference: f64 },
    #[error("--learned-lcb-z {0}: must be a finite number ≥ 0")]
    LcbZ(f64),
    #[error("--grader learned: the reward model's Bayesian logistic posterior")]
    Bandit(#[from] bandit::BanditError),
}

/// What a run directory keeps of its learned grader.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LearnedGraderFile {
    pub version: u32,
    /// SHA-256 of the data file it was fitted on (its train split).
    pub data_sha256: String,
    /// κ: the reward is σ(μ − κ·s).
    pub lcb_z: f64,
    /// What earns the floor (absent from files written before the option: ranges).
    #[serde(default)]
    pub floor: LearnedFloor,
    /// How the fit weighed served answers (absent from older files: none).
    #[serde(default)]
    pub served_weighting: ServedWeighting,
    /// Logged decisions it was fitted on.
    pub observations: usize,
    /// The candidate index of each organization of the data, as the fit read it from the
    /// database (model prices and statistics for the cost of a model switch and the context's
    /// price tier).
    pub indexes: Vec<CandidateIndex>,
    /// Prompt id → where the organization's clustering model placed its failures (prompts of
    /// organizations without one are absent), for the context's cluster and embedding.
    pub placements: BTreeMap<String, PromptPlacement>,
    /// The posterior mean of the coefficients, d = |z|·|c|.
    pub mean: Vec<f64>,
    /// How well it predicted the validation split's logged decisions, by origin (`train
    /// --grader learned` writes it; not read back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_out: Option<HeldOutCalibration>,
}

/// Where an organization's clustering model places a prompt's failures, as serving places a
/// request's: the cluster's label (read like one more failure) and the reduced embedding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PromptPlacement {
    pub cluster: String,
    pub reduced: Vec<f64>,
}

/// Places every prompt whose organization has a clustering model in `models` (by organization)
/// and that has failures.
pub fn place_prompts<'a>(
    prompts: impl IntoIterator<Item = &'a RftPrompt>,
    models: &BTreeMap<String, ClusterModel>,
) -> BTreeMap<String, PromptPlacement> {
    let mut placements = BTreeMap::new();
    for prompt in prompts {
        let Some(model) = models.get(&prompt.org) else {
            continue;
        };
        let texts: Vec<FailureText> = prompt
            .facts
            .failures
            .iter()
            .flat_map(|group| {
                let text = FailureText {
                    failure_category: group.failure_category.clone(),
                    error_message: group.example.clone(),
                    tool_name: None,
                    error_type: None,
                };
                std::iter::repeat_n(text, group.failures_read())
            })
            .collect();
        if let Ok(assignment) = model.assign_texts(&texts) {
            placements.insert(
                prompt.id.clone(),
                PromptPlacement {
                    cluster: assignment.label,
                    reduced: assignment.reduced,
                },
            );
        }
    }
    placements
}

/// A learned grader's view of one diff in one context.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LearnedScore {
    /// σ(μ): the posterior mean's acceptance probability.
    pub probability: f64,
    /// σ(μ − κ·s): the pessimistic probability the reward is made of; 0 (the floor) for a diff
    /// bringing in a model or tool the organization has never run and, under
    /// [`LearnedFloor::Ranges`], for any diff out of the data's support.
    pub lower_bound: f64,
    /// s, the posterior standard deviation of the log-odds.
    pub log_odds_sd: f64,
    /// Whether the diff lies in the logged data's support: only models and tools the
    /// organization has run ([`CandidateIndex::unknown_name`]), and every candidate feature within the range the fitted decisions span. Outside it the
    /// linear log-odds extrapolate (world 7's first learned-grader run learned to write
    /// `{"timeout_s": 2}` in 55 of 80 contexts: far below any logged timeout, read as ever
    /// better), so a serving prior counts it as p = 0 and, under [`LearnedFloor::Ranges`],
    /// the lower bound is the floor.
    pub in_support: bool,
}

/// The fitted reward model.
#[derive(Debug, Clone)]
pub struct LearnedGrader {
    policy: ThompsonPolicy,
    indexes: BTreeMap<String, CandidateIndex>,
    placements: BTreeMap<String, PromptPlacement>,
    pessimism: Pessimism,
    data_sha256: String,
    observations: usize,
    /// Per candidate feature, the least and greatest value among the fitted decisions.
    support: Vec<(f64, f64)>,
}

/// The posterior the grader keeps: logistic, prior N(0, I), nothing forgotten; one draw in the
/// bank (the grader reads the mean and the exact standard deviation, never the draws).
fn grader_policy_config() -> PolicyConfig {
    PolicyConfig {
        model: ModelKind::Logistic,
        prior_precision: 1.0,
        noise_scale: 1.0,
        epsilon: 0.0,
        mc_samples: 1,
        half_life_s: None,
    }
}

impl LearnedGrader {
    /// Fits the grader on every logged decision of `prompts` (the run's train split), each
    /// organization's switches priced by its index in `indexes`, each context placed as
    /// `placements` says (see [`place_prompts`]; every prompt it will score, held-out ones too).
    /// `data_sha256` names the data file (see [`data_sha256`]).
    pub fn fit<'a>(
        prompts: impl IntoIterator<Item = &'a RftPrompt>,
        indexes: Vec<CandidateIndex>,
        placements: BTreeMap<String, PromptPlacement>,
        pessimism: Pessimism,
        data_sha256: String,
    ) -> Result<Self, LearnedGraderError> {
        if !(pessimism.lcb_z.is_finite() && pessimism.lcb_z >= 0.0) {
            return Err(LearnedGraderError::LcbZ(pessimism.lcb_z));
        }
        let indexes: BTreeMap<String, CandidateIndex> = indexes
            .into_iter()
            .map(|index| (index.org.clone(), index))
            .collect();
        let mut observations = Vec::new();
        // The logged propensity of each served answer (None: the platform's own decision).
        let mut propensities = Vec::new();
        for prompt in prompts {
            let index = indexes
                .get(&prompt.org)
                .ok_or_else(|| LearnedGraderError::UnknownOrg {
                    org: prompt.org.clone(),
                })?;
            let z = context_of(prompt, index, placements.get(&prompt.id));
            for (i, decision) in prompt.facts.decisions.iter().enumerate() {
                let patch = minimal_patch(&prompt.current_config, &decision.diff);
                // File order breaks no ties: `rebuild` orders by (timestamp, id), and the
                // timestamp is the decision's position in the data.
                observations.push(Observation::binary(
                    format!("{}#{i}", prompt.id),
                    observations.len() as f64,
                    z.clone(),
                    candidate_of(prompt, index, &patch),
                    decision.approved,
                ));
                propensities.push(decision.served.as_ref().map(|s| s.propensity));
            }
        }
        if observations.is_empty() {
            return Err(LearnedGraderError::NoDecisions);
        }
        let mut support = vec![(f64::INFINITY, f64::NEG_INFINITY); layout().candidate_dims];
        for observation in &observations {
            for ((lo, hi), &v) in support.iter_mut().zip(&observation.candidate) {
                *lo = lo.min(v);
                *hi = hi.max(v);
            }
        }
        let mut policy = ThompsonPolicy::new(layout(), grader_policy_config())?;
        let weights = pessimism.served_weighting.weights(&propensities);
        policy.rebuild_weighted(&observations, &weights, observations.len() as f64)?;
        Ok(Self {
            policy,
            indexes,
            placements,
            pessimism,
            data_sha256,
            observations: observations.len(),
            support,
        })
    }

    /// Refits the grader `file` describes on `prompts` (the train split of the data file whose
    /// SHA-256 is `data_sha256`, read from `path`) and checks it is the same fit.
    pub fn load<'a>(
        file: LearnedGraderFile,
        prompts: impl IntoIterator<Item = &'a RftPrompt>,
        path: &Path,
        data_sha256: String,
    ) -> Result<Self, LearnedGraderError> {
        if file.version != LEARNED_GRADER_VERSION {
            return Err(LearnedGraderError::Version {
                found: file.version,
            });
        }
        if file.data_sha256 != data_sha256 {
            return Err(LearnedGraderError::DataChanged {
                path: path.to_owned(),
                fitted: file.data_sha256,
                found: data_sha256,
            });
        }
        let grader = Self::fit(
            prompts,
            file.indexes,
            file.placements,
            Pessimism {
                lcb_z: file.lcb_z,
                floor: file.floor,
                served_weighting: file.served_weighting,
            },
            data_sha256,
        )?;
        let difference = max_relative_difference(grader.policy.mean(), &file.mean);
        if difference > REFIT_TOLERANCE {
            return Err(LearnedGraderError::Refit { difference });
        }
        Ok(grader)
    }

    /// What a run directory keeps (see [`LearnedGraderFile`]).
    pub fn to_file(&self) -> LearnedGraderFile {
        LearnedGraderFile {
            version: LEARNED_GRADER_VERSION,
            data_sha256: self.data_sha256.clone(),
            lcb_z: self.pessimism.lcb_z,
            floor: self.pessimism.floor,
            served_weighting: self.pessimism.served_weighting,
            observations: self.observations,
            indexes: self.indexes.values().cloned().collect(),
            placements: self.placements.clone(),
            mean: self.policy.mean().to_vec(),
            held_out: None,
        }
    }

    /// Logged decisions it was fitted on.
    pub fn observations(&self) -> usize {
        self.observations
    }

    /// How well the posterior mean ranks the logged decisions of `prompts` (e.g. the held-out
    /// split): the AUC, P(an approved diff scores above a rejected one, ties half), and the number
    /// of decisions; `None` without both an approval and a rejection among them.
    pub fn auc<'a>(
        &self,
        prompts: impl IntoIterator<Item = &'a RftPrompt>,
    ) -> Option<(f64, usize)> {
        let mut scored: Vec<(f64, bool)> = self
            .scored_decisions(prompts)
            .into_iter()
            .map(|(p, approved, _)| (p, approved))
            .collect();
        auc(&mut scored).map(|a| (a, scored.len()))
    }

    /// How well the posterior-mean probability predicts the logged decisions of `prompts` (the
    /// held-out split), over all of them and by origin (`platform`: the platform's own decided
    /// diffs; `served`: answers to what arc-rec served); `None` when none could be scored.
    pub fn calibration<'a>(
        &self,
        prompts: impl IntoIterator<Item = &'a RftPrompt>,
    ) -> Option<HeldOutCalibration> {
        let scored = self.scored_decisions(prompts);
        let all: Vec<(f64, bool)> = scored.iter().map(|&(p, y, _)| (p, y)).collect();
        let mut by_origin = BTreeMap::new();
        for origin in [Origin::Platform, Origin::Served] {
            let some: Vec<(f64, bool)> = scored
                .iter()
                .filter(|(_, _, o)| *o == origin)
                .map(|&(p, y, _)| (p, y))
                .collect();
            if let Some(figures) = Calibration::of(some) {
                by_origin.insert(origin.name().to_owned(), figures);
            }
        }
        Some(HeldOutCalibration {
            all: Calibration::of(all)?,
            by_origin,
        })
    }

    /// Each logged decision of `prompts` the grader can score: its posterior-mean probability,
    /// whether it was approved, and its origin.
    fn scored_decisions<'a>(
        &self,
        prompts: impl IntoIterator<Item = &'a RftPrompt>,
    ) -> Vec<(f64, bool, Origin)> {
        let mut scored = Vec::new();
        for prompt in prompts {
            for decision in &prompt.facts.decisions {
                let patch = minimal_patch(&prompt.current_config, &decision.diff);
                if let Ok(score) = self.score(prompt, &patch) {
                    scored.push((score.probability, decision.approved, decision.origin()));
                }
            }
        }
        scored
    }

    /// Checks that every prompt's organization has an index here.
    pub fn check_orgs<'a>(
        &self,
        prompts: impl IntoIterator<Item = &'a RftPrompt>,
    ) -> Result<(), LearnedGraderError> {
        match prompts
            .into_iter()
            .find(|p| !self.indexes.contains_key(&p.org))
        {
            Some(prompt) => Err(LearnedGraderError::UnknownOrg {
                org: prompt.org.clone(),
            }),
            None => Ok(()),
        }
    }

    /// The grader's view of the recommendation whose minimal patch over the prompt's
    /// configuration is `patch`.
    pub fn score(
        &self,
        prompt: &RftPrompt,
        patch: &Value,
    ) -> Result<LearnedScore, LearnedGraderError> {
        let index =
            self.indexes
                .get(&prompt.org)
                .ok_or_else(|| LearnedGraderError::UnknownOrg {
                    org: prompt.org.clone(),
                })?;
        let z = context_of(prompt, index, self.placements.get(&prompt.id));
        let c = candidate_of(prompt, index, patch);
        let mean = self.policy.mean_score(&z, &c)?;
        let sd = self.policy.posterior_sd(&z, &c)?;
        // An unknown model or tool is out of support whatever its features say: nothing prices
        // it (a switch's cost delta reads 0, a free upgrade) and nothing shows it exists; the
        // first learned-grader runs on world 1 learned to write made-up model names for that.
        let known_names = index.unknown_name(&prompt.current_config, patch).is_none();
        let in_range = c
            .iter()
            .zip(&self.support)
            .all(|(&v, &(lo, hi))| (lo - SUPPORT_SLACK..=hi + SUPPORT_SLACK).contains(&v));
        let floored = match self.pessimism.floor {
            LearnedFloor::Ranges => !(known_names && in_range),
            LearnedFloor::Models => !known_names,
        };
        let lower_bound = if floored {
            0.0
        } else {
            sigmoid(mean - self.pessimism.lcb_z * sd)
        };
        Ok(LearnedScore {
            probability: sigmoid(mean),
            lower_bound,
            log_odds_sd: sd,
            in_support: known_names && in_range,
        })
    }
}

impl LearnedGrader {
    /// The serving prior of a candidate proposed in `contexts` (each a prompt and the candidate's
    /// minimal patch over the prompt's configuration): the mixture, with equal weights, of the
    /// grader's per-context posteriors of P(accept), each the posterior mean's probability σ(μ)
    /// with sd σ'(μ)·s (the delta method); mean = average p, variance = average of (sd² + p²)
    /// less mean². A context where the candidate lies outside the data's support
    /// ([`LearnedScore::in_support`]) counts as p = 0 with no spread, as for the reward.
    /// `None` without contexts.
    pub fn prior<'a>(
        &self,
        contexts: impl IntoIterator<Item = (&'a RftPrompt, &'a Value)>,
    ) -> Result<Option<CandidatePrior>, LearnedGraderError> {
        let (mut n, mut sum, mut second) = (0usize, 0.0, 0.0);
        for (prompt, patch) in contexts {
            let score = self.score(prompt, patch)?;
            let (p, sd) = if score.in_support {
                let p = score.probability;
                (p, p * (1.0 - p) * score.log_odds_sd)
            } else {
                (0.0, 0.0)
            };
            n += 1;
            sum += p;
            second += sd * sd + p * p;
        }
        if n == 0 {
            return Ok(None);
        }
        let mean = (sum / n as f64).clamp(0.0, 1.0);
        let variance = (second / n as f64 - mean * mean).max(0.0);
        Ok(Some(CandidatePrior {
            mean,
            sd: variance.sqrt().min(1.0),
        }))
    }
}

/// The context vector z of a prompt, as serving builds it for the same failures and user: with
/// the cluster label and reduced embedding where the organization's clustering model placed it,
/// without either where it has none.
fn context_of(
    prompt: &RftPrompt,
    index: &CandidateIndex,
    placement: Option<&PromptPlacement>,
) -> Vec<f64> {
    let failures = prompt
        .facts
        .failures
        .iter()
        .flat_map(FailureGroup::observations)
        .collect();
    let request = CandidateRequest {
        failures,
        cluster_key: placement.map(|p| p.cluster.clone()),
        ..CandidateRequest::new(prompt.current_config.clone())
    };
    context_for(
        index,
        &request,
        placement.map(|p| p.reduced.as_slice()),
        prompt.facts.user_role.as_deref(),
        prompt.facts.domain.as_deref(),
    )
}

/// The candidate vector c of a diff as the grader sees it: what it changes, priced by the
/// organization's index, with no type and no measured expectation.
fn candidate_of(prompt: &RftPrompt, index: &CandidateIndex, patch: &Value) -> Vec<f64> {
    let mut c = candidate_vector_for(
        &Candidate {
            candidate_id: String::new(),
            // Any type: its one-hot is cleared below.
            recommendation_type: RecommendationType::Balanced,
            diff: patch.clone(),
            description: String::new(),
            expected_reliability_delta: 0.0,
            expected_cost_delta_usd: index.expected_cost_delta(&prompt.current_config, patch),
            evidence_count: 0,
            source: CandidateSource::Heuristic,
        },
        &prompt.current_config,
    );
    c[..RecommendationType::ALL.len()].fill(0.0);
    c
}

/// SHA-256 of a data file, hex.
pub fn data_sha256(path: &Path) -> std::io::Result<String> {
    let bytes = std::fs::read(path)?;
    Ok(hex::encode(Sha256::digest(&bytes)))
}

/// How well predicted acceptance probabilities match logged answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// Decisions scored, and how many of them were approved.
    pub decisions: usize,
    pub approved: usize,
    /// Mean −ln P(the logged answer), the probability clamped to [10⁻⁶, 1 − 10⁻⁶].
    pub log_loss: f64,
    /// Expected calibration error: over ten equal-width bins of the probability, the mean over
    /// decisions of |the bin's mean probability − its approval rate|.
    pub calibration_error: f64,
    /// `None` without both an approval and a rejection.
    pub auc: Option<f64>,
}

/// [`Calibration`] over every held-out decision and by origin (`platform`, `served`; an origin
/// without decisions is absent).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeldOutCalibration {
    pub all: Calibration,
    pub by_origin: BTreeMap<String, Calibration>,
}

impl Calibration {
    /// The figures of `(probability, approved)` pairs; `None` for none.
    pub fn of(mut scored: Vec<(f64, bool)>) -> Option<Self> {
        if scored.is_empty() {
            return None;
        }
        let n = scored.len() as f64;
        let log_loss = scored
            .iter()
            .map(|&(p, y)| {
                let p = p.clamp(1e-6, 1.0 - 1e-6);
                -(if y { p } else { 1.0 - p }).ln()
            })
            .sum::<f64>()
            / n;
        let mut bins = [(0.0, 0.0, 0usize); 10];
        for &(p, y) in &scored {
            let bin = ((p * 10.0).floor() as usize).min(9);
            bins[bin].0 += p;
            bins[bin].1 += f64::from(u8::from(y));
            bins[bin].2 += 1;
        }
        let calibration_error = bins
            .iter()
            .filter(|b| b.2 > 0)
            .map(|&(p, y, _)| (p - y).abs())
            .sum::<f64>()
            / n;
        Some(Calibration {
            decisions: scored.len(),
            approved: scored.iter().filter(|(_, y)| *y).count(),
            log_loss,
            calibration_error,
            auc: auc(&mut scored),
        })
    }
}

/// The Mann-Whitney AUC of scores against labels, ties counted half (average ranks).
fn auc(scored: &mut [(f64, bool)]) -> Option<f64> {
    scored.sort_by(|a, b| a.0.total_cmp(&b.0));
    let positives = scored.iter().filter(|(_, y)| *y).count() as f64;
    let negatives = scored.len() as f64 - positives;
    if positives == 0.0 || negatives == 0.0 {
        return None;
    }
    let mut rank_sum = 0.0;
    let mut i = 0;
    while i < scored.len() {
        let mut j = i;
        while j < scored.len() && scored[j].0 == scored[i].0 {
            j += 1;
        }
        // Ranks i+1..=j share their average.
        let average = (i + 1 + j) as f64 / 2.0;
        rank_sum += average * scored[i..j].iter().filter(|(_, y)| *y).count() as f64;
        i = j;
    }
    Some((rank_sum - positives * (positives + 1.0) / 2.0) / (positives * negatives))
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn max_relative_difference(a: &[f64], b: &[f64]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / (1.0 + x.abs().max(y.abs())))
        .fold(0.0, f64::max)
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;

    #[test]
    fn ips_weights_are_self_normalised_over_served_answers_and_capped() {
        let propensities = [None, Some(0.5), Some(0.001), Some(0.25), None];
        assert!(ServedWeighting::None.weights(&propensities).is_empty());
        assert!(ServedWeighting::Ips.weights(&[None, None]).is_empty());
        let weights = ServedWeighting::Ips.weights(&propensities);
        // Raw 2, 20 (1000 capped), 4: mean 26/3.
        let mean = 26.0 / 3.0;
        let expected = [1.0, 2.0 / mean, 20.0 / mean, 4.0 / mean, 1.0];
        for (w, e) in weights.iter().zip(expected) {
            assert!((w - e).abs() < 1e-12, "{weights:?}");
        }
    }
    use crate::export::Split;
    use crate::rft::dataset::{LoggedDecision, PromptFacts};

    fn config() -> Value {
        json!({"model": "openai/gpt-4.1", "temperature": 0.7, "timeout_s": 30,
               "retry": {"max_attempts": 1}})
    }

    /// A context with timeouts, where people approved a longer timeout four times in five and a
    /// cooler temperature one time in five.
    pub(crate) fn prompt(n: usize) -> RftPrompt {
        let decisions = (0..10)
            .map(|i| {
                let (diff, approved) = if i % 2 == 0 {
                    (json!({"timeout_s": 120}), i % 10 != 0)
                } else {
                    (json!({"temperature": 0.2}), i % 10 == 1)
                };
                LoggedDecision {
                    diff,
                    approved,
                    served: None,
                }
            })
            .collect();
        RftPrompt {
            id: format!("acme/c{n}/1"),
            org: "acme".into(),
            config_id: format!("c{n}"),
            split: Split::Train,
            user_turn: String::new(),
            current_config: config(),
            logged: BTreeMap::new(),
            accepted_completions: Vec::new(),
            logged_completions: Default::default(),
            cluster: None,
            facts: PromptFacts {
                failures: vec![FailureGroup {
                    failure_category: "timeout".into(),
                    failure_type: "execution_error".into(),
                    count: 5,
                    example: "Agent stopped due to iteration limit or time limit.".into(),
                }],
                user_role: Some("ml_engineer".into()),
                domain: Some("saas".into()),
                decisions,
            },
        }
    }

    pub(crate) fn fitted(prompts: &[RftPrompt]) -> LearnedGrader {
        LearnedGrader::fit(
            prompts,
            vec![CandidateIndex::empty("acme")],
            BTreeMap::new(),
            Pessimism::default(),
            "sha".into(),
        )
        .unwrap()
    }

    #[test]
    fn it_learns_what_people_approved_and_doubts_what_nobody_proposed() {
        let prompts: Vec<RftPrompt> = (0..30).map(prompt).collect();
        let grader = fitted(&prompts);
        assert_eq!(grader.observations(), 300);
        let fresh = prompt(99);
        let score = |patch: Value| grader.score(&fresh, &patch).unwrap();
        let timeout = score(json!({"timeout_s": 120}));
        let cooler = score(json!({"temperature": 0.2}));
        // The logged rates are 0.8 and 0.2; the prior pulls both a little towards 0.5.
        assert!((0.6..0.85).contains(&timeout.probability), "{timeout:?}");
        assert!((0.15..0.4).contains(&cooler.probability), "{cooler:?}");
        // Never proposed here: a model switch; its log-odds are far less certain, so its lower
        // bound sits well below its mean.
        let switch = score(json!({"model": "anthropic/claude-3-haiku"}));
        assert!(
            switch.log_odds_sd > 2.0 * timeout.log_odds_sd,
            "{switch:?} vs {timeout:?}"
        );
        for s in [timeout, cooler] {
            assert!(s.lower_bound < s.probability, "{s:?}");
        }
        // The organization never ran that model (the index is empty): out of support, no credit.
        assert_eq!(switch.lower_bound, 0.0);
        assert!(switch.probability > 0.0 && !switch.in_support);
        // Beyond the logged range of a feature (no logged timeout went past 120 s, or below
        // 30 s): out of support too, however the straight line extrapolates.
        assert!(timeout.in_support && cooler.in_support);
        for patch in [json!({"timeout_s": 600}), json!({"timeout_s": 2})] {
            let beyond = score(patch.clone());
            assert!(
                !beyond.in_support && beyond.lower_bound == 0.0,
                "{patch}: {beyond:?}"
            );
            let prior = grader.prior([(&fresh, &patch)]).unwrap().unwrap();
            assert_eq!((prior.mean, prior.sd), (0.0, 0.0));
        }
        // Fitted where the organization has run it (and priced it: 0.4 of the current model's
        // price) ...
        let model = |name: &str, usd_per_1k_tokens| crate::storage::candidate_stats::ModelRow {
            model: name.to_owned(),
            runs: 40,
            simulations: 10,
            mean_reliability: Some(0.8),
            mean_cost_usd: Some(0.01),
            usd_per_1k_tokens: Some(usd_per_1k_tokens),
            success_reliability: None,
            failure_reliability: None,
        };
        let rows = crate::storage::candidate_stats::StatsRows {
            models: vec![
                model("anthropic/claude-3-haiku", 0.4),
                model("openai/gpt-4.1", 1.0),
            ],
            ..Default::default()
        };
        // ... and where people were proposed that switch (so its features lie in the support).
        let mut switched = prompts.clone();
        for (i, prompt) in switched.iter_mut().enumerate().take(10) {
            prompt.facts.decisions.push(LoggedDecision {
                diff: json!({"model": "anthropic/claude-3-haiku"}),
                approved: i % 2 == 0,
                served: None,
            });
        }
        let known = LearnedGrader::fit(
            &switched,
            vec![CandidateIndex::from_rows("acme", &rows)],
            BTreeMap::new(),
            Pessimism::default(),
            "sha".into(),
        )
        .unwrap()
        .score(&fresh, &json!({"model": "anthropic/claude-3-haiku"}))
        .unwrap();
        assert!(
            known.lower_bound > 0.0 && known.lower_bound < known.probability,
            "{known:?}"
        );
        // κ = 0: the bound is the mean.
        let plain = LearnedGrader::fit(
            &prompts,
            vec![CandidateIndex::empty("acme")],
            BTreeMap::new(),
            Pessimism {
                lcb_z: 0.0,
                ..Pessimism::default()
            },
            "sha".into(),
        )
        .unwrap()
        .score(&fresh, &json!({"timeout_s": 120}))
        .unwrap();
        assert_eq!(plain.lower_bound, plain.probability);
    }

    fn fitted_with_the_models_floor(prompts: &[RftPrompt], index: CandidateIndex) -> LearnedGrader {
        LearnedGrader::fit(
            prompts,
            vec![index],
            BTreeMap::new(),
            Pessimism {
                floor: LearnedFloor::Models,
                ..Pessimism::default()
            },
            "sha".into(),
        )
        .unwrap()
    }

    /// `--learned-floor models`: beyond the logged range the reward is the lower bound, which
    /// the wider posterior there pulls down; an unknown model or tool and the serving prior keep
    /// the floor.
    #[test]
    fn the_models_floor_grades_beyond_the_logged_range_by_the_lower_bound() {
        let prompts: Vec<RftPrompt> = (0..30).map(prompt).collect();
        let models_only = fitted_with_the_models_floor(&prompts, CandidateIndex::empty("acme"));
        let ranges = fitted(&prompts);
        let fresh = prompt(99);
        let inside = json!({"timeout_s": 120});
        assert_eq!(
            models_only.score(&fresh, &inside).unwrap(),
            ranges.score(&fresh, &inside).unwrap()
        );
        let within = models_only.score(&fresh, &inside).unwrap();
        for patch in [json!({"timeout_s": 600}), json!({"timeout_s": 2})] {
            let beyond = models_only.score(&fresh, &patch).unwrap();
            let floored = ranges.score(&fresh, &patch).unwrap();
            assert!(!beyond.in_support && !floored.in_support);
            assert_eq!(floored.lower_bound, 0.0);
            assert_eq!(
                (beyond.probability, beyond.log_odds_sd),
                (floored.probability, floored.log_odds_sd)
            );
            let mean = (beyond.probability / (1.0 - beyond.probability)).ln();
            let expected = sigmoid(mean - DEFAULT_LCB_Z * beyond.log_odds_sd);
            assert!(
                (beyond.lower_bound - expected).abs() < 1e-9 && beyond.lower_bound > 0.0,
                "{patch}: {beyond:?}"
            );
            assert!(
                beyond.log_odds_sd > within.log_odds_sd,
                "{beyond:?} vs {within:?}"
            );
            let prior = models_only.prior([(&fresh, &patch)]).unwrap().unwrap();
            assert_eq!((prior.mean, prior.sd), (0.0, 0.0));
        }
        let switch = models_only
            .score(&fresh, &json!({"model": "anthropic/claude-3-haiku"}))
            .unwrap();
        assert_eq!(switch.lower_bound, 0.0);
        // So does a tool the organization has never run, whatever name a model invents for it
        // (a recommender model wrote these three, one with a timeout of 38,933 s) ...
        let invented = json!({"tools": [{"name": "anthropic/claude-3.5-sonnet"}, {"name": "}},"},
                                        {"name": "retry_policy", "timeout_s": 38933}]});
        let invented_score = models_only.score(&fresh, &invented).unwrap();
        assert!(
            invented_score.lower_bound == 0.0 && !invented_score.in_support,
            "{invented_score:?}"
        );
        let prior = models_only.prior([(&fresh, &invented)]).unwrap().unwrap();
        assert_eq!((prior.mean, prior.sd), (0.0, 0.0));
        // ... while adding one it has run is graded by its lower bound.
        let tool_rows = crate::storage::candidate_stats::StatsRows {
            tools: vec![crate::storage::candidate_stats::ToolRow {
                tool: "web_search".into(),
                calls: 50,
                ok_calls: 45,
                p50_ok_ms: Some(800.0),
                p90_ok_ms: Some(2500.0),
                versions_configured: 4,
                versions_called: 4,
            }],
            ..Default::default()
        };
        let with_tools =
            fitted_with_the_models_floor(&prompts, CandidateIndex::from_rows("acme", &tool_rows));
        let known_tool = with_tools
            .score(&fresh, &json!({"tools": [{"name": "web_search"}]}))
            .unwrap();
        assert!(known_tool.lower_bound > 0.0, "{known_tool:?}");
        // The file keeps the floor, and a file from before the option reads as ranges.
        let file = models_only.to_file();
        assert_eq!(file.floor, LearnedFloor::Models);
        let mut old = serde_json::to_value(&file).unwrap();
        old.as_object_mut().unwrap().remove("floor");
        let old: LearnedGraderFile = serde_json::from_value(old).unwrap();
        assert_eq!(old.floor, LearnedFloor::Ranges);
        let reloaded = LearnedGrader::load(file, &prompts, Path::new("d"), "sha".into()).unwrap();
        assert_eq!(reloaded.pessimism, models_only.pessimism);
    }

    #[test]
    fn a_candidate_s_prior_mixes_its_contexts_posteriors() {
        let prompts: Vec<RftPrompt> = (0..30).map(prompt).collect();
        let grader = fitted(&prompts);
        let (a, b) = (prompt(98), prompt(99));
        let timeout = json!({"timeout_s": 120});
        let one = grader.score(&a, &timeout).unwrap();
        let prior = grader.prior([(&a, &timeout)]).unwrap().unwrap();
        let p = one.probability;
        assert!((prior.mean - p).abs() < 1e-12);
        assert!((prior.sd - p * (1.0 - p) * one.log_odds_sd).abs() < 1e-12);
        // Two contexts: the same diff scores the same in equal contexts, so the mixture is the
        // same; with an unknown model's switch (p = 0, no spread) beside it, the mean halves and
        // the spread between the two shows in the sd.
        let twice = grader
            .prior([(&a, &timeout), (&b, &timeout)])
            .unwrap()
            .unwrap();
        assert!((twice.mean - prior.mean).abs() < 1e-12);
        assert!((twice.sd - prior.sd).abs() < 1e-12);
        let switch = json!({"model": "anthropic/claude-3-haiku"});
        let mixed = grader
            .prior([(&a, &timeout), (&b, &switch)])
            .unwrap()
            .unwrap();
        assert!((mixed.mean - p / 2.0).abs() < 1e-12);
        let expected = ((prior.sd * prior.sd + p * p) / 2.0 - (p / 2.0) * (p / 2.0)).sqrt();
        assert!((mixed.sd - expected).abs() < 1e-12);
        assert_eq!(grader.prior(std::iter::empty()).unwrap(), None);
        // A context of an organization the grader was not fitted for is an error.
        let mut stranger = prompt(97);
        stranger.org = "globex".into();
        assert!(grader.prior([(&stranger, &timeout)]).is_err());
    }

    #[test]
    fn auc_matches_pair_counting() {
        let cases: [&[(f64, bool)]; 4] = [
            &[(0.1, false), (0.9, true)],
            &[(0.9, false), (0.1, true)],
            &[
                (0.5, false),
                (0.5, true),
                (0.7, true),
                (0.2, false),
                (0.5, true),
            ],
            &[(0.3, true), (0.3, true)],
        ];
        for case in cases {
            let pairs: Vec<f64> = case
                .iter()
                .filter(|(_, y)| *y)
                .flat_map(|(p, _)| {
                    case.iter().filter(|(_, y)| !*y).map(move |(n, _)| {
                        if p > n {
                            1.0
                        } else if p == n {
                            0.5
                        } else {
                            0.0
                        }
                    })
                })
                .collect();
            let oracle =
                (!pairs.is_empty()).then(|| pairs.iter().sum::<f64>() / pairs.len() as f64);
            assert_eq!(auc(&mut case.to_vec()), oracle, "{case:?}");
        }
        let grader = fitted(&(0..30).map(prompt).collect::<Vec<_>>());
        let (held_out, n) = grader.auc([&prompt(99)]).unwrap();
        assert_eq!(n, 10);
        assert!(held_out > 0.7, "{held_out}");
    }

    #[test]
    fn calibration_figures_match_their_definitions_and_split_by_origin() {
        let figures = Calibration::of(vec![(0.9, true), (0.9, false), (0.1, false)]).unwrap();
        assert_eq!((figures.decisions, figures.approved), (3, 1));
        let log_loss = -(0.9f64.ln() + 0.1f64.ln() + 0.9f64.ln()) / 3.0;
        assert!((figures.log_loss - log_loss).abs() < 1e-12, "{figures:?}");
        // Bin 9 holds 0.9 twice with one approval (|1.8 − 1|), bin 1 holds 0.1 unapproved.
        assert!(
            (figures.calibration_error - 0.9 / 3.0).abs() < 1e-12,
            "{figures:?}"
        );
        assert_eq!(figures.auc, Some(0.75));
        assert_eq!(Calibration::of(Vec::new()), None);
        assert_eq!(Calibration::of(vec![(0.4, true)]).unwrap().auc, None);

        // A held-out prompt whose decisions are half served: the figures by origin count each.
        let grader = fitted(&(0..30).map(prompt).collect::<Vec<_>>());
        let mut held_out = prompt(99);
        for (i, decision) in held_out.facts.decisions.iter_mut().enumerate() {
            if i % 2 == 0 {
                decision.served = Some(crate::export::ServedDecision {
                    event_id: format!("e{i}"),
                    recommendation_id: format!("r{i}"),
                    source: "model".into(),
                    model_version_id: Some("v1".into()),
                    position: 0,
                    propensity: 0.5,
                });
            }
        }
        let calibration = grader.calibration([&held_out]).unwrap();
        assert_eq!(calibration.all.decisions, 10);
        let count = |origin: &str| calibration.by_origin[origin].decisions;
        assert_eq!((count("platform"), count("served")), (5, 5));
        assert_eq!(
            calibration.all.auc,
            grader.auc([&held_out]).map(|(auc, _)| auc)
        );
    }

    #[test]
    fn prompts_are_placed_by_their_organization_s_clustering_model_as_serving_places_requests() {
        use crate::clustering::{ClusterOptions, PatternInput, Previous, fit_org};

        let patterns: Vec<PatternInput> = (0..40)
            .map(|i| PatternInput {
                pattern_id: format!("p{i}"),
                failure_type: "execution_error".into(),
                failure_category: if i % 2 == 0 { "timeout" } else { "model_error" }.into(),
                error_message: if i % 2 == 0 {
                    format!("Agent stopped due to iteration limit or time limit after {i} s.")
                } else {
                    format!("Error code: 429 - rate limit exceeded (retry after {i}s)")
                },
                ..PatternInput::default()
            })
            .collect();
        let options = ClusterOptions {
            dims: 4,
            ..ClusterOptions::default()
        };
        let model = fit_org("acme", &patterns, &Previous::default(), &options)
            .unwrap()
            .model;
        let timeouts = prompt(1);
        let mut limits = prompt(2);
        limits.facts.failures[0].failure_category = "model_error".into();
        limits.facts.failures[0].example = "Error code: 429 - rate limit exceeded".into();
        let mut calm = prompt(3);
        calm.facts.failures.clear();
        let mut stranger = prompt(4);
        stranger.org = "globex".into();
        let models = BTreeMap::from([("acme".to_owned(), model)]);
        let placements = place_prompts([&timeouts, &limits, &calm, &stranger], &models);
        assert_eq!(
            placements.keys().collect::<Vec<_>>(),
            ["acme/c1/1", "acme/c2/1"],
            "no failures, or no model: not placed"
        );
        let (a, b) = (&placements["acme/c1/1"], &placements["acme/c2/1"]);
        assert_ne!(a.cluster, b.cluster);
        assert_eq!(a.reduced.len(), 4);

        // The placement enters the context: the same decisions, another fit.
        let prompts: Vec<RftPrompt> = (0..5).map(prompt).collect();
        let placed = place_prompts(&prompts, &models);
        assert_eq!(placed.len(), 5);
        let with = LearnedGrader::fit(
            &prompts,
            vec![CandidateIndex::empty("acme")],
            placed,
            Pessimism::default(),
            "sha".into(),
        )
        .unwrap();
        let without = fitted(&prompts);
        let patch = json!({"timeout_s": 120});
        assert_ne!(
            with.score(&prompts[0], &patch).unwrap(),
            without.score(&prompts[0], &patch).unwrap()
        );
        assert_eq!(with.to_file().placements.len(), 5);
    }

    #[test]
    fn bad_fits_are_named() {
        let prompts = vec![prompt(1)];
        let err = LearnedGrader::fit(
            &prompts,
            vec![],
            BTreeMap::new(),
            Pessimism::default(),
            "sha".into(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("organization \"acme\""), "{err}");
        let err = LearnedGrader::fit(
            &prompts,
            vec![CandidateIndex::empty("acme")],
            BTreeMap::new(),
            Pessimism {
                lcb_z: f64::NAN,
                ..Pessimism::default()
            },
            "sha".into(),
        )
        .unwrap_err();
        assert!(err.to_string().starts_with("--learned-lcb-z NaN"), "{err}");
        let mut silent = prompt(1);
        silent.facts.decisions.clear();
        let err = LearnedGrader::fit(
            [&silent],
            vec![CandidateIndex::empty("acme")],
            BTreeMap::new(),
            Pessimism::default(),
            "sha".into(),
        )
        .unwrap_err();
        assert!(matches!(err, LearnedGraderError::NoDecisions), "{err}");
        let grader = fitted(&prompts);
        let mut stranger = prompt(2);
        stranger.org = "globex".into();
        assert!(grader.check_orgs([&prompts[0]]).is_ok());
        let err = grader.check_orgs([&stranger]).unwrap_err();
        assert!(err.to_string().contains("\"globex\""), "{err}");
    }

    #[test]
    fn a_stored_grader_reloads_to_the_same_fit_and_refuses_other_data_or_coefficients() {
        let prompts: Vec<RftPrompt> = (0..5).map(prompt).collect();
        let grader = fitted(&prompts);
        let file: LearnedGraderFile =
            serde_json::from_slice(&serde_json::to_vec(&grader.to_file()).unwrap()).unwrap();
        let path = Path::new("data.jsonl");
        let reloaded = LearnedGrader::load(file.clone(), &prompts, path, "sha".into()).unwrap();
        assert_eq!(reloaded.policy.mean(), grader.policy.mean());
        assert_eq!(reloaded.to_file(), grader.to_file());

        let err = LearnedGrader::load(file.clone(), &prompts, path, "other".into()).unwrap_err();
        assert!(
            err.to_string()
                .contains("fitted on data with SHA-256 sha, but data.jsonl has other"),
            "{err}"
        );
        let mut changed = file.clone();
        changed.mean[3] += 0.01;
        let err = LearnedGrader::load(changed, &prompts, path, "sha".into()).unwrap_err();
        assert!(matches!(err, LearnedGraderError::Refit { .. }), "{err}");
        // Other decisions under the same hash (a file edited in place is caught by the hash;
        // this is the refit check's own test).
        let err = LearnedGrader::load(file.clone(), &prompts[..4], path, "sha".into()).unwrap_err();
        assert!(matches!(err, LearnedGraderError::Refit { .. }), "{err}");
        let mut old = file;
        old.version = 0;
        let err = LearnedGrader::load(old, &prompts, path, "sha".into()).unwrap_err();
        assert!(err.to_string().contains("layout version 0"), "{err}");
    }
}
