//! The SQL side of failure clustering: read an organization's failure patterns with their
//! trajectories' facts, read and replace its cluster model, clusters and pattern assignments — all
//! of one organization's run in one transaction, serialized per organization by an advisory lock.
//! Every query filters by `org_id`.

use std::collections::BTreeSet;

use sqlx::{PgPool, Postgres, Row, Transaction};

use super::{QueryContext, StorageError};
use crate::clustering::{
    FeaturizerKind, HashedTfIdf, PatternAssignment, PatternInput, StoredCluster, StoredModel,
    StoredProjection,
};

/// Organizations that have failure patterns (all, or only `only` when it has some).
pub async fn orgs_with_patterns(
    pool: &PgPool,
    only: Option<&str>,
) -> Result<Vec<String>, StorageError> {
    // Listing organizations is the one read that spans them; it returns ids only.
    sqlx::query_scalar(
        "SELECT o.org_id FROM organizations o
         WHERE ($1::text IS NULL OR o.org_id = $1)
           AND EXISTS (SELECT 1 FROM failure_patterns fp WHERE fp.org_id = o.org_id)
         ORDER BY o.org_id",
    )
    .bind(only)
    .fetch_all(pool)
    .await
    .context("list organizations with failure patterns")
}

/// The ids of an organization's active failure clusters: those `serve` places requests in.
pub async fn active_cluster_ids(pool: &PgPool, org_id: &str) -> Result<Vec<String>, StorageError> {
    sqlx::query_scalar(
        "SELECT cluster_id FROM failure_clusters WHERE org_id = $1 AND active ORDER BY cluster_id",
    )
    .bind(org_id)
    .fetch_all(pool)
    .await
    .context("read active cluster ids")
}

/// Reads an organization's failure patterns with what their outcome's trajectory says: the
/// unrecovered error events' types, failing and called tools, and model providers. Tolerates
/// trajectories without those arrays or with odd elements (they contribute nothing).
const PATTERNS_SQL: &str = "
SELECT fp.pattern_id, fp.failure_type, fp.failure_category, fp.error_message,
       fp.error_embedding, fp.pattern_cluster_id,
       ARRAY(SELECT e->>'error_type'
             FROM jsonb_array_elements(CASE WHEN jsonb_typeof(o.trajectory->'error_events') = 'array'
                                            THEN o.trajectory->'error_events' ELSE '[]'::jsonb END)
                  WITH ORDINALITY AS ev(e, i)
             WHERE jsonb_typeof(e) = 'object' AND e->>'error_type' IS NOT NULL
               AND coalesce(e->'recovery_successful', 'false'::jsonb) <> 'true'::jsonb
             ORDER BY i) AS error_types,
       ARRAY(SELECT t->>'tool_name'
             FROM jsonb_array_elements(CASE WHEN jsonb_typeof(o.trajectory->'tool_calls') = 'array'
                                            THEN o.trajectory->'tool_calls' ELSE '[]'::jsonb END)
                  WITH ORDINALITY AS tc(t, i)
             WHERE jsonb_typeof(t) = 'object' AND t->>'tool_name' IS NOT NULL
               AND t->'success' = 'false'::jsonb
             ORDER BY i) AS failing_tools,
       ARRAY(SELECT DISTINCT t->>'tool_name'
             FROM jsonb_array_elements(CASE WHEN jsonb_typeof(o.trajectory->'tool_calls') = 'array'
                                            THEN o.trajectory->'tool_calls' ELSE '[]'::jsonb END) AS t
             WHERE jsonb_typeof(t) = 'object' AND t->>'tool_name' IS NOT NULL) AS tools,
       ARRAY(SELECT DISTINCT split_part(l->>'model', '/', 1)
             FROM jsonb_array_elements(CASE WHEN jsonb_typeof(o.trajectory->'llm_interactions') = 'array'
                                            THEN o.trajectory->'llm_interactions' ELSE '[]'::jsonb END) AS l
             WHERE jsonb_typeof(l) = 'object' AND l->>'model' LIKE '_%/%') AS providers
