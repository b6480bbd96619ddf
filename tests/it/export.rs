//! Export against a real database: every reward rule on hand-made rows, filters and formats.

use std::collections::HashMap;

use arc_rec::export::{ExportFormat, ExportOptions, Holdout, Split, export_to_file};
use arc_rec::ingest::{BadLinePolicy, ingest_file};
use arc_rec::storage::export_rows::ExportFilter;
use chrono::{DateTime, Utc};
use indicatif::ProgressBar;
use serde_json::{Value, json};

use crate::helpers::{TestDb, fresh_database, jsonl_file};

fn line(kind: &str, data: Value) -> String {
    json!({"kind": kind, "org": "acme", "data": data}).to_string()
}

fn outcome(
    id: &str,
    sim: &str,
    reliability: f64,
    tool_calls: Value,
    error_events: Value,
) -> String {
    line(
        "outcome",
        json!({
            "outcome_id": id, "simulation_id": sim, "scenario_id": "s1",
            "execution_time": "2026-10-01T10:00:00Z", "status": if reliability < 0.5 { "error" } else { "success" },
            "reliability_score": reliability, "cost_usd": 0.01,
            "trajectory": {"start_time": "2026-10-01T10:00:00Z", "status": "done",
                           "tool_calls": tool_calls, "error_events": error_events}
        }),
    )
}

fn call(ok: bool) -> Value {
    json!({"tool_name": "web_search", "duration_ms": 100.0, "success": ok})
}

fn timeout_event() -> Value {
    json!({"error_type": "ToolTimeout", "error_message": "web_search timed out after 5000 ms"})
}

fn diff(id: &str, status: &str, kind: &str, patch: Value, after: Option<&str>, day: u32) -> String {
    let mut data = json!({
        "diff_id": id, "config_id": "c1", "version_before": "v1", "change_summary": format!("change {id}"),
        "diff": patch, "recommendation_type": kind, "approval_status": status,
        "created_at": format!("2026-11-{day:02}T12:00:00Z"),
    });
    if let Some(after) = after {
        data["version_after"] = json!(after);
    }
    line("config_diff", data)
}

/// The hand-made world: v1 fails with timeouts, v2 (retries) mostly works.
fn hand_made_rows() -> Vec<String> {
    let config = json!({"model": "openai/gpt-4.1", "temperature": 0.7, "tools": [{"name": "web_search"}], "retry": {"max_attempts": 1}});
    let mut config_v2 = config.clone();
    config_v2["retry"] = json!({"max_attempts": 3});
    vec![
        line(
            "user",
            json!({"user_id": "u1", "user_role": "senior_ml_engineer", "domain": "fintech"}),
        ),
        line(
            "configuration",
            json!({"config_id": "c1", "name": "support", "user_id": "u1"}),
        ),
        line(
            "config_version",
            json!({"version_id": "v1", "config_id": "c1", "version_number": 1, "parsed_config": config}),
        ),
        line(
            "config_version",
            json!({"version_id": "v2", "config_id": "c1", "version_number": 2, "parsed_config": config_v2, "generated_by": "llm_recommendation"}),
        ),
        line("scenario", json!({"scenario_id": "s1", "name": "refund"})),
        line(
            "simulation",
            json!({"simulation_id": "sim1", "config_version_id": "v1", "status": "completed"}),
        ),
        line(
            "simulation",
            json!({"simulation_id": "sim2", "config_version_id": "v2", "status": "completed"}),
        ),
        outcome(
            "o1",
            "sim1",
            0.4,
            json!([call(false)]),
            json!([timeout_event()]),
        ),
        outcome(
            "o2",
            "sim1",
            0.2,
            json!([call(false)]),
            json!([timeout_event()]),
        ),
        outcome(
            "o3",
            "sim2",
            0.9,
            json!([call(true), call(true), call(true), call(false)]),
            json!([timeout_event()]),
        ),
        outcome("o4", "sim2", 0.8, json!([call(true)]), json!([])),
        line(
            "failure_pattern",
            json!({"pattern_id": "p1", "outcome_id": "o1", "failure_type": "tool_error", "failure_category": "timeout", "error_message": "web_search timed out after 5000 ms"}),
        ),
        line(
            "failure_pattern",
            json!({"pattern_id": "p2", "outcome_id": "o2", "failure_type": "tool_error", "failure_category": "timeout", "error_message": "Timeout: web_search exceeded 5s"}),
        ),
        diff(
            "d1",
            "approved",
            "retry_policy",
            json!({"retry": {"max_attempts": 3}}),
            Some("v2"),
            1,
        ),
        diff(
            "d2",
            "rejected",
            "temperature",
            json!({"temperature": 0.2}),
            None,
            2,
        ),
        diff(
            "d3",
            "approved",
            "model_switch",
            json!({"model": "anthropic/claude-3-haiku"}),
            None,
            3,
        ),
        diff(
            "d4",
            "rejected",
            "magic",
            json!({"temperature": 0.3}),
            None,
            4,
        ),
        diff(
            "d5",
            "pending",
            "retry_policy",
            json!({"retry": {"max_attempts": 5}}),
            None,
            5,
        ),
    ]
}

