//! Recommendations and feedback through the HTTP API, and the bandit's state across replicas
//! and restarts.

use std::time::Duration;

use arc_rec::recommend::service::Serving;
use serde_json::{Value, json};

use crate::helpers::{
    TestApp, arc_rec, contract_lines, contract_request, spawn_app, wait_for_answers,
};

/// Posts the contract request with the platform key and returns the response body.
pub(crate) async fn recommend_contract(app: &TestApp) -> Value {
    app.post(
        "/v1/recommendations",
        Some(&app.platform_key),
        &contract_request(),
    )
    .await
    .json()
    .await
    .unwrap()
}

pub(crate) async fn with_contract_data() -> TestApp {
    let app = spawn_app().await;
    let records = Value::Array(
        contract_lines()
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect(),
    );
    assert_eq!(
        app.post("/v1/trajectories", Some(&app.platform_key), &records)
            .await
            .status(),
        201
    );
    app
}

#[tokio::test]
async fn the_contract_request_works_as_written_and_is_logged() {
    let app = with_contract_data().await;
    let response = app
        .post(
            "/v1/recommendations",
            Some(&app.platform_key),
            &contract_request(),
        )
        .await;
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    assert!(body["policy_version"].as_str().unwrap().starts_with("ts-"));
    let recommendations = body["recommendations"].as_array().unwrap();
    assert_eq!(recommendations.len(), 3, "{body}");
    for r in recommendations {
        for field in [
            "recommendation_id",
            "type",
            "diff",
            "description",
            "expected_reliability_delta",
            "expected_cost_delta_usd",
            "evidence_count",
            "score",
            "propensity",
        ] {
            assert!(!r[field].is_null(), "{field} missing in {r}");
        }
        // No model candidates are stored here: every one is the heuristics', without a version.
        assert_eq!(r["source"], "heuristic", "{r}");
        assert!(r.get("model_version_id").is_none(), "{r}");
        let propensity = r["propensity"].as_f64().unwrap();
        assert!(propensity > 0.0 && propensity <= 1.0);
        assert!(
            r["expected_cost_delta_usd"].as_f64().unwrap() <= 0.05,
            "cost cap respected: {r}"
        );
        assert_ne!(r["diff"], json!({}));
        let groups: Vec<&str> = r["explanation"]["contributions"]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(groups, ["candidate", "cluster", "config", "user"]);
    }
    // The 200 means the decision is durable.
    let event_id = body["event_id"].as_str().unwrap();
    let items: i64 =
        sqlx::query_scalar("SELECT count(*) FROM decision_items WHERE event_id = $1::uuid")
            .bind(event_id)
            .fetch_one(app.db.pool())
            .await
            .unwrap();
    assert_eq!(items, 3);

    // The optional `config_id` (not in the contract) is logged with the decision's context, so
    // its answers can be grouped with the configuration's other decisions; without it the
    // contract's request logs none.
    let mut request = contract_request();
    request["config_id"] = json!("c1");
    let body: Value = app
        .post("/v1/recommendations", Some(&app.platform_key), &request)
        .await
        .json()
        .await
        .unwrap();
    let logged: Vec<Option<String>> = sqlx::query_scalar(
        "SELECT context ->> 'config_id' FROM decision_log WHERE event_id IN ($1::uuid, $2::uuid)
         ORDER BY context ->> 'config_id' NULLS FIRST",
    )
    .bind(event_id)
    .bind(body["event_id"].as_str().unwrap())
    .fetch_all(app.db.pool())
    .await
    .unwrap();
    assert_eq!(logged, [None, Some("c1".to_owned())]);
}

#[tokio::test]
async fn feedback_is_idempotent_and_checked() {
    let app = with_contract_data().await;
    let body = recommend_contract(&app).await;
    let feedback = json!({
        "event_id": body["event_id"], "recommendation_id": body["recommendations"][0]["recommendation_id"],
        "outcome": "accepted", "reliability_delta": 0.21, "feedback_score": 4
    });
    assert_eq!(
        app.post("/v1/feedback", Some(&app.platform_key), &feedback)
            .await
            .status(),
        201
    );
    assert_eq!(
        app.post("/v1/feedback", Some(&app.platform_key), &feedback)
            .await
            .status(),
        200
    );
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM feedback")
        .fetch_one(app.db.pool())
        .await
        .unwrap();
    assert_eq!(rows, 1, "the same feedback twice is one row");
    assert_eq!(
        app.post("/v1/feedback", Some(&app.analyst_key), &feedback)
            .await
            .status(),
        403
    );
    let mut unknown = feedback.clone();
    unknown["recommendation_id"] = json!("r-0000000000000000");
    assert_eq!(
        app.post("/v1/feedback", Some(&app.platform_key), &unknown)
            .await
            .status(),
        404
    );
    let mut bad = feedback.clone();
    bad["feedback_score"] = json!(9);
    let error: Value = app
        .post("/v1/feedback", Some(&app.platform_key), &bad)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(error["error"]["fields"][0]["field"], "feedback_score");
}

#[tokio::test]
async fn request_errors_name_the_field() {
    let app = with_contract_data().await;
    let key = Some(app.platform_key.as_str());
    let mut request = contract_request();
    request["current_config"]["temperature"] = json!(7);
    request["k"] = json!(0);
    let response = app.post("/v1/recommendations", key, &request).await;
    assert_eq!(response.status(), 422);
    let error: Value = response.json().await.unwrap();
    let fields: Vec<&str> = error["error"]["fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["field"].as_str().unwrap())
        .collect();
    assert_eq!(fields, ["current_config.temperature", "k"]);

    let mut request = contract_request();
    request["failure_context"]["colour"] = json!("red");
    let error: Value = app
        .post("/v1/recommendations", key, &request)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        error["error"]["fields"][0]["field"],
        "failure_context.colour"
    );

    let mut request = contract_request();
    request["failure_context"] = json!({});
    assert_eq!(
        app.post("/v1/recommendations", key, &request)
            .await
            .status(),
        422
    );

    for bad in [json!(""), json!(" "), json!("x".repeat(201)), json!(7)] {
        let mut request = contract_request();
        request["config_id"] = bad.clone();
        let response = app.post("/v1/recommendations", key, &request).await;
        assert_eq!(response.status(), 422, "config_id {bad}");
        let error: Value = response.json().await.unwrap();
        assert_eq!(
            error["error"]["fields"][0]["field"], "config_id",
            "config_id {bad}: {error}"
        );
    }
}

