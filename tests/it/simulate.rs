//! The synthetic world through the binary: loading directly and loading its JSON-lines file give
//! the same database, and its history exports into parseable training examples.

use assert_cmd::Command;

use crate::helpers::{arc_rec, fresh_database, run};

#[tokio::test]
async fn simulate_and_ingest_of_its_file_agree_and_export_parses() {
    let direct = fresh_database().await;
    let via_file = fresh_database().await;
    let dir = tempfile::tempdir().unwrap();
    let history = dir.path().join("history.jsonl");

    run(arc_rec(&direct.url).args(["simulate", "--seed", "7", "--outcomes", "1500"]));
    run(arc_rec(&via_file.url)
        .args(["simulate", "--seed", "7", "--outcomes", "1500", "--out"])
        .arg(&history));
    run(arc_rec(&via_file.url).arg("ingest").arg(&history));
    let counts = direct.counts().await;
    assert_eq!(counts, via_file.counts().await);
    let outcomes = counts.iter().find(|(k, _)| k == "outcome").unwrap().1;
    assert_eq!(outcomes, 1500);

    // Same seed again: nothing changes.
    let again = run(arc_rec(&direct.url).args(["simulate", "--seed", "7", "--outcomes", "1500"]));
    assert!(again.contains("0 rows inserted, 0 updated"), "{again}");

    let out = dir.path().join("examples.jsonl");
    run(arc_rec(&direct.url).args(["export", "--out"]).arg(&out));
    let text = std::fs::read_to_string(&out).unwrap();
    let examples: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("every line parses"))
        .collect();
    assert!(examples.len() > 50, "{} examples", examples.len());
    let accepted = examples
        .iter()
        .filter(|e| e["reward"]["binary"] == 1.0)
        .count();
    assert!(
        accepted > 0 && accepted < examples.len(),
        "both accepted and rejected examples"
    );
    // In the world, approved changes that were re-run mostly raised reliability.
    let rerun: Vec<f64> = examples
        .iter()
        .filter_map(|e| e["reward"]["reliability_delta"].as_f64())
        .collect();
    assert!(!rerun.is_empty());
    let mean = rerun.iter().sum::<f64>() / rerun.len() as f64;
    assert!(
        mean > 0.0,
        "mean reliability delta of applied changes {mean}"
    );
}

#[test]
fn bad_simulation_parameters_are_errors_not_panics() {
    let output = Command::cargo_bin("arc-rec")
        .unwrap()
        .args([
            "simulate",
            "--orgs",
            "a b",
            "--out",
            "/tmp/never-written.jsonl",
        ])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("orgs"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// `arc-rec bench pipeline` on a small simulated world with one hand-written model arm: a JSON
/// report with every arm error-free, the PNG written, and bad arms named.
#[tokio::test]
async fn bench_pipeline_runs_on_a_simulated_world_and_names_bad_arms() {
    let db = fresh_database().await;
    let dir = tempfile::tempdir().unwrap();
    run(arc_rec(&db.url).args(["simulate", "--seed", "7", "--outcomes", "1500"]));
    let diff = serde_json::json!({"timeout_s": 600});
    let kind = arc_rec::domain::RecommendationType::TimeoutAdjustment;
    let line = serde_json::json!({
        "org": "acme",
        "cluster": null,
        "candidate": {
            "candidate_id": arc_rec::domain::Candidate::id_for(kind, &diff),
            "recommendation_type": "timeout_adjustment",
            "diff": diff,
            "description": "a model idea",
            "expected_reliability_delta": 0.0,
            "expected_cost_delta_usd": 0.0,
            "evidence_count": 0,
            "source": {"source": "model", "model_version_id": "mv-1",
                       "prior": {"mean": 0.6, "sd": 0.1}}
        }
    });
    let arm = dir.path().join("model.jsonl");
    std::fs::write(&arm, format!("{line}\n")).unwrap();
    let plot = dir.path().join("pipeline.png");
    let stdout = run(arc_rec(&db.url)
        .args([
            "bench",
            "pipeline",
            "--world-seed",
            "7",
            "--world-outcomes",
            "1500",
        ])
        .args(["--rounds", "300", "--cold-start", "100", "--json", "--arm"])
        .arg(format!("model={}", arm.display()))
        .arg("--plot")
        .arg(&plot));
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let arms = report["arms"].as_array().unwrap();
    let names: Vec<&str> = arms.iter().map(|a| a["arm"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "random heuristic order",
            "(a) heuristics",
            "+ model",
            "menu oracle: heuristics",
            "menu oracle: + model"
        ]
    );
    for a in arms {
        assert_eq!(a["errors"], 0, "{a}");
    }
    // Every bandit arm first learned the world's log, as serving's warm start does.
    let (logged, matched) = (
        report["warm_start"]["logged"].as_u64().unwrap(),
        report["warm_start"]["matched"].as_u64().unwrap(),
    );
    assert!(matched > 0 && matched <= logged, "{}", report["warm_start"]);
    // The model idea is on acme's menus (a third of the contexts).
    let share = arms[2]["mean_model_candidates"].as_f64().unwrap();
    assert!(share > 0.1 && share < 0.6, "{share}");
    assert!(std::fs::metadata(&plot).unwrap().len() > 1000);

    // Without it, none is reported.
    let stdout = run(arc_rec(&db.url)
        .args(["bench", "pipeline", "--world-seed", "7"])
        .args(["--world-outcomes", "1500", "--rounds", "20", "--json"])
        .arg("--no-warm-start"));
    let cold: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert!(cold["warm_start"].is_null(), "{}", cold["warm_start"]);

    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"org\": \"acme\"}\n").unwrap();
    for (arm, expected) in [
        ("nofile".to_owned(), "expected NAME=FILE"),
        (
            format!("x={}", dir.path().join("missing").display()),
            "--arm x",
        ),
        (
            format!("x={}", bad.display()),
            "bad.jsonl:1: not a candidate line",
        ),
    ] {
        let output = arc_rec(&db.url)
            .args([
                "bench",
                "pipeline",
                "--world-seed",
                "7",
                "--world-outcomes",
                "1500",
            ])
            .args(["--rounds", "10", "--arm", &arm])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{arm}");
        assert!(stderr.contains(expected), "{arm}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    // A world the database does not hold is named.
    let other = fresh_database().await;
    let output = arc_rec(&other.url)
        .args(["bench", "pipeline", "--rounds", "10"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("arc-rec simulate --seed 1 --outcomes 20000"),
        "{stderr}"
    );
}
