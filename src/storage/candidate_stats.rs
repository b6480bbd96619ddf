//! The SQL behind candidate generation: aggregates over one organization's Configuration→Outcome
//! graph (per model, per past diff pattern, per tool), run at startup and on a refresh timer by
//! the service — never per request — and turned into the `candidates::CandidateIndex` the request
//! path reads (by `CandidateIndex::load`, one layer up: storage does not know the index); and the
//! recommender model's stored candidates (`candidate_recommendations`, source `model`).
//!
//! Every query filters every table it reads by `org_id`. The heavy part (scanning outcomes and
//! their trajectories) is aggregated server-side; what comes back is a few hundred small rows.
//! JSON is read defensively (`jsonb_typeof` before every cast), because `parsed_config`, diffs and
//! trajectories are client data: an odd value is skipped, never an error.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::PgPool;

use super::{QueryContext, StorageError};
use crate::domain::{Candidate, CandidatePrior, CandidateSource, RecommendationType};

/// One model's runs: `simulations.metadata->>'agent_model'`, else the version's
/// `parsed_config->>'model'`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct ModelRow {
    pub model: String,
    /// Outcomes (runs).
    pub runs: i64,
    /// Distinct simulations (the platform's evidence unit: `HAVING COUNT(DISTINCT simulation_id) >= 3`).
    pub simulations: i64,
    pub mean_reliability: Option<f64>,
    pub mean_cost_usd: Option<f64>,
    /// Cost per 1k tokens actually billed (cost / tokens over runs reporting both): the model's
    /// blended price, independent of how big its configurations' prompts are.
    pub usd_per_1k_tokens: Option<f64>,
    /// Mean reliability of successful and of failed runs (the score a fixed failure gains).
    pub success_reliability: Option<f64>,
    pub failure_reliability: Option<f64>,
}

/// Failed runs of one model with one error category and code.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct ModelFailureRow {
    pub model: String,
    pub error_category: Option<String>,
    pub error_code: Option<String>,
    pub failures: i64,
}

/// One model's runs within the versions that showed a failure category: how the model does on
/// configurations that suffer from this kind of failure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct ModelCategoryRow {
    pub model: String,
    pub category: String,
    pub runs: i64,
    pub simulations: i64,
    pub mean_reliability: Option<f64>,
}

/// Past diffs grouped by (recommendation type, lever, dominant failure category of the version
/// they changed). `lever` is one of `model`, `retry`, `temperature_down`, `temperature_up`,
/// `timeout`, `tool_timeout`, `tools_add`, `tools_remove`, `tools_other`, `other`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct DiffGroupRow {
    pub recommendation_type: Option<String>,
    pub lever: String,
    pub category: Option<String>,
    pub proposed: i64,
    pub approved: i64,
    pub rejected: i64,
    /// Approved diffs whose before and after versions both have runs.
    pub applied: i64,
    /// Applied diffs after which mean reliability rose.
    pub improved: i64,
    pub mean_reliability_delta: Option<f64>,
    pub mean_cost_delta_usd: Option<f64>,
    /// Approved diffs that did not lower reliability (or were never re-run): the ones whose
    /// values are worth copying.
    pub effective: i64,
    /// Median of the lever's value over effective diffs: retry attempts, new temperature, or the
    /// ratio new/old timeout.
    pub median_value: Option<f64>,
    /// Median retry backoff (seconds) over effective diffs.
    pub median_backoff_s: Option<f64>,
}

/// One tool across the organization's trajectories and configurations.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct ToolRow {
    pub tool: String,
    pub calls: i64,
    pub ok_calls: i64,
    /// Latency of successful calls (ms).
    pub p50_ok_ms: Option<f64>,
    pub p90_ok_ms: Option<f64>,
    /// Versions with runs (in the window) that configure the tool, and those of them whose runs
    /// called it.
    pub versions_configured: i64,
    pub versions_called: i64,
}

/// Everything `candidates::CandidateIndex::from_rows` needs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StatsRows {
    pub models: Vec<ModelRow>,
    pub failures: Vec<ModelFailureRow>,
    pub categories: Vec<ModelCategoryRow>,
    pub diffs: Vec<DiffGroupRow>,
    pub tools: Vec<ToolRow>,
}