FROM failure_patterns fp
LEFT JOIN outcomes o ON o.org_id = fp.org_id AND o.outcome_id = fp.outcome_id
WHERE fp.org_id = $1
ORDER BY fp.pattern_id";

/// One organization's clustering run: a transaction holding the organization's clustering lock.
#[derive(Debug)]
pub struct ClusterTx {
    tx: Transaction<'static, Postgres>,
    org_id: String,
}

impl ClusterTx {
    /// Begins the run's transaction and waits for any other run on the same organization.
    pub async fn begin(pool: &PgPool, org_id: &str) -> Result<Self, StorageError> {
        let mut tx = pool.begin().await.context("begin clustering transaction")?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('arc-rec cluster ' || $1, 0))")
            .bind(org_id)
            .execute(&mut *tx)
            .await
            .context("lock the organization's clustering")?;
        Ok(Self {
            tx,
            org_id: org_id.to_owned(),
        })
    }

    /// The organization's failure patterns, by pattern id.
    pub async fn patterns(&mut self) -> Result<Vec<PatternInput>, StorageError> {
        let rows = sqlx::query(PATTERNS_SQL)
            .bind(&self.org_id)
            .fetch_all(&mut *self.tx)
            .await
            .context("read failure patterns")?;
        rows.into_iter()
            .map(|row| {
                Ok(PatternInput {
                    pattern_id: row.try_get("pattern_id")?,
                    failure_type: row.try_get("failure_type")?,
                    failure_category: row.try_get("failure_category")?,
                    error_message: row.try_get("error_message")?,
                    error_embedding: row.try_get("error_embedding")?,
                    previous_cluster: row.try_get("pattern_cluster_id")?,
                    error_types: row.try_get("error_types")?,
                    failing_tools: row.try_get("failing_tools")?,
                    tools: row.try_get("tools")?,
                    providers: row.try_get("providers")?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .context("decode failure patterns")
    }

    /// The organization's current model (if any) and every cluster id it ever used.
    pub async fn previous(
        &mut self,
    ) -> Result<(Option<StoredModel>, BTreeSet<String>), StorageError> {
        let ids: Vec<String> =
            sqlx::query_scalar("SELECT cluster_id FROM failure_clusters WHERE org_id = $1")
                .bind(&self.org_id)
                .fetch_all(&mut *self.tx)
                .await
                .context("read cluster ids")?;
        let model = read_model(&mut self.tx, &self.org_id).await?;
        Ok((model, ids.into_iter().collect()))
    }

    /// Replaces the organization's model, clusters and pattern assignments.
    pub async fn save(
        &mut self,
        model: &StoredModel,
        assignments: &[PatternAssignment],
    ) -> Result<(), StorageError> {
        let org = &self.org_id;
        let featurizer = serde_json::to_value(&model.text_featurizer)
            .map_err(|e| sqlx::Error::Encode(Box::new(e)))
            .context("encode the text featurizer")?;
        let embedding = model.embedding.as_ref();
        sqlx::query(
            "INSERT INTO cluster_models (org_id, version, featurizer, input_dim, dims, method,
                 text_featurizer, text_mean, text_components, text_explained,
                 embedding_mean, embedding_components, embedding_explained,
                 sigma2, text_sigma2, patterns, quality)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)
             ON CONFLICT (org_id) DO UPDATE SET
                 version = EXCLUDED.version, featurizer = EXCLUDED.featurizer,
                 input_dim = EXCLUDED.input_dim, dims = EXCLUDED.dims, method = EXCLUDED.method,
                 text_featurizer = EXCLUDED.text_featurizer, text_mean = EXCLUDED.text_mean,
                 text_components = EXCLUDED.text_components,
                 text_explained = EXCLUDED.text_explained,
                 embedding_mean = EXCLUDED.embedding_mean,
                 embedding_components = EXCLUDED.embedding_components,
                 embedding_explained = EXCLUDED.embedding_explained,
                 sigma2 = EXCLUDED.sigma2, text_sigma2 = EXCLUDED.text_sigma2,
                 patterns = EXCLUDED.patterns, quality = EXCLUDED.quality, updated_at = now()",
        )
        .bind(org)
        .bind(model.version)
        .bind(model.featurizer.as_str())
        .bind(to_i32(
            embedding.map_or(model.text.input_dim, |e| e.input_dim),
        ))
        .bind(to_i32(model.dims))
        .bind(&model.method)
        .bind(featurizer)
        .bind(&model.text.mean)
        .bind(&model.text.components)
        .bind(&model.text.explained)
        .bind(embedding.map(|e| &e.mean))
        .bind(embedding.map(|e| &e.components))
        .bind(embedding.map(|e| &e.explained))
        .bind(model.sigma2)
        .bind(model.text_sigma2)
        .bind(to_i32(model.patterns))
        .bind(&model.quality)
        .execute(&mut *self.tx)
        .await
        .context("write the cluster model")?;

        // Retire everything, then (re)activate this run's clusters: labels are unique among
        // active clusters, and a label may move from one cluster to another between runs.
        sqlx::query(
            "UPDATE failure_clusters SET active = false, size = 0, updated_at = now()
             WHERE org_id = $1 AND active",
        )
        .bind(org)
        .execute(&mut *self.tx)
        .await
        .context("retire old clusters")?;
        for c in &model.clusters {
            sqlx::query(
                "INSERT INTO failure_clusters (org_id, cluster_id, label, centroid, size, active,
                     model_version, text_centroid, radius, text_radius)
                 VALUES ($1, $2, $3, $4, $5, true, $6, $7, $8, $9)
                 ON CONFLICT (org_id, cluster_id) DO UPDATE SET
                     label = EXCLUDED.label, centroid = EXCLUDED.centroid, size = EXCLUDED.size,
                     active = true, model_version = EXCLUDED.model_version,
                     text_centroid = EXCLUDED.text_centroid, radius = EXCLUDED.radius,
                     text_radius = EXCLUDED.text_radius, updated_at = now()",
            )
            .bind(org)
            .bind(&c.cluster_id)
            .bind(&c.label)
            .bind(&c.centroid)
            .bind(to_i32(c.size))
            .bind(model.version)
            .bind(&c.text_centroid)
            .bind(c.radius)
            .bind(c.text_radius)
            .execute(&mut *self.tx)
            .await
            .context("write a failure cluster")?;
        }

        let ids: Vec<&str> = assignments.iter().map(|a| a.pattern_id.as_str()).collect();
        let clusters: Vec<&str> = assignments.iter().map(|a| a.cluster_id.as_str()).collect();
        let confidence: Vec<f32> = assignments
            .iter()
            .map(|a| a.confidence.clamp(0.0, 1.0) as f32)
            .collect();
        // Only rows whose cluster, confidence or neighbour count changed are touched.
        sqlx::query(
            "WITH u AS (
                 SELECT * FROM unnest($2::text[], $3::text[], $4::real[])
                     AS u(pattern_id, cluster_id, confidence)
             ), sizes AS (
                 SELECT cluster_id, count(*)::integer - 1 AS similar FROM u GROUP BY cluster_id
             )
             UPDATE failure_patterns fp
             SET pattern_cluster_id = u.cluster_id, cluster_confidence = u.confidence,
                 similar_failures_count = s.similar
             FROM u JOIN sizes s USING (cluster_id)
             WHERE fp.org_id = $1 AND fp.pattern_id = u.pattern_id
               AND (fp.pattern_cluster_id IS DISTINCT FROM u.cluster_id
                    OR fp.cluster_confidence IS DISTINCT FROM u.confidence
                    OR fp.similar_failures_count IS DISTINCT FROM s.similar)",
        )
        .bind(org)
        .bind(&ids)
        .bind(&clusters)
        .bind(&confidence)
        .execute(&mut *self.tx)
        .await
        .context("write pattern clusters")?;
        Ok(())
    }

    /// Commits the run.
    pub async fn commit(self) -> Result<(), StorageError> {
        self.tx.commit().await.context("commit clustering")
    }
}