async fn loaded() -> TestDb {
    let db = fresh_database().await;
    let file = jsonl_file(&hand_made_rows());
    ingest_file(
        db.pool(),
        file.path(),
        BadLinePolicy::RejectAll,
        &ProgressBar::hidden(),
    )
    .await
    .unwrap();
    db
}

fn options(format: ExportFormat) -> ExportOptions {
    ExportOptions {
        filter: ExportFilter::default(),
        format,
        split: None,
        holdout: Holdout {
            validation_percent: 10,
            test_percent: 10,
        },
        accepted_only: false,
    }
}

async fn export(db: &TestDb, options: &ExportOptions) -> Vec<Value> {
    let dir = tempfile::tempdir().unwrap();
    // A directory that does not exist yet: the export makes it (`--out out/examples.jsonl` on a
    // fresh checkout).
    let out = dir.path().join("out").join("out.jsonl");
    export_to_file(&db.database, options, &out, &ProgressBar::hidden())
        .await
        .unwrap();
    let text = std::fs::read_to_string(&out).unwrap();
    let leftovers = std::fs::read_dir(dir.path().join("out")).unwrap().count();
    assert_eq!(
        leftovers, 1,
        "the temporary file must be renamed, not left behind"
    );
    text.lines()
        .map(|l| serde_json::from_str(l).expect("every line parses"))
        .collect()
}

#[tokio::test]
async fn every_reward_rule_on_hand_made_rows() {
    let db = loaded().await;
    let rows = export(&db, &options(ExportFormat::Arc)).await;
    let by_id: HashMap<&str, &Value> = rows
        .iter()
        .map(|r| (r["diff_id"].as_str().unwrap(), r))
        .collect();
    assert_eq!(rows.len(), 4, "pending diffs are not exported");

    // d1: accepted (+1), reliability 0.3 → 0.85 (+0.5), well formed (+0.1).
    let d1 = by_id["d1"];
    assert_eq!(d1["reward"]["acceptance"], 1.0);
    assert_eq!(d1["reward"]["reliability_improved"], true);
    assert!(
        (d1["reward"]["total"].as_f64().unwrap() - 1.6).abs() < 1e-9,
        "{}",
        d1["reward"]
    );
    assert!((d1["reward"]["reliability_delta"].as_f64().unwrap() - 0.55).abs() < 1e-9);
    // Process features of the applied config: 1 timeout and 4 successful calls over 2 runs.
    let process = &d1["reward"]["process"];
    assert_eq!(process["runs"], 2);
    assert!((process["tool_timeouts_per_run"].as_f64().unwrap() - 0.5).abs() < 1e-9);
    assert!((process["successful_tool_calls_per_run"].as_f64().unwrap() - 2.0).abs() < 1e-9);
    assert!(
        (process["value"].as_f64().unwrap() - 0.05).abs() < 1e-9,
        "{process}"
    );
    // d2: rejected (−1), well formed (+0.1).
    assert!((by_id["d2"]["reward"]["total"].as_f64().unwrap() + 0.9).abs() < 1e-9);
    assert_eq!(by_id["d2"]["reward"]["binary"], -1.0);
    // d3: accepted, never re-run: no reliability bonus, no process reward.
    assert!((by_id["d3"]["reward"]["total"].as_f64().unwrap() - 1.1).abs() < 1e-9);
    assert!(by_id["d3"]["reward"]["process"].is_null());
    // d4: unknown type → not well formed: exactly −1.
    assert_eq!(by_id["d4"]["reward"]["total"], -1.0);
    assert_eq!(by_id["d4"]["reward"]["format_valid"], false);

    // The prompt context is built from trajectories, failure patterns, config and user.
    let context = &d1["context"];
    assert_eq!(
        context["user_context"],
        json!({"user_role": "senior_ml_engineer", "domain": "fintech"})
    );
    assert_eq!(context["current_config"]["retry"]["max_attempts"], 1);
    assert_eq!(context["failures"][0]["count"], 2);
    assert_eq!(context["failing_tools"]["web_search"], 2);
    let summary = context["failure_summary"].as_str().unwrap();
    assert!(
        summary.starts_with("2 of 2 runs failed (mean reliability 0.30"),
        "{summary}"
    );
    assert_eq!(d1["cluster"], "timeout");
}

