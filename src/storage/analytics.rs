//! Analyst queries over the decision log and feedback.

use chrono::NaiveDate;
use sqlx::PgPool;

use super::{QueryContext, StorageError};

/// A dimension acceptance can be grouped by.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum GroupBy {
    Cluster,
    Type,
    Provider,
    PolicyVersion,
    /// `heuristic`, or `model:<model version>` for the recommender model's ideas.
    Source,
    Day,
}

impl GroupBy {
    /// The column of `analyst_acceptance_counts` holding the key.
    fn column(self) -> &'static str {
        match self {
            GroupBy::Cluster => "cluster_id",
            GroupBy::Type => "recommendation_type",
            GroupBy::Provider => "model_provider",
            GroupBy::PolicyVersion => "policy_version",
            GroupBy::Source => "source_key",
            GroupBy::Day => "day::text",
        }
    }
}

/// Shown and accepted counts for one key.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct AcceptanceCount {
    pub key: String,
    pub shown: i64,
    pub accepted: i64,
}

impl AcceptanceCount {
    /// Accepted / shown (0 when nothing was shown).
    pub fn rate(&self) -> f64 {
        self.accepted as f64 / self.shown.max(1) as f64
    }

    /// The Wilson 95 % interval of the rate ([0, 1] when nothing was shown).
    pub fn ci95(&self) -> [f64; 2] {
        let count = |n: i64| u64::try_from(n).unwrap_or(0);
        let (lo, hi) = bandit::interval::wilson(count(self.accepted), count(self.shown), 1.96)
            .unwrap_or((0.0, 1.0));
        [lo, hi]
    }
}

/// A period of UTC days, `[since, until)`, either end open.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Period {
    pub since: Option<NaiveDate>,
    pub until: Option<NaiveDate>,
}

impl Period {
    /// Refuses an empty or inverted period, naming `since`.
    pub fn new(since: Option<NaiveDate>, until: Option<NaiveDate>) -> Result<Self, String> {
        match (since, until) {
            (Some(since), Some(until)) if since >= until => {
                Err(format!("must be before until ({until})"))
            }
            _ => Ok(Self { since, until }),
        }
    }
}

/// Acceptance counts of shown recommendations by `group_by` over `period`, most shown first:
/// `org`'s, or every organization's together when `None` (operators' CLI). Read from the counts
/// kept as decisions and answers are written (sql/0015), so its cost grows with days × groups,
/// not with the log.
pub async fn acceptance(
    pool: &PgPool,
    org: Option<&str>,
    group_by: GroupBy,
    period: Period,
) -> Result<Vec<AcceptanceCount>, StorageError> {
    // The column comes from a closed enum, never from the client's text.
    let sql = format!(
        "SELECT {col} AS key, sum(shown)::bigint AS shown, sum(accepted)::bigint AS accepted
         FROM analyst_acceptance_counts
         WHERE ($1::text IS NULL OR org_id = $1)
           AND ($2::date IS NULL OR day >= $2) AND ($3::date IS NULL OR day < $3)
         GROUP BY 1 ORDER BY shown DESC, key",
        col = group_by.column()
    );
    sqlx::query_as(&sql)
        .bind(org)
        .bind(period.since)
        .bind(period.until)
        .fetch_all(pool)
        .await
        .context("acceptance analytics")
}

/// A logged top recommendation for off-policy evaluation.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct LoggedTop {
    /// The decision's candidate set in the binary layout of `recommend::candidate_log`...
    pub candidate_set: Option<Vec<u8>>,
    /// ...or, for decisions logged before that column, as a JSON array.
    pub candidates: Option<serde_json::Value>,
    pub recommendation_id: String,
    pub propensity: f64,
    pub accepted: bool,
}

/// Folds the acceptance deltas written since the last call into `acceptance_counts` (sql/0015);
/// returns how many delta rows were folded (0 while another replica is folding).
pub async fn compact_acceptance(pool: &PgPool) -> Result<i64, StorageError> {
    sqlx::query_scalar("SELECT arc_rec_compact_acceptance()")
        .fetch_one(pool)
        .await
        .context("fold acceptance deltas")
}

/// Most decisions one off-policy evaluation reads (the newest).
pub const OPE_MAX_DECISIONS: i64 = 200_000;

/// `org`'s position-0 decisions in `[since, until)` with whether they were accepted.
pub async fn logged_tops(
    pool: &PgPool,
    org: &str,
    period: Period,
) -> Result<Vec<LoggedTop>, StorageError> {
    sqlx::query_as(
        "SELECT l.candidate_set, l.candidates, i.recommendation_id, i.propensity,
                EXISTS (SELECT 1 FROM feedback f WHERE f.org_id = i.org_id AND f.event_id = i.event_id
                        AND f.recommendation_id = i.recommendation_id AND f.outcome IN ('accepted', 'applied')) AS accepted
         FROM decision_items i
         JOIN decision_log l ON l.org_id = i.org_id AND l.event_id = i.event_id
         WHERE i.org_id = $1 AND i.position = 0
           AND ($2::date IS NULL OR l.created_at >= $2::date) AND ($3::date IS NULL OR l.created_at < $3::date)
         ORDER BY l.created_at DESC
         LIMIT $4",
    )
    .bind(org)
    .bind(period.since)
    .bind(period.until)
    .bind(OPE_MAX_DECISIONS)
    .fetch_all(pool)
    .await
    .context("read the decision log for off-policy evaluation")
}