#[tokio::test]
async fn wrong_embedding_dimension_is_named() {
    let app = spawn_app().await;
    let run = |args: &[&str]| {
        let output = arc_rec(&app.db.url).args(args).output().unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    run(&[
        "simulate",
        "--seed",
        "4",
        "--outcomes",
        "500",
        "--orgs",
        "acme",
        "--embedding-dim",
        "8",
    ]);
    run(&["cluster", "--org", "acme"]);
    let mut request = contract_request();
    request["failure_context"] = json!({"failure_cluster_embedding": [0.01, -0.2, 0.33]});
    let response = app
        .post("/v1/recommendations", Some(&app.platform_key), &request)
        .await;
    assert_eq!(response.status(), 422);
    let error: Value = response.json().await.unwrap();
    assert_eq!(
        error["error"]["fields"][0]["field"],
        "failure_context.failure_cluster_embedding"
    );
    assert!(
        error["error"]["fields"][0]["message"]
            .as_str()
            .unwrap()
            .contains("expected 8"),
        "{error}"
    );
    request["failure_context"] =
        json!({"failure_cluster_embedding": [0.1, 0.2, -0.3, 0.05, 0.0, 0.4, -0.2, 0.1]});
    let response = app
        .post("/v1/recommendations", Some(&app.platform_key), &request)
        .await;
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    assert!(
        body["cluster_id"].is_string(),
        "placed by the embedding: {body}"
    );
    // The log keeps the embedding as real[] and the rest of the request as JSON.
    let event_id: uuid::Uuid = body["event_id"].as_str().unwrap().parse().unwrap();
    let (context, embedding): (Value, Vec<f32>) =
        sqlx::query_as("SELECT context, context_embedding FROM decision_log WHERE event_id = $1")
            .bind(event_id)
            .fetch_one(app.db.pool())
            .await
            .unwrap();
    assert_eq!(embedding, [0.1, 0.2, -0.3, 0.05, 0.0, 0.4, -0.2, 0.1]);
    assert_eq!(
        context["failure_context"],
        json!({"failures": [], "outcome_ids": []})
    );
    assert_eq!(context["current_config"], request["current_config"]);
}

/// Serves `n` contract requests and answers each: `answer(i)` picks the position of the
/// recommendation the feedback is about and its outcome; every feedback must be stored (201).
pub(crate) async fn serve_and_answer(
    app: &TestApp,
    n: usize,
    answer: impl Fn(usize) -> (usize, &'static str),
) {
    for i in 0..n {
        let body = recommend_contract(app).await;
        let (position, outcome) = answer(i);
        let feedback = json!({"event_id": body["event_id"], "recommendation_id": body["recommendations"][position]["recommendation_id"], "outcome": outcome});
        assert_eq!(
            app.post("/v1/feedback", Some(&app.platform_key), &feedback)
                .await
                .status(),
            201
        );
    }
}

/// The largest elementwise difference of two posterior means.
fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

/// Waits until `serving`'s policy for acme has done its warm start and learned `n` answers
/// besides.
async fn wait_for_observations(
    serving: &Serving,
    n: u64,
) -> std::sync::Arc<bandit::ThompsonPolicy> {
    wait_for_answers(serving, "acme", n, Duration::from_secs(10)).await
}

#[tokio::test]
async fn replicas_agree_and_state_survives_a_restart() {
    let app = with_contract_data().await;
    // A second replica on the same database.
    let replica = Serving::start(app.db.pool().clone()).await.unwrap();
    serve_and_answer(&app, 12, |i| {
        (i % 3, if i % 3 == 0 { "accepted" } else { "rejected" })
    })
    .await;
    let served_by_app = app.serving.clone();
    let here = wait_for_observations(&served_by_app, 12).await;
    // The other replica learns the same feedback by polling the database.
    let there = wait_for_observations(&replica, 12).await;
    let diff = max_abs_diff(here.mean(), there.mean());
    assert!(diff < 1e-9, "replicas disagree by {diff}");
    // A restart rebuilds the same posterior from the logged feedback.
    let restarted = Serving::start(app.db.pool().clone()).await.unwrap();
    let rebuilt = wait_for_observations(&restarted, 12).await;
    let diff = max_abs_diff(here.mean(), rebuilt.mean());
    assert!(diff < 1e-9, "restart changed the posterior by {diff}");
    assert!(
        here.mean().iter().any(|m| m.abs() > 1e-6),
        "the policy learned something"
    );
}

/// Posts the contract request for the configuration as stored (version v1), asking for every
/// candidate (k = 20), and returns their diffs in the order shown.
async fn shown_diffs(app: &TestApp) -> Vec<Value> {
    let mut request = contract_request();
    request["k"] = json!(20);
    request["current_config"] = json!({"model": "openai/gpt-4.1", "temperature": 0.7,
        "tools": [{"name": "web_search"}, {"name": "calculator"}], "retry": {"max_attempts": 1},
        "timeout_s": 30, "system_prompt": "You are..."});
    let body: Value = app
        .post("/v1/recommendations", Some(&app.platform_key), &request)
        .await
        .json()
        .await
        .unwrap();
    body["recommendations"]
        .as_array()
        .unwrap_or_else(|| panic!("{body}"))
        .iter()
        .map(|r| r["diff"].clone())
        .collect()
}

/// A new organization's policy first learns the platform's logged decisions: a log that
/// approved, in the contract's context (on the stored configuration), the temperature change
/// and rejected every other candidate puts that change on top from the first request on (a prior alone shows it first about
/// once in as many requests as there are candidates); a replica's warm start reaches the same
/// posterior; the warm start is counted apart from answers.
#[tokio::test]
async fn a_new_organization_starts_from_the_platform_s_logged_decisions() {
    // The contract context's candidates, from a twin database whose organization has served.
    let twin = with_contract_data().await;
    let candidates = shown_diffs(&twin).await;
    assert!(candidates.len() >= 3, "{candidates:?}");
    let favourite = candidates
        .iter()
        .find(|diff| diff.get("temperature").is_some())
        .expect("a temperature change among the candidates")
        .clone();

    let app = with_contract_data().await;
    let decided_at = chrono::Utc::now() - chrono::TimeDelta::hours(1);
    // The configuration's owner, in the contract request's segment.
    let mut records = vec![
        json!({"kind": "user", "org": "acme", "data": {"user_id": "u7",
        "user_role": "senior_ml_engineer", "domain": "fintech"}}),
    ];
    for round in 0..30 {
        for (i, diff) in candidates.iter().enumerate() {
            records.push(json!({"kind": "config_diff", "org": "acme", "data": {
                "diff_id": format!("log-{round}-{i}"), "config_id": "c1",
                "version_before": "v1", "version_after": "v2",
                "change_summary": "logged by the platform's own recommender", "diff": diff,
                "llm_generated": false,
                "approval_status": if *diff == favourite { "approved" } else { "rejected" },
                "approved_by": "u7",
                "created_at": (decided_at + chrono::TimeDelta::seconds(round)).to_rfc3339()}}));
        }
    }
    assert_eq!(
        app.post(
            "/v1/trajectories",
            Some(&app.platform_key),
            &Value::Array(records)
        )
        .await
        .status(),
        201
    );
    // The newest decided diffs, oldest first: the last round's, ties broken by id.
    let newest = arc_rec::storage::export_rows::newest_rows(
        app.db.pool(),
        &arc_rec::storage::export_rows::ExportFilter {
            org: Some("acme".into()),
            ..Default::default()
        },
        5,
    )
    .await
    .unwrap();
    let ids: Vec<&str> = newest.iter().map(|r| r.diff_id.as_str()).collect();
    assert_eq!(
        ids,
        ["log-29-1", "log-29-2", "log-29-3", "log-29-4", "log-29-5"]
    );
    // The first request installs the organization; its learner warm-starts meanwhile.
    let first = recommend_contract(&app).await;
    assert!(first["recommendations"].is_array(), "{first}");

    let warmed = wait_for_observations(&app.serving, 0).await;
    let warm = app.serving.warm_start("acme").unwrap();
    assert_eq!(warm.logged, 1 + 30 * candidates.len() as u64, "{warm:?}");
    assert!(warm.matched >= 30 * candidates.len() as u64, "{warm:?}");
    // Whether the favourite leads one ranking is a Thompson draw; the probability that it leads
    // is not: the logged propensity of the first slot, (1−ε)·(share of the posterior bank's
    // draws that put it first) + ε/K, exact for the bank the request ranked with. Counting wins
    // over a few requests instead would fail now and then by chance alone (15 of 20 once, where
    // ≥ 16 was asked of a propensity near 0.8).
    let mut on_top = 0;
    for _ in 0..20 {
        if shown_diffs(&app).await.first() == Some(&favourite) {
            on_top += 1;
        }
    }
    // At a propensity ≥ 0.5 the chance of 20 requests without one lead is below 10⁻⁶. (The first
    // request, ranked before the warm start, is not among them.)
    assert!(on_top > 0, "the logged favourite led none of 20 rankings");
    let led_with: f64 = sqlx::query_scalar(
        "SELECT min(propensity) FROM decision_items WHERE org_id = 'acme' AND position = 0 \
         AND diff = $1 AND event_id::text <> $2",
    )
    .bind(&favourite)
    .bind(first["event_id"].as_str())
    .fetch_one(app.db.pool())
    .await
    .unwrap();
    let prior_share = 1.0 / candidates.len() as f64;
    assert!(
        led_with >= 0.5,
        "the logged favourite leads with probability {led_with:.3} (a prior alone: \
         {prior_share:.3}); it led {on_top} of 20 rankings"
    );

    // A replica starting now, which meets the organization through an answer it polls, reaches
    // the same posterior from the same log and the answer.
    let replica = Serving::start(app.db.pool().clone()).await.unwrap();
    let feedback = json!({"event_id": first["event_id"],
        "recommendation_id": first["recommendations"][0]["recommendation_id"],
        "outcome": "rejected"});
    assert_eq!(
        app.post("/v1/feedback", Some(&app.platform_key), &feedback)
            .await
            .status(),
        201
    );
    let here = wait_for_observations(&app.serving, 1).await;
    let there = wait_for_observations(&replica, 1).await;
    assert_eq!(replica.warm_start("acme"), Some(warm));
    assert_eq!(there.observations(), warmed.observations() + 1);
    let diff = max_abs_diff(here.mean(), there.mean());
    assert!(diff < 1e-9, "replicas disagree by {diff}");
}

/// A server starting from the learners' snapshots replays only the feedback past them and ranks
/// as one that replayed the whole log: same posterior, same scores, same order for every logged
/// decision; a second answer about an item learned before the snapshot is not learned again.
#[tokio::test]
async fn a_server_started_from_snapshots_ranks_as_a_full_replay() {
    let app = with_contract_data().await;
    serve_and_answer(&app, 10, |i| {
        (i % 3, if i % 2 == 0 { "accepted" } else { "rejected" })
    })
    .await;
    wait_for_observations(&app.serving, 10).await;
    // Received hours ago, two minutes apart, as far as the log says: a snapshot of them covers
    // all but the newest (within its overlap window), and a restart need not re-read them.
    sqlx::query(
        "UPDATE feedback f SET received_at = f.received_at - interval '2 hours' - o.n * interval '2 minutes'
         FROM (SELECT event_id, recommendation_id, row_number() OVER (ORDER BY received_at DESC) AS n
               FROM feedback) o
         WHERE o.event_id = f.event_id AND o.recommendation_id = f.recommendation_id",
    )
        .execute(app.db.pool())
        .await
        .unwrap();
    let earlier = Serving::start(app.db.pool().clone()).await.unwrap();
    wait_for_observations(&earlier, 10).await;
    assert_eq!(earlier.snapshot_all().await.unwrap(), 1);
    let stored: i64 = sqlx::query_scalar(
        "SELECT feedback_count FROM bandit_state WHERE org_id = 'acme' AND policy_version = $1",
    )
    .bind(earlier.policy_version())
    .fetch_one(app.db.pool())
    .await
    .unwrap();
    assert_eq!(stored, 10);
    // Past the snapshot: new answers, and an `applied` telling again an answer it learned.
    serve_and_answer(&app, 6, |i| (i % 2, "accepted")).await;
    let (event_id, recommendation_id): (uuid::Uuid, String) = sqlx::query_as(
        "SELECT event_id, recommendation_id FROM feedback WHERE outcome = 'accepted'
         ORDER BY received_at LIMIT 1",
    )
    .fetch_one(app.db.pool())
    .await
    .unwrap();
    let again =
        json!({"event_id": event_id, "recommendation_id": recommendation_id, "outcome": "applied"});
    assert_eq!(
        app.post("/v1/feedback", Some(&app.platform_key), &again)
            .await
            .status(),
        201
    );
    let live = wait_for_observations(&app.serving, 16).await;

    let from_snapshot = Serving::start(app.db.pool().clone()).await.unwrap();
    let report = from_snapshot.startup();
    assert_eq!(report.restored, 1, "{report:?}");
    // Re-read: the six new answers and the newest snapshotted one (skipped as learned); the
    // `applied` is not a first answer.
    assert_eq!(report.replayed, 7, "{report:?}");
    let restored = wait_for_observations(&from_snapshot, 16).await;
    sqlx::query("DELETE FROM bandit_state")
        .execute(app.db.pool())
        .await
        .unwrap();
    let full = Serving::start(app.db.pool().clone()).await.unwrap();
    assert_eq!(full.startup().restored, 0);
    assert_eq!(full.startup().replayed, 16);
    let replayed = wait_for_observations(&full, 16).await;

    for (name, policy) in [("live", &live), ("full replay", &replayed)] {
        let diff = max_abs_diff(restored.mean(), policy.mean());
        assert!(
            diff < 1e-9,
            "snapshot restart vs {name}: means differ by {diff}"
        );
        let diff = max_abs_diff(restored.precision(), policy.precision());
        assert!(
            diff < 1e-9,
            "snapshot restart vs {name}: precisions differ by {diff}"
        );
    }
    // Every logged decision's items score and order the same under both.
    let decisions: Vec<(Vec<f32>, Vec<Vec<f32>>)> = {
        let rows: Vec<(uuid::Uuid, Vec<f32>)> = sqlx::query_as(
            "SELECT event_id, context_features FROM decision_log ORDER BY created_at",
        )
        .fetch_all(app.db.pool())
        .await
        .unwrap();
        let mut decisions = Vec::new();
        for (event_id, z) in rows {
            let items: Vec<Vec<f32>> = sqlx::query_scalar(
                "SELECT candidate_features FROM decision_items WHERE event_id = $1 ORDER BY position",
            )
            .bind(event_id)
            .fetch_all(app.db.pool())
            .await
            .unwrap();
            decisions.push((z, items));
        }
        decisions
    };
    assert!(decisions.len() >= 16);
    let widen = |v: &[f32]| v.iter().map(|x| f64::from(*x)).collect::<Vec<f64>>();
    for (z, items) in &decisions {
        let z = widen(z);
        let order = |policy: &bandit::ThompsonPolicy| {
            let scores: Vec<f64> = items
                .iter()
                .map(|c| policy.mean_score(&z, &widen(c)).unwrap())
                .collect();
            let mut order: Vec<usize> = (0..scores.len()).collect();
            order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
            (order, scores)
        };
        let (restored_order, restored_scores) = order(&restored);
        let (full_order, full_scores) = order(&replayed);
        assert_eq!(restored_order, full_order);
        assert!(max_abs_diff(&restored_scores, &full_scores) < 1e-9);
    }
}

#[tokio::test]
async fn analytics_over_served_decisions() {
    let app = with_contract_data().await;
    serve_and_answer(&app, 10, |i| {
        (0, if i < 4 { "accepted" } else { "rejected" })
    })
    .await;
    let acceptance: Value = app
        .get(
            "/v1/analytics/acceptance?group_by=policy_version",
            Some(&app.analyst_key),
        )
        .await
        .json()
        .await
        .unwrap();
    let row = &acceptance["rows"][0];
    assert_eq!(
        (row["shown"].as_i64(), row["accepted"].as_i64()),
        (Some(30), Some(4))
    );
    let ci = row["ci95"].as_array().unwrap();
    assert!(ci[0].as_f64().unwrap() < 4.0 / 30.0 && 4.0 / 30.0 < ci[1].as_f64().unwrap());

    // Uniform: the shown item always has weight under it, so the estimate exists whatever the
    // sampler happened to show first (the heuristic's pick may never have been on top in ten
    // random decisions, and SNIPS is then undefined: a 422 naming the policy).
    let ope: Value = app
        .get("/v1/analytics/ope?policy=uniform", Some(&app.analyst_key))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(ope["decisions"], 10, "{ope}");
    assert!((ope["logged_acceptance_rate"].as_f64().unwrap() - 0.4).abs() < 1e-9);
    let snips = &ope["snips"];
    assert!(snips["ci95"][0].as_f64().unwrap() <= snips["ci95"][1].as_f64().unwrap());
    let error: Value = app
        .get("/v1/analytics/ope?policy=best", Some(&app.analyst_key))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(error["error"]["fields"][0]["field"], "policy");
    assert_eq!(
        app.get("/v1/analytics/ope?policy=uniform", Some(&app.platform_key))
            .await
            .status(),
        403
    );
}

/// A server remembers which answers it learned only as long as its poll may re-read them: old
/// answers (stored around it, found by its poll) and a fresh one (posted to it) are each
/// learned once, and then only the fresh one is remembered, so memory does not grow with the
/// feedback log.
#[tokio::test]
async fn learned_answers_are_remembered_only_for_the_poll_window() {
    let app = with_contract_data().await;
    let mut bodies = Vec::new();
    for _ in 0..3 {
        bodies.push(recommend_contract(&app).await);
    }
    // Two answers received ten minutes ago, written around the server (as another replica's
    // would be, long since).
    for body in &bodies[..2] {
        sqlx::query(
            "INSERT INTO feedback (org_id, event_id, recommendation_id, outcome, received_at)
             VALUES ('acme', $1::uuid, $2, 'rejected', now() - interval '10 minutes')",
        )
        .bind(body["event_id"].as_str().unwrap())
        .bind(
            body["recommendations"][0]["recommendation_id"]
                .as_str()
                .unwrap(),
        )
        .execute(app.db.pool())
        .await
        .unwrap();
    }
    let feedback = json!({"event_id": bodies[2]["event_id"], "recommendation_id": bodies[2]["recommendations"][0]["recommendation_id"], "outcome": "accepted"});
    assert_eq!(
        app.post("/v1/feedback", Some(&app.platform_key), &feedback)
            .await
            .status(),
        201
    );
    let learned = wait_for_observations(&app.serving, 3).await.observations();
    // A few more polls: nothing learned twice, the old answers forgotten.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        app.serving.policy("acme").map(|p| p.observations()),
        Some(learned)
    );
    assert_eq!(app.serving.remembered_answers(), 1);
}

/// The acceptance counts analysts read (kept as decisions and answers are written, folded by
/// `arc_rec_compact_acceptance`) equal a hand-written count over the row-level view for every
/// grouping, with answers about the same items arriving at once (an `accepted` and an `applied`
/// about one item is one acceptance) and two folds racing them.
#[tokio::test]
async fn acceptance_counts_equal_the_row_level_truth_under_concurrent_answers() {
    use arc_rec::storage::analytics::{self, GroupBy};
    let app = with_contract_data().await;
    let mut answers = Vec::new();
    for i in 0..12 {
        let body = recommend_contract(&app).await;
        let item = |position: usize| body["recommendations"][position]["recommendation_id"].clone();
        let event = body["event_id"].clone();
        // Item 0: accepted and applied at once; item 1: rejected then (maybe) accepted; item 2
        // of every third decision: applied only.
        // The platform reports the same measured reliability delta with both answers.
        let delta = f64::from(i) / 100.0 - 0.05;
        answers.push(
            json!({"event_id": event, "recommendation_id": item(0), "outcome": "accepted",
                            "reliability_delta": delta}),
        );
        answers.push(
            json!({"event_id": event, "recommendation_id": item(0), "outcome": "applied",
                            "reliability_delta": delta}),
        );
        answers
            .push(json!({"event_id": event, "recommendation_id": item(1), "outcome": "rejected"}));
        if i % 2 == 0 {
            answers.push(
                json!({"event_id": event, "recommendation_id": item(1), "outcome": "accepted"}),
            );
        }
        if i % 3 == 0 {
            answers.push(
                json!({"event_id": event, "recommendation_id": item(2), "outcome": "applied",
                                "reliability_delta": 0.2}),
            );
        }
    }
    let app = &app;
    let sends = answers.iter().map(|feedback| async move {
        let status = app
            .post("/v1/feedback", Some(&app.platform_key), feedback)
            .await
            .status();
        assert_eq!(status, 201, "{feedback}");
    });
    let folds = (0..2).map(|_| async move {
        for _ in 0..5 {
            analytics::compact_acceptance(app.db.pool()).await.unwrap();
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    futures_util::future::join(
        futures_util::future::join_all(sends),
        futures_util::future::join_all(folds),
    )
    .await;

    let check = || async {
        for (group_by, column) in [
            (GroupBy::Cluster, "cluster_id"),
            (GroupBy::Type, "recommendation_type"),
            (GroupBy::Provider, "model_provider"),
            (GroupBy::PolicyVersion, "policy_version"),
            (GroupBy::Source, "source_key"),
            (GroupBy::Day, "day::text"),
        ] {
            let truth: Vec<(String, i64, i64)> = sqlx::query_as(&format!(
                "SELECT {column}, count(*), count(*) FILTER (WHERE accepted)
                 FROM analyst_shown_recommendations WHERE org_id = 'acme'
                 GROUP BY 1 ORDER BY 2 DESC, 1"
            ))
            .fetch_all(app.db.pool())
            .await
            .unwrap();
            let scope = analytics::Scope {
                org: Some("acme"),
                ..Default::default()
            };
            let counted: Vec<(String, i64, i64)> =
                analytics::acceptance(app.db.pool(), scope, group_by)
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|c| (c.key, c.shown, c.accepted))
                    .collect();
            assert_eq!(counted, truth, "{group_by:?}");
            // Reported reliability deltas and expected cost changes of the accepted items: counts
            // and sums (in millionths, as the two sums add in different orders).
            let truth: Vec<(String, i64, i64, i64, i64, i64)> = sqlx::query_as(&format!(
                "SELECT {column}, count(*), count(reliability_delta),
                        round(coalesce(sum(reliability_delta), 0) * 1e6)::bigint,
                        count(expected_cost_delta_usd),
                        round(coalesce(sum(expected_cost_delta_usd), 0) * 1e6)::bigint
                 FROM analyst_shown_recommendations WHERE org_id = 'acme' AND accepted
                 GROUP BY 1 ORDER BY 2 DESC, 1"
            ))
            .fetch_all(app.db.pool())
            .await
            .unwrap();
            let micro = |sum: f64| (sum * 1e6).round() as i64;
            let counted: Vec<(String, i64, i64, i64, i64, i64)> =
                analytics::accepted_outcomes(app.db.pool(), scope, group_by)
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|r| {
                        (
                            r.key,
                            r.accepted,
                            r.reliability_reported,
                            micro(r.reliability_delta_sum),
                            r.cost_known,
                            micro(r.cost_delta_sum),
                        )
                    })
                    .collect();
            assert_eq!(counted, truth, "{group_by:?} reliability");
        }
    };
    check().await;
    let accepted: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM analyst_shown_recommendations WHERE org_id = 'acme' AND accepted",
    )
    .fetch_one(app.db.pool())
    .await
    .unwrap();
    assert_eq!(accepted, 12 + 6 + 4, "the answers were not all stored");
    // Everything folded: the same numbers from acceptance_counts alone.
    analytics::compact_acceptance(app.db.pool()).await.unwrap();
    let pending: i64 = sqlx::query_scalar("SELECT count(*) FROM acceptance_deltas")
        .fetch_one(app.db.pool())
        .await
        .unwrap();
    assert_eq!(pending, 0);
    check().await;
    // A recount from the rows changes nothing.
    sqlx::query("SELECT arc_rec_recount_acceptance()")
        .execute(app.db.pool())
        .await
        .unwrap();
    check().await;
}

/// Every query of docs/ANALYTICS.md runs on a served database, and its "model vs heuristics"
/// query gives the numbers the API gives.
#[tokio::test]
async fn the_analytics_guide_s_queries_run_and_agree_with_the_api() {
    let app = with_contract_data().await;
    serve_and_answer(&app, 8, |i| {
        (i % 3, if i % 2 == 0 { "accepted" } else { "rejected" })
    })
    .await;
    let guide =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/ANALYTICS.md")).unwrap();
    let queries: Vec<&str> = guide
        .split("```sql")
        .skip(1)
        .map(|block| block.split("```").next().unwrap())
        .collect();
    assert!(queries.len() >= 5, "{} queries in the guide", queries.len());
    for query in &queries {
        let rows = sqlx::query(query)
            .fetch_all(app.db.pool())
            .await
            .unwrap_or_else(|err| panic!("{err}: {query}"));
        assert!(!rows.is_empty(), "no rows: {query}");
    }
    let by_source = queries
        .iter()
        .position(|q| q.contains("GROUP BY source_key"))
        .unwrap();
    let from_sql: Vec<(String, i64, i64)> = sqlx::query_as(&format!(
        "SELECT source_key, shown::bigint, accepted::bigint FROM ({}) AS guide",
        queries[by_source].trim().trim_end_matches(';')
    ))
    .fetch_all(app.db.pool())
    .await
    .unwrap();
    let mut from_api = acceptance_by_source(&app).await;
    from_api.sort();
    assert_eq!(from_sql, from_api);
    let accepted: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM analyst_shown_recommendations WHERE org_id = 'acme' AND accepted",
    )
    .fetch_one(app.db.pool())
    .await
    .unwrap();
    assert!(accepted > 0);
    assert_eq!(from_api.iter().map(|r| r.2).sum::<i64>(), accepted);
}

