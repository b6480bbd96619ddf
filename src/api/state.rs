//! What every handler can reach: the database, the key cache, metrics and limits (body size,
//! handling time, request rates, daily quotas).

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;

use crate::api::request_schemas::RequestSchemas;
use crate::auth::{KeyCache, RoleQuotas, RoleRateLimits};
use crate::quota::QuotaLedger;
use crate::rate_limit::RateLimiter;
use crate::recommend::service::Serving;

/// Shared application state (behind `web::Data`).
#[derive(Debug)]
pub struct AppState {
    pub pool: PgPool,
    /// Analyst queries' own pool (`storage::analytics_pool`): they never take serving's
    /// connections, and take at most one database backend.
    pub analytics_pool: PgPool,
    pub keys: KeyCache,
    pub metrics: telemetry::Metrics,
    /// Largest accepted request body, in bytes.
    pub body_limit: usize,
    /// Longest a request may take to handle before it is answered 503.
    pub handling_timeout: Duration,
    /// Each role's request rate limit (a key's own, where set, wins).
    pub rate_limits: RoleRateLimits,
    /// The keys' request buckets.
    pub limiter: RateLimiter,
    /// Each role's daily quota (a key's own, where set, wins).
    pub quotas: RoleQuotas,
    /// The keys' requests today, shared with the task that stores them (`commands::serve`).
    pub quota_ledger: Arc<QuotaLedger>,
    /// Each operation's request body schema, from the served OpenAPI document.
    pub request_schemas: &'static RequestSchemas,
    /// Candidates, cluster models and bandit policies per organization.
    pub serving: Arc<Serving>,
}