/// Loads the statistics candidate generation reads.
#[derive(Debug, Clone, Copy, Default)]
pub struct CandidateStats;

impl CandidateStats {
    /// The raw aggregates of one organization over outcomes and diffs since `since` (all
    /// history when `None`; a rolling window keeps refreshes cheap on a large history and lets
    /// old evidence go).
    pub async fn load_rows(
        pool: &PgPool,
        org: &str,
        since: Option<DateTime<Utc>>,
    ) -> Result<StatsRows, StorageError> {
        let models = sqlx::query_as::<_, ModelRow>(MODELS_SQL)
            .bind(org)
            .bind(since)
            .fetch_all(pool)
            .await
            .context("load model statistics")?;
        let failures = sqlx::query_as::<_, ModelFailureRow>(FAILURES_SQL)
            .bind(org)
            .bind(since)
            .fetch_all(pool)
            .await
            .context("load model failure statistics")?;
        let categories = sqlx::query_as::<_, ModelCategoryRow>(CATEGORIES_SQL)
            .bind(org)
            .bind(since)
            .fetch_all(pool)
            .await
            .context("load model statistics per failure category")?;
        let diffs = sqlx::query_as::<_, DiffGroupRow>(DIFFS_SQL)
            .bind(org)
            .bind(since)
            .fetch_all(pool)
            .await
            .context("load config diff statistics")?;
        let tools = sqlx::query_as::<_, ToolRow>(TOOLS_SQL)
            .bind(org)
            .bind(since)
            .fetch_all(pool)
            .await
            .context("load tool statistics")?;
        Ok(StatsRows {
            models,
            failures,
            categories,
            diffs,
            tools,
        })
    }

    /// Every organization's id, in order (the one read that spans organizations; ids only).
    pub async fn organizations(pool: &PgPool) -> Result<Vec<String>, StorageError> {
        sqlx::query_scalar("SELECT org_id FROM organizations ORDER BY org_id")
            .fetch_all(pool)
            .await
            .context("list organizations")
    }
}

/// Tools the given outcomes' trajectories called (any call, successful or not), for telling the
/// generator which configured tools a configuration really uses.
pub async fn tools_called(
    pool: &PgPool,
    org: &str,
    outcome_ids: &[String],
) -> Result<Vec<String>, StorageError> {
    sqlx::query_scalar(
        "SELECT DISTINCT tc ->> 'tool_name' AS tool
         FROM outcomes o
         CROSS JOIN LATERAL jsonb_array_elements(
             CASE WHEN jsonb_typeof(o.trajectory -> 'tool_calls') = 'array'
                  THEN o.trajectory -> 'tool_calls' ELSE '[]'::jsonb END) AS tc
         WHERE o.org_id = $1 AND o.outcome_id = ANY($2) AND tc ->> 'tool_name' IS NOT NULL
         ORDER BY 1",
    )
    .bind(org)
    .bind(outcome_ids)
    .fetch_all(pool)
    .await
    .context("load tools called by outcomes")
}

/// Most model-generated candidates [`load_model_candidates`] returns.
pub const MODEL_CANDIDATE_LIMIT: i64 = 200;

/// Every model candidate of `org`'s live model versions (`model_versions::set_status`) with the
/// cluster it was generated for (`None`: any cluster), newest first; the serving state caches
/// these instead of querying per request.
pub async fn load_model_candidates_by_cluster(
    pool: &PgPool,
    org: &str,
) -> Result<Vec<(Option<String>, Candidate)>, StorageError> {
    type Row = (
        Option<String>,
        String,
        Value,
        String,
        Option<f64>,
        Option<f64>,
        i32,
        Option<String>,
        Option<f64>,
        Option<f64>,
    );
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT cluster_id, recommendation_type, diff, description, expected_reliability_delta,
                expected_cost_delta_usd, evidence_count, model_version_id, prior_mean, prior_sd
         FROM candidate_recommendations c
         WHERE org_id = $1 AND source = 'model' AND EXISTS (
             SELECT 1 FROM model_versions v
             WHERE v.org_id = c.org_id AND v.model_version_id = c.model_version_id
               AND v.status = 'live')
         ORDER BY created_at DESC, candidate_id
         LIMIT $2",
    )
    .bind(org)
    .bind(MODEL_CANDIDATE_LIMIT * 10)
    .fetch_all(pool)
    .await
    .context("load model candidates")?;
    Ok(rows
        .into_iter()
        .filter_map(
            |(cluster, kind, diff, description, rel, cost, evidence, version, mean, sd)| {
                let kind = RecommendationType::parse(&kind)?;
                let candidate = Candidate {
                    candidate_id: Candidate::id_for(kind, &diff),
                    recommendation_type: kind,
                    diff,
                    description,
                    expected_reliability_delta: rel.unwrap_or(0.0),
                    expected_cost_delta_usd: cost.unwrap_or(0.0),
                    evidence_count: u32::try_from(evidence).unwrap_or(0),
                    source: CandidateSource::Model {
                        model_version_id: version.unwrap_or_default(),
                        prior: CandidatePrior::from_stored(mean, sd),
                    },
                };
                Some((cluster, candidate))
            },
        )
        .collect())
}