/// `arc-rec analytics acceptance` prints the API's numbers (the same body with `--format json`,
/// one CSV line per row) for every grouping, and refuses an inverted period naming `--since`.
#[tokio::test]
async fn the_analytics_cli_prints_the_api_s_numbers_for_every_grouping() {
    use crate::helpers::{arc_rec, run};
    let app = with_contract_data().await;
    serve_and_answer(&app, 8, |i| {
        (i % 3, if i % 2 == 0 { "accepted" } else { "rejected" })
    })
    .await;
    for (cli, api) in [
        ("cluster", "cluster"),
        ("type", "type"),
        ("provider", "provider"),
        ("policy", "policy_version"),
        ("source", "source"),
        ("day", "day"),
    ] {
        let from_api: Value = app
            .get(
                &format!("/v1/analytics/acceptance?group_by={api}"),
                Some(&app.analyst_key),
            )
            .await
            .json()
            .await
            .unwrap();
        assert!(
            !from_api["rows"].as_array().unwrap().is_empty(),
            "{from_api}"
        );
        let args = [
            "analytics",
            "acceptance",
            "--org",
            "acme",
            "--group-by",
            cli,
        ];
        let json = run(arc_rec(&app.db.url).args(args).args(["--format", "json"]));
        let from_cli: Value = serde_json::from_str(&json).unwrap();
        assert_eq!(from_cli, from_api, "--group-by {cli}");
        let csv = run(arc_rec(&app.db.url).args(args).args(["--format", "csv"]));
        assert_eq!(
            csv.lines().count(),
            from_api["rows"].as_array().unwrap().len() + 1
        );
        let table = run(arc_rec(&app.db.url).args(args));
        let first = &from_api["rows"][0];
        assert!(
            table.contains(first["key"].as_str().unwrap())
                && table.contains(&format!("{:.3}", first["rate"].as_f64().unwrap())),
            "{table}"
        );
    }
    let output = arc_rec(&app.db.url)
        .args(["analytics", "acceptance", "--group-by", "day"])
        .args(["--since", "2026-02-01", "--until", "2026-01-01"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--since") && stderr.contains("before"),
        "{stderr}"
    );
}

/// A model candidate stored with the learned grader's prior enters at that prior (ahead of every
/// heuristic candidate, which no feedback has priced yet), is logged with its source and prior,
/// and then moves with feedback as any other candidate: rejections pull it down (the learner
/// learns the residual from its prior, and the idea's own surprise corrects its prior),
/// acceptances lift a heuristic; a replica started later replays the same.
#[tokio::test]
async fn a_priced_model_candidate_enters_at_its_prior_and_feedback_moves_it_like_any_other() {
    let app = with_contract_data().await;
    store_priced_candidate(app.db.pool(), "mv-priced", 0.9, 0.05).await;
    let mut request = contract_request();
    request["k"] = json!(20);
    let recommend = || async {
        let body: Value = app
            .post("/v1/recommendations", Some(&app.platform_key), &request)
            .await
            .json()
            .await
            .unwrap();
        body
    };
    let mean_of = |body: &Value, id: &str| -> f64 {
        body["recommendations"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["recommendation_id"] == id)
            .unwrap_or_else(|| panic!("{id} not shown: {body}"))["explanation"]["mean_score"]
            .as_f64()
            .unwrap()
    };
    let body = recommend().await;
    let recommendations = body["recommendations"].as_array().unwrap();
    let model = recommendations
        .iter()
        .find(|r| r["source"] == "model")
        .unwrap_or_else(|| panic!("the priced candidate is shown: {body}"));
    assert_eq!(model["model_version_id"], "mv-priced");
    assert!((model["explanation"]["mean_score"].as_f64().unwrap() - 0.9).abs() < 1e-9);
    assert!(
        model["explanation"]["contributions"]["prior"].is_number(),
        "{model}"
    );
    let heuristics: Vec<&Value> = recommendations
        .iter()
        .filter(|r| r["source"] == "heuristic")
        .collect();
    assert!(!heuristics.is_empty());
    for h in &heuristics {
        assert!(
            h["explanation"]["mean_score"].as_f64().unwrap().abs() < 1e-9,
            "{h}"
        );
        assert!(
            h["explanation"]["contributions"].get("prior").is_none(),
            "{h}"
        );
    }
    let model_id = model["recommendation_id"].as_str().unwrap().to_owned();
    let heuristic_id = heuristics[0]["recommendation_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let logged: (String, Option<String>, Option<f64>) = sqlx::query_as(
        "SELECT source, model_version_id, prior_mean FROM decision_items
         WHERE event_id = $1::uuid AND recommendation_id = $2",
    )
    .bind(body["event_id"].as_str().unwrap())
    .bind(&model_id)
    .fetch_one(app.db.pool())
    .await
    .unwrap();
    assert_eq!(
        logged,
        ("model".into(), Some("mv-priced".into()), Some(0.9))
    );

    // Reject the model's idea and accept the heuristic, eight times each.
    let rounds = 8;
    // The default cap on new model versions may leave the idea out of a decision: ask again.
    let recommend_showing_both = || async {
        for _ in 0..50 {
            let body = recommend().await;
            let shown = |id: &str| {
                body["recommendations"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|r| r["recommendation_id"] == id)
            };
            if shown(&model_id) && shown(&heuristic_id) {
                return body;
            }
        }
        panic!("{model_id} and {heuristic_id} never shown together");
    };
    for _ in 0..rounds {
        let body = recommend_showing_both().await;
        for (id, outcome) in [(&model_id, "rejected"), (&heuristic_id, "accepted")] {
            let feedback =
                json!({"event_id": body["event_id"], "recommendation_id": id, "outcome": outcome});
            assert_eq!(
                app.post("/v1/feedback", Some(&app.platform_key), &feedback)
                    .await
                    .status(),
                201
            );
        }
    }
    wait_for_observations(&app.serving, 2 * rounds).await;
    let body = recommend_showing_both().await;
    let (model_after, heuristic_after) = (mean_of(&body, &model_id), mean_of(&body, &heuristic_id));
    // Learning the residual (0 − 0.9) takes the idea's worth to about what was observed; had the
    // learner learned the raw 0 the prior would have kept it near 0.9.
    assert!(
        model_after < 0.3,
        "model candidate after rejections: {model_after}"
    );
    assert!(
        heuristic_after > 0.6,
        "heuristic after acceptances: {heuristic_after}"
    );
    assert!(heuristic_after > model_after);
    // The idea's own evidence is in the log (each answer's surprise against what was predicted
    // when it was shown): a replica started now ranks it the same. (The cap on new versions may
    // leave it out of a decision: ask again.)
    let replica = Serving::start(app.db.pool().clone()).await.unwrap();
    wait_for_observations(&replica, 2 * rounds).await;
    let idea_mean_score = |serving: std::sync::Arc<Serving>| {
        let model_id = model_id.clone();
        async move {
            for _ in 0..50 {
                let shown = serving
                    .recommend("acme", contract_query(50))
                    .await
                    .unwrap()
                    .recommendations
                    .into_iter()
                    .find(|r| r.recommendation_id == model_id);
                if let Some(shown) = shown {
                    return shown.shown.item.mean_score;
                }
            }
            panic!("{model_id} never shown");
        }
    };
    let (original, replayed) = (
        idea_mean_score(app.serving.clone()).await,
        idea_mean_score(replica).await,
    );
    assert!(
        (original - replayed).abs() < 1e-9,
        "replica {replayed} vs {original}"
    );

    // Analysts see the model's ideas apart from the heuristics'.
    let rows = acceptance_by_source(&app).await;
    let model_row = rows.iter().find(|r| r.0 == "model:mv-priced").unwrap();
    let heuristic_row = rows.iter().find(|r| r.0 == "heuristic").unwrap();
    let model_shown: i64 =
        sqlx::query_scalar("SELECT count(*) FROM decision_items WHERE source = 'model'")
            .fetch_one(app.db.pool())
            .await
            .unwrap();
    assert!(model_shown >= rounds as i64 + 2);
    assert_eq!((model_row.1, model_row.2), (model_shown, 0), "{rows:?}");
    assert_eq!(heuristic_row.2, rounds as i64, "{rows:?}");
    assert_eq!(rows.len(), 2, "{rows:?}");
    // Items logged before sources were (NULL source) are told apart by their features.
    sqlx::query("UPDATE decision_items SET source = NULL, model_version_id = NULL")
        .execute(app.db.pool())
        .await
        .unwrap();
    // Rows changed around the service are counted again by a recount (docs/OPERATIONS.md).
    sqlx::query("SELECT arc_rec_recount_acceptance()")
        .execute(app.db.pool())
        .await
        .unwrap();
    let rows = acceptance_by_source(&app).await;
    let keys: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    assert!(
        keys.contains(&"model") && keys.contains(&"heuristic"),
        "{rows:?}"
    );
    assert_eq!(rows.iter().find(|r| r.0 == "model").unwrap().1, model_shown);
}

/// `GET /v1/analytics/acceptance?group_by=source` as (key, shown, accepted) rows.
async fn acceptance_by_source(app: &TestApp) -> Vec<(String, i64, i64)> {
    let body: Value = app
        .get(
            "/v1/analytics/acceptance?group_by=source",
            Some(&app.analyst_key),
        )
        .await
        .json()
        .await
        .unwrap();
    body["rows"]
        .as_array()
        .unwrap_or_else(|| panic!("{body}"))
        .iter()
        .map(|r| {
            (
                r["key"].as_str().unwrap().to_owned(),
                r["shown"].as_i64().unwrap(),
                r["accepted"].as_i64().unwrap(),
            )
        })
        .collect()
}

/// A model version's candidates, stored while two replicas are serving, reach both within the
/// stated bound without a restart.
#[tokio::test]
async fn a_new_model_version_reaches_every_running_replica_within_the_bound() {
    use arc_rec::recommend::service::MODEL_CANDIDATES_RELOAD_BOUND;

    let app = with_contract_data().await;
    let replica = Serving::start(app.db.pool().clone()).await.unwrap();
    let query = || contract_query(50);
    for serving in [&*app.serving, &*replica] {
        assert!(served_model_versions(serving, query()).await.is_empty());
    }
    store_priced_candidate(app.db.pool(), "mv-new", 0.7, 0.1).await;
    let stored = std::time::Instant::now();
    for (name, serving) in [("app", &*app.serving), ("replica", &*replica)] {
        loop {
            if served_model_versions(serving, query()).await == ["mv-new"] {
                break;
            }
            assert!(
                stored.elapsed() < MODEL_CANDIDATES_RELOAD_BOUND,
                "{name} did not serve the new version within {MODEL_CANDIDATES_RELOAD_BOUND:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    eprintln!(
        "both replicas served the new version after {:?}",
        stored.elapsed()
    );
}

/// Issue 54's lifecycle: `models retire` takes a version's candidates out of every running
/// replica within the reload bound, `models promote` brings them back, and `models list` shows
/// the version's status, decisions, answers and acceptance. An unknown version is named.
#[tokio::test]
async fn a_retired_version_leaves_serving_within_the_bound_and_promote_brings_it_back() {
    use crate::helpers::run;
    use arc_rec::recommend::service::MODEL_CANDIDATES_RELOAD_BOUND;

    let app = with_contract_data().await;
    let replica = Serving::start(app.db.pool().clone()).await.unwrap();
    let query = || contract_query(50);
    store_priced_candidate(app.db.pool(), "mv-new", 0.7, 0.1).await;
    let wait_for = |want: &'static [&'static str], what: &'static str| {
        let (app, replica) = (&app, &replica);
        async move {
            let changed = std::time::Instant::now();
            for (name, serving) in [("app", &*app.serving), ("replica", &**replica)] {
                while served_model_versions(serving, query()).await != want {
                    assert!(
                        changed.elapsed() < MODEL_CANDIDATES_RELOAD_BOUND,
                        "{name} did not {what} within {MODEL_CANDIDATES_RELOAD_BOUND:?}"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    };
    wait_for(&["mv-new"], "serve the new version").await;

    // One answer to the version's idea: accepted. (A new version is shown in at most its share
    // of decisions until it has its answers, so not in every one.)
    let mut shown = None;
    for _ in 0..100 {
        let answer = app.serving.recommend("acme", query()).await.unwrap();
        if let Some(idea) = answer
            .recommendations
            .iter()
            .find(|r| r.shown.candidate.source.model_version_id() == Some("mv-new"))
        {
            shown = Some((answer.event_id, idea.recommendation_id.clone()));
            break;
        }
    }
    let (event_id, recommendation_id) = shown.expect("the version's idea is shown");
    let feedback = json!({"event_id": event_id.to_string(),
        "recommendation_id": recommendation_id, "outcome": "accepted"});
    assert_eq!(
        app.post("/v1/feedback", Some(&app.platform_key), &feedback)
            .await
            .status(),
        201
    );

    let stdout = run(arc_rec(&app.db.url).args(["models", "retire", "--org", "acme", "mv-new"]));
    assert!(stdout.contains("mv-new: retired (was live)"), "{stdout}");
    // A decision may leave a new version out under its exposure cap, so an empty answer alone
    // proves nothing: once the bound has passed, no answer of either replica shows it.
    tokio::time::sleep(MODEL_CANDIDATES_RELOAD_BOUND).await;
    for serving in [&*app.serving, &*replica] {
        for _ in 0..20 {
            assert!(served_model_versions(serving, query()).await.is_empty());
        }
    }
    let listed = run(arc_rec(&app.db.url).args(["models", "list", "--org", "acme", "--json"]));
    let version: Value = serde_json::from_str(listed.lines().next().unwrap()).unwrap();
    assert_eq!(version["model_version_id"], "mv-new", "{listed}");
    assert_eq!(version["status"], "retired", "{listed}");
    assert_eq!(version["candidates"], 1, "{listed}");
    // The requests above showed its idea at least twice; one answer, accepted.
    assert!(version["decisions"].as_i64() >= Some(2), "{listed}");
    assert_eq!(
        (&version["answered"], &version["accepted"]),
        (&json!(1), &json!(1))
    );
    assert_eq!(version["acceptance"], 1.0, "{listed}");
    let table = run(arc_rec(&app.db.url).args(["models", "list"]));
    assert!(
        table.contains("mv-new") && table.contains("retired"),
        "{table}"
    );

    let stdout = run(arc_rec(&app.db.url).args(["models", "promote", "--org", "acme", "mv-new"]));
    assert!(stdout.contains("mv-new: live (was retired)"), "{stdout}");
    wait_for(&["mv-new"], "serve the promoted version again").await;
    let again = run(arc_rec(&app.db.url).args(["models", "promote", "--org", "acme", "mv-new"]));
    assert!(again.contains("already live"), "{again}");

    let output = arc_rec(&app.db.url)
        .args(["models", "retire", "--org", "acme", "rft-unknown"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("no model version rft-unknown in organization acme"),
        "{stderr}"
    );
}

/// The model versions of the candidates `serving` shows acme for `query`.
async fn served_model_versions(
    serving: &Serving,
    query: arc_rec::recommend::service::RecommendationQuery,
) -> Vec<String> {
    serving
        .recommend("acme", query)
        .await
        .unwrap()
        .recommendations
        .into_iter()
        .filter_map(|r| {
            r.shown
                .candidate
                .source
                .model_version_id()
                .map(str::to_owned)
        })
        .collect()
}

/// The contract's failure context as a `RecommendationQuery` for `k` recommendations.
fn contract_query(k: usize) -> arc_rec::recommend::service::RecommendationQuery {
    let request = contract_request();
    arc_rec::recommend::service::RecommendationQuery {
        embedding: None,
        failures: vec![arc_rec::candidates::FailureObservation {
            failure_category: Some("timeout".into()),
            error_message: Some("web_search timed out after 5000 ms".into()),
            tool_name: Some("web_search".into()),
            error_code: None,
        }],
        outcome_ids: Vec::new(),
        current_config: request["current_config"].clone(),
        user_role: None,
        domain: None,
        k,
        max_cost_increase_usd_per_run: None,
        raw: serde_json::value::to_raw_value(&request).unwrap(),
    }
}

/// A rejection by acme of one shown recommendation, without a measured delta or score.
fn acme_rejection(
    event_id: uuid::Uuid,
    recommendation_id: String,
) -> arc_rec::storage::decisions::FeedbackRecord {
    arc_rec::storage::decisions::FeedbackRecord {
        org_id: "acme".into(),
        event_id,
        recommendation_id,
        outcome: arc_rec::storage::decisions::FeedbackOutcome::Rejected,
        reliability_delta: None,
        feedback_score: None,
    }
}

/// Stores one priced model candidate of `version` for acme (a cooler temperature).
async fn store_priced_candidate(pool: &sqlx::PgPool, version: &str, mean: f64, sd: f64) {
    use arc_rec::domain::{Candidate, CandidatePrior, CandidateSource, RecommendationType};
    let diff = json!({"temperature": 0.45});
    let kind = RecommendationType::Temperature;
    let candidate = Candidate {
        candidate_id: Candidate::id_for(kind, &diff),
        recommendation_type: kind,
        diff,
        description: format!("an idea of {version}"),
        expected_reliability_delta: 0.0,
        expected_cost_delta_usd: 0.0,
        evidence_count: 0,
        source: CandidateSource::Model {
            model_version_id: version.into(),
            prior: Some(CandidatePrior { mean, sd }),
        },
    };
    arc_rec::storage::candidate_stats::save_model_candidates_by_cluster(
        pool,
        "acme",
        version,
        "tiny",
        &[(None, candidate)],
    )
    .await
    .unwrap();
}

/// A brand-new model version heads at most its share of decisions until it has its answers;
/// the decisions it sat out log it.
#[tokio::test]
async fn a_new_model_version_heads_at_most_its_share_until_it_has_its_answers() {
    use arc_rec::recommend::exposure::ExposureCap;
    use arc_rec::recommend::service::ServingOptions;

    let app = with_contract_data().await;
    store_priced_candidate(app.db.pool(), "mv-capped", 1.0, 0.01).await;
    let cap = ExposureCap {
        share: 0.05,
        feedbacks: 3,
    };
    let serving = Serving::start_with(
        app.db.pool().clone(),
        ServingOptions {
            exposure_cap: cap,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let rounds = 100;
    let (mut headed, mut absent, mut answered) = (0, 0, Vec::new());
    for _ in 0..rounds {
        let answer = serving.recommend("acme", contract_query(50)).await.unwrap();
        let versions: Vec<Option<&str>> = answer
            .recommendations
            .iter()
            .map(|r| r.shown.candidate.source.model_version_id())
            .collect();
        headed += usize::from(versions.first() == Some(&Some("mv-capped")));
        match answer
            .recommendations
            .iter()
            .find(|r| r.shown.candidate.source.model_version_id().is_some())
        {
            Some(model) if answered.len() < 2 => {
                answered.push((answer.event_id, model.recommendation_id.clone()));
            }
            Some(_) => {}
            None => absent += 1,
        }
    }
    assert!(
        headed as f64 <= 0.05 * rounds as f64 + 1.0,
        "headed {headed} of {rounds}"
    );
    assert!(absent > 0, "the cap never bound: headed {headed}");
    let logged: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM decision_log WHERE capped_versions = ARRAY['mv-capped']",
    )
    .fetch_one(app.db.pool())
    .await
    .unwrap();
    assert_eq!(logged, absent as i64);

    // Two answers: still new. A third, on a fresh decision: no longer capped.
    let answer = acme_rejection;
    for (event_id, recommendation_id) in answered {
        assert!(
            serving
                .feedback(answer(event_id, recommendation_id))
                .await
                .unwrap()
        );
    }
    let mut third = None;
    for _ in 0..200 {
        let decision = serving.recommend("acme", contract_query(50)).await.unwrap();
        if let Some(model) = decision
            .recommendations
            .iter()
            .find(|r| r.shown.candidate.source.model_version_id().is_some())
        {
            third = Some((decision.event_id, model.recommendation_id.clone()));
            break;
        }
    }
    let third = third.expect("the capped version is shown again once its share falls");
    assert!(serving.feedback(answer(third.0, third.1)).await.unwrap());
    for _ in 0..20 {
        let decision = serving.recommend("acme", contract_query(50)).await.unwrap();
        assert!(
            decision
                .recommendations
                .iter()
                .any(|r| r.shown.candidate.source.model_version_id() == Some("mv-capped")),
            "capped after three answers"
        );
    }
}

/// The exploration floor puts the newest version's unanswered idea first in about its share of
/// decisions, logs which decisions it could and did pick with the pick's propensity, stops once
/// the idea has its answers, and `models list` prices it from the log.
#[tokio::test]
async fn the_exploration_floor_shows_a_new_idea_first_at_its_share_until_it_is_answered() {
    use arc_rec::recommend::exposure::{ExplorationFloorOptions, ExposureCap};
    use arc_rec::recommend::service::ServingOptions;

    let app = with_contract_data().await;
    // Priced at the bottom: the policy alone would seldom put it first.
    store_priced_candidate(app.db.pool(), "mv-new", 0.0, 0.01).await;
    let options = ServingOptions {
        exposure_cap: ExposureCap {
            share: 1.0,
            feedbacks: 50,
        },
        exploration: ExplorationFloorOptions {
            share: 0.5,
            answers_per_idea: 2,
        },
    };
    let serving = Serving::start_with(app.db.pool().clone(), options)
        .await
        .unwrap();
    let rounds = 120;
    let mut picks = Vec::new();
    for _ in 0..rounds {
        let answer = serving.recommend("acme", contract_query(3)).await.unwrap();
        let first = &answer.recommendations[0];
        if first.shown.candidate.source.model_version_id() == Some("mv-new") {
            // First by the floor (probability ≥ its share) or by the policy: either way the
            // logged propensity is at least the floor's.
            assert!(first.shown.item.propensity >= 0.5 - 1e-12);
            picks.push((answer.event_id, first.recommendation_id.clone()));
        }
    }
    let pool = app.db.pool();
    let (eligible, floor_picks): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE floor_pick) FROM decision_log
         WHERE org_id = 'acme' AND floor_version = 'mv-new'",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(
        eligible, rounds,
        "every decision had the unanswered idea on its menu"
    );
    // Binomial(120, 0.5): 60 ± 5.5; eight standard deviations either side.
    assert!(
        (16..=104).contains(&floor_picks),
        "the floor picked {floor_picks} of {rounds}"
    );
    assert!(picks.len() as i64 >= floor_picks);

    // Two answers about the idea: it no longer needs the floor.
    for (event_id, recommendation_id) in picks.iter().take(2).cloned() {
        let outcome = acme_rejection(event_id, recommendation_id);
        assert!(serving.feedback(outcome).await.unwrap());
    }
    for _ in 0..10 {
        serving.recommend("acme", contract_query(3)).await.unwrap();
    }
    let (eligible_after, floored_after): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE floor_version = 'mv-new'),
                count(*) FILTER (WHERE floor_version IS NOT NULL OR floor_pick IS NOT NULL)
         FROM decision_log WHERE org_id = 'acme'",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(
        eligible_after, rounds,
        "answered twice, the idea is off the floor"
    );
    assert_eq!(floored_after, rounds);

    let versions = arc_rec::storage::model_versions::list(pool, Some("acme"))
        .await
        .unwrap();
    let floor = versions[0].floor;
    assert_eq!(versions[0].model_version_id, "mv-new");
    assert_eq!(
        (floor.floor_decisions, floor.floor_picks),
        (eligible, floor_picks)
    );
    // The two rejections were of first items: floor picks or the policy's own.
    assert_eq!(floor.pick_answered + floor.policy_answered, 2);
    assert_eq!(floor.pick_accepted + floor.policy_accepted, 0);
}

/// A key of one organization never sees or changes another's data, endpoint by endpoint:
/// globex's keys against acme's decisions, feedback, outcomes and analytics.
#[tokio::test]
async fn a_key_of_one_organization_never_reaches_another_s_data() {
    use arc_rec::auth::{Role, create_key};
    let app = with_contract_data().await;
    serve_and_answer(&app, 3, |_| (0, "accepted")).await;
    let acme_event = recommend_contract(&app).await;
    let globex = arc_rec::domain::OrgId::parse("globex").unwrap();
    let key = |role| create_key(app.db.pool(), &globex, role, None, Default::default());
    let platform = key(Role::Platform).await.unwrap().token;
    let analyst = key(Role::Analyst).await.unwrap().token;
    let pool = app.db.pool().clone();
    let count = move |sql: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    let acme_feedback = count("SELECT count(*) FROM feedback WHERE org_id = 'acme'").await;

    // Feedback on acme's event: as unknown as an event that never was.
    let feedback = json!({
        "event_id": acme_event["event_id"],
        "recommendation_id": acme_event["recommendations"][0]["recommendation_id"],
        "outcome": "rejected"
    });
    let response = app.post("/v1/feedback", Some(&platform), &feedback).await;
    assert_eq!(response.status(), 404);
    assert_eq!(
        count("SELECT count(*) FROM feedback WHERE org_id = 'acme'").await,
        acme_feedback
    );
    assert_eq!(
        count("SELECT count(*) FROM feedback WHERE org_id = 'globex'").await,
        0
    );

    // Recommendations: acme's outcome ids place nothing for globex, and globex's decision is
    // logged as globex's.
    let mut request = contract_request();
    request["failure_context"] = json!({"outcome_ids": ["o1"]});
    let response = app
        .post("/v1/recommendations", Some(&platform), &request)
        .await;
    assert_eq!(response.status(), 422);
    let response = app
        .post("/v1/recommendations", Some(&platform), &contract_request())
        .await;
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    let owner: String =
        sqlx::query_scalar("SELECT org_id FROM decision_log WHERE event_id = $1::text::uuid")
            .bind(body["event_id"].as_str().unwrap())
            .fetch_one(app.db.pool())
            .await
            .unwrap();
    assert_eq!(owner, "globex");
    assert!(
        body["recommendations"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["evidence_count"] == 0),
        "globex has no history, so no recommendation rests on acme's: {body}"
    );

    // Trajectories: a record of acme sent with globex's key is refused, nothing written.
    let acme_configs = count("SELECT count(*) FROM configurations").await;
    let record: Value = serde_json::from_str(&contract_lines()[0]).unwrap();
    let response = app.post("/v1/trajectories", Some(&platform), &record).await;
    assert_eq!(response.status(), 422);
    assert_eq!(
        count("SELECT count(*) FROM configurations").await,
        acme_configs
    );

    // Analytics: globex's analyst sees globex's decisions only, whatever the grouping.
    for group in [
        "type",
        "cluster",
        "provider",
        "policy_version",
        "source",
        "day",
    ] {
        let path = format!("/v1/analytics/acceptance?group_by={group}");
        let rows: Value = app.get(&path, Some(&analyst)).await.json().await.unwrap();
        let shown: i64 = rows["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["shown"].as_i64().unwrap())
            .sum();
        let acme: Value = app
            .get(&path, Some(&app.analyst_key))
            .await
            .json()
            .await
            .unwrap();
        let acme_accepted: i64 = acme["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["accepted"].as_i64().unwrap())
            .sum();
        assert_eq!(acme_accepted, 3, "{group}: {acme}");
        assert!(
            rows["rows"]
                .as_array()
                .unwrap()
                .iter()
                .all(|r| r["accepted"] == 0),
            "{group}: {rows}"
        );
        assert!(
            shown <= 3,
            "{group}: globex showed one decision's items at most: {rows}"
        );
    }
    let decisions = |key: String| {
        let app = &app;
        async move {
            let ope: Value = app
                .get("/v1/analytics/ope?policy=uniform", Some(&key))
                .await
                .json()
                .await
                .unwrap();
            ope["decisions"].as_u64()
        }
    };
    assert_eq!(decisions(analyst).await, Some(1), "globex's one decision");
    assert_eq!(
        decisions(app.analyst_key.clone()).await,
        Some(4),
        "acme's four"
    );
}

/// Two replicas behind any load balancer: a key revoked in the database is refused by both
/// within the key cache's lifetime (30 s in `serve`; 1 s here, the same code path), after each
/// had cached it as valid.
#[tokio::test]
async fn a_revoked_key_is_refused_by_every_replica_within_the_key_cache_s_lifetime() {
    use crate::helpers::{Limits, spawn_app_with, spawn_server};
    let ttl = Duration::from_secs(1);
    let limits = Limits {
        key_cache_ttl: ttl,
        ..Limits::default()
    };
    let app = spawn_app_with(limits.clone()).await;
    let (replica, _serving, _handle) = spawn_server(app.db.pool(), limits).await;
    let path = "/v1/analytics/acceptance?group_by=type";
    let status = |address: String| {
        let client = app.client.clone();
        let key = app.analyst_key.clone();
        async move {
            client
                .get(format!("{address}{path}"))
                .bearer_auth(key)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    for address in [&app.address, &replica] {
        assert_eq!(status(address.clone()).await, 200, "cached as valid");
    }
    let key_id = app.analyst_key.split('_').nth(1).unwrap();
    let revoked_at = std::time::Instant::now();
    assert!(
        arc_rec::storage::api_keys::revoke(app.db.pool(), "acme", key_id)
            .await
            .unwrap()
    );
    for address in [&app.address, &replica] {
        while status(address.clone()).await != 401 {
            assert!(
                revoked_at.elapsed() < ttl + Duration::from_secs(2),
                "{address} still accepts the key {:?} after its revocation",
                revoked_at.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Issue 54: answers to served recommendations are training data. `export` writes every answered
/// served item beside the platform's diffs, with origin `served`, the request's context (its
/// `config_id`, else a key of its configuration), the shown diff, how it was served (source,
/// position, logged propensity) and the answer; unanswered items are not written; two exports
/// are identical; RFT reads them with how they were served; chat lines carry the origin.
#[tokio::test]
async fn served_answers_are_exported_as_logged_decisions_with_their_origin() {
    let app = with_contract_data().await;
    let key = Some(app.platform_key.as_str());
    let mut with_id = contract_request();
    with_id["config_id"] = json!("c1");
    let first: Value = app
        .post("/v1/recommendations", key, &with_id)
        .await
        .json()
        .await
        .unwrap();
    let second = recommend_contract(&app).await;
    let answer = |body: &Value, i: usize, outcome: &str| {
        json!({"event_id": body["event_id"],
            "recommendation_id": body["recommendations"][i]["recommendation_id"],
            "outcome": outcome})
    };
    // First request: its top item accepted (then rejected too: the first acceptance decides),
    // its second rejected; second request: its second item applied; the rest unanswered.
    for feedback in [
        answer(&first, 0, "accepted"),
        answer(&first, 0, "rejected"),
        answer(&first, 1, "rejected"),
        answer(&second, 1, "applied"),
    ] {
        assert_eq!(
            app.post("/v1/feedback", key, &feedback).await.status(),
            201,
            "{feedback}"
        );
    }

    let dir = tempfile::tempdir().unwrap();
    let export = |name: &str, format: &str| {
        let out = dir.path().join(name);
        let stderr = arc_rec(&app.db.url)
            .args(["export", "--format", format, "--out"])
            .arg(&out)
            .output()
            .unwrap();
        assert!(stderr.status.success(), "{stderr:?}");
        (
            std::fs::read_to_string(&out).unwrap(),
            String::from_utf8_lossy(&stderr.stderr).into_owned(),
        )
    };
    let (text, summary) = export("a.jsonl", "arc");
    assert!(
        summary.contains("3 of them answers to served recommendations"),
        "{summary}"
    );
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let served: Vec<&Value> = lines.iter().filter(|l| l["origin"] == "served").collect();
    assert_eq!(served.len(), 3, "{text}");
    assert!(
        lines
            .iter()
            .filter(|l| l["origin"] == "platform")
            .all(|l| l.get("served").is_none())
    );
    // A recommendation id names the candidate, so the same one shown in two answers is told
    // apart by its event.
    let find = |body: &Value, i: usize| -> &Value {
        let id = body["recommendations"][i]["recommendation_id"]
            .as_str()
            .unwrap();
        served
            .iter()
            .find(|l| {
                l["served"]["recommendation_id"] == id
                    && l["served"]["event_id"] == body["event_id"]
            })
            .unwrap_or_else(|| panic!("{id} not exported: {text}"))
    };
    for (body, i, status, config) in [
        (&first, 0, "approved", Some("c1")),
        (&first, 1, "rejected", Some("c1")),
        (&second, 1, "approved", None),
    ] {
        let line = find(body, i);
        let shown = &body["recommendations"][i];
        assert_eq!(line["outcome"]["approval_status"], status, "{line}");
        assert_eq!(line["recommendation"]["diff"], shown["diff"], "{line}");
        assert_eq!(line["served"]["event_id"], body["event_id"], "{line}");
        assert_eq!(line["served"]["position"], i, "{line}");
        assert_eq!(line["served"]["propensity"], shown["propensity"], "{line}");
        assert_eq!(line["served"]["source"], "heuristic", "{line}");
        assert_eq!(
            line["context"]["current_config"],
            contract_request()["current_config"]
        );
        assert_eq!(
            line["context"]["failures"][0]["failure_category"], "timeout",
            "{line}"
        );
        assert_eq!(
            line["context"]["user_context"]["domain"], "fintech",
            "{line}"
        );
        match config {
            Some(id) => assert_eq!(line["config_id"], id),
            None => assert!(
                line["config_id"].as_str().unwrap().starts_with("ctx-"),
                "{line}"
            ),
        }
    }
    let (again, _) = export("b.jsonl", "arc");
    assert_eq!(again, text, "two exports of the same data differ");

    let data = dir.path().join("a.jsonl");
    let dataset = arc_rec::rft::RftDataset::load(&data).unwrap();
    let served_decisions = dataset
        .prompts
        .iter()
        .flat_map(|p| &p.facts.decisions)
        .filter(|d| d.served.is_some())
        .count();
    assert_eq!(served_decisions, 3);

    let (chat, _) = export("chat.jsonl", "chat");
    assert!(
        chat.lines().any(|l| l.contains("\"origin\":\"served\"")),
        "{chat}"
    );
}