/// The organization's current cluster model in its stored form, `None` when it was never
/// clustered (`ClusterModel::from_stored` turns it into a model; that check belongs to
/// `clustering`, which does no IO).
pub async fn load_model(pool: &PgPool, org_id: &str) -> Result<Option<StoredModel>, StorageError> {
    let mut conn = pool
        .acquire()
        .await
        .context("acquire a connection for the cluster model")?;
    read_model(&mut conn, org_id).await
}

/// Reads the stored model and its active clusters.
async fn read_model(
    conn: &mut sqlx::PgConnection,
    org_id: &str,
) -> Result<Option<StoredModel>, StorageError> {
    let Some(row) = sqlx::query(
        "SELECT version, featurizer, dims, method, text_featurizer, text_mean, text_components,
                text_explained, embedding_mean, embedding_components, embedding_explained,
                sigma2, text_sigma2, patterns, quality
         FROM cluster_models WHERE org_id = $1",
    )
    .bind(org_id)
    .fetch_optional(&mut *conn)
    .await
    .context("read the cluster model")?
    else {
        return Ok(None);
    };
    let clusters = sqlx::query(
        "SELECT cluster_id, label, centroid, text_centroid, radius, text_radius, size
         FROM failure_clusters WHERE org_id = $1 AND active
         ORDER BY size DESC, cluster_id",
    )
    .bind(org_id)
    .fetch_all(&mut *conn)
    .await
    .context("read failure clusters")?;
    decode_model(org_id, &row, &clusters).context("decode the cluster model")
}

