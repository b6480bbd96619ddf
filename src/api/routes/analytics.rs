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
use crate::storage::analytics::{self, GroupBy, Period, Scope};

/// Query parameters.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AcceptanceQuery {
    /// `cluster`, `type`, `provider`, `policy_version`, `source` (`heuristic` or
    /// `model:<model version>`) or `day`.
    pub group_by: GroupBy,
    /// First day included (YYYY-MM-DD, UTC).
    pub since: Option<NaiveDate>,
    /// First day excluded (YYYY-MM-DD, UTC).
    pub until: Option<NaiveDate>,
    /// Only decisions placed in this failure cluster.
    pub cluster: Option<String>,
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
    let period =
        Period::new(query.since, query.until).map_err(|e| ApiError::invalid("since", e))?;
    let scope = Scope {
        org: Some(principal.org.as_str()),
        period,
        cluster: query.cluster.as_deref(),
    };
    let counts = analytics::acceptance(&state.analytics_pool, scope, query.group_by).await?;
    Ok(web::Json(AcceptanceResponse::new(query.group_by, counts)))
}

impl AcceptanceResponse {
    /// The answer for counts grouped by `group_by` (also `arc-rec analytics acceptance --format
    /// json`'s).
    pub fn new(group_by: GroupBy, counts: Vec<analytics::AcceptanceCount>) -> Self {
        let rows = counts
            .into_iter()
            .map(|c| AcceptanceRow {
                rate: c.rate(),
                ci95: c.ci95(),
                key: c.key,
                shown: c.shown,
                accepted: c.accepted,
            })
            .collect();
        Self { group_by, rows }
    }
}

/// Query parameters of the off-policy evaluation.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct OpeQuery {
    /// `heuristic`, `lowest_cost`, `uniform` or `type:<recommendation type>`.
    // Its pattern in the document is written from the types by `api::schema_rules`.
    pub policy: String,
    /// First day included (YYYY-MM-DD, UTC).
    pub since: Option<NaiveDate>,
    /// First day excluded (YYYY-MM-DD, UTC).
    pub until: Option<NaiveDate>,
}

/// An estimate with its 95% bootstrap interval.
#[derive(Debug, Serialize, ToSchema)]
pub struct Estimate {
    pub estimate: f64,
    pub ci95: [f64; 2],
}

/// How the stated policy would have done.
#[derive(Debug, Serialize, ToSchema)]
pub struct OpeResponse {
    pub policy: String,
    /// Logged decisions used.
    pub decisions: usize,
    /// Acceptance rate of the top recommendation under the logging (live) policy.
    pub logged_acceptance_rate: f64,
    /// Estimated top-1 acceptance rate under the stated policy.
    pub ips: Estimate,
    pub snips: Estimate,
    /// (Σw)²/Σw²: how many decisions the estimate is effectively worth.
    pub effective_sample_size: f64,
}

/// Off-policy estimate of another policy's top-1 acceptance rate from the decision log (analyst
/// or admin keys).
#[utoipa::path(
    tag = "analytics",
    params(OpeQuery),
    responses((status = 200, body = OpeResponse), (status = 401, body = crate::api::error::ErrorBody),
               (status = 403, body = crate::api::error::ErrorBody), (status = 422, body = crate::api::error::ErrorBody)),
    security(("api_key" = []))
)]
#[get("/v1/analytics/ope")]
pub async fn ope(
    caller: Caller,
    request: HttpRequest,
    state: web::Data<AppState>,
) -> Result<web::Json<OpeResponse>, ApiError> {
    use crate::recommend::ope::{TargetPolicy, decisions_of, evaluate};

    let principal = caller.require(Permission::ReadAnalytics)?;
    let query: OpeQuery = parse_query(&request)?;
    let target = TargetPolicy::parse(&query.policy).ok_or_else(|| {
        ApiError::invalid(
            "policy",
            "must be heuristic, lowest_cost, uniform or type:<recommendation type>",
        )
    })?;
    let period =
        Period::new(query.since, query.until).map_err(|e| ApiError::invalid("since", e))?;
    let scope = Scope {
        org: Some(principal.org.as_str()),
        period,
        cluster: None,
    };
    let rows =
        analytics::logged_tops(&state.analytics_pool, scope, analytics::OPE_MAX_DECISIONS).await?;
    let log = decisions_of(rows);
    if log.is_empty() {
        return Err(ApiError::invalid(
            "since",
            "no logged decisions in this period",
        ));
    }
    let logged_acceptance_rate =
        log.iter().filter(|d| d.accepted).count() as f64 / log.len() as f64;
    let config = bandit::BootstrapConfig {
        resamples: 1000,
        level: 0.95,
        seed: 1,
    };
    let decisions = log.len();
    let report = tokio::task::spawn_blocking(move || evaluate(&log, target, &config))
        .await
        .map_err(|e| ApiError::Internal(e.into()))?
        .map_err(|e| ApiError::invalid("policy", format!("cannot evaluate: {e}")))?;
    let estimate = |ci: bandit::ConfidenceInterval| Estimate {
        estimate: ci.estimate,
        ci95: [ci.lower, ci.upper],
    };
    Ok(web::Json(OpeResponse {
        policy: query.policy,
        decisions,
        logged_acceptance_rate,
        ips: estimate(report.ips),
        snips: estimate(report.snips),
        effective_sample_size: report.effective_sample_size,
    }))
}
