//! The schema itself: constraints hold even for writers that bypass arc-rec, organizations are
//! isolated, and the analyst views compute what the Rust code would.

use crate::helpers::fresh_database;

#[tokio::test]
async fn every_table_carries_an_org_id() {
    let db = fresh_database().await;
    let missing: Vec<String> = sqlx::query_scalar(
        "SELECT t.table_name::text FROM information_schema.tables t
         WHERE t.table_schema = 'public' AND t.table_type = 'BASE TABLE' AND t.table_name <> '_sqlx_migrations'
           AND NOT EXISTS (SELECT 1 FROM information_schema.columns c
                           WHERE c.table_schema = 'public' AND c.table_name = t.table_name AND c.column_name = 'org_id')",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    assert!(missing.is_empty(), "tables without org_id: {missing:?}");
}

#[tokio::test]
async fn database_constraints_reject_what_validation_rejects() {
    let db = fresh_database().await;
    let pool = db.pool();
    sqlx::query("INSERT INTO organizations (org_id) VALUES ('acme'), ('globex')")
        .execute(pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO configurations (org_id, config_id, name) VALUES ('acme', 'c1', 'x')")
        .execute(pool)
        .await
        .unwrap();
    let insert_version = |org: &'static str, config: &'static str, temperature: &'static str| {
        sqlx::query(
            "INSERT INTO config_versions (org_id, version_id, config_id, version_number, parsed_config, config_hash)
             VALUES ($1, 'v1', $2, 1, jsonb_build_object('model', 'm', 'temperature', $3::jsonb), repeat('a', 64))",
        )
        .bind(org)
        .bind(config)
        .bind(temperature)
        .execute(pool)
    };
    let err = insert_version("acme", "c1", "7").await.unwrap_err();
    assert!(
        err.to_string().contains("parsed_config_temperature_range"),
        "{err}"
    );
    let err = insert_version("acme", "c1", "\"warm\"").await.unwrap_err();
    assert!(
        err.to_string().contains("parsed_config_temperature_range"),
        "{err}"
    );
    // The same config id in another organization is not reachable.
    let err = insert_version("globex", "c1", "0.5").await.unwrap_err();
    assert!(err.to_string().contains("foreign key"), "{err}");
    insert_version("acme", "c1", "0.5").await.unwrap();

    let bad_status = sqlx::query(
        "INSERT INTO config_diffs (org_id, diff_id, config_id, version_before, change_summary, diff, approval_status)
         VALUES ('acme', 'd1', 'c1', 'v1', 's', '{}', 'maybe')",
    )
    .execute(pool)
    .await
    .unwrap_err();
    assert!(
        bad_status.to_string().contains("check constraint"),
        "{bad_status}"
    );
}

#[tokio::test]
async fn trajectories_have_a_gin_index() {
    let db = fresh_database().await;
    let method: String = sqlx::query_scalar(
        "SELECT am.amname::text FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am am ON am.oid = c.relam
         WHERE c.relname = 'outcomes_trajectory_gin'",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(method, "gin");
}

#[tokio::test]
async fn acceptance_views_count_and_bound_like_the_rust_code() {
    let db = fresh_database().await;
    let pool = db.pool();
    sqlx::query("INSERT INTO organizations (org_id) VALUES ('acme')")
        .execute(pool)
        .await
        .unwrap();
    // 12 requests, one shown item each; types alternate; 5 accepted (4 retry, 1 model switch).
    for i in 0..12u32 {
        let event = format!("00000000-0000-0000-0000-{i:012}");
        let kind = if i % 2 == 0 {
            "retry_policy"
        } else {
            "model_switch"
        };
        sqlx::query(
            "INSERT INTO decision_log (org_id, event_id, policy_version, seed, cluster_id, context, candidates, created_at)
             VALUES ('acme', $1::uuid, 'ts-1', 7, 'tool_timeout', '{}', '[]', '2026-11-20T10:00:00Z')",
        )
        .bind(&event)
        .execute(pool)
        .await
        .unwrap();
        sqlx::query(
            "INSERT INTO decision_items (org_id, event_id, recommendation_id, position, recommendation_type, model_provider, diff, score, propensity)
             VALUES ('acme', $1::uuid, 'r1', 0, $2, 'openai', '{}', 0.5, 0.8)",
        )
        .bind(&event)
        .bind(kind)
        .execute(pool)
        .await
        .unwrap();
        let accepted = (i % 2 == 0 && i < 8) || i == 1;
        let outcome = if accepted { "accepted" } else { "rejected" };
        for _ in 0..2 {
            // Duplicate feedback is one row.
            sqlx::query(
                "INSERT INTO feedback (org_id, event_id, recommendation_id, outcome) VALUES ('acme', $1::uuid, 'r1', $2)
                 ON CONFLICT DO NOTHING",
            )
            .bind(&event)
            .bind(outcome)
            .execute(pool)
            .await
            .unwrap();
        }
    }
    let rows: Vec<(String, i64, i64, f64, f64, f64)> = sqlx::query_as(
        "SELECT key, shown, accepted, rate, ci95_low, ci95_high FROM analyst_acceptance_by_type WHERE org_id = 'acme' ORDER BY key",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), 2);
    let (key, shown, accepted, rate, lo, hi) = &rows[1];
    assert_eq!((key.as_str(), *shown, *accepted), ("retry_policy", 6, 4));
    assert!((rate - 4.0 / 6.0).abs() < 1e-12);
    let (want_lo, want_hi) = bandit::interval::wilson(4, 6, 1.96).unwrap();
    assert!(
        (lo - want_lo).abs() < 1e-4 && (hi - want_hi).abs() < 1e-4,
        "{lo} {hi} vs {want_lo} {want_hi}"
    );

    let by_cluster: (i64, i64) = sqlx::query_as(
        "SELECT shown, accepted FROM analyst_acceptance_by_cluster WHERE key = 'tool_timeout'",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(by_cluster, (12, 5));
    for view in [
        "analyst_acceptance_by_provider",
        "analyst_acceptance_by_policy",
        "analyst_acceptance_by_day",
    ] {
        let shown: i64 = sqlx::query_scalar(&format!("SELECT sum(shown)::bigint FROM {view}"))
            .fetch_one(pool)
            .await
            .unwrap();
        assert_eq!(shown, 12, "{view}");
    }
}
