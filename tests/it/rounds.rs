//! `arc-rec round` through the binary and the HTTP API: two rounds end to end (the first
//! round's version served, its answers exported with their origin into the second, a new
//! version trained, gated, served, the old one retired), and the bad inputs of a loop: a round
//! with no new answers, a round started while another runs, an answer to an unknown event, a
//! second answer to the same item.

use std::path::Path;

use arc_rec::rft::RftDataset;
use arc_rec::rft::model_candidates::serving_contexts;
use arc_rec::storage::rounds::RoundLock;
use serde_json::{Value, json};

use crate::helpers::{Limits, arc_rec, fresh_database, run, spawn_app_on, training_world};

const ORG: &str = "acme";

/// `round run` with a short recipe (the recipe's quality is `bench loop`'s question, not this
/// test's); `extra` goes before `--`.
fn round(url: &str, dir: &Path, extra: &[&str]) -> String {
    run(arc_rec(url)
        .args(["round", "run", "--org", ORG, "--model"])
        .arg(dir.join("tiny"))
        .arg("--dir")
        .arg(dir.join("rounds"))
        .args(["--candidates-k", "4"])
        .args(extra)
        .args(["--", "--sft-steps", "10", "--lr-schedule", "constant"])
        .args(["--steps", "4", "--k", "2", "--n", "4", "--eval-every", "2"])
        .args(["--prompts-per-step", "2", "--max-new-tokens", "48"])
        .args(["--device", "cpu"]))
}

