//! `arc-rec bench serve`: the HTTP recommendation path under fixed request rates.
//!
//! Sets up an organization of its own (`bench-serve`) in the database: a simulated history with
//! 64-dimensional failure embeddings, clustered, plus recommender-model candidates so every
//! request ranks the 50-candidate maximum. Then it starts `arc-rec serve` as a child process and,
//! for each rate, runs `arc-rec bench load` as another process (open loop, latency from the
//! scheduled send time). Every 200 includes the durable decision-log write.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use rand::SeedableRng;
use serde::Serialize;
use serde_json::{Value, json};

use crate::commands::load::LoadReport;
use crate::domain::{Candidate, CandidateSource, OrgId, RecommendationType};
use crate::storage::Database;
use crate::world::{Environment, World, WorldParams};

/// The organization the benchmark owns.
const ORG: &str = "bench-serve";
/// Dimension of the failure-cluster embeddings the requests carry.
const EMBEDDING_DIM: usize = 64;

/// Arguments of `arc-rec bench serve`.
#[derive(Debug, Args)]
pub struct BenchServeArgs {
    /// Request rates to drive, per second.
    #[arg(long, value_delimiter = ',', default_value = "250,500,1000,1500,2000")]
    pub rates: Vec<u32>,
    /// Seconds measured per rate (after one second of warm-up). The default spans one period of
    /// the kernel's dirty-page writeback (30 s): where nothing paces it (a server on another
    /// Postgres) it stalls WAL flushes for tens of ms, and a shorter window holds that stall
    /// either once or not at all, so its p99 would swing with where the flush falls.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..=600))]
    pub duration: u32,
    /// HTTP worker threads of the server (default: one per core).
    #[arg(long)]
    pub workers: Option<usize>,
    /// A rate is sustained when this share of it completes without errors.
    #[arg(long, default_value_t = 0.98)]
    pub sustained_share: f64,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Write each rate's per-request latencies to DIR/latency-<N>-<rate>.csv (N counts the
    /// rates run; see `arc-rec bench load --latency-log`).
    #[arg(long, value_name = "DIR")]
    pub latency_dir: Option<std::path::PathBuf>,
}

#[derive(Debug, Serialize)]
struct ServeBench {
    candidates_per_request: usize,
    embedding_dim: usize,
    rates: Vec<LoadReport>,
    /// Highest rate completed at ≥ `sustained_share` of its target with < 1% errors.
    highest_sustained_rate: Option<u32>,
    server_peak_rss_mb: f64,
}

