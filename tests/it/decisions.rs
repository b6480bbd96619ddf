//! The decision log and feedback storage: group-committed decisions are durable, feedback is
//! idempotent and must name a shown recommendation of the same organization.

use arc_rec::domain::{CandidatePrior, CandidateSource, RecommendationType};
use arc_rec::recommend::candidate_log::{self, CandidateEntry};
use arc_rec::recommend::decision_writer::DecisionWriter;
use arc_rec::storage::decisions::{
    DecisionItemRecord, DecisionRecord, FeedbackOutcome, FeedbackRecord, FeedbackStored,
    feedback_since, insert_feedback, stored_candidate_set,
};
use serde_json::json;
use serde_json::value::RawValue;
use uuid::Uuid;

use crate::helpers::fresh_database;

fn decision(org: &str, event_id: Uuid) -> DecisionRecord {
    DecisionRecord {
        org_id: org.to_owned(),
        event_id,
        created_at: chrono::Utc::now(),
        policy_version: "ts-test".into(),
        seed: 42,
        cluster_id: Some("tool_timeout-web_search".into()),
        context: RawValue::from_string(r#"{"failures": []}"#.to_owned()).expect("valid JSON"),
        context_embedding: Some(vec![0.25, -1.5]),
        candidate_set: candidate_log::encode(
            [CandidateEntry {
                candidate_id: "c-00000000000000aa",
                kind: RecommendationType::RetryPolicy,
                expected_reliability_delta: 0.25,
                expected_cost_delta_usd: 0.5,
            }]
            .into_iter(),
        )
        .expect("encodes"),
        context_features: vec![1.0, 0.5],
        user_role: Some("senior_ml_engineer".into()),
        domain: Some("fintech".into()),
        capped_versions: vec!["mv-new".into()],
        floor_version: Some("mv-new".into()),
        floor_pick: true,
        items: (0..3)
            .map(|p| DecisionItemRecord {
                recommendation_id: format!("r-{p}"),
                position: p,
                recommendation_type: "retry_policy".into(),
                model_provider: Some("openai".into()),
                diff: json!({"retry": {"max_attempts": 3 + p}}),
                score: 0.5,
                propensity: 0.4,
                candidate_features: vec![p as f32, 1.0],
                source: if p == 2 {
                    CandidateSource::Model {
                        model_version_id: "mv-1".into(),
                        prior: Some(CandidatePrior { mean: 0.6, sd: 0.1 }),
                    }
                } else {
                    CandidateSource::Heuristic
                },
                predicted: (p == 2).then_some(0.55),
                expected_cost_delta_usd: Some(0.001 * f64::from(p)),
            })
            .collect(),
    }
}

#[tokio::test]
async fn concurrent_decisions_are_all_durable() {
    let db = fresh_database().await;
    sqlx::query("INSERT INTO organizations (org_id) VALUES ('acme')")
        .execute(db.pool())
        .await
        .unwrap();
    let writer = DecisionWriter::spawn(db.pool().clone());
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let writer = writer.clone();
            tokio::spawn(async move { writer.write(decision("acme", Uuid::new_v4())).await })
        })
        .collect();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    let logged: i64 = sqlx::query_scalar("SELECT count(*) FROM decision_log")
        .fetch_one(db.pool())
        .await
        .unwrap();
    let items: i64 = sqlx::query_scalar("SELECT count(*) FROM decision_items")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!((logged, items), (64, 192));
    // Each item keeps its source, model version, prior and what was predicted of it.
    type SourceRow = (
        String,
        Option<String>,
        Option<f64>,
        Option<f64>,
        Option<f64>,
    );
    let sources: Vec<SourceRow> = sqlx::query_as(
        "SELECT DISTINCT source, model_version_id, prior_mean, prior_sd, predicted
         FROM decision_items ORDER BY 1",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    assert_eq!(
        sources,
        [
            ("heuristic".to_owned(), None, None, None, None),
            (
                "model".to_owned(),
                Some("mv-1".to_owned()),
                Some(0.6),
                Some(0.1),
                Some(0.55)
            ),
        ]
    );
    // The binary candidate set and the embedding come back as written.
    let (event_id, embedding): (Uuid, Vec<f32>) =
        sqlx::query_as("SELECT event_id, context_embedding FROM decision_log LIMIT 1")
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(embedding, [0.25, -1.5]);
    let capped: Vec<String> =
        sqlx::query_scalar("SELECT capped_versions FROM decision_log LIMIT 1")
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(capped, ["mv-new"]);
    let floor: (Option<String>, Option<bool>) =
        sqlx::query_as("SELECT floor_version, floor_pick FROM decision_log LIMIT 1")
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(floor, (Some("mv-new".to_owned()), Some(true)));
    let (binary, json) = stored_candidate_set(db.pool(), "acme", event_id)
        .await
        .unwrap()
        .expect("logged");
    assert!(json.is_none());
    let candidates = candidate_log::decode_stored(binary.as_deref(), json).unwrap();
    assert_eq!(candidates.len(), 1);
    assert_eq!(candidates[0].candidate_id, "c-00000000000000aa");
    assert_eq!(candidates[0].kind, RecommendationType::RetryPolicy);
    // A failing batch reports its error to every waiting request.
    let err = writer
        .write(decision("no-such-org", Uuid::new_v4()))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("decision log"), "{err}");
}

