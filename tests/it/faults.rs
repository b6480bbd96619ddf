//! Faults the service must survive: Postgres stopped and started under it, a database missing
//! migrations. Each 2xx still means the data is in the database.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use arc_rec::storage::{
    ACQUIRE_TIMEOUT, Database, DatabaseTarget, EmbeddedOptions, EmbeddedPostgres,
};
use serde_json::Value;

use crate::helpers::{
    Limits, TestApp, TestDb, contract_lines, contract_request, spawn_app, spawn_app_on,
};

/// `/readyz` is 503, naming the versions, while the database lacks a migration this binary
/// knows (a restored backup), and 200 again once it has them.
#[tokio::test]
async fn readiness_needs_every_migration() {
    let app = spawn_app().await;
    assert_eq!(app.get("/readyz", None).await.status(), 200);
    let latest: i64 = sqlx::query_scalar("SELECT max(version) FROM _sqlx_migrations")
        .fetch_one(app.db.pool())
        .await
        .unwrap();
    let mark = |success: bool| {
        sqlx::query("UPDATE _sqlx_migrations SET success = $1 WHERE version = $2")
            .bind(success)
            .bind(latest)
            .execute(app.db.pool())
    };
    mark(false).await.unwrap();
    let response = app.get("/readyz", None).await;
    assert_eq!(response.status(), 503);
    let body: Value = response.json().await.unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("migrations pending") && message.contains(&latest.to_string()),
        "{message}"
    );
    mark(true).await.unwrap();
    assert_eq!(app.get("/readyz", None).await.status(), 200);
}

/// A Postgres cluster of the test's own under a temporary directory (stopping the shared one
/// would fail every other test), stopped when the test ends whatever happened.
struct OwnCluster {
    root: PathBuf,
    _dir: tempfile::TempDir,
}

impl OwnCluster {
    const OPTIONS: EmbeddedOptions = EmbeddedOptions {
        unsafe_fast: true,
        keep_running: true,
    };

    async fn start() -> (Self, TestDb) {
        let dir = tempfile::Builder::new().prefix("arcpg").tempdir().unwrap();
        // Reachable by the postgres user, so that as root the cluster's files stay in the
        // directory removed at the end (not under /var/lib/arc-rec/clusters).
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let root = dir.path().to_owned();
        let target = DatabaseTarget::Embedded {
            root: root.clone(),
            options: Self::OPTIONS,
        };
        let database = Database::open(&target).await.expect("start a cluster");
        database.migrate().await.unwrap();
        let url = database.libpq_url().to_owned();
        (Self { root, _dir: dir }, TestDb { database, url })
    }

    async fn stop(&self) {
        let root = self.root.clone();
        let stopped = tokio::task::spawn_blocking(move || EmbeddedPostgres::stop_cluster(&root))
            .await
            .unwrap()
            .unwrap();
        assert!(stopped);
    }

    async fn restart(&self) {
        let root = self.root.clone();
        tokio::task::spawn_blocking(move || EmbeddedPostgres::start(&root, Self::OPTIONS))
            .await
            .unwrap()
            .expect("restart the cluster");
    }
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        let _ = EmbeddedPostgres::stop_cluster(&self.root);
    }
}

/// Sends `body` to `path` and returns the status, the error code and how long it took.
async fn timed_post(app: &TestApp, path: &str, body: &Value) -> (u16, Option<String>, Duration) {
    let started = Instant::now();
    let response = app.post(path, Some(&app.platform_key), body).await;
    let status = response.status().as_u16();
    let code = response
        .json::<Value>()
        .await
        .ok()
        .and_then(|b| b["error"]["code"].as_str().map(str::to_owned));
    (status, code, started.elapsed())
}