/// What a model-candidate reload compares: how many live model candidates an organization has,
/// when the newest was stored and when a version's status last changed.
/// `save_model_candidates_by_cluster` changes it on every write (a taken-over row gets a new
/// `created_at`), `model_versions::set_status` on every retire or promote.
pub type ModelCandidatesMark = (i64, Option<DateTime<Utc>>, Option<DateTime<Utc>>);

/// The [`ModelCandidatesMark`] of each of `orgs` (`(0, None, None)` for one without model versions).
pub async fn model_candidates_marks(
    pool: &PgPool,
    orgs: &[String],
) -> Result<HashMap<String, ModelCandidatesMark>, StorageError> {
    type Row = (String, i64, Option<DateTime<Utc>>, Option<DateTime<Utc>>);
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT o,
                (SELECT count(*) FROM candidate_recommendations c
                 JOIN model_versions v USING (org_id, model_version_id)
                 WHERE c.org_id = o AND c.source = 'model' AND v.status = 'live'),
                (SELECT max(c.created_at) FROM candidate_recommendations c
                 JOIN model_versions v USING (org_id, model_version_id)
                 WHERE c.org_id = o AND c.source = 'model' AND v.status = 'live'),
                (SELECT max(status_changed_at) FROM model_versions WHERE org_id = o)
         FROM unnest($1::text[]) AS o",
    )
    .bind(orgs)
    .fetch_all(pool)
    .await
    .context("read model candidate marks")?;
    Ok(rows
        .into_iter()
        .map(|(org, count, newest, status_changed)| (org, (count, newest, status_changed)))
        .collect())
}

/// The recommender model's stored candidates for an organization (and cluster, when given), newest
/// first. Rows with a type outside the vocabulary are skipped; ids are recomputed with
/// [`Candidate::id_for`] so equal diffs share one whatever id was stored.
pub async fn load_model_candidates(
    pool: &PgPool,
    org: &str,
    cluster_id: Option<&str>,
) -> Result<Vec<Candidate>, StorageError> {
    Ok(load_model_candidates_by_cluster(pool, org)
        .await?
        .into_iter()
        .filter(|(for_cluster, _)| {
            cluster_id.is_none() || for_cluster.is_none() || for_cluster.as_deref() == cluster_id
        })
        .map(|(_, candidate)| candidate)
        .take(usize::try_from(MODEL_CANDIDATE_LIMIT).unwrap_or(usize::MAX))
        .collect())
}

/// The model a run used: the simulation's `agent_model`, else its version's configured model.
macro_rules! run_model {
    () => {
        "COALESCE(NULLIF(s.metadata ->> 'agent_model', ''), v.parsed_config ->> 'model')"
    };
}

/// Runs joined to their simulation and version (the `WHERE` filters one organization).
macro_rules! runs_join {
    () => {
        "
         FROM outcomes o
         JOIN simulations s ON s.org_id = o.org_id AND s.simulation_id = o.simulation_id
         JOIN config_versions v ON v.org_id = s.org_id AND v.version_id = s.config_version_id"
    };
}

