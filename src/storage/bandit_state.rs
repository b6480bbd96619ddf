//! `bandit_state`: each organization's learner snapshot per policy version
//! (`recommend::snapshot`), written by the learners and read at start-up.

use sqlx::pool::PoolConnection;
use sqlx::{Connection, PgPool, Postgres};

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
    let mut connection = pool.acquire().await.context("store a bandit snapshot")?;
    let stored = sqlx::query(
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
    .execute(&mut *connection)
    .await
    .context("store a bandit snapshot");
    discard(connection).await;
    stored.map(drop)
}

/// Every organization's snapshot for `policy_version`.
pub async fn load_snapshots(
    pool: &PgPool,
    policy_version: &str,
) -> Result<Vec<StoredSnapshot>, StorageError> {
    let mut connection = pool.acquire().await.context("read bandit snapshots")?;
    let snapshots = sqlx::query_as(
        "SELECT org_id, state_version, state::text AS state, feedback_count
         FROM bandit_state WHERE policy_version = $1 ORDER BY org_id",
    )
    .bind(policy_version)
    .fetch_all(&mut *connection)
    .await
    .context("read bandit snapshots");
    discard(connection).await;
    snapshots
}

/// Closes a connection that carried a snapshot instead of returning it to the pool (which opens
/// a replacement when one is needed). A connection keeps its socket buffers at the largest
/// message it ever sent or read, so one that carried a snapshot (megabytes) would hold that much
/// for the rest of its life, and over hours of snapshots every connection of the pool would: the
/// soak's server grew by ~12 MB per pooled connection that way (heaptrack). A close that fails
/// (the connection is already broken) leaves nothing to free.
async fn discard(connection: PoolConnection<Postgres>) {
    if let Err(err) = connection.detach().close().await {
        tracing::debug!(error = %err, "closing a snapshot's connection");
    }
}