/// Runs the benchmark.
pub async fn run(args: &BenchServeArgs, database: &Database) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("cannot find the arc-rec binary")?;
    let url = database.libpq_url().to_owned();
    let child = |args: &[&str]| -> anyhow::Result<()> {
        let output = Command::new(&exe)
            .args(args)
            .env("DATABASE_URL", &url)
            .output()?;
        anyhow::ensure!(
            output.status.success(),
            "arc-rec {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(())
    };
    eprintln!("preparing organization {ORG}: history, clusters, model candidates...");
    let dim = EMBEDDING_DIM.to_string();
    child(&[
        "simulate",
        "--seed",
        "1",
        "--outcomes",
        "4000",
        "--orgs",
        ORG,
        "--embedding-dim",
        &dim,
    ])?;
    child(&["cluster", "--org", ORG])?;
    crate::storage::candidate_stats::save_model_candidates(
        database.pool(),
        ORG,
        "bench-model",
        "random-candidates",
        None,
        &model_candidates(),
    )
    .await?;
    let org = OrgId::parse(ORG).map_err(anyhow::Error::msg)?;
    let key = crate::auth::create_key(
        database.pool(),
        &org,
        crate::auth::Role::Platform,
        Some("bench serve"),
        Default::default(),
    )
    .await?;

    // Measure the steady state, not the tail of the load: a fresh cluster would otherwise vacuum
    // and checkpoint the history during the first rate (measured: 1,801 errors at 1,000/s).
    database.settle_after_bulk_load().await?;

    let bodies = tempfile::NamedTempFile::new()?;
    write_bodies(&bodies, 500)?;

    let mut server = start_server(&exe, database, args.workers)?;
    let port = server.port;
    let probe = reqwest::Client::new();
    let first: Value = probe
        .post(format!("http://127.0.0.1:{port}/v1/recommendations"))
        .bearer_auth(&key.token)
        .header("content-type", "application/json")
        .body(
            std::fs::read_to_string(bodies.path())?
                .lines()
                .next()
                .unwrap_or_default()
                .to_owned(),
        )
        .send()
        .await?
        .json()
        .await?;
    anyhow::ensure!(
        first["recommendations"].is_array(),
        "the server did not recommend: {first}"
    );
    let event_id: uuid::Uuid = first["event_id"]
        .as_str()
        .unwrap_or_default()
        .parse()
        .context("no event id")?;
    let (binary, json) =
        crate::storage::decisions::stored_candidate_set(database.pool(), ORG, event_id)
            .await?
            .context("the first decision was not logged")?;
    let ranked = crate::recommend::candidate_log::decode_stored(binary.as_deref(), json)?.len();

    if let Some(dir) = &args.latency_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let mut reports = Vec::new();
    for (n, &rate) in args.rates.iter().enumerate() {
        eprintln!("driving {rate} requests/s for {} s...", args.duration);
        let mut load = Command::new(&exe);
        load.args([
            "bench",
            "load",
            "--url",
            &format!("http://127.0.0.1:{port}/v1/recommendations"),
        ]);
        if let Some(dir) = &args.latency_dir {
            load.arg("--latency-log")
                .arg(dir.join(format!("latency-{}-{rate}.csv", n + 1)));
        }
        let output = load
            .arg("--bodies")
            .arg(bodies.path())
            .args([
                "--rate",
                &rate.to_string(),
                "--duration",
                &args.duration.to_string(),
            ])
            .env("ARC_REC_LOAD_KEY", &key.token)
            .output()
            .context("cannot run the load generator")?;
        anyhow::ensure!(
            output.status.success(),
            "load generator failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let report: LoadReport =
            serde_json::from_slice(&output.stdout).context("unreadable load report")?;
        reports.push(report);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let peak = server.peak_rss_mb();
    server.stop();

    let sustained = reports
        .iter()
        .filter(|r| {
            r.achieved_rate >= args.sustained_share * f64::from(r.target_rate)
                && (r.errors as f64) < 0.01 * r.sent.max(1) as f64
        })
        .map(|r| r.target_rate)
        .max();
    let result = ServeBench {
        candidates_per_request: ranked,
        embedding_dim: EMBEDDING_DIM,
        rates: reports,
        highest_sustained_rate: sustained,
        server_peak_rss_mb: peak,
    };
    if args.json {
        println!("{}", serde_json::to_string(&result)?);
        return Ok(());
    }
    println!(
        "POST /v1/recommendations: {} candidates ranked, {EMBEDDING_DIM}-dim embedding, decision logged durably",
        result.candidates_per_request
    );
    println!(
        "{:>8} {:>10} {:>8} {:>8} {:>9} {:>9} {:>9}",
        "rate/s", "achieved", "ok", "errors", "p50 ms", "p99 ms", "max ms"
    );
    let ms = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}"));
    for r in &result.rates {
        println!(
            "{:>8} {:>10.1} {:>8} {:>8} {:>9} {:>9} {:>9}",
            r.target_rate,
            r.achieved_rate,
            r.ok,
            r.errors,
            ms(r.p50_ms),
            ms(r.p99_ms),
            ms(r.max_ms)
        );
    }
    match result.highest_sustained_rate {
        Some(rate) => println!("highest sustained rate: {rate}/s"),
        None => println!("highest sustained rate: none of the rates tried"),
    }
    println!("server peak RSS: {:.1} MB", result.server_peak_rss_mb);
    println!("goal: p99 <= 10 ms at 1000 requests/s");
    Ok(())
}

/// Recommender-model candidates: many distinct valid changes, so the candidate set is full.
fn model_candidates() -> Vec<Candidate> {
    let mut diffs: Vec<(RecommendationType, Value)> = Vec::new();
    for t in 0..=12 {
        diffs.push((
            RecommendationType::Temperature,
            json!({"temperature": f64::from(t) * 0.1}),
        ));
    }
    for attempts in 2..=8 {
        for backoff in [1, 2, 5] {
            diffs.push((
                RecommendationType::RetryPolicy,
                json!({"retry": {"max_attempts": attempts, "backoff_s": backoff}}),
            ));
        }
    }
    for timeout in [20, 45, 60, 90, 120, 180, 240, 300] {
        diffs.push((
            RecommendationType::TimeoutAdjustment,
            json!({"timeout_s": timeout}),
        ));
    }
    for model in [
        "anthropic/claude-3-haiku",
        "google/gemini-1.5-flash",
        "mistral/mistral-large",
        "deepseek/deepseek-v3",
        "meta/llama-3.1-70b",
    ] {
        diffs.push((RecommendationType::ModelSwitch, json!({"model": model})));
    }
    diffs
        .into_iter()
        .map(|(kind, diff)| Candidate {
            candidate_id: Candidate::id_for(kind, &diff),
            description: format!("Model suggestion: {diff}"),
            recommendation_type: kind,
            diff,
            expected_reliability_delta: 0.05,
            expected_cost_delta_usd: 0.0,
            evidence_count: 3,
            source: CandidateSource::Model {
                model_version_id: "bench-model".to_owned(),
                prior: None,
            },
        })
        .collect()
}

/// Request bodies from the world's contexts, with 64-dimensional embeddings.
fn write_bodies(file: &tempfile::NamedTempFile, n: usize) -> anyhow::Result<()> {
    let world = World::new(WorldParams {
        seed: 1,
        outcomes: 0,
        orgs: vec![ORG.to_owned()],
        embedding_dim: Some(EMBEDDING_DIM),
        ..WorldParams::default()
    })?;
    let environment = Environment::new(&world);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let mut out = std::io::BufWriter::new(file.as_file());
    for _ in 0..n {
        let ctx = environment.next_context(&mut rng);
        let embedding = ctx
            .embedding
            .clone()
            .unwrap_or_else(|| vec![0.1; EMBEDDING_DIM]);
        let body = json!({
            "failure_context": {"failure_cluster_embedding": embedding, "failures": ctx.failures},
            "current_config": ctx.current_config,
            "user_context": {"user_role": ctx.user.role, "domain": ctx.user.domain},
            "k": 3,
        });
        writeln!(out, "{body}")?;
    }
    out.flush()?;
    Ok(())
}

struct ServerProcess {
    child: Child,
    port: u16,
}

fn start_server(
    exe: &std::path::Path,
    database: &Database,
    workers: Option<usize>,
) -> anyhow::Result<ServerProcess> {
    let mut command = Command::new(exe);
    // On the embedded cluster the server joins it as users do (and so paces its writeback);
    // a server named by URL is reached the same way as here.
    match database.embedded_root() {
        Some(root) => command
            .arg("--data-dir")
            .arg(root)
            .env_remove("DATABASE_URL"),
        None => command.env("DATABASE_URL", database.libpq_url()),
    };
    // The rates measured go past a platform key's default limit, and the bench measures
    // serving, not the limiter: platform keys are not limited here.
    command
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(["--rate-limit", "platform=off"])
        .stderr(Stdio::piped())
        .stdout(Stdio::null());
    if let Some(workers) = workers {
        command.args(["--workers", &workers.to_string()]);
    }
    let mut child = command.spawn().context("cannot start arc-rec serve")?;
    let stderr = child.stderr.take().context("no stderr")?;
    let mut lines = BufReader::new(stderr).lines();
    // `arc-rec serve` announces "listening on ... (port N)" on stderr once it is bound.
    let port = loop {
        let Some(line) = lines.next() else {
            let _ = child.kill();
            anyhow::bail!("arc-rec serve exited before listening");
        };
        let line = line?;
        if let Some(rest) = line.split("(port ").nth(1) {
            break rest
                .trim_end_matches(')')
                .parse::<u16>()
                .context("unreadable port")?;
        }
    };
    // Keep draining stderr so the server never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    Ok(ServerProcess { child, port })
}

impl ServerProcess {
    fn peak_rss_mb(&self) -> f64 {
        crate::commands::peak_memory::peak_rss_mb_of(&self.child.id().to_string())
    }

    fn stop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.child.wait();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.stop();
        }
    }
}
