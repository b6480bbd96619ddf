//! `arc-rec candidates` through the binary: a short recorded training run's model writes
//! candidates for serving into `candidate_recommendations`, `POST /v1/recommendations` returns one
//! of them marked as the model's, feedback on it is learned like feedback on a heuristic
//! candidate; bad input is named.

use std::path::Path;
use std::time::{Duration, Instant};

use arc_rec::rft::RftDataset;
use arc_rec::rft::model_candidates::serving_contexts;
use serde_json::{Value, json};

use crate::helpers::{
    Limits, TestApp, arc_rec, fresh_database, run, spawn_app_on, training_world, wait_for_answers,
    world_grader_args,
};
/// Only this organization is clustered, so the others' contexts keep failure categories as
/// their clusters and their candidates are stored for any cluster: both paths are exercised.
const CLUSTERED_ORG: &str = "acme";

/// Waits until `org`'s policy in `app` has done its warm start and learned `n` answers besides;
/// returns its posterior mean.
async fn wait_for_observations(app: &TestApp, org: &str, n: u64) -> Vec<f64> {
    wait_for_answers(&app.serving, org, n, Duration::from_secs(30))
        .await
        .mean()
        .to_vec()
}

fn train(db_url: &str, dir: &Path, out: &Path) -> String {
    let started = Instant::now();
    let stdout = run(arc_rec(db_url)
        .arg("train")
        .arg("--data")
        .arg(dir.join("examples.jsonl"))
        .arg("--model")
        .arg(dir.join("tiny"))
        .arg("--out")
        .arg(out)
        .args(world_grader_args())
        // A short warm-up: the grammar keeps the tiny model's recommendations well-formed, and 10
        // steps at a constant rate already give serving dozens to write (measured: 53 of 64
        // valid, 41 written; 70 steps: 59 valid, 32 written, in five times the training time).
        .args(["--sft-steps", "10", "--lr-schedule", "constant"])
        .args(["--steps", "2", "--k", "2", "--n", "4"])
        .args(["--prompts-per-step", "2", "--max-new-tokens", "48"])
        // Two RL steps select nothing worth gating on: the gate has its own test below.
        .args(["--eval-every", "0"])
        .args(["--device", "cpu", "--seed", "7"]));
    eprintln!("train: {:.1} s", started.elapsed().as_secs_f64());
    stdout
}

