//! A candidate recommendation: one concrete change to a configuration, with what arc-rec expects
//! it to do. Heuristics and the recommender model both produce these; the bandit ranks them.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::agent_config::config_hash;
use super::recommendation::RecommendationType;

/// Where a candidate came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "source", rename_all = "snake_case")]
pub enum CandidateSource {
    /// arc-rec's heuristics over the Configuration→Outcome graph.
    Heuristic,
    /// A generation of the recommender model.
    Model {
        /// The `model_versions` row that generated it.
        model_version_id: String,
        /// What the learned grader expected of it when `arc-rec candidates` stored it (`None`:
        /// stored without one): serving ranks it from this prior instead of from zero.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        prior: Option<CandidatePrior>,
    },
}

impl CandidateSource {
    /// `"heuristic"` or `"model"`, as stored.
    pub fn kind(&self) -> &'static str {
        match self {
            CandidateSource::Heuristic => "heuristic",
            CandidateSource::Model { .. } => "model",
        }
    }

    /// The model version of a model candidate.
    pub fn model_version_id(&self) -> Option<&str> {
        match self {
            CandidateSource::Heuristic => None,
            CandidateSource::Model {
                model_version_id, ..
            } => Some(model_version_id),
        }
    }

    /// The prior of a priced model candidate.
    pub fn prior(&self) -> Option<CandidatePrior> {
        match self {
            CandidateSource::Heuristic => None,
            CandidateSource::Model { prior, .. } => *prior,
        }
    }
}

/// A model candidate's prior acceptance: the learned grader's posterior mean probability of
/// acceptance over the contexts it was generated for, and the standard deviation of that
/// estimate (the spread of the per-context posteriors, mixed). In serving's units: the bandit
/// models accept = 1 / reject = 0 linearly, so `mean` is added to the score as is.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CandidatePrior {
    pub mean: f64,
    pub sd: f64,
}

impl CandidatePrior {
    /// A prior from stored columns, when both are present and in range (mean and sd in [0, 1]).
    pub fn from_stored(mean: Option<f64>, sd: Option<f64>) -> Option<Self> {
        let (mean, sd) = (mean?, sd?);
        ((0.0..=1.0).contains(&mean) && (0.0..=1.0).contains(&sd)).then_some(Self { mean, sd })
    }
}

/// One change that could be recommended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    /// Stable id: the same type and diff always get the same id (see [`Candidate::id_for`]).
    pub candidate_id: String,
    pub recommendation_type: RecommendationType,
    /// JSON Merge Patch over the current configuration.
    pub diff: Value,
    /// One line for people, e.g. "Switch to claude-3-haiku (98.7% lower cost, 96% reliability)".
    pub description: String,
    /// Expected change of the reliability score (0–1 scale).
    pub expected_reliability_delta: f64,
    /// Expected change of the cost per run, in USD.
    pub expected_cost_delta_usd: f64,
    /// How many runs or decisions the expectation rests on.
    pub evidence_count: u32,
    pub source: CandidateSource,
}

impl Candidate {
    /// The id of a (type, diff) pair: `c-` and 16 hex digits of a hash over the type and the
    /// canonical diff, so equal diffs written in another key order share an id.
    pub fn id_for(kind: RecommendationType, diff: &Value) -> String {
        let digest = Sha256::new()
            .chain_update(kind.as_str())
            .chain_update(b"\0")
            .chain_update(config_hash(diff))
            .finalize();
        format!("c-{}", hex::encode(&digest[..8]))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn id_ignores_key_order_and_depends_on_type_and_diff() {
        let a = Candidate::id_for(
            RecommendationType::Balanced,
            &json!({"model": "m", "temperature": 0.3}),
        );
        let b = Candidate::id_for(
            RecommendationType::Balanced,
            &json!({"temperature": 0.3, "model": "m"}),
        );
        assert_eq!(a, b);
        assert_ne!(
            a,
            Candidate::id_for(
                RecommendationType::ModelSwitch,
                &json!({"model": "m", "temperature": 0.3})
            )
        );
        assert_ne!(
            a,
            Candidate::id_for(
                RecommendationType::Balanced,
                &json!({"model": "m", "temperature": 0.4})
            )
        );
        assert_eq!(a.len(), 18);
    }
}
