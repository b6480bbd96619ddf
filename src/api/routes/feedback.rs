//! `POST /v1/feedback`: what happened to a shown recommendation. Idempotent; may arrive days
//! later and at any replica.

use actix_web::{HttpRequest, HttpResponse, post, web};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::api::body::{read_json, typed};
use crate::api::error::ApiError;
use crate::api::extract::Caller;
use crate::api::state::AppState;
use crate::auth::Permission;
use crate::domain::{FieldErrors, OrgId};
use crate::storage::decisions::{FeedbackOutcome, FeedbackRecord};

/// Feedback on one recommendation.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FeedbackRequest {
    pub event_id: Uuid,
    /// As the recommendation response gave it.
    #[schema(min_length = 1, max_length = 256, pattern = r"\S")]
    pub recommendation_id: String,
    /// `accepted`, `rejected` or `applied`.
    pub outcome: FeedbackOutcome,
    /// Reliability change measured after applying it (−1 to 1).
    #[serde(default)]
    #[schema(minimum = -1.0, maximum = 1.0)]
    pub reliability_delta: Option<f64>,
    /// A 1–5 rating. Read as a number so `3.0` is the integer 3, as JSON Schema counts it.
    #[serde(default)]
    #[schema(value_type = Option<i32>, minimum = 1, maximum = 5)]
    pub feedback_score: Option<f64>,
}

impl FeedbackRequest {
    /// Checks what types cannot, naming each bad field, and makes the record `org` stores (the
    /// handler's checks, and what the fuzz target `feedback_request` drives).
    pub fn into_record(self, org: &OrgId) -> Result<FeedbackRecord, ApiError> {
        let mut errors = FieldErrors::default();
        errors.check_id("recommendation_id", &self.recommendation_id);
        if let Some(delta) = self.reliability_delta {
            errors.check_range("reliability_delta", delta, -1.0, 1.0);
        }
        let feedback_score = match self.feedback_score {
            // A whole number from 1 to 5, so the cast is exact.
            Some(score) if score.fract() == 0.0 && (1.0..=5.0).contains(&score) => {
                Some(score as i32)
            }
            Some(score) => {
                errors.push(
                    "feedback_score",
                    format!("must be a whole number between 1 and 5, got {score}"),
                );
                None
            }
            None => None,
        };
        errors.finish().map_err(ApiError::Invalid)?;
        Ok(FeedbackRecord {
            org_id: org.as_str().to_owned(),
            event_id: self.event_id,
            recommendation_id: self.recommendation_id,
            outcome: self.outcome,
            reliability_delta: self.reliability_delta,
            feedback_score,
        })
    }
}

/// Whether this feedback was new.
#[derive(Debug, Serialize, ToSchema)]
pub struct FeedbackResponse {
    /// False when the same feedback was already stored (nothing changed).
    pub stored: bool,
}

/// Record feedback (platform keys). 201 when stored, 200 when it was already there; both mean
/// it is durable.
#[utoipa::path(
    tag = "recommendations",
    request_body = FeedbackRequest,
    responses(
        (status = 201, body = FeedbackResponse), (status = 200, body = FeedbackResponse),
        (status = 401, body = crate::api::error::ErrorBody), (status = 403, body = crate::api::error::ErrorBody),
        (status = 404, body = crate::api::error::ErrorBody), (status = 422, body = crate::api::error::ErrorBody),
    ),
    security(("api_key" = []))
)]
#[post("/v1/feedback")]
pub async fn post_feedback(
    caller: Caller,
    request: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let principal = caller.require(Permission::Feedback)?;
    let raw = read_json(&request, payload, state.body_limit).await?;
    let record = typed::<FeedbackRequest>(&raw)?.into_record(&principal.org)?;
    state.request_schemas.check("POST", "/v1/feedback", &raw)?;
    let stored = state.serving.feedback(record).await?;
    let mut response = if stored {
        HttpResponse::Created()
    } else {
        HttpResponse::Ok()
    };
    Ok(response.json(FeedbackResponse { stored }))
}
