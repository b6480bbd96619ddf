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
