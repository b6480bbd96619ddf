//! `bandit_state`: each organization's learner snapshot per policy version
//! (`recommend::snapshot`), written by the learners and read at start-up.

use sqlx::PgPool;

use super::{QueryContext, StorageError};

/// One stored snapshot.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct StoredSnapshot {
    pub org_id: String,
    /// The snapshot format (`recommend::snapshot::SNAPSHOT_FORMAT`).
    pub state_version: i32,
    /// The snapshot as JSON text.
    pub state: String,
    /// Feedback rows the snapshot has learned.
    pub feedback_count: i64,
}

/// Stores `org`'s snapshot for `policy_version` unless one that learned more is stored already
/// (replicas snapshot the same learning; the most advanced one wins, so a lagging replica never
/// takes a restart back).
pub async fn save_snapshot(
    pool: &PgPool,
    org: &str,
    policy_version: &str,
    state_version: i32,
    state: &str,
    feedback_count: i64,
) -> Result<(), StorageError> {
    sqlx::query(
        "INSERT INTO bandit_state (org_id, policy_version, state_version, state, feedback_count)
         VALUES ($1, $2, $3, $4::jsonb, $5)
         ON CONFLICT (org_id, policy_version) DO UPDATE
         SET state_version = EXCLUDED.state_version, state = EXCLUDED.state,
             feedback_count = EXCLUDED.feedback_count, created_at = now()
         WHERE bandit_state.feedback_count <= EXCLUDED.feedback_count",
    )
    .bind(org)
    .bind(policy_version)
    .bind(state_version)
    .bind(state)
    .bind(feedback_count)
    .execute(pool)
    .await
    .context("store a bandit snapshot")?;
    Ok(())
}

/// Every organization's snapshot for `policy_version`.
pub async fn load_snapshots(
    pool: &PgPool,
    policy_version: &str,
) -> Result<Vec<StoredSnapshot>, StorageError> {
    sqlx::query_as(
        "SELECT org_id, state_version, state::text AS state, feedback_count
         FROM bandit_state WHERE policy_version = $1 ORDER BY org_id",
    )
    .bind(policy_version)
    .fetch_all(pool)
    .await
    .context("read bandit snapshots")
}
