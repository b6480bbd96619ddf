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

/// Which decisions an analyst query counts: one organization's (or, for operators' CLI, every
/// organization's together when `org` is `None`), in a period, optionally in one failure cluster.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Scope<'a> {
    pub org: Option<&'a str>,
    pub period: Period,
    pub cluster: Option<&'a str>,
}

/// Acceptance counts of shown recommendations in `scope` by `group_by`, most shown first. Read
/// from the counts kept as decisions and answers are written (sql/0015), so its cost grows with
/// days × groups, not with the log.
pub async fn acceptance(
    pool: &PgPool,
    scope: Scope<'_>,
    group_by: GroupBy,
) -> Result<Vec<AcceptanceCount>, StorageError> {
    // The column comes from a closed enum, never from the client's text.
    let sql = format!(
        "SELECT {col} AS key, sum(shown)::bigint AS shown, sum(accepted)::bigint AS accepted
         FROM analyst_acceptance_counts
         WHERE {SCOPE_WHERE}
         GROUP BY 1 ORDER BY shown DESC, key",
        col = group_by.column()
    );
    bind_scope(sqlx::query_as(&sql), scope)
        .fetch_all(pool)
        .await
        .context("acceptance analytics")
}

/// The filter every counts query shares: $1 organization, $2–$3 period, $4 cluster.
const SCOPE_WHERE: &str = "($1::text IS NULL OR org_id = $1)
           AND ($2::date IS NULL OR day >= $2) AND ($3::date IS NULL OR day < $3)
           AND ($4::text IS NULL OR cluster_id = $4)";

fn bind_scope<'q, O>(
    query: sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments>,
    scope: Scope<'q>,
) -> sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments> {
    query
        .bind(scope.org)
        .bind(scope.period.since)
        .bind(scope.period.until)
        .bind(scope.cluster)
}

/// Shown and accepted counts of one series (a value of the grouping) on one day.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct DailyCount {
    pub day: NaiveDate,
    pub series: String,
    pub shown: i64,
    pub accepted: i64,
}

impl DailyCount {
    /// The day's counts as an [`AcceptanceCount`] keyed by the series (for its rate and interval).
    pub fn counts(&self) -> AcceptanceCount {
        AcceptanceCount {
            key: self.series.clone(),
            shown: self.shown,
            accepted: self.accepted,
        }
    }
}

/// Acceptance counts in `scope` per day and per value of `series` (e.g. each policy version's
/// line over time), by day then series.
pub async fn acceptance_by_day(
    pool: &PgPool,
    scope: Scope<'_>,
    series: GroupBy,
) -> Result<Vec<DailyCount>, StorageError> {
    let sql = format!(
        "SELECT day, {col} AS series, sum(shown)::bigint AS shown, sum(accepted)::bigint AS accepted
         FROM analyst_acceptance_counts
         WHERE {SCOPE_WHERE}
         GROUP BY 1, 2 ORDER BY 1, 2",
        col = series.column()
    );
    bind_scope(sqlx::query_as(&sql), scope)
        .fetch_all(pool)
        .await
        .context("acceptance analytics by day")
}

/// A failure cluster some decision of the organization was placed in, with its label where the
/// clustering model still has it.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct ClusterName {
    pub cluster_id: String,
    pub label: Option<String>,
}

/// The clusters `org`'s counted decisions fall in (every organization's with `None`; a
/// dashboard's cluster filter).
pub async fn counted_clusters(
    pool: &PgPool,
    org: Option<&str>,
) -> Result<Vec<ClusterName>, StorageError> {
    sqlx::query_as(
        "SELECT c.cluster_id, f.label
         FROM (SELECT DISTINCT cluster_id FROM analyst_acceptance_counts
               WHERE ($1::text IS NULL OR org_id = $1)) AS c
         LEFT JOIN LATERAL (SELECT label FROM failure_clusters f
                            WHERE f.cluster_id = c.cluster_id AND ($1::text IS NULL OR f.org_id = $1)
                            ORDER BY f.org_id LIMIT 1) AS f ON true
         ORDER BY c.cluster_id",
    )
    .bind(org)
    .fetch_all(pool)
    .await
    .context("list the counted clusters")
}

