//! The SQL side of `arc-rec export`: one row per decided past recommendation (config diff) with
//! the Configuration→Outcome facts around it, read through a server-side cursor so memory stays
//! bounded however many rows there are.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::{Connection, Executor, PgConnection};

use super::{Database, QueryContext, StorageError};

/// Rows fetched per round trip from the cursor.
const FETCH_ROWS: usize = 512;

/// Which diffs to export.
#[derive(Debug, Clone, Default)]
pub struct ExportFilter {
    /// Only diffs created at or after this instant.
    pub since: Option<DateTime<Utc>>,
    /// Only diffs created before this instant.
    pub until: Option<DateTime<Utc>>,
    /// Only this organization.
    pub org: Option<String>,
    /// Only diffs whose failure context falls in this cluster.
    pub cluster: Option<String>,
}

/// One decided config diff and its surroundings, as the export query returns it.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct ExportRow {
    pub org_id: String,
    pub diff_id: String,
    pub config_id: String,
    pub created_at: DateTime<Utc>,
    pub approval_status: String,
    pub recommendation_type: Option<String>,
    pub diff: Value,
    pub change_summary: String,
    pub llm_generated: bool,
    pub version_before: String,
    pub version_after: Option<String>,
    pub config_before: Value,
    pub user_role: Option<String>,
    pub domain: Option<String>,
    /// Runs (outcomes) of the version before the change, their mean reliability and cost.
    pub before_runs: i64,
    pub before_failed: i64,
    pub before_reliability: Option<f64>,
    pub before_cost: Option<f64>,
    /// Runs of the version after the change (none when it was never applied or simulated).
    pub after_runs: i64,
    pub after_reliability: Option<f64>,
    pub after_cost: Option<f64>,
    /// Process features over the after-version's trajectories.
    pub after_tool_timeouts: Option<i64>,
    pub after_tool_calls_ok: Option<i64>,
    /// Top failure groups of the before-version: `[{failure_category, failure_type, count, example}]`.
    pub failures: Option<Value>,
    /// Failing tools of the before-version: `{tool_name: count}`.
    pub failing_tools: Option<Value>,
    /// The dominant failure cluster (pattern_cluster_id, else failure_category).
    pub cluster: Option<String>,
    /// For an answered recommendation arc-rec served (`SERVED_SQL`), how it was served:
    /// `{event_id, recommendation_id, source, model_version_id, position, propensity}`; `None`
    /// for the platform's own decided diffs.
    pub served: Option<Value>,
}

/// The export query with the filter's values inlined as SQL literals, so exactly the same text
/// can run through a cursor here and through `psql \copy` in the benchmark.
pub fn export_sql(filter: &ExportFilter) -> String {
    with_filter(EXPORT_SQL, filter)
}

/// The served answers' query ([`SERVED_SQL`]) with the filter inlined as in [`export_sql`].
pub fn served_sql(filter: &ExportFilter) -> String {
    with_filter(SERVED_SQL, filter)
}

fn with_filter(sql: &str, filter: &ExportFilter) -> String {
    let ts = |t: &Option<DateTime<Utc>>| match t {
        Some(t) => format!("'{}'::timestamptz", t.to_rfc3339()),
        None => "NULL::timestamptz".to_owned(),
    };
    let text = |s: &Option<String>| match s {
        Some(s) => quote_literal(s),
        None => "NULL::text".to_owned(),
    };
    sql.replace("{since}", &ts(&filter.since))
        .replace("{until}", &ts(&filter.until))
        .replace("{org}", &text(&filter.org))
        .replace("{cluster}", &text(&filter.cluster))
}

/// An SQL string literal (standard_conforming_strings is on since Postgres 9.1).
fn quote_literal(s: &str) -> String {
    format!("'{}'::text", s.replace('\'', "''"))
}

