//! Test databases: one embedded cluster per test run (under `target/tmp`, left running for the
//! next test process; `scripts/test.sh` stops it), and a fresh database per test cloned from a
//! migrated template, so every test starts from an empty, current schema.

use std::path::PathBuf;
use std::sync::OnceLock;

use arc_rec::storage::{self, Database, EmbeddedOptions, EmbeddedPostgres};
use sqlx::{Connection, Executor};

/// Where the test cluster lives.
pub fn cluster_dir() -> PathBuf {
    std::env::var_os("ARC_REC_TEST_PG_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_TARGET_TMPDIR"), "/pg")))
}

fn cluster() -> &'static EmbeddedPostgres {
    static CLUSTER: OnceLock<EmbeddedPostgres> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let options = EmbeddedOptions {
            unsafe_fast: true,
            keep_running: true,
        };
        EmbeddedPostgres::start(&cluster_dir(), options).expect("start the test cluster")
    })
}

/// A template named after the migrations it holds, so a changed migration gets a new one.
fn template_name() -> String {
    let mut hasher = std::hash::DefaultHasher::new();
    for migration in storage::MIGRATOR.iter() {
        std::hash::Hash::hash(&migration.checksum, &mut hasher);
    }
    format!(
        "arc_rec_template_{:016x}",
        std::hash::Hasher::finish(&hasher)
    )
}

async fn ensure_template(cluster: &EmbeddedPostgres) -> String {
    let name = template_name();
    let admin = cluster.connect_options("postgres");
    let mut conn = sqlx::PgConnection::connect_with(&admin)
        .await
        .expect("connect to the test cluster");
    // Serialise template creation across test processes (nextest runs each test in its own).
    conn.execute("SELECT pg_advisory_lock(4242)")
        .await
        .expect("lock");
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(&name)
            .fetch_one(&mut conn)
            .await
            .expect("look up template");
    if !exists {
        let building = format!("{name}_building");
        conn.execute(format!("DROP DATABASE IF EXISTS {building}").as_str())
            .await
            .expect("drop stale template");
        storage::create_database(&admin, &building, None)
            .await
            .expect("create template");
        let db = Database::open_with(
            cluster.connect_options(&building),
            String::new(),
            PathBuf::new(),
        )
        .await
        .expect("open template");
        db.migrate().await.expect("migrate template");
        db.close().await.expect("close template");
        conn.execute(format!("ALTER DATABASE {building} RENAME TO {name}").as_str())
            .await
            .expect("publish template");
    }
    conn.execute("SELECT pg_advisory_unlock(4242)")
        .await
        .expect("unlock");
    conn.close().await.expect("close");
    name
}

/// A fresh, migrated, empty database of its own.
pub async fn fresh_database() -> TestDb {
    let cluster = cluster();
    let template = ensure_template(cluster).await;
    let name = format!("test_{}", uuid_like());
    storage::create_database(&cluster.connect_options("postgres"), &name, Some(&template))
        .await
        .expect("create test database");
    let database = Database::open_with(
        cluster.connect_options(&name),
        cluster.libpq_url(&name),
        cluster.bin_dir().join("psql"),
    )
    .await
    .expect("open test database");
    TestDb {
        database,
        url: cluster.libpq_url(&name),
    }
}

/// A test's database and the URL the binary can reach it by.
pub struct TestDb {
    pub database: Database,
    /// libpq URL (unix socket), for `DATABASE_URL`.
    pub url: String,
}

impl TestDb {
    /// The pool.
    pub fn pool(&self) -> &sqlx::PgPool {
        self.database.pool()
    }

    /// A small pool on the calling test's own runtime. A `TestDb` shared between tests (a
    /// static fixture) keeps the pool of the runtime that made it, whose connections fail once
    /// that test has ended ("a Tokio context ... is being shutdown").
    pub async fn pool_here(&self) -> sqlx::PgPool {
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .connect_with(self.database.connect_options().clone())
            .await
            .expect("connect to the test database")
    }

    /// Row counts of every platform table.
    pub async fn counts(&self) -> Vec<(String, i64)> {
        storage::record_writer::table_counts(self.pool())
            .await
            .expect("count rows")
            .into_iter()
            .map(|(k, n)| (k.as_str().to_owned(), n))
            .collect()
    }
}

fn uuid_like() -> String {
    use rand::Rng;
    let mut rng = rand::rng();
    format!("{:016x}{:08x}", rng.random::<u64>(), std::process::id())
}

/// Path of a file under `tests/fixtures`.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// Writes `lines` to a temporary JSON-lines file.
pub fn jsonl_file(lines: &[String]) -> tempfile::NamedTempFile {
    use std::io::Write;
    let mut file = tempfile::Builder::new()
        .suffix(".jsonl")
        .tempfile()
        .expect("temp file");
    for line in lines {
        writeln!(file, "{line}").expect("write temp file");
    }
    file.flush().expect("flush temp file");
    file
}

