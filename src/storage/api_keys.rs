//! API keys: creation, lookup and revocation. Only a SHA-256 of each secret is stored.

use sqlx::PgPool;

use super::{QueryContext, StorageError};

/// A stored key as the service needs it to authenticate a request.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct StoredKey {
    pub org_id: String,
    pub key_id: String,
    pub secret_hash: String,
    pub role: String,
    /// The key's own rate limit (requests per second, burst), where one was set.
    pub rate_per_second: Option<f64>,
    pub burst: Option<i32>,
}

/// Stores a new key (creating its organization if needed).
pub async fn insert(
    pool: &PgPool,
    org: &str,
    key_id: &str,
    secret_hash: &str,
    role: &str,
    label: Option<&str>,
    rate_limit: Option<(f64, i32)>,
) -> Result<(), StorageError> {
    let mut tx = pool.begin().await.context("begin key transaction")?;
    sqlx::query("INSERT INTO organizations (org_id) VALUES ($1) ON CONFLICT DO NOTHING")
        .bind(org)
        .execute(&mut *tx)
        .await
        .context("insert organization")?;
    sqlx::query("INSERT INTO api_keys (org_id, key_id, secret_hash, role, label, rate_per_second, burst) VALUES ($1, $2, $3, $4, $5, $6, $7)")
        .bind(org)
        .bind(key_id)
        .bind(secret_hash)
        .bind(role)
        .bind(label)
        .bind(rate_limit.map(|(rate, _)| rate))
        .bind(rate_limit.map(|(_, burst)| burst))
        .execute(&mut *tx)
        .await
        .context("insert api key")?;
    tx.commit().await.context("commit api key")
}

/// The unrevoked key with this id, if any.
pub async fn find_active(pool: &PgPool, key_id: &str) -> Result<Option<StoredKey>, StorageError> {
    sqlx::query_as("SELECT org_id, key_id, secret_hash, role, rate_per_second, burst FROM api_keys WHERE key_id = $1 AND revoked_at IS NULL")
        .bind(key_id)
        .fetch_optional(pool)
        .await
        .context("look up api key")
}

/// Revokes a key of `org`; returns whether one was revoked.
pub async fn revoke(pool: &PgPool, org: &str, key_id: &str) -> Result<bool, StorageError> {
    let result = sqlx::query("UPDATE api_keys SET revoked_at = now() WHERE org_id = $1 AND key_id = $2 AND revoked_at IS NULL")
        .bind(org)
        .bind(key_id)
        .execute(pool)
        .await
        .context("revoke api key")?;
    Ok(result.rows_affected() == 1)
}

/// Sets (or, with `None`, clears) an active key's own rate limit; returns whether `org` has
/// such a key.
pub async fn set_rate_limit(
    pool: &PgPool,
    org: &str,
    key_id: &str,
    rate_limit: Option<(f64, i32)>,
) -> Result<bool, StorageError> {
    let result = sqlx::query("UPDATE api_keys SET rate_per_second = $3, burst = $4 WHERE org_id = $1 AND key_id = $2 AND revoked_at IS NULL")
        .bind(org)
        .bind(key_id)
        .bind(rate_limit.map(|(rate, _)| rate))
        .bind(rate_limit.map(|(_, burst)| burst))
        .execute(pool)
        .await
        .context("set api key rate limit")?;
    Ok(result.rows_affected() == 1)
}

/// A key as `arc-rec keys list` shows it (never its secret).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ListedKey {
    pub key_id: String,
    pub role: String,
    pub label: Option<String>,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub revoked: bool,
    pub rate_per_second: Option<f64>,
    pub burst: Option<i32>,
}

/// Keys of an organization, newest first.
pub async fn list(pool: &PgPool, org: &str) -> Result<Vec<ListedKey>, StorageError> {
    sqlx::query_as(
        "SELECT key_id, role, label, created_at, revoked_at IS NOT NULL AS revoked, rate_per_second, burst FROM api_keys WHERE org_id = $1 ORDER BY created_at DESC",
    )
    .bind(org)
    .fetch_all(pool)
    .await
    .context("list api keys")
}
