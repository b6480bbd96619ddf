//! `arc-rec bench serve`'s organization, requests and verdict: the recommender-model candidates
//! that fill every candidate set, the request bodies (the world's contexts with 64-dimensional
//! embeddings), how many candidates a logged decision ranked, and the highest rate that held.

use rand::SeedableRng;
use serde::Serialize;
use serde_json::{Value, json};
use sqlx::PgPool;

use super::candidate_log::{CandidateLogError, decode_stored};
use crate::auth::{Role, create_key};
use crate::domain::{Candidate, CandidateSource, OrgId, RecommendationType};
use crate::http_load::LoadReport;
use crate::storage::StorageError;
use crate::world::{Environment, World, WorldError, WorldParams};

/// The organization the benchmark owns.
pub const ORG: &str = "bench-serve";
/// Dimension of the failure-cluster embeddings the requests carry.
pub const EMBEDDING_DIM: usize = 64;

/// What the benchmark found.
#[derive(Debug, Serialize)]
pub struct ServeBench {
    pub candidates_per_request: usize,
    pub embedding_dim: usize,
    pub rates: Vec<LoadReport>,
    /// Highest rate completed at ≥ `sustained_share` of its target with < 1% errors.
    pub highest_sustained_rate: Option<u32>,
    pub server_peak_rss_mb: f64,
}

/// Why the organization or its requests could not be prepared or checked.
#[derive(Debug, thiserror::Error)]
pub enum ServeBenchError {
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("{0}")]
    Org(String),
    #[error(transparent)]
    World(#[from] WorldError),
    #[error(transparent)]
    CandidateLog(#[from] CandidateLogError),
    #[error("the first decision was not logged")]
    NotLogged,
}

/// Stores [`model_candidates`] for [`ORG`] and makes it a platform key; returns the key's token.
pub async fn add_model_candidates_and_key(pool: &PgPool) -> Result<String, ServeBenchError> {
    crate::storage::candidate_stats::save_model_candidates(
        pool,
        ORG,
        "bench-model",
        "random-candidates",
        None,
        &model_candidates(),
    )
    .await?;
    let org = OrgId::parse(ORG).map_err(ServeBenchError::Org)?;
    let key = create_key(
        pool,
        &org,
        Role::Platform,
        Some("bench serve"),
        Default::default(),
    )
    .await?;
    Ok(key.token)
}

/// Recommender-model candidates: many distinct valid changes, so the candidate set is full.
pub fn model_candidates() -> Vec<Candidate> {
    let mut diffs: Vec<(RecommendationType, Value)> = Vec::new();
    for t in 0..=12 {
        diffs.push((
            RecommendationType::Temperature,
            json!({"temperature": f64::from(t) * 0.1}),
        ));
    }
    for attempts in 2..=8 {
        for backoff in [1, 2, 5] {
            diffs.push((
                RecommendationType::RetryPolicy,
                json!({"retry": {"max_attempts": attempts, "backoff_s": backoff}}),
            ));
        }
    }
    for timeout in [20, 45, 60, 90, 120, 180, 240, 300] {
        diffs.push((
            RecommendationType::TimeoutAdjustment,
            json!({"timeout_s": timeout}),
        ));
    }
    for model in [
        "anthropic/claude-3-haiku",
        "google/gemini-1.5-flash",
        "mistral/mistral-large",
        "deepseek/deepseek-v3",
        "meta/llama-3.1-70b",
    ] {
        diffs.push((RecommendationType::ModelSwitch, json!({"model": model})));
    }
    diffs
        .into_iter()
        .map(|(kind, diff)| Candidate {
            candidate_id: Candidate::id_for(kind, &diff),
            description: format!("Model suggestion: {diff}"),
            recommendation_type: kind,
            diff,
            expected_reliability_delta: 0.05,
            expected_cost_delta_usd: 0.0,
            evidence_count: 3,
            source: CandidateSource::Model {
                model_version_id: "bench-model".to_owned(),
                prior: None,
            },
        })
        .collect()
}

/// `n` recommendation request bodies (JSON, one line each) from the world's contexts, with
/// [`EMBEDDING_DIM`]-dimensional embeddings.
pub fn request_bodies(n: usize) -> Result<Vec<String>, WorldError> {
    let world = World::new(WorldParams {
        seed: 1,
        outcomes: 0,
        orgs: vec![ORG.to_owned()],
        embedding_dim: Some(EMBEDDING_DIM),
        ..WorldParams::default()
    })?;
    let environment = Environment::new(&world);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let bodies = (0..n)
        .map(|_| {
            let ctx = environment.next_context(&mut rng);
            let embedding = ctx
                .embedding
                .clone()
                .unwrap_or_else(|| vec![0.1; EMBEDDING_DIM]);
            json!({
                "failure_context": {"failure_cluster_embedding": embedding, "failures": ctx.failures},
                "current_config": ctx.current_config,
                "user_context": {"user_role": ctx.user.role, "domain": ctx.user.domain},
                "k": 3,
            })
            .to_string()
        })
        .collect();
    Ok(bodies)
}

/// How many candidates the decision `event_id` of [`ORG`] ranked, as its log stored them.
pub async fn candidates_ranked(
    pool: &PgPool,
    event_id: uuid::Uuid,
) -> Result<usize, ServeBenchError> {
    let (binary, json) = crate::storage::decisions::stored_candidate_set(pool, ORG, event_id)
        .await?
        .ok_or(ServeBenchError::NotLogged)?;
    Ok(decode_stored(binary.as_deref(), json)?.len())
}

/// The highest target rate completed at `sustained_share` of it or more with under 1% errors.
pub fn highest_sustained_rate(reports: &[LoadReport], sustained_share: f64) -> Option<u32> {
    reports
        .iter()
        .filter(|r| {
            r.achieved_rate >= sustained_share * f64::from(r.target_rate)
                && (r.errors as f64) < 0.01 * r.sent.max(1) as f64
        })
        .map(|r| r.target_rate)
        .max()
}