/// What is known of the accepted recommendations of one group: the reliability deltas the
/// platform reported with them and the expected cost changes they were served with (sql/0018),
/// each as a count of items that had one and their sum.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct AcceptedOutcomes {
    pub key: String,
    pub accepted: i64,
    pub reliability_reported: i64,
    pub reliability_delta_sum: f64,
    pub cost_known: i64,
    pub cost_delta_sum: f64,
}

impl AcceptedOutcomes {
    /// The mean reported reliability delta (`None` when no accepted item carried one).
    pub fn mean_reliability_delta(&self) -> Option<f64> {
        (self.reliability_reported > 0)
            .then(|| self.reliability_delta_sum / self.reliability_reported as f64)
    }

    /// The mean expected cost change per run, USD (`None` when no accepted item had one).
    pub fn mean_cost_delta_usd(&self) -> Option<f64> {
        (self.cost_known > 0).then(|| self.cost_delta_sum / self.cost_known as f64)
    }
}

/// The outcomes of the accepted recommendations in `scope` by `group_by`, from the same counts
/// as [`acceptance`].
pub async fn accepted_outcomes(
    pool: &PgPool,
    scope: Scope<'_>,
    group_by: GroupBy,
) -> Result<Vec<AcceptedOutcomes>, StorageError> {
    let sql = format!(
        "SELECT {col} AS key, sum(accepted)::bigint AS accepted,
                sum(reliability_reported)::bigint AS reliability_reported,
                sum(reliability_delta_sum)::float8 AS reliability_delta_sum,
                sum(accepted_cost_known)::bigint AS cost_known,
                sum(accepted_cost_delta_sum)::float8 AS cost_delta_sum
         FROM analyst_acceptance_counts
         WHERE {SCOPE_WHERE}
         GROUP BY 1 HAVING sum(accepted) > 0 ORDER BY accepted DESC, key",
        col = group_by.column()
    );
    bind_scope(sqlx::query_as(&sql), scope)
        .fetch_all(pool)
        .await
        .context("outcomes of accepted recommendations")
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

/// The newest `limit` position-0 decisions in `scope` with whether they were accepted.
pub async fn logged_tops(
    pool: &PgPool,
    scope: Scope<'_>,
    limit: i64,
) -> Result<Vec<LoggedTop>, StorageError> {
    // The newest tops first, then one index probe of the feedback per top (LIMIT 1 in a lateral
    // join): an EXISTS over the whole select was planned as a hash of every accepting answer of
    // the log (0.8 s at a million answers, where this takes 0.3 s for 20,000 tops).
    sqlx::query_as(
        "SELECT t.candidate_set, t.candidates, t.recommendation_id, t.propensity,
                a.accepted IS NOT NULL AS accepted
         FROM (SELECT l.candidate_set, l.candidates, l.created_at, i.org_id, i.event_id,
                      i.recommendation_id, i.propensity
               FROM decision_items i
               JOIN decision_log l ON l.org_id = i.org_id AND l.event_id = i.event_id
               WHERE ($1::text IS NULL OR i.org_id = $1) AND i.position = 0
                 AND ($2::date IS NULL OR l.created_at >= $2::date)
                 AND ($3::date IS NULL OR l.created_at < $3::date)
                 AND ($4::text IS NULL OR coalesce(l.cluster_id, 'unassigned') = $4)
               ORDER BY l.created_at DESC
               LIMIT $5) AS t
         LEFT JOIN LATERAL (SELECT true AS accepted FROM feedback f
                            WHERE f.org_id = t.org_id AND f.event_id = t.event_id
                              AND f.recommendation_id = t.recommendation_id
                              AND f.outcome IN ('accepted', 'applied')
                            LIMIT 1) AS a ON true
         ORDER BY t.created_at DESC",
    )
    .bind(scope.org)
    .bind(scope.period.since)
    .bind(scope.period.until)
    .bind(scope.cluster)
    .bind(limit)
    .fetch_all(pool)
    .await
    .context("read the decision log for off-policy evaluation")
}