const EXPORT_SQL: &str = r#"
SELECT * FROM (
SELECT
    d.org_id, d.diff_id, d.config_id, d.created_at, d.approval_status, d.recommendation_type,
    d.diff, d.change_summary, d.llm_generated, d.version_before, d.version_after,
    vb.parsed_config AS config_before,
    u.user_role, u.domain,
    b.runs AS before_runs, b.failed AS before_failed,
    b.reliability AS before_reliability, b.cost AS before_cost,
    a.runs AS after_runs, a.reliability AS after_reliability, a.cost AS after_cost,
    a.tool_timeouts AS after_tool_timeouts, a.tool_calls_ok AS after_tool_calls_ok,
    f.failures, ft.failing_tools, f.cluster, NULL::jsonb AS served
FROM config_diffs d
JOIN config_versions vb ON vb.org_id = d.org_id AND vb.version_id = d.version_before
LEFT JOIN configurations c ON c.org_id = d.org_id AND c.config_id = d.config_id
LEFT JOIN users u ON u.org_id = d.org_id AND u.user_id = c.user_id
CROSS JOIN LATERAL (
    SELECT count(*) AS runs,
           count(*) FILTER (WHERE o.status <> 'success') AS failed,
           avg(o.reliability_score) AS reliability,
           avg(o.cost_usd) AS cost
    FROM simulations s
    JOIN outcomes o ON o.org_id = s.org_id AND o.simulation_id = s.simulation_id
    WHERE s.org_id = d.org_id AND s.config_version_id = d.version_before
) b
CROSS JOIN LATERAL (
    SELECT count(*) AS runs,
           avg(o.reliability_score) AS reliability,
           avg(o.cost_usd) AS cost,
           sum((SELECT count(*) FROM jsonb_array_elements(o.trajectory -> 'error_events') e
                WHERE e ->> 'error_type' ILIKE '%timeout%'))::bigint AS tool_timeouts,
           sum((SELECT count(*) FROM jsonb_array_elements(o.trajectory -> 'tool_calls') t
                WHERE t -> 'success' = 'true'::jsonb))::bigint AS tool_calls_ok
    FROM simulations s
    JOIN outcomes o ON o.org_id = s.org_id AND o.simulation_id = s.simulation_id
    WHERE s.org_id = d.org_id AND s.config_version_id = d.version_after
) a
LEFT JOIN LATERAL (
    SELECT jsonb_agg(jsonb_build_object(
               'failure_category', g.failure_category, 'failure_type', g.failure_type,
               'count', g.n, 'example', g.example) ORDER BY g.n DESC, g.failure_category) AS failures,
           (array_agg(g.cluster ORDER BY g.n DESC, g.cluster))[1] AS cluster
    FROM (
        SELECT fp.failure_category, fp.failure_type, count(*) AS n, min(fp.error_message) AS example,
               coalesce(min(fp.pattern_cluster_id), fp.failure_category) AS cluster
        FROM simulations s
        JOIN outcomes o ON o.org_id = s.org_id AND o.simulation_id = s.simulation_id
        JOIN failure_patterns fp ON fp.org_id = o.org_id AND fp.outcome_id = o.outcome_id
        WHERE s.org_id = d.org_id AND s.config_version_id = d.version_before
        GROUP BY fp.failure_category, fp.failure_type
        ORDER BY n DESC, fp.failure_category
        LIMIT 5
    ) g
) f ON true
LEFT JOIN LATERAL (
    SELECT jsonb_object_agg(t.tool_name, t.n) AS failing_tools
    FROM (
        SELECT tc ->> 'tool_name' AS tool_name, count(*) AS n
        FROM simulations s
        JOIN outcomes o ON o.org_id = s.org_id AND o.simulation_id = s.simulation_id
        CROSS JOIN jsonb_array_elements(o.trajectory -> 'tool_calls') tc
        WHERE s.org_id = d.org_id AND s.config_version_id = d.version_before
          AND tc -> 'success' = 'false'::jsonb
        GROUP BY 1
        ORDER BY n DESC, 1
        LIMIT 5
    ) t
) ft ON true
WHERE d.approval_status IN ('approved', 'rejected')
  AND ({since} IS NULL OR d.created_at >= {since})
  AND ({until} IS NULL OR d.created_at < {until})
  AND ({org} IS NULL OR d.org_id = {org})
) x
WHERE ({cluster} IS NULL OR x.cluster = {cluster})
ORDER BY x.org_id, x.created_at, x.diff_id
"#;

