//! The decision log (one row per recommendation request, one item per shown recommendation)
//! and feedback. Writes are batched by the caller (see `recommend::decision_writer`) so that
//! many requests share one durable commit.

use chrono::{DateTime, Utc};
use serde_json::Value;
use serde_json::value::RawValue;
use sqlx::PgPool;
use uuid::Uuid;

use super::{QueryContext, StorageError};
use crate::domain::CandidateSource;

/// One recommendation request as logged.
#[derive(Debug, Clone)]
pub struct DecisionRecord {
    pub org_id: String,
    pub event_id: Uuid,
    pub created_at: DateTime<Utc>,
    pub policy_version: String,
    pub seed: i64,
    pub cluster_id: Option<String>,
    /// The request's context as received (for audits and replays), already serialized: the
    /// request path writes it once, straight to JSON text, instead of building a `Value` tree.
    pub context: Box<RawValue>,
    /// The request's failure-cluster embedding, if it sent one (kept out of `context`: as
    /// `real[]` it is a quarter of its JSON size).
    pub context_embedding: Option<Vec<f32>>,
    /// Every candidate considered: id, type and expected deltas (for off-policy evaluation; the
    /// shown items carry their features), in the binary layout of `recommend::candidate_log`.
    pub candidate_set: Vec<u8>,
    pub context_features: Vec<f32>,
    pub user_role: Option<String>,
    pub domain: Option<String>,
    /// Model versions left out of this decision by the exposure cap on new versions.
    pub capped_versions: Vec<String>,
    /// The model version whose unanswered ideas the exploration floor could put first in this
    /// decision (`None`: the floor did not apply).
    pub floor_version: Option<String>,
    /// Whether the floor did put one first (logged only with `floor_version`).
    pub floor_pick: bool,
    pub items: Vec<DecisionItemRecord>,
}

/// One shown recommendation.
#[derive(Debug, Clone, PartialEq)]
pub struct DecisionItemRecord {
    pub recommendation_id: String,
    pub position: i32,
    pub recommendation_type: String,
    pub model_provider: Option<String>,
    pub diff: Value,
    pub score: f64,
    pub propensity: f64,
    pub candidate_features: Vec<f32>,
    /// Heuristic or model (with its version and the prior it was ranked with).
    pub source: CandidateSource,
    /// For a priced model candidate, what the shared model and its prior predicted of it when
    /// shown (for analysts: its corrections are measured against the shared model as it is at
    /// each ranking, `recommend::engine::CandidateEvidence`).
    pub predicted: Option<f64>,
    /// The expected cost change per run it was served with (counted for accepted items,
    /// sql/0018).
    pub expected_cost_delta_usd: Option<f64>,
}