/// The CONTRACTS.md ingest examples, one string per line.
pub fn contract_lines() -> Vec<String> {
    std::fs::read_to_string(fixture("contracts.jsonl"))
        .expect("read contracts fixture")
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The `arc-rec` binary pointed at `url` (and never at an embedded cluster).
pub fn arc_rec(url: &str) -> assert_cmd::Command {
    let mut cmd = assert_cmd::Command::cargo_bin("arc-rec").expect("binary built");
    cmd.env("DATABASE_URL", url).env_remove("ARC_REC_DATA_DIR");
    cmd
}

/// A running API server on a fresh database, with one key per role.
pub struct TestApp {
    pub db: TestDb,
    pub address: String,
    pub platform_key: String,
    pub analyst_key: String,
    pub admin_key: String,
    pub client: reqwest::Client,
    /// The server's serving state (its bandit policies).
    pub serving: std::sync::Arc<arc_rec::recommend::service::Serving>,
    handle: actix_web::dev::ServerHandle,
}

impl TestApp {
    /// `POST path` with `body` as JSON, authenticated with `key` when given.
    pub async fn post(
        &self,
        path: &str,
        key: Option<&str>,
        body: &serde_json::Value,
    ) -> reqwest::Response {
        let mut request = self
            .client
            .post(format!("{}{path}", self.address))
            .json(body);
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        request.send().await.expect("request sent")
    }

    /// `GET path`, authenticated with `key` when given.
    pub async fn get(&self, path: &str, key: Option<&str>) -> reqwest::Response {
        let mut request = self.client.get(format!("{}{path}", self.address));
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        request.send().await.expect("request sent")
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        drop(self.handle.stop(false));
    }
}

/// Starts the API on port 0 over a fresh database (zero-to-production's `spawn_app`).
pub async fn spawn_app() -> TestApp {
    spawn_app_with(Limits::default()).await
}

/// The server's limits a test may tighten (the rest of its settings are `serve`'s defaults).
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest request body, bytes.
    pub body: usize,
    /// Longest handling of one request.
    pub handling: std::time::Duration,
    /// How long a verified key is trusted without asking the database.
    pub key_cache_ttl: std::time::Duration,
    /// Each role's daily quota (none by default, as `serve`'s).
    pub quotas: arc_rec::auth::RoleQuotas,
    /// The server's count of each key's requests today (share one to look into it; tests
    /// store it with `storage::api_keys::store_usage` where `serve` would every second).
    pub quota_ledger: std::sync::Arc<arc_rec::quota::QuotaLedger>,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            body: arc_rec::api::DEFAULT_BODY_LIMIT,
            handling: arc_rec::api::DEFAULT_HANDLING_TIMEOUT,
            key_cache_ttl: arc_rec::auth::KeyCache::TTL,
            quotas: Default::default(),
            quota_ledger: Default::default(),
        }
    }
}

/// [`spawn_app`] with custom limits.
pub async fn spawn_app_with(limits: Limits) -> TestApp {
    let db = fresh_database().await;
    Box::pin(spawn_app_on(db, "acme", limits)).await
}

/// One more server (a replica) over `pool`'s database with `limits`: its address, serving state
/// and handle. [`spawn_app_on`] starts its first one with this.
pub async fn spawn_server(
    pool: &sqlx::PgPool,
    limits: Limits,
) -> (
    String,
    std::sync::Arc<arc_rec::recommend::service::Serving>,
    actix_web::dev::ServerHandle,
) {
    let serving = arc_rec::recommend::service::Serving::start(pool.clone())
        .await
        .expect("serving state");
    let state = arc_rec::api::state::AppState {
        serving: serving.clone(),
        pool: pool.clone(),
        analytics_pool: arc_rec::storage::analytics_pool(&pool.connect_options()),
        keys: arc_rec::auth::KeyCache::with_ttl(limits.key_cache_ttl),
        metrics: telemetry::Metrics::new("arc_rec_test").expect("metrics"),
        body_limit: limits.body,
        handling_timeout: limits.handling,
        rate_limits: Default::default(),
        limiter: Default::default(),
        quotas: limits.quotas,
        quota_ledger: limits.quota_ledger.clone(),
        request_schemas: arc_rec::api::request_schemas::RequestSchemas::served()
            .expect("request schemas"),
    };
    let settings = arc_rec::api::ServerSettings {
        listen: "127.0.0.1:0".into(),
        workers: 1,
        keep_alive: arc_rec::api::DEFAULT_KEEP_ALIVE,
    };
    let app = arc_rec::api::Application::build(&settings, state).expect("bind");
    let address = format!("http://127.0.0.1:{}", app.port());
    let handle = app.handle();
    tokio::spawn(app.run_until_stopped());
    (address, serving, handle)
}

