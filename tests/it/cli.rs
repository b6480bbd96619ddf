//! The binary as people run it.

use assert_cmd::Command;

use crate::helpers::{arc_rec, contract_lines, fresh_database, jsonl_file};

#[tokio::test]
async fn ingest_rejects_a_bad_file_naming_line_and_field() {
    let db = fresh_database().await;
    let mut lines = contract_lines();
    lines[1] = lines[1].replace(r#""temperature":0.7"#, r#""temperature":7"#);
    let file = jsonl_file(&lines);
    let output = arc_rec(&db.url)
        .arg("ingest")
        .arg(file.path())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(
            "line 2: field `data.parsed_config.temperature`: must be between 0 and 2, got 7"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("nothing was written"), "{stderr}");
    assert!(db.counts().await.iter().all(|(_, n)| *n == 0));
}

#[tokio::test]
async fn ingest_then_export_through_the_binary() {
    let db = fresh_database().await;
    let file = jsonl_file(&contract_lines());
    let output = arc_rec(&db.url)
        .arg("ingest")
        .arg(file.path())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("examples.jsonl");
    let output = arc_rec(&db.url)
        .args(["export", "--format", "chat", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = std::fs::read_to_string(&out).unwrap();
    assert_eq!(text.lines().count(), 1);
    let chat: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert!(
        chat["messages"][2]["content"]
            .as_str()
            .unwrap()
            .contains("retry_policy")
    );
}

#[test]
fn bad_arguments_are_reported_by_name() {
    let output = Command::cargo_bin("arc-rec")
        .unwrap()
        .args(["export", "--out", "x.jsonl", "--since", "yesterday"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--since"), "{stderr}");
}

/// `keys create --rate-limit`, `keys list` (which shows it and never a secret), `keys
/// set-rate-limit` back to the role's, a bad limit named, and revocation.
#[tokio::test]
async fn keys_carry_their_own_rate_limit_through_the_binary() {
    use crate::helpers::run;
    let db = fresh_database().await;
    let token = run(arc_rec(&db.url).args([
        "keys",
        "create",
        "--org",
        "acme",
        "--role",
        "analyst",
        "--rate-limit",
        "5/10",
    ]));
    let key_id = token.trim().split('_').nth(1).unwrap().to_owned();
    let secret = token.trim().split('_').nth(2).unwrap().to_owned();
    let listed = run(arc_rec(&db.url).args(["keys", "list", "--org", "acme"]));
    let row = listed.lines().find(|l| l.starts_with(&key_id)).unwrap();
    assert!(row.contains(" 5/10 "), "{listed}");
    assert!(!listed.contains(&secret));
    run(arc_rec(&db.url).args([
        "keys",
        "set-rate-limit",
        "--org",
        "acme",
        "--key-id",
        &key_id,
        "--rate-limit",
        "default",
    ]));
    let listed = run(arc_rec(&db.url).args(["keys", "list", "--org", "acme"]));
    let row = listed.lines().find(|l| l.starts_with(&key_id)).unwrap();
    assert!(row.contains(" role ") && !row.contains("5/10"), "{listed}");
    let output = arc_rec(&db.url)
        .args([
            "keys",
            "set-rate-limit",
            "--org",
            "acme",
            "--key-id",
            &key_id,
        ])
        .args(["--rate-limit", "5/0"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains("--rate-limit") && stderr.contains("burst"),
        "{stderr}"
    );
    let output = arc_rec(&db.url)
        .args([
            "keys",
            "set-rate-limit",
            "--org",
            "other",
            "--key-id",
            &key_id,
        ])
        .args(["--rate-limit", "5/5"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("no active key"),
        "another organization's key is not touched"
    );
    // A daily quota: set, listed with today's count, refused when zero, back to the role's.
    let set_quota = |quota: &str| {
        arc_rec(&db.url)
            .args(["keys", "set-quota", "--org", "acme", "--key-id", &key_id])
            .args(["--daily-quota", quota])
            .output()
            .unwrap()
    };
    assert!(set_quota("250").status.success());
    let listed = run(arc_rec(&db.url).args(["keys", "list", "--org", "acme"]));
    let row = listed.lines().find(|l| l.starts_with(&key_id)).unwrap();
    assert!(row.contains(" 250/day ") && row.contains(" 0 "), "{listed}");
    let refused = set_quota("0");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success()
            && stderr.contains("--daily-quota")
            && stderr.contains("at least 1"),
        "{stderr}"
    );
    assert!(set_quota("default").status.success());
    let listed = run(arc_rec(&db.url).args(["keys", "list", "--org", "acme"]));
    assert!(!listed.contains("250/day"), "{listed}");
    run(arc_rec(&db.url).args(["keys", "revoke", "--org", "acme", "--key-id", &key_id]));
}

/// `db url` prints the running embedded cluster's URL, and says how to start one that is not.
#[tokio::test]
async fn db_url_names_the_running_cluster_or_says_it_is_not() {
    let _db = fresh_database().await; // the shared test cluster is running
    let url = crate::helpers::run(
        Command::cargo_bin("arc-rec")
            .unwrap()
            .env_remove("DATABASE_URL")
            .arg("--data-dir")
            .arg(crate::helpers::cluster_dir())
            .args(["db", "url"]),
    );
    assert!(
        url.starts_with("postgresql://") && url.contains("host="),
        "{url}"
    );
    let empty = tempfile::tempdir().unwrap();
    let output = Command::cargo_bin("arc-rec")
        .unwrap()
        .env_remove("DATABASE_URL")
        .arg("--data-dir")
        .arg(empty.path())
        .args(["db", "url"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains("not running"),
        "{stderr}"
    );
}
