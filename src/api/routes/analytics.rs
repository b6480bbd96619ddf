//! `GET /v1/analytics/acceptance`: acceptance rates of shown recommendations, grouped.

use actix_web::{HttpRequest, get, web};
use chrono::NaiveDate;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::api::body::parse_query;
use crate::api::error::ApiError;
use crate::api::extract::Caller;
use crate::api::state::AppState;
use crate::auth::Permission;
use crate::storage::analytics::{self, GroupBy};

/// Query parameters.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct AcceptanceQuery {
    /// `cluster`, `type`, `provider`, `policy_version` or `day`.
    pub group_by: GroupBy,
    /// First day included (YYYY-MM-DD, UTC).
    pub since: Option<NaiveDate>,
    /// First day excluded (YYYY-MM-DD, UTC).
    pub until: Option<NaiveDate>,
}

/// Acceptance by group.
#[derive(Debug, Serialize, ToSchema)]
pub struct AcceptanceResponse {
    pub group_by: GroupBy,
    pub rows: Vec<AcceptanceRow>,
}

/// One group.
#[derive(Debug, Serialize, ToSchema)]
pub struct AcceptanceRow {
    pub key: String,
    pub shown: i64,
    pub accepted: i64,
    pub rate: f64,
    /// Wilson 95% interval of the rate.
    pub ci95: [f64; 2],
}

/// Acceptance rates with counts and 95% intervals (analyst or admin keys).
#[utoipa::path(
    tag = "analytics",
    params(AcceptanceQuery),
    responses((status = 200, body = AcceptanceResponse), (status = 401, body = crate::api::error::ErrorBody),
               (status = 403, body = crate::api::error::ErrorBody), (status = 422, body = crate::api::error::ErrorBody)),
    security(("api_key" = []))
)]
#[get("/v1/analytics/acceptance")]
pub async fn acceptance(
    caller: Caller,
    request: HttpRequest,
    state: web::Data<AppState>,
) -> Result<web::Json<AcceptanceResponse>, ApiError> {
    let principal = caller.require(Permission::ReadAnalytics)?;
    let query: AcceptanceQuery = parse_query(&request)?;
    if let (Some(since), Some(until)) = (query.since, query.until)
        && since >= until
    {
        return Err(ApiError::invalid(
            "since",
            format!("must be before until ({until})"),
        ));
    }
    let counts = analytics::acceptance(
        &state.pool,
        principal.org.as_str(),
        query.group_by,
        query.since,
        query.until,
    )
    .await?;
    let rows = counts
        .into_iter()
        .map(|c| {
            let (lo, hi) = bandit::interval::wilson(c.accepted as u64, c.shown as u64, 1.96)
                .unwrap_or((0.0, 1.0));
            AcceptanceRow {
                rate: c.accepted as f64 / c.shown.max(1) as f64,
                ci95: [lo, hi],
                key: c.key,
                shown: c.shown,
                accepted: c.accepted,
            }
        })
        .collect();
    Ok(web::Json(AcceptanceResponse {
        group_by: query.group_by,
        rows,
    }))
}