const MODELS_SQL: &str = concat!(
    "SELECT ",
    run_model!(),
    " AS model,
            COUNT(*) AS runs,
            COUNT(DISTINCT s.simulation_id) AS simulations,
            AVG(o.reliability_score) AS mean_reliability,
            AVG(o.cost_usd) AS mean_cost_usd,
            1000.0 * SUM(o.cost_usd) FILTER (WHERE o.tokens_used > 0)
                / NULLIF(SUM(o.tokens_used) FILTER (WHERE o.tokens_used > 0
                                                    AND o.cost_usd IS NOT NULL), 0)::float8
                AS usd_per_1k_tokens,
            AVG(o.reliability_score) FILTER (WHERE o.status = 'success') AS success_reliability,
            AVG(o.reliability_score) FILTER (WHERE o.status <> 'success') AS failure_reliability",
    runs_join!(),
    "
     WHERE o.org_id = $1 AND ($2::timestamptz IS NULL OR o.execution_time >= $2)
     GROUP BY 1
     HAVING ",
    run_model!(),
    " IS NOT NULL
     ORDER BY 1"
);

const FAILURES_SQL: &str = concat!(
    "SELECT ",
    run_model!(),
    " AS model, o.error_category, left(o.error_code, 64) AS error_code, COUNT(*) AS failures",
    runs_join!(),
    "
     WHERE o.org_id = $1 AND o.status <> 'success'
       AND ($2::timestamptz IS NULL OR o.execution_time >= $2)
     GROUP BY 1, 2, 3
     HAVING ",
    run_model!(),
    " IS NOT NULL
     ORDER BY 1, 2, 3"
);

const CATEGORIES_SQL: &str = concat!(
    "WITH version_categories AS (
         SELECT DISTINCT s.config_version_id AS version_id, o.error_category AS category
         FROM outcomes o
         JOIN simulations s ON s.org_id = o.org_id AND s.simulation_id = o.simulation_id
         WHERE o.org_id = $1 AND o.error_category IS NOT NULL
           AND ($2::timestamptz IS NULL OR o.execution_time >= $2)
     )
     SELECT ",
    run_model!(),
    " AS model, vc.category,
            COUNT(*) AS runs,
            COUNT(DISTINCT s.simulation_id) AS simulations,
            AVG(o.reliability_score) AS mean_reliability",
    runs_join!(),
    "
     JOIN version_categories vc ON vc.version_id = s.config_version_id
     WHERE o.org_id = $1 AND ($2::timestamptz IS NULL OR o.execution_time >= $2)
     GROUP BY 1, 2
     HAVING ",
    run_model!(),
    " IS NOT NULL
     ORDER BY 1, 2"
);

