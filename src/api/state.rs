//! What every handler can reach: the database, the key cache, metrics and limits.

use std::sync::Arc;

use sqlx::PgPool;

use crate::auth::KeyCache;
use crate::recommend::service::Serving;

/// Shared application state (behind `web::Data`).
#[derive(Debug)]
pub struct AppState {
    pub pool: PgPool,
    pub keys: KeyCache,
    pub metrics: telemetry::Metrics,
    /// Largest accepted request body, in bytes.
    pub body_limit: usize,
    /// Candidates, cluster models and bandit policies per organization.
    pub serving: Arc<Serving>,
}
