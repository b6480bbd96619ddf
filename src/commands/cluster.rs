//! `arc-rec cluster`: cluster every organization's failure patterns (or one's), keep cluster ids
//! stable across runs, and store the model that places new failures at request time.

use std::time::Instant;

use anyhow::Context;
use clap::Args;
use serde::Serialize;

use crate::clustering::quality::{Agreement, agreement};
use crate::clustering::{
    ClusterModel, ClusterOptions, FitSummary, MAX_CLUSTERS, MAX_DIMS, MIN_DIMS, Previous, fit_org,
};
use crate::progress;
use crate::storage::Database;
use crate::storage::clusters::{ClusterTx, orgs_with_patterns};

/// Arguments of `arc-rec cluster`.
#[derive(Debug, Args)]
pub struct ClusterArgs {
    /// Only this organization.
    #[arg(long)]
    pub org: Option<String>,
    /// Number of clusters (default: chosen by silhouette).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=MAX_CLUSTERS as i64))]
    pub k: Option<u16>,
    /// Reduced dimension of the failure embedding (the bandit's cluster-context size).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(MIN_DIMS as i64..=MAX_DIMS as i64))]
    pub dims: u16,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// One organization's run, as reported.
#[derive(Debug, Serialize)]
struct OrgReport {
    #[serde(flatten)]
    summary: FitSummary,
    /// Agreement of clusters with each pattern's exception class (the last unrecovered error
    /// event's `error_type`); on `arc-rec simulate` data that class is the latent failure mode.
    error_type_agreement: Option<Agreement>,
    seconds: f64,
}

/// Runs the clustering for every organization (or `--org`), one transaction each.
pub async fn run(args: &ClusterArgs, database: &Database) -> anyhow::Result<()> {
    let started = Instant::now();
    let pool = database.pool();
    let orgs = orgs_with_patterns(pool, args.org.as_deref()).await?;
    if let Some(org) = &args.org
        && orgs.is_empty()
    {
        anyhow::bail!("organization {org:?} has no failure patterns to cluster");
    }
    let options = ClusterOptions {
        dims: usize::from(args.dims),
        k: args.k.map(usize::from),
        ..ClusterOptions::default()
    };
    let bar = progress::bar(orgs.len() as u64, "orgs", false);
    let mut reports = Vec::with_capacity(orgs.len());
    for org in &orgs {
        bar.set_message(org.clone());
        let org_started = Instant::now();
        let mut tx = ClusterTx::begin(pool, org).await?;
        let patterns = tx.patterns().await?;
        let (stored, cluster_ids) = tx.previous().await?;
        let model = match stored.map(ClusterModel::from_stored).transpose() {
            Ok(model) => model,
            Err(err) => {
                // A broken stored model must not block re-clustering; ids still never repeat.
                tracing::warn!(org = %org, "ignoring the stored cluster model: {err}");
                None
            }
        };
        let previous = Previous { model, cluster_ids };
        let (org_id, opts) = (org.clone(), options.clone());
        let (fit, agreement) = tokio::task::spawn_blocking(move || {
            let fit = fit_org(&org_id, &patterns, &previous, &opts)?;
            let classes: Vec<Option<&String>> =
                patterns.iter().map(|p| p.error_types.last()).collect();
            let clusters: Vec<&str> = fit
                .assignments
                .iter()
                .map(|a| a.cluster_id.as_str())
                .collect();
            let agreement = classes
                .iter()
                .all(Option::is_some)
                .then(|| agreement(&clusters, &classes))
                .flatten();
            Ok::<_, crate::clustering::ClusterError>((fit, agreement))
        })
        .await
        .context("clustering task failed")?
        .with_context(|| format!("cannot cluster organization {org}"))?;
        tx.save(fit.model.stored(), &fit.assignments).await?;
        tx.commit().await?;
        reports.push(OrgReport {
            summary: fit.summary,
            error_type_agreement: agreement,
            seconds: org_started.elapsed().as_secs_f64(),
        });
        bar.inc(1);
    }
    bar.finish_and_clear();
    let seconds = started.elapsed().as_secs_f64();
    if args.json {
        println!(
            "{}",
            serde_json::json!({"orgs": reports, "seconds": seconds})
        );
        return Ok(());
    }
    print_reports(&reports);
    println!(
        "clustered {} organizations in {seconds:.1} s",
        reports.len()
    );
    Ok(())
}

fn print_reports(reports: &[OrgReport]) {
    println!(
        "{:<16} {:<7} {:<16} {:>4} {:>8} {:>5} {:>5} {:>4} {:>7} {:>10} {:>7} {:>6} {:>6}",
        "org",
        "method",
        "featurizer",
        "k",
        "patterns",
        "dims",
        "kept",
        "new",
        "retired",
        "silhouette",
        "purity",
        "ARI",
        "secs"
    );
    for r in reports {
        let s = &r.summary;
        let figure = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.3}"));
        println!(
            "{:<16} {:<7} {:<16} {:>4} {:>8} {:>5} {:>5} {:>4} {:>7} {:>10} {:>7} {:>6} {:>6.1}",
            s.org_id,
            s.method,
            s.featurizer.as_str(),
            s.k,
            s.patterns,
            s.dims,
            s.ids_kept,
            s.ids_new,
            s.retired.len(),
            figure(s.silhouette),
            figure(r.error_type_agreement.map(|a| a.purity)),
            figure(r.error_type_agreement.map(|a| a.adjusted_rand_index)),
            r.seconds
        );
        for (id, label, size) in &s.clusters {
            if id == label {
                println!("    {size:>6}  {id}");
            } else {
                println!("    {size:>6}  {id} ({label})");
            }
        }
    }
    println!("purity and ARI: agreement with the patterns' exception classes (error_type)");
}