/// Past diffs: the before version's outcomes (and dominant failure category), the after
/// version's outcomes when it was applied and re-run, and which lever the diff pulls.
const DIFFS_SQL: &str = "
WITH version_runs AS (
    SELECT s.config_version_id AS version_id, COUNT(*) AS runs,
           AVG(o.reliability_score) AS reliability, AVG(o.cost_usd) AS cost
    FROM outcomes o
    JOIN simulations s ON s.org_id = o.org_id AND s.simulation_id = o.simulation_id
    WHERE o.org_id = $1 AND ($2::timestamptz IS NULL OR o.execution_time >= $2)
    GROUP BY s.config_version_id
),
version_category AS (
    SELECT DISTINCT ON (s.config_version_id) s.config_version_id AS version_id,
           o.error_category AS category
    FROM outcomes o
    JOIN simulations s ON s.org_id = o.org_id AND s.simulation_id = o.simulation_id
    WHERE o.org_id = $1 AND o.error_category IS NOT NULL
      AND ($2::timestamptz IS NULL OR o.execution_time >= $2)
    GROUP BY s.config_version_id, o.error_category
    ORDER BY s.config_version_id, COUNT(*) DESC, o.error_category
),
diffs AS (
    SELECT d.recommendation_type, d.approval_status, vc.category,
           b.reliability AS rel_before, b.cost AS cost_before,
           a.reliability AS rel_after, a.cost AS cost_after,
           CASE
               WHEN d.diff ? 'model'
                    AND d.diff ->> 'model' IS DISTINCT FROM vb.parsed_config ->> 'model' THEN 'model'
               WHEN jsonb_typeof(d.diff -> 'retry') = 'object' THEN 'retry'
               WHEN jsonb_typeof(d.diff -> 'temperature') = 'number'
                    AND jsonb_typeof(vb.parsed_config -> 'temperature') = 'number' THEN
                   CASE WHEN (d.diff ->> 'temperature')::float8
                             < (vb.parsed_config ->> 'temperature')::float8
                        THEN 'temperature_down' ELSE 'temperature_up' END
               WHEN jsonb_typeof(d.diff -> 'timeout_s') = 'number' THEN 'timeout'
               WHEN t.tools_after IS NOT NULL THEN
                   CASE WHEN (SELECT array_agg(e ->> 'name' ORDER BY i)
                              FROM jsonb_array_elements(t.tools_after) WITH ORDINALITY AS x (e, i))
                             IS NOT DISTINCT FROM
                             (SELECT array_agg(e ->> 'name' ORDER BY i)
                              FROM jsonb_array_elements(t.tools_before) WITH ORDINALITY AS x (e, i))
                        THEN 'tool_timeout'
                        WHEN jsonb_array_length(t.tools_after) > jsonb_array_length(t.tools_before)
                        THEN 'tools_add'
                        WHEN jsonb_array_length(t.tools_after) < jsonb_array_length(t.tools_before)
                        THEN 'tools_remove'
                        ELSE 'tools_other' END
               ELSE 'other'
           END AS lever,
           CASE WHEN jsonb_typeof(d.diff -> 'retry' -> 'max_attempts') = 'number'
                THEN (d.diff -> 'retry' ->> 'max_attempts')::float8 END AS new_attempts,
           CASE WHEN jsonb_typeof(d.diff -> 'retry' -> 'backoff_s') = 'number'
                THEN (d.diff -> 'retry' ->> 'backoff_s')::float8 END AS new_backoff,
           CASE WHEN jsonb_typeof(d.diff -> 'temperature') = 'number'
                THEN (d.diff ->> 'temperature')::float8 END AS new_temperature,
           CASE WHEN jsonb_typeof(d.diff -> 'timeout_s') = 'number'
                THEN (d.diff ->> 'timeout_s')::float8 END AS new_timeout,
           COALESCE(CASE WHEN jsonb_typeof(vb.parsed_config -> 'timeout_s') = 'number'
                         THEN (vb.parsed_config ->> 'timeout_s')::float8 END, 30.0) AS old_timeout,
           (SELECT MAX((e ->> 'timeout_s')::float8)
            FROM jsonb_array_elements(t.tools_after) AS e
            WHERE jsonb_typeof(e -> 'timeout_s') = 'number') AS new_tool_timeout
    FROM config_diffs d
    JOIN config_versions vb ON vb.org_id = d.org_id AND vb.version_id = d.version_before
    CROSS JOIN LATERAL (
        SELECT CASE WHEN jsonb_typeof(vb.parsed_config -> 'tools') = 'array'
                    THEN vb.parsed_config -> 'tools' ELSE '[]'::jsonb END AS tools_before,
               CASE WHEN jsonb_typeof(d.diff -> 'tools') = 'array'
                    THEN d.diff -> 'tools' END AS tools_after
    ) AS t
    LEFT JOIN version_runs b ON b.version_id = d.version_before
    LEFT JOIN version_runs a
           ON a.version_id = d.version_after AND d.approval_status = 'approved'
    LEFT JOIN version_category vc ON vc.version_id = d.version_before
    WHERE d.org_id = $1 AND ($2::timestamptz IS NULL OR d.created_at >= $2)
),
valued AS (
    SELECT diffs.*,
           CASE lever
               WHEN 'retry' THEN new_attempts
               WHEN 'temperature_down' THEN new_temperature
               WHEN 'temperature_up' THEN new_temperature
               WHEN 'timeout' THEN new_timeout / NULLIF(old_timeout, 0)
               WHEN 'tool_timeout' THEN new_tool_timeout / NULLIF(old_timeout, 0)
           END AS value,
           approval_status = 'approved'
               AND (rel_after IS NULL OR rel_before IS NULL OR rel_after >= rel_before)
               AS effective
    FROM diffs
)
SELECT recommendation_type, lever, category,
       COUNT(*) AS proposed,
       COUNT(*) FILTER (WHERE approval_status = 'approved') AS approved,
       COUNT(*) FILTER (WHERE approval_status = 'rejected') AS rejected,
       COUNT(rel_after - rel_before) AS applied,
       COUNT(*) FILTER (WHERE rel_after > rel_before) AS improved,
       AVG(rel_after - rel_before) AS mean_reliability_delta,
       AVG(cost_after - cost_before) AS mean_cost_delta_usd,
       COUNT(*) FILTER (WHERE effective) AS effective,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY value) FILTER (WHERE effective) AS median_value,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY new_backoff) FILTER (WHERE effective)
           AS median_backoff_s