#[tokio::test]
async fn filters_select_by_time_cluster_and_split() {
    let db = loaded().await;
    let mut opts = options(ExportFormat::Arc);
    opts.filter.since = Some("2026-11-02T00:00:00Z".parse::<DateTime<Utc>>().unwrap());
    opts.filter.until = Some("2026-11-04T00:00:00Z".parse::<DateTime<Utc>>().unwrap());
    let ids: Vec<String> = export(&db, &opts)
        .await
        .iter()
        .map(|r| r["diff_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids, ["d2", "d3"]);

    let mut opts = options(ExportFormat::Arc);
    opts.filter.cluster = Some("rate_limit".into());
    assert!(export(&db, &opts).await.is_empty());
    opts.filter.cluster = Some("timeout".into());
    assert_eq!(export(&db, &opts).await.len(), 4);

    let mut opts = options(ExportFormat::Arc);
    opts.holdout = Holdout {
        validation_percent: 40,
        test_percent: 30,
    };
    let mut by_split = Vec::new();
    for split in [Split::Train, Split::Validation, Split::Test] {
        opts.split = Some(split);
        let rows = export(&db, &opts).await;
        assert!(rows.iter().all(|r| r["split"] == split.name()), "{rows:?}");
        by_split.push(rows.len());
    }
    assert_eq!(by_split.iter().sum::<usize>(), 4, "{by_split:?}");
}

#[tokio::test]
async fn trl_and_chat_formats() {
    let db = loaded().await;
    let rows = export(&db, &options(ExportFormat::PromptCompletion)).await;
    assert_eq!(rows.len(), 4);
    for row in &rows {
        // The key set, not their order: serde_json keeps insertion order in builds with the
        // model (llguidance turns `preserve_order` on) and sorts without it.
        let mut keys: Vec<&str> = row
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        assert_eq!(keys, ["completion", "label", "origin", "prompt"]);
        assert_eq!(row["origin"], "platform");
        let completion: Value = serde_json::from_str(row["completion"].as_str().unwrap()).unwrap();
        assert!(completion["diff"].is_object());
    }
    assert_eq!(rows.iter().filter(|r| r["label"] == true).count(), 2);

    let chats = export(&db, &options(ExportFormat::Chat)).await;
    assert_eq!(
        chats.len(),
        2,
        "chat is for supervised warm-up: accepted only"
    );
    for chat in &chats {
        let roles: Vec<&str> = chat["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["role"].as_str().unwrap())
            .collect();
        assert_eq!(roles, ["system", "user", "assistant"]);
        assert_eq!(chat["origin"], "platform");
    }
}