fn examples(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn two_rounds_learn_from_served_answers_end_to_end_over_http() {
    let db = fresh_database().await;
    let url = db.url.clone();
    let pool = db.pool().clone();
    let dir = tempfile::tempdir().unwrap();
    training_world(&url, dir.path(), None);

    // Round 1: the platform's history only. Forced: a four-step run's gate verdict is noise,
    // and this test is about the loop (the gate's own test is in model_candidates).
    let stdout = round(&url, dir.path(), &["--force"]);
    assert!(stdout.contains("round 1 of acme: served"), "{stdout}");
    let v1: String = sqlx::query_scalar(
        "SELECT model_version_id FROM rounds WHERE org_id = $1 AND round_no = 1",
    )
    .bind(ORG)
    .fetch_one(&pool)
    .await
    .unwrap();
    // Nothing answered since: a second round has nothing to learn and is not started.
    let stdout = round(&url, dir.path(), &[]);
    assert!(stdout.contains("nothing new to learn"), "{stdout}");

    // Serve the first version's ideas and answer what is shown.
    let first = dir.path().join("rounds/round-001/examples.jsonl");
    let dataset = RftDataset::load(&first).unwrap();
    let contexts: Vec<_> = serving_contexts(&dataset)
        .into_iter()
        .filter(|c| c.org == ORG)
        .collect();
    assert!(!contexts.is_empty());
    let app = spawn_app_on(db, ORG, Limits::default()).await;
    let (mut answered, mut model_answered) = (0, 0);
    let mut last = None;
    for (i, context) in contexts.iter().cycle().take(24).enumerate() {
        let failures: Vec<(String, String)> = sqlx::query_as(
            "SELECT failure_category, error_message FROM failure_patterns
             WHERE org_id = $1 AND failure_category = $2 ORDER BY pattern_id LIMIT 2",
        )
        .bind(ORG)
        .bind(context.cluster)
        .fetch_all(&pool)
        .await
        .unwrap();
        let request = json!({
            "failure_context": {"failures": failures.iter().map(|(category, message)| json!({
                "failure_category": category, "error_message": message})).collect::<Vec<_>>()},
            "current_config": context.prompt.current_config,
            "config_id": format!("cfg-{}", i % 5),
            "k": 10,
        });
        let response = app
            .post("/v1/recommendations", Some(&app.platform_key), &request)
            .await;
        assert_eq!(response.status(), 200);
        let body: Value = response.json().await.unwrap();
        let shown = body["recommendations"].as_array().unwrap();
        // The top item and every model idea shown get an answer.
        for (position, item) in shown.iter().enumerate() {
            if position > 0 && item["source"] != "model" {
                continue;
            }
            let outcome = if (i + position) % 2 == 0 {
                "accepted"
            } else {
                "rejected"
            };
            let feedback = json!({"event_id": body["event_id"],
                "recommendation_id": item["recommendation_id"], "outcome": outcome});
            let response = app
                .post("/v1/feedback", Some(&app.platform_key), &feedback)
                .await;
            assert_eq!(response.status(), 201);
            answered += 1;
            if item["source"] == "model" {
                assert_eq!(item["model_version_id"], json!(v1));
                model_answered += 1;
            }
            last = Some(feedback);
        }
    }
    assert!(model_answered > 0, "no idea of {v1} shown in 24 decisions");

    // Bad answers: an unknown event is a 404 and stores nothing; the same answer again is a
    // no-op, counted once.
    let count = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM feedback")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    let stored = count().await;
    let unknown = json!({"event_id": uuid::Uuid::now_v7(), "recommendation_id": "r-x",
        "outcome": "accepted"});
    let response = app
        .post("/v1/feedback", Some(&app.platform_key), &unknown)
        .await;
    assert_eq!(response.status(), 404);
    let again = last.unwrap();
    let response = app
        .post("/v1/feedback", Some(&app.platform_key), &again)
        .await;
    assert!(response.status().is_success(), "{}", response.status());
    assert_eq!(count().await, stored, "nothing stored twice");

    // A round while another holds the organization's lock: refused, nothing started.
    let lock = RoundLock::try_take(&pool, ORG).await.unwrap().unwrap();
    let output = arc_rec(&url)
        .args(["round", "run", "--org", ORG, "--model"])
        .arg(dir.path().join("tiny"))
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("is running in another process"), "{stderr}");
    lock.release().await.unwrap();
    let open: i64 = sqlx::query_scalar("SELECT count(*) FROM rounds WHERE status = 'running'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(open, 0);

    // Round 2 learns from the answers: its export holds them as served examples with the
    // version that proposed each, and its own version goes live beside the first.
    let stdout = round(&url, dir.path(), &["--force"]);
    assert!(stdout.contains("round 2 of acme: served"), "{stdout}");
    let (new_answers, v2, figures): (i64, String, Value) = sqlx::query_as(
        "SELECT new_answers, model_version_id, figures FROM rounds
         WHERE org_id = $1 AND round_no = 2",
    )
    .bind(ORG)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(new_answers, answered, "every answer once");
    assert_ne!(v2, v1);
    // The gate's verdict is recorded: the selection's choice, or null when no validation
    // context held both an accepted and a rejected answer (the traffic's Thompson draws are
    // not seeded, so which contexts do varies) and the run kept its last step.
    let selection = &figures["selection"];
    assert!(
        selection.is_null() || selection["beats_warmup"].is_boolean(),
        "{figures}"
    );
    assert!(
        figures["grader_held_out"]["all"]["decisions"].as_u64() > Some(0),
        "{figures}"
    );
    let served: Vec<Value> = examples(&dir.path().join("rounds/round-002/examples.jsonl"))
        .into_iter()
        .filter(|e| e["origin"] == "served")
        .collect();
    assert_eq!(
        served.len() as i64,
        answered,
        "each answered item one example"
    );
    assert_eq!(figures["export"]["served"], json!(answered));
    assert_eq!(
        served
            .iter()
            .filter(|e| e["served"]["model_version_id"] == json!(v1))
            .count(),
        model_answered
    );
    assert!(
        served
            .iter()
            .all(|e| e["served"]["propensity"].as_f64().unwrap() > 0.0)
    );

    // The first version retires; the second stays live.
    let stdout = run(arc_rec(&url).args(["models", "retire", "--org", ORG, &v1]));
    assert!(stdout.contains("retired"), "{stdout}");
    let statuses: Vec<(String, String)> = sqlx::query_as(
        "SELECT model_version_id, status FROM model_versions WHERE org_id = $1
         ORDER BY created_at",
    )
    .bind(ORG)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(
        statuses.contains(&(v1.clone(), "retired".to_owned())),
        "{statuses:?}"
    );
    assert!(
        statuses.contains(&(v2.clone(), "live".to_owned())),
        "{statuses:?}"
    );
    let listed = run(arc_rec(&url).args(["round", "list", "--org", ORG]));
    assert!(listed.contains(&v2) && listed.contains(&v1), "{listed}");
}

/// `bench loop` checks its model and its organization before any traffic: an organization the
/// database lacks, or one with an earlier loop's versions, is named with what to do.
#[tokio::test(flavor = "multi_thread")]
async fn bench_loop_names_a_missing_model_and_an_organization_that_is_not_fresh() {
    let db = fresh_database().await;
    let dir = tempfile::tempdir().unwrap();
    let bench = |model: &Path| {
        let output = arc_rec(&db.url)
            .args(["bench", "loop", "--world-seed", "1", "--rounds", "1"])
            .args(["--decisions", "10", "--model"])
            .arg(model)
            .arg("--dir")
            .arg(dir.path().join("rounds"))
            .output()
            .unwrap();
        assert!(!output.status.success());
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let stderr = bench(&dir.path().join("missing"));
    assert!(
        stderr.contains("--model") && stderr.contains("config.json"),
        "{stderr}"
    );
    std::fs::create_dir_all(dir.path().join("m")).unwrap();
    std::fs::write(dir.path().join("m/config.json"), "{}").unwrap();
    let stderr = bench(&dir.path().join("m"));
    assert!(stderr.contains("lacks organization acme"), "{stderr}");
    assert!(stderr.contains("arc-rec simulate --seed 1"), "{stderr}");
    sqlx::query("INSERT INTO organizations (org_id) VALUES ('acme')")
        .execute(db.pool())
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO model_versions (org_id, model_version_id, base_model)
         VALUES ('acme', 'rft-old', 'tiny')",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let stderr = bench(&dir.path().join("m"));
    assert!(stderr.contains("already has model versions"), "{stderr}");
}