FROM valued
GROUP BY 1, 2, 3
ORDER BY 1, 2, 3";

/// Tool calls from trajectories (count, success, latency of successful calls) and how often a
/// configured tool is called at all.
const TOOLS_SQL: &str = "
WITH calls AS (
    SELECT s.config_version_id AS version_id, tc ->> 'tool_name' AS tool,
           tc -> 'success' = 'true'::jsonb AS ok,
           CASE WHEN jsonb_typeof(tc -> 'duration_ms') = 'number'
                THEN (tc ->> 'duration_ms')::float8 END AS ms
    FROM outcomes o
    JOIN simulations s ON s.org_id = o.org_id AND s.simulation_id = o.simulation_id
    CROSS JOIN LATERAL jsonb_array_elements(
        CASE WHEN jsonb_typeof(o.trajectory -> 'tool_calls') = 'array'
             THEN o.trajectory -> 'tool_calls' ELSE '[]'::jsonb END) AS tc
    WHERE o.org_id = $1 AND ($2::timestamptz IS NULL OR o.execution_time >= $2)
),
per_tool AS (
    SELECT tool, COUNT(*) AS calls, COUNT(*) FILTER (WHERE ok) AS ok_calls,
           percentile_cont(0.5) WITHIN GROUP (ORDER BY ms) FILTER (WHERE ok) AS p50_ok_ms,
           percentile_cont(0.9) WITHIN GROUP (ORDER BY ms) FILTER (WHERE ok) AS p90_ok_ms
    FROM calls
    WHERE tool IS NOT NULL
    GROUP BY tool
),
called AS (
    SELECT DISTINCT version_id, tool FROM calls WHERE tool IS NOT NULL
),
configured AS (
    SELECT DISTINCT v.version_id, e ->> 'name' AS tool
    FROM config_versions v
    CROSS JOIN LATERAL jsonb_array_elements(
        CASE WHEN jsonb_typeof(v.parsed_config -> 'tools') = 'array'
             THEN v.parsed_config -> 'tools' ELSE '[]'::jsonb END) AS e
    WHERE v.org_id = $1
      AND v.version_id IN (
          SELECT s.config_version_id
          FROM outcomes o
          JOIN simulations s ON s.org_id = o.org_id AND s.simulation_id = o.simulation_id
          WHERE o.org_id = $1 AND ($2::timestamptz IS NULL OR o.execution_time >= $2))
),
usage AS (
    SELECT c.tool, COUNT(*) AS versions_configured, COUNT(k.version_id) AS versions_called
    FROM configured c
    LEFT JOIN called k ON k.version_id = c.version_id AND k.tool = c.tool
    WHERE c.tool IS NOT NULL
    GROUP BY c.tool
)
SELECT COALESCE(p.tool, u.tool) AS tool,
       COALESCE(p.calls, 0) AS calls,
       COALESCE(p.ok_calls, 0) AS ok_calls,
       p.p50_ok_ms, p.p90_ok_ms,
       COALESCE(u.versions_configured, 0) AS versions_configured,
       COALESCE(u.versions_called, 0) AS versions_called
FROM per_tool p
FULL JOIN usage u ON u.tool = p.tool
ORDER BY 1";

/// Stores candidates a recommender model generated (creating its training run and model version
/// rows if needed), for `cluster_id` or, when `None`, for every cluster. See
/// [`save_model_candidates_by_cluster`].
pub async fn save_model_candidates(
    pool: &PgPool,
    org: &str,
    model_version_id: &str,
    base_model: &str,
    cluster_id: Option<&str>,
    candidates: &[Candidate],
) -> Result<SavedCandidates, StorageError> {
    let rows: Vec<(Option<String>, Candidate)> = candidates
        .iter()
        .map(|c| (cluster_id.map(str::to_owned), c.clone()))
        .collect();
    save_model_candidates_by_cluster(pool, org, model_version_id, base_model, &rows).await
}

