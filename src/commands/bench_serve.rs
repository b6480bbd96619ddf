//! `arc-rec bench serve`: the HTTP recommendation path under fixed request rates.
//!
//! Sets up an organization of its own (`bench-serve`) in the database: a simulated history with
//! 64-dimensional failure embeddings, clustered, plus recommender-model candidates so every
//! request ranks the 50-candidate maximum. Then it starts `arc-rec serve` as a child process and,
//! for each rate, runs `arc-rec bench load` as another process (open loop, latency from the
//! scheduled send time). Every 200 includes the durable decision-log write.

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use serde_json::Value;

use super::server_process::ServerProcess;
use crate::http_load::LoadReport;
use crate::recommend::serve_bench::{self, EMBEDDING_DIM, ORG, ServeBench, highest_sustained_rate};
use crate::storage::Database;

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

/// Runs the benchmark.
pub async fn run(args: &BenchServeArgs, database: &Database) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("cannot find the arc-rec binary")?;
    let key = prepare_org(&exe, database).await?;
    // Measure the steady state, not the tail of the load: a fresh cluster would otherwise vacuum
    // and checkpoint the history during the first rate (measured: 1,801 errors at 1,000/s).
    database.settle_after_bulk_load().await?;
    let bodies = serve_bench::request_bodies(500)?;
    let file = tempfile::NamedTempFile::new()?;
    write_bodies(&file, &bodies)?;

    let workers = args.workers.map(|w| w.to_string());
    let extra: Vec<&str> = match &workers {
        Some(w) => vec!["--workers", w],
        None => vec![],
    };
    let mut server = ServerProcess::start(&exe, database, &extra)?;
    let ranked = probe(server.port, &key, &bodies[0], database).await?;
    if let Some(dir) = &args.latency_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let reports = drive_rates(args, &exe, server.port, file.path(), &key).await?;
    let peak = server.peak_rss_mb();
    server.stop();

    let result = ServeBench {
        candidates_per_request: ranked,
        embedding_dim: EMBEDDING_DIM,
        highest_sustained_rate: highest_sustained_rate(&reports, args.sustained_share),
        rates: reports,
        server_peak_rss_mb: peak,
    };
    if args.json {
        println!("{}", serde_json::to_string(&result)?);
    } else {
        print_table(&result);
    }
    Ok(())
}

/// Gives the benchmark's organization a simulated history with embeddings (`arc-rec simulate`),
/// its clusters (`arc-rec cluster`), the model candidates and a platform key; returns the key.
async fn prepare_org(exe: &Path, database: &Database) -> anyhow::Result<String> {
    let url = database.libpq_url().to_owned();
    let child = |args: &[&str]| -> anyhow::Result<()> {
        let output = Command::new(exe)
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
    Ok(serve_bench::add_model_candidates_and_key(database.pool()).await?)
}

/// Writes the request bodies as JSON lines.
fn write_bodies(file: &tempfile::NamedTempFile, bodies: &[String]) -> anyhow::Result<()> {
    let mut out = std::io::BufWriter::new(file.as_file());
    for body in bodies {
        writeln!(out, "{body}")?;
    }
    out.flush()?;
    Ok(())
}

/// Sends one request and checks the server recommended and logged it; returns how many
/// candidates it ranked.
async fn probe(port: u16, key: &str, body: &str, database: &Database) -> anyhow::Result<usize> {
    let first: Value = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/v1/recommendations"))
        .bearer_auth(key)
        .header("content-type", "application/json")
        .body(body.to_owned())
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
    Ok(serve_bench::candidates_ranked(database.pool(), event_id).await?)
}

/// Drives each rate in turn with `arc-rec bench load` in a process of its own, a second apart.
async fn drive_rates(
    args: &BenchServeArgs,
    exe: &Path,
    port: u16,
    bodies: &Path,
    key: &str,
) -> anyhow::Result<Vec<LoadReport>> {
    let mut reports = Vec::new();
    for (n, &rate) in args.rates.iter().enumerate() {
        eprintln!("driving {rate} requests/s for {} s...", args.duration);
        let mut load = Command::new(exe);
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
            .arg(bodies)
            .args([
                "--rate",
                &rate.to_string(),
                "--duration",
                &args.duration.to_string(),
            ])
            .env("ARC_REC_LOAD_KEY", key)
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
    Ok(reports)
}

fn print_table(result: &ServeBench) {
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
}