/// The gate: an RL phase that learns to be rejected (its advantages negated by a hidden fault
/// hook) never scores above its warm-up on the held-out criterion, so the run keeps the warm-up
/// model as its RL adapter, says so, and `candidates` refuses its ideas until `--force`.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_whose_rl_only_gets_worse_keeps_its_warm_up_and_candidates_refuse_it_without_force() {
    let db = fresh_database().await;
    let dir = tempfile::tempdir().unwrap();
    training_world(&db.url, dir.path(), None);
    // Half the contexts held out for validation, so several carry both verdicts.
    let data = dir.path().join("half.jsonl");
    run(arc_rec(&db.url)
        .args(["export", "--validation-percent", "50", "--out"])
        .arg(&data));
    let out = dir.path().join("run");
    let stdout = run(arc_rec(&db.url)
        .env("ARC_REC_TEST_INVERT_ADVANTAGES", "1")
        .arg("train")
        .arg("--data")
        .arg(&data)
        .arg("--model")
        .arg(dir.path().join("tiny"))
        .arg("--out")
        .arg(&out)
        .args(world_grader_args())
        .args(["--sft-steps", "10", "--sft-batch", "4"])
        .args(["--lr-schedule", "constant"])
        .args([
            "--steps",
            "6",
            "--eval-every",
            "2",
            "--learning-rate",
            "0.1",
        ])
        .args(["--k", "2", "--n", "4", "--prompts-per-step", "2"])
        .args(["--max-new-tokens", "48", "--keep-zero-advantage-groups"])
        .args(["--device", "cpu", "--seed", "7", "--no-record"]));
    let summary: Value =
        serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    let selection = &summary["selection"];
    assert_eq!(
        selection["points"], 4,
        "RL steps 0, 2, 4 and 6: {selection}"
    );
    assert_eq!(selection["rl_step"], 0, "{selection}\n{stdout}");
    assert_eq!(selection["beats_warmup"], false, "{selection}");
    assert!(stdout.contains("kept the warm-up model"), "{stdout}");
    // The scored points' adapters are gone but the chosen one, which is the run's adapter.
    assert!(out.join("adapter").is_dir());
    assert!(!out.join("eval-point-10").exists());

    let candidates = |force: bool| {
        let mut cmd = arc_rec(&db.url);
        cmd.args(["candidates", "--run"])
            .arg(&out)
            .args(["--k", "2", "--device", "cpu", "--out"])
            .arg(dir.path().join("candidates.jsonl"));
        if force {
            cmd.arg("--force");
        }
        cmd.output().unwrap()
    };
    let refused = candidates(false);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("did not beat its warm-up"), "{stderr}");
    assert!(stderr.contains("--force"), "{stderr}");
    let warmup = format!("{:.3}", selection["warmup_value"].as_f64().unwrap());
    assert!(stderr.contains(&warmup), "names the figures: {stderr}");
    let forced = candidates(true);
    assert!(
        forced.status.success(),
        "{}",
        String::from_utf8_lossy(&forced.stderr)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn model_candidates_are_served_marked_as_the_models_and_feedback_on_them_is_learned() {
    let db = fresh_database().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("examples.jsonl");
    training_world(&db.url, dir.path(), Some(CLUSTERED_ORG));
    let out = dir.path().join("run");
    let stdout = train(&db.url, dir.path(), &out);
    assert!(
        stdout.contains("recorded run and model version"),
        "{stdout}"
    );
    let run_id = std::fs::read_to_string(out.join("run_id"))
        .unwrap()
        .trim()
        .to_owned();

    let started = Instant::now();
    let stdout = run(arc_rec(&db.url)
        .args(["candidates", "--run"])
        .arg(&out)
        .args(["--k", "4", "--device", "cpu"]));
    eprintln!(
        "candidates: {:.1} s\n{stdout}",
        started.elapsed().as_secs_f64()
    );
    let rows: Vec<(String, Option<String>, String, Value, String)> = sqlx::query_as(
        "SELECT org_id, cluster_id, candidate_id, diff, model_version_id
         FROM candidate_recommendations WHERE source = 'model' ORDER BY org_id, candidate_id",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    assert!(!rows.is_empty(), "no model candidate written: {stdout}");
    // Each is priced by the learned grader (--prior learned, the default).
    let priors: Vec<(Option<f64>, Option<f64>)> = sqlx::query_as(
        "SELECT prior_mean, prior_sd FROM candidate_recommendations WHERE source = 'model'",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    assert!(
        priors
            .iter()
            .all(|(mean, sd)| mean.is_some_and(|m| (0.0..=1.0).contains(&m))
                && sd.is_some_and(|s| (0.0..=1.0).contains(&s))),
        "{priors:?}"
    );
    assert!(
        stdout.contains(&format!("priced {} candidates", rows.len())),
        "{stdout}"
    );
    assert!(
        rows.iter().all(|row| row.4 == run_id),
        "every row carries the run's model version"
    );
    assert!(
        stdout.contains(&format!(
            "wrote {} candidates of model version {run_id}",
            rows.len()
        )),
        "{stdout}"
    );
    for column in [
        "contexts",
        "generated",
        "valid",
        "unknown",
        "passed",
        "written",
    ] {
        assert!(stdout.contains(column), "summary lacks {column}: {stdout}");
    }
    // Rows tied to a cluster are tied to an active stored cluster (only the clustered
    // organization has any); the others are for any cluster.
    for (org, cluster, ..) in rows.iter().filter(|row| row.1.is_some()) {
        assert_eq!(org, CLUSTERED_ORG, "{cluster:?}");
    }
    // Serve the organization with the most model candidates, for the typical configuration and
    // failures of its contexts, until a model candidate is shown.
    let org = {
        let mut per_org = std::collections::BTreeMap::<&str, usize>::new();
        for row in &rows {
            *per_org.entry(row.0.as_str()).or_default() += 1;
        }
        per_org
            .into_iter()
            .max_by_key(|(org, n)| (*n, std::cmp::Reverse(*org)))
            .unwrap()
            .0
            .to_owned()
    };
    let dataset = RftDataset::load(&data).unwrap();
    let contexts: Vec<_> = serving_contexts(&dataset)
        .into_iter()
        .filter(|c| c.org == org)
        .collect();
    let pool = db.pool().clone();
    let app = spawn_app_on(db, &org, Limits::default()).await;
    let mut shown: Option<(Value, Value)> = None;
    'contexts: for context in &contexts {
        let failures: Vec<(String, String)> = sqlx::query_as(
            "SELECT failure_category, error_message FROM failure_patterns
             WHERE org_id = $1 AND (pattern_cluster_id = $2 OR failure_category = $2)
             ORDER BY pattern_id LIMIT 3",
        )
        .bind(&org)
        .bind(context.cluster)
        .fetch_all(&pool)
        .await
        .unwrap();
        if failures.is_empty() {
            continue;
        }
        let request = json!({
            "failure_context": {"failures": failures.iter().map(|(category, message)| json!({
                "failure_category": category, "error_message": message
            })).collect::<Vec<_>>()},
            "current_config": context.prompt.current_config,
            "k": 20,
        });
        for _ in 0..3 {
            let response = app
                .post("/v1/recommendations", Some(&app.platform_key), &request)
                .await;
            assert_eq!(response.status(), 200);
            let body: Value = response.json().await.unwrap();
            let recommendations = body["recommendations"].as_array().unwrap();
            for r in recommendations {
                match r["source"].as_str() {
                    Some("heuristic") => assert!(r.get("model_version_id").is_none(), "{r}"),
                    Some("model") => assert_eq!(r["model_version_id"], json!(run_id), "{r}"),
                    other => panic!("source {other:?} in {r}"),
                }
            }
            if let Some(model) = recommendations.iter().find(|r| r["source"] == "model") {
                shown = Some((body.clone(), model.clone()));
                break 'contexts;
            }
        }
    }
    let (body, model) = shown.unwrap_or_else(|| {
        panic!(
            "no model candidate shown for any of {}'s {} contexts ({} of its candidates stored)",
            org,
            contexts.len(),
            rows.iter().filter(|row| row.0 == org).count()
        )
    });
    assert!(
        rows.iter()
            .any(|row| row.0 == org && row.3 == model["diff"]),
        "the shown model candidate is a stored one: {model}"
    );

    // Feedback on it is stored and learned, as feedback on a heuristic candidate is.
    let warmed = wait_for_observations(&app, &org, 0).await;
    // Before any answer, the policy learned the world's logged decisions (the warm start).
    let warm = app.serving.warm_start(&org).unwrap();
    assert!(warm.matched > 0 && warm.matched <= warm.logged, "{warm:?}");
    let feedback = |recommendation: &Value, outcome: &str| {
        json!({"event_id": body["event_id"], "recommendation_id": recommendation["recommendation_id"],
               "outcome": outcome})
    };
    assert_eq!(
        app.post(
            "/v1/feedback",
            Some(&app.platform_key),
            &feedback(&model, "accepted")
        )
        .await
        .status(),
        201
    );
    let learned = wait_for_observations(&app, &org, 1).await;
    assert!(
        learned
            .iter()
            .zip(&warmed)
            .any(|(a, b)| (a - b).abs() > 1e-6),
        "the posterior moved after feedback on the model's candidate"
    );
    let heuristic = body["recommendations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["source"] == "heuristic")
        .expect("heuristic candidates beside the model's");
    assert_eq!(
        app.post(
            "/v1/feedback",
            Some(&app.platform_key),
            &feedback(heuristic, "rejected")
        )
        .await
        .status(),
        201
    );
    let both = wait_for_observations(&app, &org, 2).await;
    assert!(learned.iter().zip(&both).any(|(a, b)| (a - b).abs() > 1e-9));
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM feedback WHERE event_id = $1::uuid")
        .bind(body["event_id"].as_str().unwrap())
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(stored, 2);

    // Bad input is named, before any model or database work.
    let not_a_run = dir.path().join("not-a-run");
    std::fs::create_dir_all(&not_a_run).unwrap();
    let unfinished = dir.path().join("unfinished");
    std::fs::create_dir_all(&unfinished).unwrap();
    for file in ["config.json", "run_id"] {
        std::fs::copy(out.join(file), unfinished.join(file)).unwrap();
    }
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["--run".into(), not_a_run.display().to_string()],
            "not a run directory",
        ),
        (
            vec!["--run".into(), unfinished.display().to_string()],
            "has not finished its RL steps",
        ),
        (
            vec![
                "--run".into(),
                out.display().to_string(),
                "--k".into(),
                "0".into(),
            ],
            "--k must be between 1 and 64, got 0",
        ),
    ];
    for (args, expected) in cases {
        let output = arc_rec(&app.db.url)
            .arg("candidates")
            .args(&args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args:?} succeeded");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}