/// Every recommendation arc-rec served that got an answer, as an export row: the request's
/// context (its `config_id`, else a key of its current configuration; the failures it reported,
/// grouped by category; its user), the shown diff and, when the candidate is stored, its
/// description; approved when any answer accepted or applied it, else rejected. No outcomes:
/// what happened after an answer is the platform's to record. `served` says how it was served
/// (source, model version, position, the logged propensity), for weighting by the policy that
/// logged it.
const SERVED_SQL: &str = r#"
SELECT * FROM (
SELECT
    l.org_id,
    'served:' || l.event_id::text || ':' || i.recommendation_id AS diff_id,
    coalesce(l.context ->> 'config_id',
             'ctx-' || left(md5(coalesce(l.context -> 'current_config', '{}'::jsonb)::text), 16))
        AS config_id,
    l.created_at,
    CASE WHEN a.accepted THEN 'approved' ELSE 'rejected' END AS approval_status,
    i.recommendation_type, i.diff, coalesce(c.description, '') AS change_summary,
    (i.model_version_id IS NOT NULL) AS llm_generated,
    '' AS version_before, NULL::text AS version_after,
    coalesce(l.context -> 'current_config', '{}'::jsonb) AS config_before,
    l.user_role, l.domain,
    0::bigint AS before_runs, 0::bigint AS before_failed,
    NULL::float8 AS before_reliability, NULL::float8 AS before_cost,
    0::bigint AS after_runs, NULL::float8 AS after_reliability, NULL::float8 AS after_cost,
    NULL::bigint AS after_tool_timeouts, NULL::bigint AS after_tool_calls_ok,
    f.failures, f.failing_tools, l.cluster_id AS cluster,
    jsonb_build_object(
        'event_id', l.event_id, 'recommendation_id', i.recommendation_id,
        'source', arc_rec_source_key(NULL, i.source, i.candidate_features),
        'model_version_id', i.model_version_id, 'position', i.position,
        'propensity', i.propensity) AS served
FROM decision_items i
JOIN decision_log l ON l.org_id = i.org_id AND l.event_id = i.event_id
CROSS JOIN LATERAL (
    SELECT bool_or(fb.outcome IN ('accepted', 'applied')) AS accepted
    FROM feedback fb
    WHERE fb.org_id = i.org_id AND fb.event_id = i.event_id
      AND fb.recommendation_id = i.recommendation_id
) a
LEFT JOIN candidate_recommendations c
    ON c.org_id = i.org_id AND c.candidate_id = 'c-' || substr(i.recommendation_id, 3)
-- The request's failures; anything but an array (the API writes one) reads as none.
CROSS JOIN LATERAL (
    SELECT CASE WHEN jsonb_typeof(l.context -> 'failure_context' -> 'failures') = 'array'
                THEN l.context -> 'failure_context' -> 'failures' ELSE '[]'::jsonb END AS failures
) reported
LEFT JOIN LATERAL (
    SELECT jsonb_agg(jsonb_build_object(
               'failure_category', g.category, 'failure_type', g.kind, 'count', g.n,
               'example', g.example) ORDER BY g.n DESC, g.category) AS failures,
           (SELECT jsonb_object_agg(t.tool, t.n) FROM (
                SELECT r ->> 'tool_name' AS tool, count(*) AS n
                FROM jsonb_array_elements(reported.failures) r
                WHERE r ->> 'tool_name' IS NOT NULL
                GROUP BY 1) t) AS failing_tools
    FROM (
        SELECT r ->> 'failure_category' AS category,
               coalesce(min(r ->> 'error_code'), 'reported') AS kind,
               count(*) AS n, min(r ->> 'error_message') AS example
        FROM jsonb_array_elements(reported.failures) r
        WHERE r ->> 'failure_category' IS NOT NULL
        GROUP BY 1
    ) g
) f ON true
WHERE a.accepted IS NOT NULL
  AND ({since} IS NULL OR l.created_at >= {since})
  AND ({until} IS NULL OR l.created_at < {until})
  AND ({org} IS NULL OR l.org_id = {org})
) x
WHERE ({cluster} IS NULL OR x.cluster = {cluster})
ORDER BY x.org_id, x.created_at, x.diff_id
"#;

/// Streams export rows through a server-side cursor on a dedicated connection, calling `each`
/// for every row in order. Returns the number of rows.
pub async fn for_each_row<F, E>(
    database: &Database,
    filter: &ExportFilter,
    each: F,
) -> Result<u64, E>
where
    F: FnMut(ExportRow) -> Result<(), E>,
    E: From<StorageError>,
{
    stream_rows(database, &export_sql(filter), each).await
}