/// Starts the API over `db` (as it is: data, clusters, model candidates), with one key per role
/// for organization `org`.
pub async fn spawn_app_on(db: TestDb, org: &str, limits: Limits) -> TestApp {
    use arc_rec::auth::{Role, create_key};
    let org = arc_rec::domain::OrgId::parse(org).unwrap();
    let key = |role| create_key(db.pool(), &org, role, None, Default::default());
    let platform_key = key(Role::Platform).await.unwrap().token;
    let analyst_key = key(Role::Analyst).await.unwrap().token;
    let admin_key = key(Role::Admin).await.unwrap().token;
    let (address, serving, handle) = Box::pin(spawn_server(db.pool(), limits)).await;
    TestApp {
        db,
        address,
        platform_key,
        analyst_key,
        admin_key,
        client: reqwest::Client::new(),
        serving,
        handle,
    }
}

/// Runs a prepared `arc-rec` command, insisting it succeeds; returns its stdout.
pub fn run(cmd: &mut assert_cmd::Command) -> String {
    let output = cmd.output().expect("run arc-rec");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// `arc-rec model init --preset tiny` into `out`, its tokenizer trained on 300 outcomes of the
/// database at `url` (enough for the tests' training runs, and quick).
/// The small synthetic world behind the training tests' data (the world grader is told the same
/// through [`world_grader_args`]).
pub const TRAINING_WORLD_SEED: &str = "3";
pub const TRAINING_WORLD_OUTCOMES: &str = "1500";

/// `--world-seed` and `--world-outcomes` of [`TRAINING_WORLD_SEED`]'s world.
pub fn world_grader_args() -> [&'static str; 4] {
    [
        "--world-seed",
        TRAINING_WORLD_SEED,
        "--world-outcomes",
        TRAINING_WORLD_OUTCOMES,
    ]
}

/// Simulates the training world into `url`'s database, clusters `cluster_org` (if any), exports
/// it to `dir/examples.jsonl` and writes a tiny model to `dir/tiny`.
pub fn training_world(url: &str, dir: &std::path::Path, cluster_org: Option<&str>) {
    run(arc_rec(url).args([
        "simulate",
        "--seed",
        TRAINING_WORLD_SEED,
        "--outcomes",
        TRAINING_WORLD_OUTCOMES,
    ]));
    if let Some(org) = cluster_org {
        run(arc_rec(url).args(["cluster", "--org", org]));
    }
    run(arc_rec(url)
        .args(["export", "--out"])
        .arg(dir.join("examples.jsonl")));
    init_tiny_model(url, &dir.join("tiny"));
}

fn init_tiny_model(url: &str, out: &std::path::Path) {
    run(arc_rec(url)
        .args([
            "model",
            "init",
            "--preset",
            "tiny",
            "--corpus-outcomes",
            "300",
        ])
        .arg("--out")
        .arg(out));
}

/// The request of CONTRACTS.md, verbatim.
pub fn contract_request() -> serde_json::Value {
    serde_json::json!({
      "failure_context": {
        "failure_cluster_embedding": [0.01, -0.2, 0.33],
        "failures": [{"failure_category": "timeout", "error_message": "web_search timed out after 5000 ms", "tool_name": "web_search"}],
        "outcome_ids": ["o1"]
      },
      "current_config": {"model": "openai/gpt-4.1", "temperature": 0.7, "tools": [{"name": "web_search"}], "retry": {"max_attempts": 1}, "timeout_s": 30},
      "user_context": {"user_role": "senior_ml_engineer", "domain": "fintech"},
      "k": 3,
      "max_cost_increase_usd_per_run": 0.05
    })
}

/// Waits (up to `timeout`) until `serving`'s policy for `org` has done its warm start and learned
/// `n` answers besides; returns it.
pub async fn wait_for_answers(
    serving: &arc_rec::recommend::service::Serving,
    org: &str,
    n: u64,
    timeout: std::time::Duration,
) -> std::sync::Arc<bandit::ThompsonPolicy> {
    let step = std::time::Duration::from_millis(100);
    for _ in 0..timeout.as_millis() / step.as_millis() {
        if let Some(warm) = serving.warm_start(org)
            && let Some(policy) = serving
                .policy(org)
                .filter(|p| p.observations() == n + warm.matched)
        {
            return policy;
        }
        tokio::time::sleep(step).await;
    }
    panic!(
        "{org}'s policy did not reach {n} answers; has {:?} observations, warm start {:?}",
        serving.policy(org).map(|p| p.observations()),
        serving.warm_start(org)
    );
}
