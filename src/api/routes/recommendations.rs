//! `POST /v1/recommendations`: ranked configuration changes for a failure context.

use std::collections::BTreeMap;

use actix_web::{HttpRequest, post, web};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use uuid::Uuid;

use crate::api::body::{read_json, typed};
use crate::api::error::ApiError;
use crate::api::extract::Caller;
use crate::api::schema_rules::MAX_EMBEDDING_VALUE;
use crate::api::state::AppState;
use crate::auth::Permission;
use crate::candidates::FailureObservation;
use crate::domain::agent_config::validate_config;
use crate::domain::{CandidateSource, FieldErrors};
use crate::recommend::service::RecommendationQuery;

/// Most recommendations one request may ask for.
pub const MAX_K: usize = 20;

/// A recommendation request (see CONTRACTS.md).
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RecommendationRequest {
    pub failure_context: FailureContextBody,
    /// The agent configuration that failed (model, temperature, tools, retry, timeout_s, ...).
    #[schema(value_type = Object)]
    pub current_config: Value,
    #[serde(default)]
    pub user_context: UserContextBody,
    /// How many recommendations (1–20, default 3).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 20)]
    pub k: Option<usize>,
    /// Hard cap on the expected cost increase per run, in USD.
    #[serde(default)]
    #[schema(minimum = 0.0)]
    pub max_cost_increase_usd_per_run: Option<f64>,
    /// The platform's id of the configuration that failed (optional; not in the platform
    /// contract). Logged with the decision, so the answers to what was served can be grouped
    /// with the configuration's other decisions when they become training data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 200)]
    pub config_id: Option<String>,
}

/// Where the failure is; any one of the three fields is enough.
#[derive(Debug, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FailureContextBody {
    /// The failure cluster's embedding (the organization's fixed dimension, e.g. 1536).
    // Omitted when absent: the decision log keeps the embedding in a column of its own and the
    // rest of the request as JSON (see `into_query`). Not `skip_serializing`, which would also
    // drop the field from the OpenAPI schema.
    // Read as f64 so a value past single precision's range is a 422 naming it (serde_json's f32
    // would round some of them to f32::MAX and refuse the rest as malformed JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_items = 1, max_items = 16384)]
    pub failure_cluster_embedding: Option<Vec<f64>>,
    #[serde(default)]
    #[schema(max_items = 100)]
    pub failures: Vec<FailureBody>,
    /// Stored outcomes whose failure patterns describe the context.
    #[serde(default)]
    #[schema(max_items = 100)]
    pub outcome_ids: Vec<String>,
}

/// One observed failure.
#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FailureBody {
    pub failure_category: String,
    pub error_message: String,
    #[serde(default)]
    pub tool_name: Option<String>,
    #[serde(default)]
    pub error_code: Option<String>,
}

/// Who will decide.
#[derive(Debug, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UserContextBody {
    #[serde(default)]
    pub user_role: Option<String>,
    #[serde(default)]
    pub domain: Option<String>,
}

/// The ranked recommendations; the decision is durably logged when this is returned.
#[derive(Debug, Serialize, ToSchema)]
pub struct RecommendationResponse {
    /// Send it back with feedback.
    pub event_id: Uuid,
    pub policy_version: String,
    /// The failure cluster the context was placed in, if any.
    pub cluster_id: Option<String>,
    pub recommendations: Vec<RecommendationBody>,
}

/// One recommendation.
#[derive(Debug, Serialize, ToSchema)]
pub struct RecommendationBody {
    pub recommendation_id: String,
    #[serde(rename = "type")]
    pub kind: String,
    /// JSON Merge Patch over the current configuration.
    #[schema(value_type = Object)]
    pub diff: Value,
    pub description: String,
    pub expected_reliability_delta: f64,
    pub expected_cost_delta_usd: f64,
    pub evidence_count: u32,
    /// Where the candidate came from: `heuristic` (arc-rec's statistics over the
    /// Configuration→Outcome history) or `model` (a generation of the recommender model, written
    /// by `arc-rec candidates`).
    pub source: CandidateOrigin,
    /// The model version that generated it (source `model` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_version_id: Option<String>,
    /// The bandit's sampled score for this context.
    pub score: f64,
    /// Probability that the policy shows this recommendation at this position.
    pub propensity: f64,
    pub explanation: ExplanationBody,
}

/// Who proposed a recommendation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CandidateOrigin {
    Heuristic,
    Model,
}

/// Why this score.
#[derive(Debug, Serialize, ToSchema)]
pub struct ExplanationBody {
    /// Each feature group's share of the score: `cluster`, `config`, `user`, `candidate`, and
    /// `prior` for a model candidate ranked from the learned grader's prior.
    pub contributions: BTreeMap<String, f64>,
    /// Posterior standard deviation of the score.
    pub posterior_sd: f64,
    /// The posterior mean of the score (the prior's mean included): what the candidate is
    /// expected to be worth, without this request's exploration.
    pub mean_score: f64,
}

