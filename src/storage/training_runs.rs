//! `training_runs` and `model_versions`: what `arc-rec train` records about a run. A run over
//! several organizations' data gets one row per organization (the tables are per organization,
//! as everything is); the model version's id is the run's id.

use serde_json::Value;
use sqlx::PgPool;

use super::{QueryContext, StorageError};

/// A run's final state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStatus {
    Running,
    Succeeded,
    Failed,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Succeeded => "succeeded",
            RunStatus::Failed => "failed",
        }
    }
}

/// Organizations of `orgs` that the database does not know (a run cannot be recorded for them).
pub async fn unknown_orgs(pool: &PgPool, orgs: &[String]) -> Result<Vec<String>, StorageError> {
    sqlx::query_scalar(
        "SELECT o FROM unnest($1::text[]) AS o
         WHERE NOT EXISTS (SELECT 1 FROM organizations WHERE org_id = o) ORDER BY o",
    )
    .bind(orgs)
    .fetch_all(pool)
    .await
    .context("look up the run's organizations")
}

/// Inserts or updates the run's row for every org: its config, status and (when finished) metrics.
pub async fn upsert_run(
    pool: &PgPool,
    orgs: &[String],
    run_id: &str,
    config: &Value,
    status: RunStatus,
    metrics: Option<&Value>,
) -> Result<(), StorageError> {
    sqlx::query(
        "INSERT INTO training_runs (org_id, run_id, status, config, metrics, finished_at)
         SELECT o, $2, $3, $4, $5, CASE WHEN $3 = 'running' THEN NULL ELSE now() END
         FROM unnest($1::text[]) AS o
         ON CONFLICT (org_id, run_id) DO UPDATE
         SET status = EXCLUDED.status, config = EXCLUDED.config, metrics = EXCLUDED.metrics,
             finished_at = EXCLUDED.finished_at",
    )
    .bind(orgs)
    .bind(run_id)
    .bind(status.as_str())
    .bind(config)
    .bind(metrics)
    .execute(pool)
    .await
    .context("record the training run")?;
    Ok(())
}

/// Records the run's final adapter as a model version (id = run id) for every org.
pub async fn upsert_model_version(
    pool: &PgPool,
    orgs: &[String],
    run_id: &str,
    base_model: &str,
    adapter_path: &str,
    metrics: &Value,
) -> Result<(), StorageError> {
    sqlx::query(
        "INSERT INTO model_versions (org_id, model_version_id, run_id, base_model, adapter_path, metrics)
         SELECT o, $2, $2, $3, $4, $5 FROM unnest($1::text[]) AS o
         ON CONFLICT (org_id, model_version_id) DO UPDATE
         SET base_model = EXCLUDED.base_model, adapter_path = EXCLUDED.adapter_path,
             metrics = EXCLUDED.metrics",
    )
    .bind(orgs)
    .bind(run_id)
    .bind(base_model)
    .bind(adapter_path)
    .bind(metrics)
    .execute(pool)
    .await
    .context("record the model version")?;
    Ok(())
}

/// A recorded run as the dashboard lists it.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct RecordedRun {
    pub run_id: String,
    pub status: String,
    pub started_at: chrono::DateTime<chrono::Utc>,
    pub finished_at: Option<chrono::DateTime<chrono::Utc>>,
    /// The run's summary (`RUN_DIR/summary.json`) once finished, its error when it failed.
    pub metrics: Option<Value>,
}

/// `org`'s newest `limit` runs, newest first (every organization's with `None`; a run over
/// several organizations' data once).
pub async fn recent_runs(
    pool: &PgPool,
    org: Option<&str>,
    limit: i64,
) -> Result<Vec<RecordedRun>, StorageError> {
    sqlx::query_as(
        "SELECT run_id, status, started_at, finished_at, metrics FROM (
             SELECT DISTINCT ON (run_id) run_id, status, started_at, finished_at, metrics
             FROM training_runs WHERE ($1::text IS NULL OR org_id = $1)
             ORDER BY run_id, org_id) AS runs
         ORDER BY started_at DESC, run_id LIMIT $2",
    )
    .bind(org)
    .bind(limit)
    .fetch_all(pool)
    .await
    .context("list the training runs")
}
