//! A [`CandidateIndex`] from the database: `storage::candidate_stats`'s aggregates built into the
//! index here, one layer above storage (which knows rows, not the index).

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::index::CandidateIndex;
use crate::storage::StorageError;
use crate::storage::candidate_stats::CandidateStats;

impl CandidateIndex {
    /// The candidate index of one organization over all its history (empty statistics for an
    /// unknown one).
    pub async fn load(pool: &PgPool, org: &str) -> Result<Self, StorageError> {
        Self::load_since(pool, org, None).await
    }

    /// The candidate index of one organization over outcomes and diffs since `since`.
    pub async fn load_since(
        pool: &PgPool,
        org: &str,
        since: Option<DateTime<Utc>>,
    ) -> Result<Self, StorageError> {
        let rows = CandidateStats::load_rows(pool, org, since).await?;
        Ok(Self::from_rows(org, &rows))
    }

    /// The candidate index of every organization (all history), for service start-up and
    /// refreshes.
    pub async fn load_all(pool: &PgPool) -> Result<Vec<Self>, StorageError> {
        let orgs = CandidateStats::organizations(pool).await?;
        let mut indexes = Vec::with_capacity(orgs.len());
        for org in orgs {
            indexes.push(Self::load(pool, &org).await?);
        }
        Ok(indexes)
    }
}