/// Inserts decisions (and their items) in one transaction: all are durable when this returns.
pub async fn insert_decisions(
    pool: &PgPool,
    decisions: &[DecisionRecord],
) -> Result<(), StorageError> {
    if decisions.is_empty() {
        return Ok(());
    }
    // Serialized straight from borrowed fields (no intermediate `Value` copies of the logged
    // context and candidate set) and unpacked by `jsonb_to_recordset`.
    #[derive(serde::Serialize)]
    struct LogRow<'a> {
        org_id: &'a str,
        event_id: Uuid,
        created_at: DateTime<Utc>,
        policy_version: &'a str,
        seed: i64,
        cluster_id: Option<&'a str>,
        context: &'a RawValue,
        context_embedding: Option<&'a [f32]>,
        #[serde(serialize_with = "bytea_hex")]
        candidate_set: &'a [u8],
        context_features: &'a [f32],
        user_role: Option<&'a str>,
        domain: Option<&'a str>,
        capped_versions: Option<&'a [String]>,
        floor_version: Option<&'a str>,
        floor_pick: Option<bool>,
    }
    #[derive(serde::Serialize)]
    struct ItemRow<'a> {
        org_id: &'a str,
        event_id: Uuid,
        recommendation_id: &'a str,
        position: i32,
        recommendation_type: &'a str,
        model_provider: Option<&'a str>,
        diff: &'a Value,
        score: f64,
        propensity: f64,
        candidate_features: &'a [f32],
        source: &'static str,
        model_version_id: Option<&'a str>,
        prior_mean: Option<f64>,
        prior_sd: Option<f64>,
        predicted: Option<f64>,
        expected_cost_delta_usd: Option<f64>,
    }
    let logs: Vec<LogRow<'_>> = decisions
        .iter()
        .map(|d| LogRow {
            org_id: &d.org_id,
            event_id: d.event_id,
            created_at: d.created_at,
            policy_version: &d.policy_version,
            seed: d.seed,
            cluster_id: d.cluster_id.as_deref(),
            context: &d.context,
            context_embedding: d.context_embedding.as_deref(),
            candidate_set: &d.candidate_set,
            context_features: &d.context_features,
            user_role: d.user_role.as_deref(),
            domain: d.domain.as_deref(),
            capped_versions: (!d.capped_versions.is_empty()).then_some(&d.capped_versions[..]),
            floor_version: d.floor_version.as_deref(),
            floor_pick: d.floor_version.as_ref().map(|_| d.floor_pick),
        })
        .collect();
    let items: Vec<ItemRow<'_>> = decisions
        .iter()
        .flat_map(|d| {
            d.items.iter().map(move |i| ItemRow {
                org_id: &d.org_id,
                event_id: d.event_id,
                recommendation_id: &i.recommendation_id,
                position: i.position,
                recommendation_type: &i.recommendation_type,
                model_provider: i.model_provider.as_deref(),
                diff: &i.diff,
                score: i.score,
                propensity: i.propensity,
                candidate_features: &i.candidate_features,
                source: i.source.kind(),
                model_version_id: i.source.model_version_id(),
                prior_mean: i.source.prior().map(|p| p.mean),
                prior_sd: i.source.prior().map(|p| p.sd),
                predicted: i.predicted,
                expected_cost_delta_usd: i.expected_cost_delta_usd,
            })
        })
        .collect();
    // One statement, so one round trip and one implicit transaction: the inserts commit
    // together (a data-modifying CTE always runs to completion). This is the only writer of
    // decision_items, which is why the items need no foreign key to the log (sql/0008), and it
    // counts what it shows in `acceptance_deltas` (sql/0015) in the same statement.
    sqlx::query(
        "WITH logged AS (
             INSERT INTO decision_log (org_id, event_id, created_at, policy_version, seed, cluster_id,
                                       context, context_embedding, candidate_set, context_features,
                                       user_role, domain, capped_versions, floor_version,
                                       floor_pick)
             SELECT org_id, event_id, created_at, policy_version, seed, cluster_id, context,
                    context_embedding, candidate_set, context_features, user_role, domain,
                    capped_versions, floor_version, floor_pick
             FROM jsonb_to_recordset($1) AS r(org_id text, event_id uuid, created_at timestamptz,
                  policy_version text, seed bigint, cluster_id text, context jsonb,
                  context_embedding real[], candidate_set bytea,
                  context_features real[], user_role text, domain text, capped_versions text[],
                  floor_version text, floor_pick boolean)
         ), counted AS (
             INSERT INTO acceptance_deltas
             SELECT l.org_id, (l.created_at AT TIME ZONE 'UTC')::date, coalesce(l.cluster_id, 'unassigned'),
                    i.recommendation_type, coalesce(i.model_provider, 'unknown'), l.policy_version,
                    arc_rec_source_key(i.model_version_id, i.source, NULL), count(*), 0
             FROM jsonb_to_recordset($2) AS i(org_id text, event_id uuid, recommendation_type text,
                  model_provider text, source text, model_version_id text)
             JOIN jsonb_to_recordset($1) AS l(org_id text, event_id uuid, created_at timestamptz,
                  cluster_id text, policy_version text) USING (org_id, event_id)
             GROUP BY 1, 2, 3, 4, 5, 6, 7
         )
         INSERT INTO decision_items (org_id, event_id, recommendation_id, position, recommendation_type,
                                     model_provider, diff, score, propensity, candidate_features,
                                     source, model_version_id, prior_mean, prior_sd, predicted,
                                     expected_cost_delta_usd)
         SELECT org_id, event_id, recommendation_id, position, recommendation_type, model_provider, diff,
                score, propensity, candidate_features, source, model_version_id, prior_mean, prior_sd,
                predicted, expected_cost_delta_usd
         FROM jsonb_to_recordset($2) AS r(org_id text, event_id uuid, recommendation_id text, position int,
              recommendation_type text, model_provider text, diff jsonb, score float8, propensity float8,
              candidate_features real[], source text, model_version_id text, prior_mean float8,
              prior_sd float8, predicted float8, expected_cost_delta_usd float8)",
    )
    .bind(sqlx::types::Json(&logs))
    .bind(sqlx::types::Json(&items))
    .execute(pool)
    .await
    .context("insert decision batch")?;
    Ok(())
}