#[tokio::test]
async fn feedback_is_idempotent_and_joins_its_decision() {
    let db = fresh_database().await;
    sqlx::query("INSERT INTO organizations (org_id) VALUES ('acme'), ('globex')")
        .execute(db.pool())
        .await
        .unwrap();
    let writer = DecisionWriter::spawn(db.pool().clone());
    let event_id = Uuid::new_v4();
    writer.write(decision("acme", event_id)).await.unwrap();
    let feedback = FeedbackRecord {
        org_id: "acme".into(),
        event_id,
        recommendation_id: "r-1".into(),
        outcome: FeedbackOutcome::Accepted,
        reliability_delta: Some(0.21),
        feedback_score: Some(4),
    };
    assert_eq!(
        insert_feedback(db.pool(), &feedback).await.unwrap(),
        FeedbackStored::Inserted
    );
    assert_eq!(
        insert_feedback(db.pool(), &feedback).await.unwrap(),
        FeedbackStored::Duplicate
    );
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM feedback")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(rows, 1);
    let unknown = FeedbackRecord {
        recommendation_id: "r-9".into(),
        ..feedback.clone()
    };
    assert_eq!(
        insert_feedback(db.pool(), &unknown).await.unwrap(),
        FeedbackStored::UnknownRecommendation
    );
    let other_org = FeedbackRecord {
        org_id: "globex".into(),
        ..feedback.clone()
    };
    assert_eq!(
        insert_feedback(db.pool(), &other_org).await.unwrap(),
        FeedbackStored::UnknownRecommendation
    );

    let learnable = feedback_since(db.pool(), None).await.unwrap();
    assert_eq!(learnable.len(), 1);
    assert_eq!(
        learnable[0].context_features.as_deref(),
        Some(&[1.0, 0.5][..])
    );
    assert_eq!(
        learnable[0].candidate_features.as_deref(),
        Some(&[1.0, 1.0][..])
    );
    assert_eq!(learnable[0].prior_mean, None);
    assert_eq!(
        FeedbackOutcome::parse(&learnable[0].outcome),
        Some(FeedbackOutcome::Accepted)
    );
}

/// A connection that carried a bandit snapshot is closed, not returned to the pool (a pooled
/// connection keeps its buffers at the largest message it ever carried: megabytes for every
/// connection that once stored or read a snapshot), and the snapshot round-trips.
#[tokio::test]
async fn a_snapshot_s_connection_is_closed_not_pooled() {
    use arc_rec::storage::bandit_state::{load_snapshots, save_snapshot};
    let db = fresh_database().await;
    let pool = db.pool();
    sqlx::query("INSERT INTO organizations (org_id) VALUES ('acme')")
        .execute(pool)
        .await
        .unwrap();
    let state = serde_json::to_string(&json!({"weights": vec![0.5; 10_000]})).unwrap();
    // An idle connection for the snapshot to take, so the pool opens none for it (a connection
    // goes back to the idle queue shortly after its query, not at once).
    let idle = || async {
        sqlx::query("SELECT 1").execute(pool).await.unwrap();
        for _ in 0..200 {
            if pool.num_idle() >= 1 {
                return pool.size();
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("no idle connection");
    };
    let before = idle().await;
    save_snapshot(pool, "acme", "v-test", 1, &state, 7)
        .await
        .unwrap();
    assert_eq!(
        pool.size(),
        before - 1,
        "the snapshot's connection was pooled"
    );
    let before = idle().await;
    let loaded = load_snapshots(pool, "v-test").await.unwrap();
    assert_eq!(pool.size(), before - 1, "the read's connection was pooled");
    assert_eq!(loaded.len(), 1);
    assert_eq!(loaded[0].feedback_count, 7);
    let round_trip: serde_json::Value = serde_json::from_str(&loaded[0].state).unwrap();
    assert_eq!(
        round_trip,
        serde_json::from_str::<serde_json::Value>(&state).unwrap()
    );
    // The pool still serves after giving its connections up.
    sqlx::query("SELECT 1").execute(pool).await.unwrap();
}