/// [`for_each_row`] over the answered recommendations arc-rec served ([`SERVED_SQL`]).
pub async fn for_each_served_row<F, E>(
    database: &Database,
    filter: &ExportFilter,
    each: F,
) -> Result<u64, E>
where
    F: FnMut(ExportRow) -> Result<(), E>,
    E: From<StorageError>,
{
    stream_rows(database, &served_sql(filter), each).await
}

async fn stream_rows<F, E>(database: &Database, sql: &str, mut each: F) -> Result<u64, E>
where
    F: FnMut(ExportRow) -> Result<(), E>,
    E: From<StorageError>,
{
    let mut conn = PgConnection::connect_with(database.connect_options())
        .await
        .map_err(StorageError::Connect)?;
    let mut tx = conn.begin().await.context("begin export transaction")?;
    tx.execute(format!("DECLARE arc_rec_export NO SCROLL CURSOR FOR {sql}").as_str())
        .await
        .context("declare export cursor")?;
    let fetch = format!("FETCH FORWARD {FETCH_ROWS} FROM arc_rec_export");
    let mut total = 0u64;
    loop {
        let rows: Vec<ExportRow> = sqlx::query_as(&fetch)
            .fetch_all(&mut *tx)
            .await
            .context("fetch export rows")?;
        let n = rows.len();
        for row in rows {
            each(row)?;
            total += 1;
        }
        if n < FETCH_ROWS {
            break;
        }
    }
    tx.rollback().await.context("close export transaction")?;
    Ok(total)
}

/// A policy's warm-start log for `org`: its newest `limit` decided diffs made before its first
/// decision in arc-rec's log ([`newest_rows`]; so an arc-rec recommendation the platform then
/// records as a diff is learned once, from its feedback). Serving's learner and `bench pipeline`
/// read it alike.
pub async fn warm_start_rows(
    pool: &sqlx::PgPool,
    org: &str,
    limit: usize,
) -> Result<Vec<ExportRow>, StorageError> {
    let filter = ExportFilter {
        org: Some(org.to_owned()),
        until: super::decisions::first_decision_at(pool, org).await?,
        ..ExportFilter::default()
    };
    newest_rows(pool, &filter, limit).await
}

/// The newest `limit` rows `filter` selects, oldest first (what a policy's warm start learns:
/// `recommend::warm_start`). Two queries on the pool: the `limit`-th newest decided diff's time
/// (an index scan), then the export of the diffs from then on, so the export's per-diff joins
/// run for about `limit` diffs however long the history; `limit` bounds the memory.
pub async fn newest_rows(
    pool: &sqlx::PgPool,
    filter: &ExportFilter,
    limit: usize,
) -> Result<Vec<ExportRow>, StorageError> {
    let Some(offset) = limit.checked_sub(1) else {
        return Ok(Vec::new());
    };
    // The same filter on config_diffs as EXPORT_SQL's WHERE (change both together), less the
    // cluster: with a cluster filter, fewer than `limit` rows may come back (serving sets none).
    let oldest: Option<DateTime<Utc>> = sqlx::query_scalar(
        "SELECT created_at FROM config_diffs
         WHERE ($1::text IS NULL OR org_id = $1)
           AND approval_status IN ('approved', 'rejected')
           AND ($2::timestamptz IS NULL OR created_at < $2)
           AND ($3::timestamptz IS NULL OR created_at >= $3)
         ORDER BY created_at DESC OFFSET $4 LIMIT 1",
    )
    .bind(&filter.org)
    .bind(filter.until)
    .bind(filter.since)
    .bind(i64::try_from(offset).unwrap_or(i64::MAX))
    .fetch_optional(pool)
    .await
    .context("find the oldest of the newest decided diffs")?;
    let filter = ExportFilter {
        since: filter.since.max(oldest),
        ..filter.clone()
    };
    let sql = format!(
        "SELECT * FROM ({}) newest ORDER BY created_at DESC, diff_id DESC LIMIT {}",
        export_sql(&filter).trim().trim_end_matches(';'),
        limit
    );
    let mut rows: Vec<ExportRow> = sqlx::query_as(&sql)
        .fetch_all(pool)
        .await
        .context("read the newest export rows")?;
    rows.reverse();
    Ok(rows)
}