/// What serving logged of `events` (decisions of `org`): per item, the decision's exploration
/// floor verdict (`None`: the floor did not apply) and the prior a priced model item was ranked
/// with. Items in the order (event, position).
pub async fn floor_and_priors(
    pool: &PgPool,
    org: &str,
    events: &[Uuid],
) -> Result<Vec<(Uuid, Option<bool>, String, Option<f64>)>, StorageError> {
    sqlx::query_as(
        "SELECT l.event_id, l.floor_pick, i.recommendation_id, i.prior_mean
         FROM decision_log l
         JOIN decision_items i ON i.org_id = l.org_id AND i.event_id = l.event_id
         WHERE l.org_id = $1 AND l.event_id = ANY($2)
         ORDER BY l.event_id, i.position",
    )
    .bind(org)
    .bind(events)
    .fetch_all(pool)
    .await
    .context("read the floor and priors of decisions")
}

/// An organization's decisions so far, and per model version the decisions whose first item
/// was its candidate (what the exposure cap on new versions starts from).
pub async fn exposure_counts(
    pool: &PgPool,
    org: &str,
) -> Result<(i64, Vec<(String, i64)>), StorageError> {
    let decisions: i64 = sqlx::query_scalar("SELECT count(*) FROM decision_log WHERE org_id = $1")
        .bind(org)
        .fetch_one(pool)
        .await
        .context("count decisions")?;
    let headed: Vec<(String, i64)> = sqlx::query_as(
        "SELECT model_version_id, count(*) FROM decision_items
         WHERE org_id = $1 AND position = 0 AND model_version_id IS NOT NULL
         GROUP BY model_version_id",
    )
    .bind(org)
    .fetch_all(pool)
    .await
    .context("count decisions headed by model versions")?;
    Ok((decisions, headed))
}

/// What feedback says happened to a shown recommendation.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum FeedbackOutcome {
    Accepted,
    Rejected,
    Applied,
}

impl FeedbackOutcome {
    /// The database label.
    pub fn as_str(self) -> &'static str {
        match self {
            FeedbackOutcome::Accepted => "accepted",
            FeedbackOutcome::Rejected => "rejected",
            FeedbackOutcome::Applied => "applied",
        }
    }

    /// Parses the database label.
    pub fn parse(label: &str) -> Option<Self> {
        [Self::Accepted, Self::Rejected, Self::Applied]
            .into_iter()
            .find(|o| o.as_str() == label)
    }
}

/// Feedback to store.
#[derive(Debug, Clone, PartialEq)]
pub struct FeedbackRecord {
    pub org_id: String,
    pub event_id: Uuid,
    pub recommendation_id: String,
    pub outcome: FeedbackOutcome,
    pub reliability_delta: Option<f64>,
    pub feedback_score: Option<i32>,
}

/// Result of storing feedback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FeedbackStored {
    /// A new row.
    Inserted,
    /// The same feedback was already stored; nothing changed.
    Duplicate,
    /// No such event or recommendation in this organization.
    UnknownRecommendation,
}