fn decode_model(
    org_id: &str,
    row: &sqlx::postgres::PgRow,
    clusters: &[sqlx::postgres::PgRow],
) -> Result<Option<StoredModel>, sqlx::Error> {
    let bad = |what: String| sqlx::Error::Decode(what.into());
    let kind: String = row.try_get("featurizer")?;
    let featurizer =
        FeaturizerKind::parse(&kind).ok_or_else(|| bad(format!("unknown featurizer {kind:?}")))?;
    let text_featurizer: HashedTfIdf =
        serde_json::from_value(row.try_get::<serde_json::Value, _>("text_featurizer")?)
            .map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
    let text = StoredProjection {
        input_dim: text_featurizer.buckets,
        mean: row.try_get("text_mean")?,
        components: row.try_get("text_components")?,
        explained: row.try_get("text_explained")?,
    };
    let embedding_mean: Option<Vec<f32>> = row.try_get("embedding_mean")?;
    let embedding = match embedding_mean {
        Some(mean) => Some(StoredProjection {
            input_dim: mean.len(),
            mean,
            components: row
                .try_get::<Option<Vec<f32>>, _>("embedding_components")?
                .unwrap_or_default(),
            explained: row
                .try_get::<Option<Vec<f32>>, _>("embedding_explained")?
                .unwrap_or_default(),
        }),
        None => None,
    };
    let clusters = clusters
        .iter()
        .map(|c| {
            let centroid: Vec<f32> = c.try_get("centroid")?;
            Ok(StoredCluster {
                cluster_id: c.try_get("cluster_id")?,
                label: c.try_get("label")?,
                text_centroid: c
                    .try_get::<Option<Vec<f32>>, _>("text_centroid")?
                    .unwrap_or_else(|| centroid.clone()),
                centroid,
                radius: c.try_get::<Option<f64>, _>("radius")?.unwrap_or(0.0),
                text_radius: c.try_get::<Option<f64>, _>("text_radius")?.unwrap_or(0.0),
                size: usize::try_from(c.try_get::<i32, _>("size")?).unwrap_or(0),
            })
        })
        .collect::<Result<Vec<_>, sqlx::Error>>()?;
    Ok(Some(StoredModel {
        org_id: org_id.to_owned(),
        version: row.try_get("version")?,
        featurizer,
        dims: usize::try_from(row.try_get::<i32, _>("dims")?).unwrap_or(0),
        method: row.try_get("method")?,
        text_featurizer,
        text,
        embedding,
        sigma2: row.try_get("sigma2")?,
        text_sigma2: row.try_get("text_sigma2")?,
        patterns: usize::try_from(row.try_get::<i32, _>("patterns")?).unwrap_or(0),
        quality: row.try_get("quality")?,
        clusters,
    }))
}

/// Counts and dimensions are small; saturate rather than wrap if one ever is not.
fn to_i32(v: usize) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}