/// Postgres stopped under a running service: every request fails within the pool's acquire
/// timeout (plus slack for a slow machine) with 503 and a JSON body, `/readyz` says so; started
/// again, the service recovers by itself, and what it acknowledged before and after is there.
#[tokio::test]
async fn while_postgres_is_down_requests_fail_fast_and_the_service_recovers_by_itself() {
    let (cluster, db) = OwnCluster::start().await;
    let app = Box::pin(spawn_app_on(db, "acme", Limits::default())).await;
    let lines = contract_lines();
    let record = |i: usize| serde_json::from_str::<Value>(&lines[i]).unwrap();
    let (status, _, _) = timed_post(&app, "/v1/trajectories", &record(0)).await;
    assert_eq!(status, 201);

    cluster.stop().await;
    let bound = ACQUIRE_TIMEOUT + Duration::from_secs(5);
    for (path, body) in [
        ("/v1/trajectories", record(1)),
        ("/v1/recommendations", contract_request()),
    ] {
        let (status, code, took) = timed_post(&app, path, &body).await;
        assert_eq!(
            (status, code.as_deref()),
            (503, Some("unavailable")),
            "{path}"
        );
        assert!(took < bound, "{path} took {took:?}, over {bound:?}");
    }
    assert_eq!(app.get("/readyz", None).await.status(), 503);

    cluster.restart().await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while app.get("/readyz", None).await.status() != 200 {
        assert!(
            Instant::now() < deadline,
            "not ready 20 s after the restart"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (status, _, _) = timed_post(&app, "/v1/trajectories", &record(1)).await;
    assert_eq!(status, 201);
    let (status, _, _) = timed_post(&app, "/v1/recommendations", &contract_request()).await;
    assert_eq!(status, 200);
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM decision_log")
        .fetch_one(app.db.pool())
        .await
        .unwrap();
    assert_eq!(stored, 1, "the one acknowledged decision");
}

/// Every pooled connection taken (a stuck query per connection, a flood): a request waits the
/// pool's acquire timeout, then gets 503, not a hang.
#[tokio::test]
async fn an_exhausted_pool_answers_503_after_the_acquire_timeout() {
    let app = spawn_app().await;
    let pool = app.db.pool();
    let mut held = Vec::new();
    while let Ok(Ok(connection)) =
        tokio::time::timeout(Duration::from_millis(500), pool.acquire()).await
    {
        held.push(connection);
    }
    assert_eq!(held.len(), pool.options().get_max_connections() as usize);
    let line: Value = serde_json::from_str(&contract_lines()[0]).unwrap();
    let (status, code, took) = timed_post(&app, "/v1/trajectories", &line).await;
    assert_eq!((status, code.as_deref()), (503, Some("unavailable")));
    assert!(
        took >= ACQUIRE_TIMEOUT && took < ACQUIRE_TIMEOUT + Duration::from_secs(5),
        "{took:?}"
    );
    drop(held);
    let (status, _, _) = timed_post(&app, "/v1/trajectories", &line).await;
    assert_eq!(status, 201);
}

/// Analyst queries run in a pool of their own (a bulkhead): with every serving connection
/// taken they still answer; that pool holds one connection without parallel workers, and a
/// statement past its timeout
/// is cancelled and counted as "unavailable" (503), not as a server error.
#[tokio::test]
async fn analyst_queries_have_a_pool_of_their_own_with_a_statement_timeout() {
    let app = spawn_app().await;
    let pool = app.db.pool();
    let acceptance = "/v1/analytics/acceptance?group_by=type";
    // The key is checked against the database once, then cached.
    let response = app.get(acceptance, Some(&app.analyst_key)).await;
    assert_eq!(response.status(), 200);
    let mut held = Vec::new();
    while let Ok(Ok(connection)) =
        tokio::time::timeout(Duration::from_millis(500), pool.acquire()).await
    {
        held.push(connection);
    }
    assert_eq!(held.len(), pool.options().get_max_connections() as usize);
    let response = app.get(acceptance, Some(&app.analyst_key)).await;
    assert_eq!(response.status(), 200);
    drop(held);

    let analytics = arc_rec::storage::analytics_pool(&pool.connect_options());
    assert_eq!(
        analytics.options().get_max_connections(),
        arc_rec::storage::ANALYTICS_CONNECTIONS
    );
    let timeout: String = sqlx::query_scalar("SHOW statement_timeout")
        .fetch_one(&analytics)
        .await
        .unwrap();
    assert_eq!(timeout, arc_rec::storage::ANALYTICS_STATEMENT_TIMEOUT);
    let workers: String = sqlx::query_scalar("SHOW max_parallel_workers_per_gather")
        .fetch_one(&analytics)
        .await
        .unwrap();
    assert_eq!(workers, "0");
    let mut connection = analytics.acquire().await.unwrap();
    sqlx::query("SET statement_timeout = '50ms'")
        .execute(&mut *connection)
        .await
        .unwrap();
    let cancelled = sqlx::query("SELECT pg_sleep(2)")
        .execute(&mut *connection)
        .await
        .unwrap_err();
    assert!(
        arc_rec::storage::sqlx_unavailable(&cancelled),
        "{cancelled}"
    );
}

/// `arc-rec serve` as a process, SIGTERM while requests are in flight: it stops accepting,
/// answers what it accepted, stores its learners' snapshots and exits 0; every decision it
/// answered 200 is in the database;
/// and nothing it logged (at trace level, SQL included) holds a key's secret, its hash or a rejected key.
#[tokio::test]
async fn sigterm_drains_in_flight_requests_and_loses_no_acknowledged_decision() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    let db = crate::helpers::fresh_database().await;
    let org = arc_rec::domain::OrgId::parse("acme").unwrap();
    let key = arc_rec::auth::create_key(
        db.pool(),
        &org,
        arc_rec::auth::Role::Platform,
        None,
        Default::default(),
    )
    .await
    .unwrap()
    .token;
    let mut server = Command::new(assert_cmd::cargo::cargo_bin("arc-rec"))
        .env("DATABASE_URL", &db.url)
        .env_remove("ARC_REC_DATA_DIR")
        // Everything the service logs, to check below that no key is in it.
        .env("RUST_LOG", "trace")
        .env("ARC_REC_LOG_FORMAT", "json")
        .args(["serve", "--listen", "127.0.0.1:0", "--workers", "2"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(server.stderr.take().unwrap()).lines();
    let port: u16 = loop {
        let line = stderr.next().expect("serve exited early").unwrap();
        if let Some(rest) = line.split("(port ").nth(1) {
            break rest.trim_end_matches(')').parse().unwrap();
        }
    };
    // Keep the rest of stderr (and never let the server block on a full pipe).
    let logged = std::thread::spawn(move || stderr.map_while(Result::ok).collect::<Vec<_>>());
    let url = format!("http://127.0.0.1:{port}/v1/recommendations");
    let client = reqwest::Client::new();
    // One request answered before the others are sent: acme's state (and its learner) is
    // loaded whatever the machine's speed, so there is a learner to snapshot at SIGTERM.
    let first = client
        .post(&url)
        .bearer_auth(&key)
        .json(&contract_request())
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), 200);
    let first: Value = first.json().await.unwrap();
    let requests: Vec<_> = (0..60)
        .map(|i| {
            let (client, url, key) = (client.clone(), url.clone(), key.clone());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(10 * i)).await;
                let response = client
                    .post(&url)
                    .bearer_auth(&key)
                    .json(&contract_request())
                    .send()
                    .await;
                match response {
                    Ok(response) => {
                        let status = response.status().as_u16();
                        let body: Value = response.json().await.unwrap_or(Value::Null);
                        Some((status, body["event_id"].as_str().map(str::to_owned)))
                    }
                    // Sent after the listener closed: refused, never acknowledged.
                    Err(_) => None,
                }
            })
        })
        .collect();
    // A forged key of the right shape (an unknown id) and a real id with a wrong secret.
    let forged = format!("arc_{}_{}", "ab".repeat(8), "cd".repeat(32));
    let wrong_secret = format!("{}{}", &key[..21], "ef".repeat(32));
    for token in [&forged, &wrong_secret] {
        let response = client
            .post(&url)
            .bearer_auth(token)
            .json(&contract_request())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 401);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pid = nix::unistd::Pid::from_raw(i32::try_from(server.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let mut acknowledged = vec![first["event_id"].as_str().unwrap().to_owned()];
    let mut refused = 0;
    for request in requests {
        match request.await.unwrap() {
            Some((200, Some(event))) => acknowledged.push(event),
            Some((status, _)) => assert_eq!(status, 503, "only 200 or 503 while stopping"),
            None => refused += 1,
        }
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = server.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "serve still running 15 s after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(status.success(), "{status}");
    let logged = logged.join().unwrap().join("\n");
    // The learner of acme (loaded by a request, on an HTTP worker) outlived the workers and
    // stored its snapshot, so the next start replays nothing.
    let snapshots: i64 =
        sqlx::query_scalar("SELECT count(*) FROM bandit_state WHERE org_id = 'acme'")
            .fetch_one(db.pool())
            .await
            .unwrap();
    let about_snapshots: Vec<&str> = logged
        .lines()
        .filter(|line| line.contains("snapshot") || line.contains("learner"))
        .collect();
    assert_eq!(
        snapshots, 1,
        "no snapshot stored at shutdown; the server logged: {about_snapshots:#?}"
    );
    assert!(
        acknowledged.len() > 1 && refused > 0,
        "{} acknowledged, {refused} refused: SIGTERM came too early or too late",
        acknowledged.len()
    );
    let found: i64 =
        sqlx::query_scalar("SELECT count(*) FROM decision_log WHERE event_id::text = ANY($1)")
            .bind(&acknowledged)
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(
        found as usize,
        acknowledged.len(),
        "acknowledged decisions missing"
    );

    // No key, secret or its hash in anything the server logged.
    assert!(logged.lines().count() > 10, "the server logged: {logged}");
    let secret = key.rsplit('_').next().unwrap();
    let hash: String = sqlx::query_scalar("SELECT secret_hash FROM api_keys LIMIT 1")
        .fetch_one(db.pool())
        .await
        .unwrap();
    for (what, needle) in [
        ("the key's secret", secret),
        ("the secret's hash", hash.as_str()),
        ("a forged key", &forged[21..]),
        ("a wrong secret", &wrong_secret[21..]),
    ] {
        assert!(!logged.contains(needle), "{what} is in the server's log");
    }
}
