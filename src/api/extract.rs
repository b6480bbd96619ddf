//! The authenticated-caller extractor: `Authorization: Bearer arc_<id>_<secret>`, then the
//! key's request rate limit and daily quota.

use std::future::Future;
use std::pin::Pin;
use std::time::Instant;

use actix_web::dev::Payload;
use actix_web::{FromRequest, HttpRequest, web};

use super::error::ApiError;
use super::state::AppState;
use crate::auth::{Permission, Principal};
use crate::quota::{Admission, DailyQuota, seconds_to_next_day};
use crate::storage::api_keys;

/// The caller, authenticated. Handlers then check a permission with [`Caller::require`].
#[derive(Debug, Clone)]
pub struct Caller(pub Principal);

impl Caller {
    /// Fails with 403 unless the caller's role allows `permission`.
    pub fn require(&self, permission: Permission) -> Result<&Principal, ApiError> {
        if self.0.role.allows(permission) {
            Ok(&self.0)
        } else {
            Err(ApiError::forbidden(self.0.role, permission))
        }
    }
}

impl FromRequest for Caller {
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<Self, Self::Error>>>>;

    fn from_request(request: &HttpRequest, _: &mut Payload) -> Self::Future {
        let token = bearer_token(request);
        let state = request.app_data::<web::Data<AppState>>().cloned();
        Box::pin(async move {
            let token = token.ok_or(ApiError::Unauthorized)?;
            let state = state
                .ok_or_else(|| ApiError::Internal(anyhow::anyhow!("application state missing")))?;
            admit(&state, &token).await
        })
    }
}

/// The key of an `Authorization: Bearer …` header.
pub fn bearer_token(request: &HttpRequest) -> Option<String> {
    request
        .headers()
        .get(actix_web::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|t| t.trim().to_owned())
}

/// Authenticates `token` and counts the request against the key's rate limit and daily quota:
/// the one door every key passes, whether it came in a header or a dashboard cookie.
pub async fn admit(state: &AppState, token: &str) -> Result<Caller, ApiError> {
    let principal = state.keys.authenticate(&state.pool, token).await?;
    if let Some(limit) = principal
        .rate_limit
        .or_else(|| state.rate_limits.of(principal.role))
    {
        state
            .limiter
            .admit(&principal.key_id, limit, Instant::now())
            .map_err(|wait| ApiError::RateLimited { retry_after: wait })?;
    }
    if let Some(quota) = principal
        .daily_quota
        .or_else(|| state.quotas.of(principal.role))
    {
        admit_within_quota(state, &principal, quota).await?;
    }
    Ok(Caller(principal))
}

/// Counts one request against the key's daily quota, reading the key's stored usage first when
/// this server has not seen the key today.
async fn admit_within_quota(
    state: &AppState,
    principal: &Principal,
    quota: DailyQuota,
) -> Result<(), ApiError> {
    let now = chrono::Utc::now();
    let today = now.date_naive();
    let mut admission = state.quota_ledger.admit(&principal.key_id, quota, today);
    if admission == Admission::Unknown {
        let stored = api_keys::usage_on(&state.pool, &principal.key_id, today).await?;
        state.quota_ledger.seed(
            principal.org.as_str(),
            &principal.key_id,
            today,
            u64::try_from(stored).unwrap_or(0),
        );
        admission = state.quota_ledger.admit(&principal.key_id, quota, today);
    }
    match admission {
        Admission::Admitted | Admission::Unknown => Ok(()),
        Admission::Exhausted => Err(ApiError::QuotaExceeded {
            quota: quota.0,
            retry_after_seconds: seconds_to_next_day(now),
        }),
    }
}
