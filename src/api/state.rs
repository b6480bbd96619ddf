//! What every handler can reach: the database, the key cache, metrics and limits.

use sqlx::PgPool;

use crate::auth::KeyCache;

/// Shared application state (behind `web::Data`).
#[derive(Debug)]
pub struct AppState {
    pub pool: PgPool,
    pub keys: KeyCache,
    pub metrics: telemetry::Metrics,
    /// Largest accepted request body, in bytes.
    pub body_limit: usize,
}