/// Stores feedback idempotently (the same feedback twice is one row), durably.
pub async fn insert_feedback(
    pool: &PgPool,
    feedback: &FeedbackRecord,
) -> Result<FeedbackStored, StorageError> {
    let result = sqlx::query(
        "INSERT INTO feedback (org_id, event_id, recommendation_id, outcome, reliability_delta, feedback_score)
         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (org_id, event_id, recommendation_id, outcome) DO NOTHING",
    )
    .bind(&feedback.org_id)
    .bind(feedback.event_id)
    .bind(&feedback.recommendation_id)
    .bind(feedback.outcome.as_str())
    .bind(feedback.reliability_delta)
    .bind(feedback.feedback_score)
    .execute(pool)
    .await;
    match result {
        Ok(done) if done.rows_affected() == 1 => Ok(FeedbackStored::Inserted),
        Ok(_) => Ok(FeedbackStored::Duplicate),
        // foreign_key_violation: the event or recommendation does not exist for this org.
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("23503") => {
            Ok(FeedbackStored::UnknownRecommendation)
        }
        Err(e) => Err(StorageError::Query {
            context: "insert feedback",
            source: e,
        }),
    }
}

/// A stored feedback row joined with what the bandit needs to learn from it.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct LearnableFeedback {
    pub org_id: String,
    pub event_id: Uuid,
    pub recommendation_id: String,
    pub outcome: String,
    pub reliability_delta: Option<f64>,
    pub received_at: DateTime<Utc>,
    pub decided_at: DateTime<Utc>,
    pub policy_version: String,
    pub context_features: Option<Vec<f32>>,
    pub candidate_features: Option<Vec<f32>>,
    /// The prior mean the item was ranked with (a priced model candidate): the learner learns
    /// the answer's residual from it.
    pub prior_mean: Option<f64>,
    /// The model version of a model candidate (the exposure cap counts its answers).
    pub model_version_id: Option<String>,
}

const LEARNABLE_SQL: &str = "SELECT f.org_id, f.event_id, f.recommendation_id, f.outcome, f.reliability_delta, f.received_at,
        l.created_at AS decided_at, l.policy_version, l.context_features, i.candidate_features,
        i.prior_mean, i.model_version_id
 FROM feedback f
 JOIN decision_items i ON i.org_id = f.org_id AND i.event_id = f.event_id AND i.recommendation_id = f.recommendation_id
 JOIN decision_log l ON l.org_id = f.org_id AND l.event_id = f.event_id";

/// Only the first answer about a shown item is learned (an `applied` after an `accepted` is
/// the same answer told twice): a row is learnable when no earlier row answers the same item.
/// Deciding this in the query, not in a set of every item ever learned, keeps a server's memory
/// and its start-up snapshot independent of how much feedback there has been.
const FIRST_ANSWER_SQL: &str = "NOT EXISTS (SELECT 1 FROM feedback e
    WHERE e.org_id = f.org_id AND e.event_id = f.event_id AND e.recommendation_id = f.recommendation_id
      AND (e.received_at, e.outcome) < (f.received_at, f.outcome))";

/// First answers received at or after `since` (all of them when `None`), oldest first, with
/// the logged features they apply to.
pub async fn feedback_since(
    pool: &PgPool,
    since: Option<DateTime<Utc>>,
) -> Result<Vec<LearnableFeedback>, StorageError> {
    sqlx::query_as(&format!(
        "{LEARNABLE_SQL} WHERE ($1::timestamptz IS NULL OR f.received_at >= $1) AND {FIRST_ANSWER_SQL}
         ORDER BY f.received_at, f.event_id, f.recommendation_id, f.outcome"
    ))
    .bind(since)
    .fetch_all(pool)
    .await
    .context("read feedback")
}

/// First answers a server starting from snapshots must replay, oldest first: for each
/// organization in `cutoffs`, those received after its cutoff; for every other organization,
/// all of them.
pub async fn feedback_after(
    pool: &PgPool,
    cutoffs: &[(String, DateTime<Utc>)],
) -> Result<Vec<LearnableFeedback>, StorageError> {
    let (orgs, after): (Vec<&str>, Vec<DateTime<Utc>>) =
        cutoffs.iter().map(|(org, t)| (org.as_str(), *t)).unzip();
    sqlx::query_as(&format!(
        "{LEARNABLE_SQL}
         LEFT JOIN unnest($1::text[], $2::timestamptz[]) AS c (org_id, after) ON c.org_id = f.org_id
         WHERE (c.after IS NULL OR f.received_at > c.after) AND {FIRST_ANSWER_SQL}
         ORDER BY f.received_at, f.event_id, f.recommendation_id, f.outcome"
    ))
    .bind(orgs)
    .bind(after)
    .fetch_all(pool)
    .await
    .context("read feedback past the snapshots")
}

