//! A model version's lifecycle (`arc-rec models`): what each version served and how it was
//! answered, and its status. Only `live` versions' candidates are served
//! (`candidate_stats::load_model_candidates_by_cluster`); `retired` takes a version's ideas out of
//! serving, `live` puts them back.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::{QueryContext, StorageError};

/// Whether a version's candidates are served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VersionStatus {
    Live,
    Retired,
}

impl VersionStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            VersionStatus::Live => "live",
            VersionStatus::Retired => "retired",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        match text {
            "live" => Some(VersionStatus::Live),
            "retired" => Some(VersionStatus::Retired),
            _ => None,
        }
    }
}

/// One model version of one organization, with what serving did with its ideas.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct VersionSummary {
    pub org_id: String,
    pub model_version_id: String,
    pub base_model: String,
    pub created_at: DateTime<Utc>,
    pub status: VersionStatus,
    pub status_changed_at: DateTime<Utc>,
    /// Candidate rows it holds now (a later version's `candidates` takes over the rows of ideas
    /// it also had).
    pub candidates: i64,
    /// Decisions that showed one of its ideas (at any position).
    pub decisions: i64,
    /// Its shown ideas that got an answer, and those accepted (the analytics' definition: an
    /// `accepted` or `applied` answer).
    pub answered: i64,
    pub accepted: i64,
}

impl VersionSummary {
    /// Accepted among answered, with its Wilson 95 % interval; `None` before the first answer.
    pub fn acceptance(&self) -> Option<(f64, [f64; 2])> {
        let count = |n: i64| u64::try_from(n).unwrap_or(0);
        let (answered, accepted) = (count(self.answered), count(self.accepted));
        let (lo, hi) = bandit::interval::wilson(accepted, answered, 1.96)?;
        Some((accepted as f64 / answered as f64, [lo, hi]))
    }
}

/// Every model version of `org` (of every organization when `None`), newest first.
pub async fn list(pool: &PgPool, org: Option<&str>) -> Result<Vec<VersionSummary>, StorageError> {
    type Row = (
        String,
        String,
        String,
        DateTime<Utc>,
        String,
        DateTime<Utc>,
        i64,
        i64,
        i64,
        i64,
    );
    // Answers are counted per shown item (its first accepting answer decides, as in analytics);
    // an item answered twice is one answer.
    let rows: Vec<Row> = sqlx::query_as(
        "WITH shown AS (
             SELECT i.org_id, i.model_version_id, i.event_id, i.recommendation_id,
                    EXISTS (SELECT 1 FROM feedback f WHERE f.org_id = i.org_id
                              AND f.event_id = i.event_id
                              AND f.recommendation_id = i.recommendation_id) AS answered,
                    EXISTS (SELECT 1 FROM feedback f WHERE f.org_id = i.org_id
                              AND f.event_id = i.event_id
                              AND f.recommendation_id = i.recommendation_id
                              AND f.outcome IN ('accepted', 'applied')) AS accepted
             FROM decision_items i
             WHERE i.model_version_id IS NOT NULL AND ($1::text IS NULL OR i.org_id = $1)
         ),
         served AS (
             SELECT org_id, model_version_id, count(DISTINCT event_id) AS decisions,
                    count(*) FILTER (WHERE answered) AS answered,
                    count(*) FILTER (WHERE accepted) AS accepted
             FROM shown GROUP BY org_id, model_version_id
         ),
         held AS (
             SELECT org_id, model_version_id, count(*) AS candidates
             FROM candidate_recommendations
             WHERE source = 'model' AND ($1::text IS NULL OR org_id = $1)
             GROUP BY org_id, model_version_id
         )
         SELECT v.org_id, v.model_version_id, v.base_model, v.created_at, v.status,
                v.status_changed_at, coalesce(h.candidates, 0), coalesce(s.decisions, 0),
                coalesce(s.answered, 0), coalesce(s.accepted, 0)
         FROM model_versions v
         LEFT JOIN held h USING (org_id, model_version_id)
         LEFT JOIN served s USING (org_id, model_version_id)
         WHERE $1::text IS NULL OR v.org_id = $1
         ORDER BY v.created_at DESC, v.org_id, v.model_version_id",
    )
    .bind(org)
    .fetch_all(pool)
    .await
    .context("list model versions")?;
    Ok(rows
        .into_iter()
        .map(
            |(
                org_id,
                model_version_id,
                base_model,
                created_at,
                status,
                status_changed_at,
                candidates,
                decisions,
                answered,
                accepted,
            )| VersionSummary {
                org_id,
                model_version_id,
                base_model,
                created_at,
                // The column's check allows only the two.
                status: VersionStatus::parse(&status).unwrap_or(VersionStatus::Live),
                status_changed_at,
                candidates,
                decisions,
                answered,
                accepted,
            },
        )
        .collect())
}

/// `version`'s status in `org` (`None`: no such version).
pub async fn status(
    pool: &PgPool,
    org: &str,
    version: &str,
) -> Result<Option<VersionStatus>, StorageError> {
    let status: Option<String> = sqlx::query_scalar(
        "SELECT status FROM model_versions WHERE org_id = $1 AND model_version_id = $2",
    )
    .bind(org)
    .bind(version)
    .fetch_optional(pool)
    .await
    .context("read model version status")?;
    Ok(status.as_deref().and_then(VersionStatus::parse))
}

/// Sets `version`'s status in `org`; returns the status it had, or `None` when the organization
/// has no such version. Setting the status it already has changes nothing (not even
/// `status_changed_at`, so serving does not reload for it).
pub async fn set_status(
    pool: &PgPool,
    org: &str,
    version: &str,
    status: VersionStatus,
) -> Result<Option<VersionStatus>, StorageError> {
    let mut tx = pool.begin().await.context("begin model version status")?;
    let before: Option<String> = sqlx::query_scalar(
        "SELECT status FROM model_versions WHERE org_id = $1 AND model_version_id = $2 FOR UPDATE",
    )
    .bind(org)
    .bind(version)
    .fetch_optional(&mut *tx)
    .await
    .context("read model version status")?;
    let Some(before) = before.as_deref().and_then(VersionStatus::parse) else {
        return Ok(None);
    };
    if before != status {
        sqlx::query(
            "UPDATE model_versions SET status = $3, status_changed_at = clock_timestamp()
             WHERE org_id = $1 AND model_version_id = $2",
        )
        .bind(org)
        .bind(version)
        .bind(status.as_str())
        .execute(&mut *tx)
        .await
        .context("set model version status")?;
    }
    tx.commit().await.context("commit model version status")?;
    Ok(Some(before))
}
