//! `arc-rec cluster` on a simulated world: clusters recover the latent failure modes, ids survive
//! a second run, every pattern gets its cluster, and a fresh failure lands in its mode's cluster.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use arc_rec::clustering::quality::agreement;
use arc_rec::clustering::{ClusterModel, FailureInput, FailureText};
use arc_rec::storage::clusters::load_model;
use assert_cmd::Command;
use serde_json::Value;

use crate::helpers::{TestDb, arc_rec, fresh_database, run};

/// `(org, pattern_id) -> (cluster, latent mode)`. The world writes each mode's exception class as
/// the fatal error event's `error_type`, one class per mode.
async fn clusters_and_modes(db: &TestDb) -> BTreeMap<(String, String), (Option<String>, String)> {
    let rows: Vec<(String, String, Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT fp.org_id, fp.pattern_id, fp.pattern_cluster_id,
                (SELECT e->>'error_type'
                 FROM jsonb_array_elements(o.trajectory->'error_events') WITH ORDINALITY AS ev(e, i)
                 WHERE e->'recovery_successful' <> 'true'::jsonb
                 ORDER BY i DESC LIMIT 1)
         FROM failure_patterns fp
         JOIN outcomes o ON o.org_id = fp.org_id AND o.outcome_id = fp.outcome_id",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    rows.into_iter()
        .map(|(org, id, cluster, mode)| ((org, id), (cluster, mode.expect("a fatal error event"))))
        .collect()
}

async fn active_clusters(db: &TestDb) -> BTreeSet<(String, String, String)> {
    let rows: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT org_id, cluster_id, label FROM failure_clusters WHERE active ORDER BY 1, 2",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    rows.into_iter().collect()
}

#[tokio::test]
async fn simulated_world_clusters_keep_their_ids_and_place_new_failures() {
    let db = fresh_database().await;
    run(arc_rec(&db.url).args(["simulate", "--seed", "3", "--outcomes", "3000"]));

    let first = run(arc_rec(&db.url).args(["cluster", "--json"]));
    let report: Value = serde_json::from_str(&first).expect("one JSON object");
    let orgs = report["orgs"].as_array().expect("orgs");
    assert_eq!(orgs.len(), 3, "{report}");
    for org in orgs {
        assert_eq!(org["method"], "kmeans");
        assert_eq!(org["dims"], 16);
        assert_eq!(org["ids_kept"], 0);
        assert_eq!(org["ids_new"], org["k"]);
    }

    // Every pattern has a cluster, and clusters recover the latent modes.
    let assigned = clusters_and_modes(&db).await;
    assert!(assigned.values().all(|(c, _)| c.is_some()));
    let mut per_org: HashMap<&str, (Vec<&str>, Vec<&str>)> = HashMap::new();
    for ((org, _), (cluster, mode)) in &assigned {
        let e = per_org.entry(org.as_str()).or_default();
        e.0.push(cluster.as_deref().unwrap_or(""));
        e.1.push(mode.as_str());
    }
    for (org, (clusters, modes)) in &per_org {
        let a = agreement(clusters, modes).unwrap();
        // Measured 0.98 / 0.99 on seed 42 (README); small orgs here are a little noisier.
        assert!(
            a.purity > 0.9 && a.adjusted_rand_index > 0.8,
            "{org}: {a:?}"
        );
    }

    // A second run keeps every id and every pattern's cluster.
    let ids_before = active_clusters(&db).await;
    let second = run(arc_rec(&db.url).args(["cluster", "--json"]));
    let report: Value = serde_json::from_str(&second).unwrap();
    for org in report["orgs"].as_array().unwrap() {
        assert_eq!(org["ids_new"], 0, "{org}");
        assert_eq!(org["ids_kept"], org["k"]);
        assert_eq!(org["version"], 2);
    }
    assert_eq!(active_clusters(&db).await, ids_before);
    let again = clusters_and_modes(&db).await;
    assert_eq!(again, assigned);

    // A fresh timeout message goes to a cluster that holds the tool-timeout mode (whose members
    // are mostly tool timeouts; a mode may span clusters, e.g. one per tool).
    let org = "acme";
    let stored = load_model(db.pool(), org)
        .await
        .unwrap()
        .expect("acme has a model");
    let model = ClusterModel::from_stored(stored).unwrap();
    let mut modes_of: HashMap<&str, HashMap<&str, usize>> = HashMap::new();
    for ((o, _), (cluster, mode)) in &assigned {
        if o == org {
            *modes_of
                .entry(cluster.as_deref().unwrap())
                .or_default()
                .entry(mode.as_str())
                .or_insert(0) += 1;
        }
    }
    let majority = |cluster: &str| {
        modes_of[cluster]
            .iter()
            .max_by_key(|(_, n)| **n)
            .map(|(m, _)| *m)
    };
    let placed = model
        .assign(&FailureInput::Failures(vec![FailureText {
            failure_category: "timeout".into(),
            error_message: "web_search timed out after 4321 ms".into(),
            tool_name: Some("web_search".into()),
            error_type: None,
        }]))
        .unwrap();
    assert_eq!(
        majority(&placed.cluster_id),
        Some("ToolTimeout"),
        "{placed:?}"
    );
    assert_eq!(placed.reduced.len(), 16);
    assert!(load_model(db.pool(), "nobody").await.unwrap().is_none());
}

#[test]
fn cluster_options_are_checked() {
    let output = Command::cargo_bin("arc-rec")
        .unwrap()
        .env("DATABASE_URL", "postgres://invalid.invalid/x")
        .args(["cluster", "--dims", "65"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("--dims"));
}