/// The first answer stored for one shown recommendation (none or one row), with its features.
pub async fn feedback_for(
    pool: &PgPool,
    org: &str,
    event_id: Uuid,
    recommendation_id: &str,
) -> Result<Vec<LearnableFeedback>, StorageError> {
    sqlx::query_as(&format!(
        "{LEARNABLE_SQL} WHERE f.org_id = $1 AND f.event_id = $2 AND f.recommendation_id = $3
           AND {FIRST_ANSWER_SQL}
         ORDER BY f.received_at, f.outcome"
    ))
    .bind(org)
    .bind(event_id)
    .bind(recommendation_id)
    .fetch_all(pool)
    .await
    .context("read feedback of a recommendation")
}

/// A failure of a stored outcome, as the recommendation API places contexts by `outcome_ids`.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct StoredFailure {
    pub outcome_id: String,
    pub failure_category: String,
    pub error_message: String,
    /// The first failing tool call's tool, if any.
    pub tool_name: Option<String>,
}

/// The failure patterns of `org`'s outcomes `ids` (unknown ids are simply absent).
pub async fn failures_of_outcomes(
    pool: &PgPool,
    org: &str,
    ids: &[String],
) -> Result<Vec<StoredFailure>, StorageError> {
    sqlx::query_as(
        "SELECT fp.outcome_id, fp.failure_category, fp.error_message,
                (SELECT tc ->> 'tool_name' FROM jsonb_array_elements(o.trajectory -> 'tool_calls') tc
                 WHERE tc -> 'success' = 'false'::jsonb LIMIT 1) AS tool_name
         FROM failure_patterns fp
         JOIN outcomes o ON o.org_id = fp.org_id AND o.outcome_id = fp.outcome_id
         WHERE fp.org_id = $1 AND fp.outcome_id = ANY($2)
         ORDER BY fp.outcome_id, fp.pattern_id
         LIMIT 200",
    )
    .bind(org)
    .bind(ids)
    .fetch_all(pool)
    .await
    .context("read failures of outcomes")
}

/// A logged decision's candidate set as stored: the binary column (`recommend::candidate_log`),
/// or the JSONB column of decisions logged before it. `None` when there is no such decision.
pub async fn stored_candidate_set(
    pool: &PgPool,
    org: &str,
    event_id: Uuid,
) -> Result<Option<(Option<Vec<u8>>, Option<Value>)>, StorageError> {
    sqlx::query_as(
        "SELECT candidate_set, candidates FROM decision_log WHERE org_id = $1 AND event_id = $2",
    )
    .bind(org)
    .bind(event_id)
    .fetch_optional(pool)
    .await
    .context("read a logged candidate set")
}

/// Writes bytes as the text form of `bytea` (`\x` and hex digits), which `jsonb_to_recordset`
/// hands to the column's input function.
fn bytea_hex<S: serde::Serializer>(bytes: &&[u8], serializer: S) -> Result<S::Ok, S::Error> {
    let mut text = vec![0u8; 2 + 2 * bytes.len()];
    text[..2].copy_from_slice(b"\\x");
    hex::encode_to_slice(bytes, &mut text[2..]).map_err(serde::ser::Error::custom)?;
    serializer.serialize_str(std::str::from_utf8(&text).map_err(serde::ser::Error::custom)?)
}

/// When the organization's first decision was logged (`None`: it has none yet).
pub async fn first_decision_at(
    pool: &PgPool,
    org: &str,
) -> Result<Option<DateTime<Utc>>, StorageError> {
    sqlx::query_scalar("SELECT min(created_at) FROM decision_log WHERE org_id = $1")
        .bind(org)
        .fetch_one(pool)
        .await
        .context("find the first decision")
}