/// What [`save_model_candidates_by_cluster`] wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SavedCandidates {
    /// Rows that did not exist.
    pub inserted: u64,
    /// Rows of an earlier generation (same organization and candidate id) that now carry this
    /// model version, cluster and rationale.
    pub updated: u64,
}

/// Stores an organization's model candidates, each for its cluster (`None`: for every cluster),
/// in one transaction, creating the model version's `training_runs` / `model_versions` rows if
/// needed. The candidate id is the row's key: a candidate an earlier generation (or model
/// version) stored is taken over by this one (model version, cluster, description, expectations,
/// `created_at`), so the newest generation tags it; a heuristic row with the same id is left
/// alone. Idempotent.
pub async fn save_model_candidates_by_cluster(
    pool: &PgPool,
    org: &str,
    model_version_id: &str,
    base_model: &str,
    candidates: &[(Option<String>, Candidate)],
) -> Result<SavedCandidates, StorageError> {
    let mut tx = pool.begin().await.context("begin model candidates")?;
    sqlx::query("INSERT INTO organizations (org_id) VALUES ($1) ON CONFLICT DO NOTHING")
        .bind(org)
        .execute(&mut *tx)
        .await
        .context("insert organization")?;
    sqlx::query(
        "INSERT INTO training_runs (org_id, run_id, status, config) VALUES ($1, $2, 'succeeded', '{}')
         ON CONFLICT DO NOTHING",
    )
    .bind(org)
    .bind(model_version_id)
    .execute(&mut *tx)
    .await
    .context("insert training run")?;
    sqlx::query(
        "INSERT INTO model_versions (org_id, model_version_id, run_id, base_model) VALUES ($1, $2, $2, $3)
         ON CONFLICT DO NOTHING",
    )
    .bind(org)
    .bind(model_version_id)
    .bind(base_model)
    .execute(&mut *tx)
    .await
    .context("insert model version")?;
    let mut saved = SavedCandidates::default();
    for (cluster_id, c) in candidates {
        // `xmax = 0` on the returned row: it was inserted, not updated. No row: a heuristic row
        // holds the id.
        let inserted: Option<bool> = sqlx::query_scalar(
            "INSERT INTO candidate_recommendations (org_id, candidate_id, cluster_id, recommendation_type, diff,
                 description, expected_reliability_delta, expected_cost_delta_usd, evidence_count, source,
                 model_version_id, prior_mean, prior_sd)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'model', $10, $11, $12)
             ON CONFLICT (org_id, candidate_id) DO UPDATE SET
                 cluster_id = EXCLUDED.cluster_id,
                 recommendation_type = EXCLUDED.recommendation_type,
                 diff = EXCLUDED.diff,
                 description = EXCLUDED.description,
                 expected_reliability_delta = EXCLUDED.expected_reliability_delta,
                 expected_cost_delta_usd = EXCLUDED.expected_cost_delta_usd,
                 evidence_count = EXCLUDED.evidence_count,
                 model_version_id = EXCLUDED.model_version_id,
                 prior_mean = EXCLUDED.prior_mean,
                 prior_sd = EXCLUDED.prior_sd,
                 created_at = now()
             WHERE candidate_recommendations.source = 'model'
             RETURNING (xmax = 0)",
        )
        .bind(org)
        .bind(&c.candidate_id)
        .bind(cluster_id.as_deref())
        .bind(c.recommendation_type.as_str())
        .bind(&c.diff)
        .bind(&c.description)
        .bind(c.expected_reliability_delta)
        .bind(c.expected_cost_delta_usd)
        .bind(i32::try_from(c.evidence_count).unwrap_or(i32::MAX))
        .bind(model_version_id)
        .bind(c.source.prior().map(|p| p.mean))
        .bind(c.source.prior().map(|p| p.sd))
        .fetch_optional(&mut *tx)
        .await
        .context("insert model candidate")?;
        match inserted {
            Some(true) => saved.inserted += 1,
            Some(false) => saved.updated += 1,
            None => {}
        }
    }
    tx.commit().await.context("commit model candidates")?;
    Ok(saved)
}
