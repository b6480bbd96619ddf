//! API keys: creation, lookup and revocation. Only a SHA-256 of each secret is stored.

use chrono::NaiveDate;
use sqlx::PgPool;

use super::{QueryContext, StorageError};
use crate::quota::QuotaLedger;

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
    /// The key's own daily request quota, where one was set.
    pub daily_quota: Option<i64>,
}

/// A key's own limits in `api_keys`' columns: (requests per second, burst) and requests per day.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StoredLimits {
    pub rate_limit: Option<(f64, i32)>,
    pub daily_quota: Option<i64>,
}

/// Stores a new key (creating its organization if needed).
pub async fn insert(
    pool: &PgPool,
    org: &str,
    key_id: &str,
    secret_hash: &str,
    role: &str,
    label: Option<&str>,
    limits: StoredLimits,
) -> Result<(), StorageError> {
    let StoredLimits {
        rate_limit,
        daily_quota,
    } = limits;
    let mut tx = pool.begin().await.context("begin key transaction")?;
    sqlx::query("INSERT INTO organizations (org_id) VALUES ($1) ON CONFLICT DO NOTHING")
        .bind(org)
        .execute(&mut *tx)
        .await
        .context("insert organization")?;
    sqlx::query("INSERT INTO api_keys (org_id, key_id, secret_hash, role, label, rate_per_second, burst, daily_quota) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)")
        .bind(org)
        .bind(key_id)
        .bind(secret_hash)
        .bind(role)
        .bind(label)
        .bind(rate_limit.map(|(rate, _)| rate))
        .bind(rate_limit.map(|(_, burst)| burst))
        .bind(daily_quota)
        .execute(&mut *tx)
        .await
        .context("insert api key")?;
    tx.commit().await.context("commit api key")
}

/// The unrevoked key with this id, if any.
pub async fn find_active(pool: &PgPool, key_id: &str) -> Result<Option<StoredKey>, StorageError> {
    sqlx::query_as("SELECT org_id, key_id, secret_hash, role, rate_per_second, burst, daily_quota FROM api_keys WHERE key_id = $1 AND revoked_at IS NULL")
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

/// Sets (or, with `None`, clears) an active key's own daily quota; returns whether `org` has
/// such a key.
pub async fn set_daily_quota(
    pool: &PgPool,
    org: &str,
    key_id: &str,
    daily_quota: Option<i64>,
) -> Result<bool, StorageError> {
    let result = sqlx::query("UPDATE api_keys SET daily_quota = $3 WHERE org_id = $1 AND key_id = $2 AND revoked_at IS NULL")
        .bind(org)
        .bind(key_id)
        .bind(daily_quota)
        .execute(pool)
        .await
        .context("set api key daily quota")?;
    Ok(result.rows_affected() == 1)
}

/// Requests stored for `key_id` on `day` (every server's flushed requests).
pub async fn usage_on(pool: &PgPool, key_id: &str, day: NaiveDate) -> Result<i64, StorageError> {
    let requests: Option<i64> =
        sqlx::query_scalar("SELECT requests FROM api_key_usage WHERE key_id = $1 AND day = $2")
            .bind(key_id)
            .bind(day)
            .fetch_optional(pool)
            .await
            .context("read api key usage")?;
    Ok(requests.unwrap_or(0))
}

/// Adds requests to the stored daily usage, (organization, key id, day, requests) each, in one
/// statement; returns each row's new total (key id, day, total).
pub async fn add_usage(
    pool: &PgPool,
    usage: &[(String, String, NaiveDate, u64)],
) -> Result<Vec<(String, NaiveDate, i64)>, StorageError> {
    let mut orgs = Vec::with_capacity(usage.len());
    let mut keys = Vec::with_capacity(usage.len());
    let mut days = Vec::with_capacity(usage.len());
    let mut counts = Vec::with_capacity(usage.len());
    for (org, key, day, count) in usage {
        orgs.push(org.as_str());
        keys.push(key.as_str());
        days.push(*day);
        counts.push(i64::try_from(*count).unwrap_or(i64::MAX));
    }
    // Sorted by key so two servers flushing the same keys lock their rows in the same order.
    sqlx::query_as(
        "INSERT INTO api_key_usage (org_id, key_id, day, requests)
         SELECT * FROM unnest($1::text[], $2::text[], $3::date[], $4::bigint[]) ORDER BY 2, 3
         ON CONFLICT (key_id, day) DO UPDATE SET requests = api_key_usage.requests + EXCLUDED.requests
         RETURNING key_id, day, requests",
    )
    .bind(orgs)
    .bind(keys)
    .bind(days)
    .bind(counts)
    .fetch_all(pool)
    .await
    .context("add api key usage")
}

/// Adds the requests `ledger` admitted since the last call to the stored daily usage and gives
/// the ledger back the totals (which include other replicas' requests); on failure the ledger
/// keeps them for the next call. Returns how many keys' usage was stored.
pub async fn store_usage(pool: &PgPool, ledger: &QuotaLedger) -> Result<usize, StorageError> {
    let pending = ledger.take_pending();
    if pending.is_empty() {
        return Ok(0);
    }
    match add_usage(pool, &pending).await {
        Ok(totals) => {
            let totals: Vec<(String, NaiveDate, u64)> = totals
                .into_iter()
                .map(|(key, day, total)| (key, day, u64::try_from(total).unwrap_or(0)))
                .collect();
            ledger.record_stored(&totals);
            Ok(totals.len())
        }
        Err(err) => {
            ledger.restore_pending(pending);
            Err(err)
        }
    }
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
    pub daily_quota: Option<i64>,
    /// Requests stored for today (UTC).
    pub requests_today: i64,
}

/// Keys of an organization, newest first.
pub async fn list(pool: &PgPool, org: &str) -> Result<Vec<ListedKey>, StorageError> {
    sqlx::query_as(
        "SELECT k.key_id, k.role, k.label, k.created_at, k.revoked_at IS NOT NULL AS revoked,
                k.rate_per_second, k.burst, k.daily_quota, coalesce(u.requests, 0) AS requests_today
         FROM api_keys k
         LEFT JOIN api_key_usage u ON u.key_id = k.key_id AND u.day = (now() AT TIME ZONE 'UTC')::date
         WHERE k.org_id = $1 ORDER BY k.created_at DESC",
    )
    .bind(org)
    .fetch_all(pool)
    .await
    .context("list api keys")
}