impl RecommendationRequest {
    /// Checks what types cannot, naming each bad field (the handler's checks, and what the fuzz
    /// target `recommendation_request` drives).
    pub fn into_query(mut self) -> Result<RecommendationQuery, ApiError> {
        // The request is logged as JSON without its embedding, which goes to a `real[]` column:
        // as JSON text a 64-value embedding alone is ~0.8 kB per decision (15 kB at 1536
        // values) for Postgres to parse into numerics and write.
        let embedding = self.failure_context.failure_cluster_embedding.take();
        let raw =
            serde_json::value::to_raw_value(&self).map_err(|e| ApiError::Internal(e.into()))?;
        self.failure_context.failure_cluster_embedding = embedding;
        let mut errors = FieldErrors::default();
        let context = &self.failure_context;
        if context.failure_cluster_embedding.is_none()
            && context.failures.is_empty()
            && context.outcome_ids.is_empty()
        {
            errors.push(
                "failure_context",
                "give at least one of failure_cluster_embedding, failures or outcome_ids",
            );
        }
        if let Some(embedding) = &context.failure_cluster_embedding {
            if embedding.is_empty() || embedding.len() > 16_384 {
                errors.push(
                    "failure_context.failure_cluster_embedding",
                    format!("must have 1 to 16384 values, got {}", embedding.len()),
                );
            } else if let Some(i) = embedding
                .iter()
                .position(|v| !v.is_finite() || v.abs() > MAX_EMBEDDING_VALUE)
            {
                errors.push(
                    &format!("failure_context.failure_cluster_embedding[{i}]"),
                    format!("must be a number within ±{MAX_EMBEDDING_VALUE:e} (single precision)"),
                );
            }
        }
        if context.failures.len() > 100 {
            errors.push("failure_context.failures", "at most 100 failures");
        }
        if context.outcome_ids.len() > 100 {
            errors.push("failure_context.outcome_ids", "at most 100 outcome ids");
        }
        let mut config_errors = FieldErrors::with_prefix("current_config");
        validate_config(&self.current_config, &mut config_errors);
        for error in config_errors.into_vec() {
            errors.push(&error.field, error.message);
        }
        let k = self.k.unwrap_or(3);
        if !(1..=MAX_K).contains(&k) {
            errors.push("k", format!("must be between 1 and {MAX_K}, got {k}"));
        }
        if let Some(cap) = self.max_cost_increase_usd_per_run {
            errors.check_non_negative("max_cost_increase_usd_per_run", cap);
        }
        if let Some(id) = &self.config_id
            && (id.trim().is_empty()
                || id.chars().count() > 200
                || id.chars().any(char::is_control))
        {
            errors.push(
                "config_id",
                "must be 1 to 200 characters, not blank and without control characters",
            );
        }
        let errors = errors.into_vec();
        if !errors.is_empty() {
            return Err(ApiError::Invalid(errors));
        }
        Ok(RecommendationQuery {
            // Within f32's range (checked above), so the cast only rounds.
            embedding: self
                .failure_context
                .failure_cluster_embedding
                .map(|values| values.into_iter().map(|v| v as f32).collect()),
            failures: self
                .failure_context
                .failures
                .into_iter()
                .map(|f| FailureObservation {
                    failure_category: Some(f.failure_category),
                    error_message: Some(f.error_message),
                    tool_name: f.tool_name,
                    error_code: f.error_code,
                })
                .collect(),
            outcome_ids: self.failure_context.outcome_ids,
            current_config: self.current_config,
            user_role: self.user_context.user_role,
            domain: self.user_context.domain,
            k,
            max_cost_increase_usd_per_run: self.max_cost_increase_usd_per_run,
            raw,
        })
    }
}

/// Recommend configuration changes for a failure context (platform keys).
#[utoipa::path(
    tag = "recommendations",
    request_body = RecommendationRequest,
    responses(
        (status = 200, body = RecommendationResponse),
        (status = 400, body = crate::api::error::ErrorBody), (status = 401, body = crate::api::error::ErrorBody),
        (status = 403, body = crate::api::error::ErrorBody), (status = 413, body = crate::api::error::ErrorBody),
        (status = 422, body = crate::api::error::ErrorBody),
    ),
    security(("api_key" = []))
)]
#[post("/v1/recommendations")]
pub async fn post_recommendations(
    caller: Caller,
    request: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<web::Json<RecommendationResponse>, ApiError> {
    let principal = caller.require(Permission::Recommend)?;
    let raw = read_json(&request, payload, state.body_limit).await?;
    let body: RecommendationRequest = typed(&raw)?;
    let query = body.into_query()?;
    state
        .request_schemas
        .check("POST", "/v1/recommendations", &raw)?;
    let answer = state
        .serving
        .recommend(principal.org.as_str(), query)
        .await?;
    Ok(web::Json(RecommendationResponse {
        event_id: answer.event_id,
        policy_version: answer.policy_version,
        cluster_id: answer.cluster_id,
        recommendations: answer
            .recommendations
            .into_iter()
            .map(|served| {
                let candidate = served.shown.candidate;
                let item = served.shown.item;
                let (source, model_version_id) = match candidate.source {
                    CandidateSource::Heuristic => (CandidateOrigin::Heuristic, None),
                    CandidateSource::Model {
                        model_version_id, ..
                    } => (CandidateOrigin::Model, Some(model_version_id)),
                };
                RecommendationBody {
                    recommendation_id: served.recommendation_id,
                    kind: candidate.recommendation_type.as_str().to_owned(),
                    diff: candidate.diff,
                    description: candidate.description,
                    expected_reliability_delta: candidate.expected_reliability_delta,
                    expected_cost_delta_usd: candidate.expected_cost_delta_usd,
                    evidence_count: candidate.evidence_count,
                    source,
                    model_version_id,
                    score: item.score,
                    propensity: item.propensity,
                    explanation: ExplanationBody {
                        contributions: item.explanation.contributions,
                        posterior_sd: item.explanation.posterior_sd,
                        mean_score: item.mean_score,
                    },
                }
            })
            .collect(),
    }))
}
