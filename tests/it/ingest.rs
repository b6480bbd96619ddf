//! Ingest against a real database.

use arc_rec::ingest::{BadLinePolicy, IngestError, ingest_file};
use indicatif::ProgressBar;

use crate::helpers::{contract_lines, fixture, fresh_database, jsonl_file};

#[tokio::test]
async fn contract_examples_load_and_reload_adds_nothing() {
    let db = fresh_database().await;
    let hidden = ProgressBar::hidden();
    let first = ingest_file(
        db.pool(),
        &fixture("contracts.jsonl"),
        BadLinePolicy::RejectAll,
        &hidden,
    )
    .await
    .unwrap();
    assert_eq!(first.loaded, 7);
    assert_eq!(first.stats.changed(), 7);
    let counts = db.counts().await;
    let second = ingest_file(
        db.pool(),
        &fixture("contracts.jsonl"),
        BadLinePolicy::RejectAll,
        &hidden,
    )
    .await
    .unwrap();
    assert_eq!(second.stats.changed(), 0, "{:?}", second.stats);
    assert_eq!(db.counts().await, counts);
    let trajectory_status: String = sqlx::query_scalar(
        "SELECT trajectory ->> 'status' FROM outcomes WHERE org_id = 'acme' AND outcome_id = 'o1'",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(trajectory_status, "error");
}

#[tokio::test]
async fn changed_record_is_an_update() {
    let db = fresh_database().await;
    let hidden = ProgressBar::hidden();
    let mut lines = contract_lines();
    let file = jsonl_file(&lines);
    ingest_file(db.pool(), file.path(), BadLinePolicy::RejectAll, &hidden)
        .await
        .unwrap();
    lines[6] = lines[6].replace(
        r#""approval_status":"approved""#,
        r#""approval_status":"rejected""#,
    );
    let file = jsonl_file(&lines);
    let report = ingest_file(db.pool(), file.path(), BadLinePolicy::RejectAll, &hidden)
        .await
        .unwrap();
    assert_eq!(report.stats.changed(), 1);
    let status: String =
        sqlx::query_scalar("SELECT approval_status FROM config_diffs WHERE diff_id = 'd1'")
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(status, "rejected");
}

/// Each bad line must be reported with its number and field, and leave the database unchanged.
#[tokio::test]
async fn bad_input_names_line_and_field_and_writes_nothing() {
    let db = fresh_database().await;
    let hidden = ProgressBar::hidden();
    ingest_file(
        db.pool(),
        &fixture("contracts.jsonl"),
        BadLinePolicy::RejectAll,
        &hidden,
    )
    .await
    .unwrap();
    let before = db.counts().await;
    let good = contract_lines();
    let cases: Vec<(usize, String, &str, &str)> = vec![
        (
            3,
            r#"{"kind":"scenario","org":"acme","data":{"scenario_id":"s9","name":"x""#.to_owned(),
            "data",
            "EOF while parsing an object at column",
        ),
        (
            3,
            good[2]
                .replace(r#""scenario_id":"s1""#, r#""scenario_id":"s2""#)
                .replace(r#""name":"refund with missing order id""#, r#""name":42"#),
            "data.name",
            "invalid type: integer `42`, expected a string",
        ),
        (
            3,
            good[1]
                .replace(r#""version_id":"v1""#, r#""version_id":"v7""#)
                .replace(r#""version_number":1"#, r#""version_number":7"#)
                .replace(r#""temperature":0.7"#, r#""temperature":7"#),
            "data.parsed_config.temperature",
            "between 0 and 2",
        ),
        (
            3,
            good[4]
                .replace(r#""outcome_id":"o1""#, r#""outcome_id":"o9""#)
                .replace(
                    r#""status":"error","reliability_score""#,
                    r#""status":"exploded","reliability_score""#,
                ),
            "data.status",
            "unknown variant `exploded`",
        ),
        (
            3,
            good[5]
                .replace(r#""pattern_id":"p1""#, r#""pattern_id":"p9""#)
                .replace(r#""outcome_id":"o1""#, r#""outcome_id":"o404""#),
            "data.outcome_id",
            "outcome `o404` not found",
        ),
    ];
    for (line_no, bad_line, field, message) in cases {
        let mut lines = vec![good[0].clone(), good[2].clone()];
        lines.insert(line_no - 1, bad_line);
        let file = jsonl_file(&lines);
        let err = ingest_file(db.pool(), file.path(), BadLinePolicy::RejectAll, &hidden)
            .await
            .unwrap_err();
        let IngestError::Rejected { bad, errors, .. } = err else {
            panic!("expected a rejection, got {err:?}")
        };
        assert_eq!(bad, 1);
        assert_eq!(errors[0].line, line_no);
        assert_eq!(errors[0].errors[0].field, field, "{errors:?}");
        assert!(
            errors[0].errors[0].message.contains(message),
            "{field}: {}",
            errors[0].errors[0].message
        );
        assert_eq!(
            db.counts().await,
            before,
            "a rejected file must write nothing"
        );
    }
}

#[tokio::test]
async fn skip_mode_skips_bad_lines_and_their_dependents() {
    let db = fresh_database().await;
    let hidden = ProgressBar::hidden();
    let mut lines = contract_lines();
    // Break the simulation: the outcome, its failure pattern depend on it.
    lines[3] = lines[3].replace(r#""overall_score":0.62"#, r#""overall_score":"high""#);
    let file = jsonl_file(&lines);
    let report = ingest_file(db.pool(), file.path(), BadLinePolicy::Skip, &hidden)
        .await
        .unwrap();
    assert_eq!(report.skipped, 3, "{:?}", report.skipped_lines);
    assert_eq!(report.loaded, 4);
    let skipped: Vec<usize> = report.skipped_lines.iter().map(|l| l.line).collect();
    assert_eq!(skipped, [4, 5, 6]);
    assert!(
        report.skipped_lines[1].errors[0]
            .message
            .contains("(line 4) was rejected"),
        "{:?}",
        report.skipped_lines
    );
    let outcomes: i64 = sqlx::query_scalar("SELECT count(*) FROM outcomes")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(outcomes, 0);
    let diffs: i64 = sqlx::query_scalar("SELECT count(*) FROM config_diffs")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(diffs, 1);
}

#[tokio::test]
async fn references_may_point_at_stored_rows_but_not_across_orgs() {
    let db = fresh_database().await;
    let hidden = ProgressBar::hidden();
    let lines = contract_lines();
    ingest_file(
        db.pool(),
        jsonl_file(&lines[..2]).path(),
        BadLinePolicy::RejectAll,
        &hidden,
    )
    .await
    .unwrap();
    // A later file may reference the stored configuration and version.
    let report = ingest_file(
        db.pool(),
        jsonl_file(&lines[2..]).path(),
        BadLinePolicy::RejectAll,
        &hidden,
    )
    .await
    .unwrap();
    assert_eq!(report.loaded, 5);
    // The same ids in another organization do not resolve.
    let other: Vec<String> = vec![lines[3].replace(r#""org":"acme""#, r#""org":"globex""#)];
    let err = ingest_file(
        db.pool(),
        jsonl_file(&other).path(),
        BadLinePolicy::RejectAll,
        &hidden,
    )
    .await
    .unwrap_err();
    let IngestError::Rejected { errors, .. } = err else {
        panic!("expected a rejection")
    };
    assert_eq!(errors[0].errors[0].field, "data.config_version_id");
}
