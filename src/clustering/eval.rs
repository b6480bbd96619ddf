//! Measurement on the synthetic world: clusters versus the world's latent failure modes (purity,
//! adjusted Rand index), for the featurizer variants and the methods considered, and request-time
//! placement of held-out failures from their text alone.
//!
//! The latent mode of a pattern is ground truth: the world writes each mode's exception class as
//! the fatal error event's `error_type` (one class per mode), which is how it is read back here.
//! The figures in the README come from
//! `cargo test --release --lib clustering::eval::report -- --ignored --nocapture`.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use linfa::DatasetBase;
use linfa::traits::{Fit, Predict, Transformer};
use linfa_clustering::{Dbscan, GaussianMixtureModel};
use ndarray::Array2;
use rand_xoshiro::Xoshiro256Plus;
use rand_xoshiro::rand_core::SeedableRng;

use super::quality::agreement;
use super::*;
use crate::domain::records::RecordData;
use crate::world::{FailureMode, World, WorldParams};

/// A pattern with its latent mode.
pub(crate) struct Labelled {
    pub input: PatternInput,
    pub mode: &'static str,
}

/// The world's failure patterns per organization, with their outcome's trajectory facts.
pub(crate) fn world_patterns(
    seed: u64,
    outcomes: usize,
    embedding_dim: Option<usize>,
) -> BTreeMap<String, Vec<Labelled>> {
    let world = World::new(WorldParams {
        seed,
        outcomes,
        embedding_dim,
        ..WorldParams::default()
    })
    .expect("valid world");
    let mut trajectories = HashMap::new();
    let mut out: BTreeMap<String, Vec<Labelled>> = BTreeMap::new();
    for record in world.history() {
        match record.data {
            RecordData::Outcome(o) => {
                trajectories.insert(o.outcome_id.clone(), o.trajectory);
            }
            RecordData::FailurePattern(p) => {
                let Some(t) = trajectories.remove(&p.outcome_id) else {
                    continue;
                };
                let fatal: Vec<String> = t
                    .error_events
                    .iter()
                    .filter(|e| !e.recovery_successful)
                    .map(|e| e.error_type.clone())
                    .collect();
                let Some(mode) = fatal.last().and_then(|t| {
                    FailureMode::ALL
                        .iter()
                        .find(|m| m.error_type() == t)
                        .map(|m| m.label())
                }) else {
                    continue;
                };
                let mut tools: Vec<String> =
                    t.tool_calls.iter().map(|c| c.tool_name.clone()).collect();
                tools.dedup();
                let input = PatternInput {
                    pattern_id: p.pattern_id,
                    failure_type: p.failure_type,
                    failure_category: p.failure_category,
                    error_message: p.error_message,
                    error_embedding: p.error_embedding,
                    error_types: fatal,
                    failing_tools: t
                        .tool_calls
                        .iter()
                        .filter(|c| !c.success)
                        .map(|c| c.tool_name.clone())
                        .collect(),
                    tools,
                    providers: t
                        .llm_interactions
                        .iter()
                        .filter_map(|l| l.model.split_once('/').map(|(p, _)| p.to_owned()))
                        .take(1)
                        .collect(),
                    previous_cluster: None,
                };
                out.entry(record.org.as_str().to_owned())
                    .or_default()
                    .push(Labelled { input, mode });
            }
            _ => {}
        }
    }
    out
}

/// Purity and ARI of `fit_org` with `options` on every org, pooled over orgs (weighted by size).
pub(crate) fn measure(
    orgs: &BTreeMap<String, Vec<Labelled>>,
    options: &ClusterOptions,
) -> (f64, f64, f64) {
    let (mut purity, mut ari, mut k, mut n) = (0.0, 0.0, 0.0, 0.0);
    for (org, patterns) in orgs {
        let inputs: Vec<PatternInput> = patterns.iter().map(|p| p.input.clone()).collect();
        let fit = fit_org(org, &inputs, &Previous::default(), options).expect("fit");
        let clusters: Vec<&str> = fit
            .assignments
            .iter()
            .map(|a| a.cluster_id.as_str())
            .collect();
        let modes: Vec<&str> = patterns.iter().map(|p| p.mode).collect();
        let a = agreement(&clusters, &modes).expect("same length");
        let w = patterns.len() as f64;
        purity += a.purity * w;
        ari += a.adjusted_rand_index * w;
        k += fit.summary.k as f64 * w;
        n += w;
    }
    (purity / n, ari / n, k / n)
}

/// Reduced primary vectors of one org under `options` (through the fitted model).
fn reduced(org: &str, patterns: &[Labelled], options: &ClusterOptions) -> Array2<f64> {
    let inputs: Vec<PatternInput> = patterns.iter().map(|p| p.input.clone()).collect();
    let fit = fit_org(org, &inputs, &Previous::default(), options).expect("fit");
    let model = fit.model;
    let mut x = Array2::zeros((inputs.len(), options.dims));
    for (i, p) in inputs.iter().enumerate() {
        let z = match (&p.error_embedding, model.embedding_dim()) {
            (Some(e), Some(_)) => model.embedding_reduced(e).expect("valid embedding"),
            _ => model.text_reduced(&p.doc()),
        };
        x.row_mut(i)
            .assign(&ndarray::ArrayView1::from(z.as_slice()));
    }
    x
}

/// Held-out placement: fit on 80% of each org's patterns, place the other 20% from what a request
/// carries (category, message, tool; no error type), and count how often the cluster's majority
/// mode is the failure's mode.
pub(crate) fn request_time_accuracy(
    orgs: &BTreeMap<String, Vec<Labelled>>,
    options: &ClusterOptions,
) -> (f64, f64) {
    let (mut right, mut total, mut micros) = (0usize, 0usize, 0.0);
    for (org, patterns) in orgs {
        let (train, test): (Vec<_>, Vec<_>) =
            patterns.iter().enumerate().partition(|(i, _)| i % 5 != 0);
        let inputs: Vec<PatternInput> = train.iter().map(|(_, p)| p.input.clone()).collect();
        let fit = fit_org(org, &inputs, &Previous::default(), options).expect("fit");
        let mut by_cluster: HashMap<&str, HashMap<&str, usize>> = HashMap::new();
        for (a, (_, p)) in fit.assignments.iter().zip(&train) {
            *by_cluster
                .entry(a.cluster_id.as_str())
                .or_default()
                .entry(p.mode)
                .or_insert(0) += 1;
        }
        let majority: HashMap<&str, &str> = by_cluster
            .iter()
            .map(|(c, modes)| {
                let m = modes.iter().max_by_key(|(_, n)| **n).map(|(m, _)| *m);
                (*c, m.unwrap_or(""))
            })
            .collect();
        for (_, p) in &test {
            let input = FailureInput::Failures(vec![FailureText {
                failure_category: p.input.failure_category.clone(),
                error_message: p.input.error_message.clone(),
                tool_name: p.input.failing_tools.first().cloned(),
                error_type: None,
            }]);
            let started = Instant::now();
            let a = fit.model.assign(&input).expect("placed");
            micros += started.elapsed().as_secs_f64() * 1e6;
            total += 1;
            right += usize::from(majority.get(a.cluster_id.as_str()) == Some(&p.mode));
        }
    }
    (
        right as f64 / total.max(1) as f64,
        micros / total.max(1) as f64,
    )
}

#[test]
#[ignore = "prints the measurement table; run in release"]
fn report() {
    let started = Instant::now();
    let text = world_patterns(42, 20_000, None);
    let sizes: Vec<usize> = text.values().map(Vec::len).collect();
    println!(
        "world seed 42, 20000 outcomes: patterns per org {sizes:?} ({:.1} s)",
        started.elapsed().as_secs_f64()
    );
    let base = ClusterOptions::default();
    let row = |name: &str, options: &ClusterOptions, orgs: &BTreeMap<String, Vec<Labelled>>| {
        let started = Instant::now();
        let (purity, ari, k) = measure(orgs, options);
        println!(
            "{name:<52} purity {purity:.3}  ARI {ari:.3}  mean k {k:>5.1}  ({:.1} s)",
            started.elapsed().as_secs_f64()
        );
    };
    println!("\n== featurizer variants (k-means, two-level k by silhouette, 16 dims)");
    row("default weights", &base, &text);
    for (name, weights) in [
        (
            "message only",
            BlockWeights {
                message: 1.0,
                error_type: 0.0,
                category: 0.0,
                subject: 0.0,
            },
        ),
        (
            "message + category",
            BlockWeights {
                error_type: 0.0,
                ..BlockWeights::default()
            },
        ),
        (
            "no tool/provider block",
            BlockWeights {
                subject: 0.0,
                ..BlockWeights::default()
            },
        ),
        (
            "error type 0.5",
            BlockWeights {
                error_type: 0.5,
                ..BlockWeights::default()
            },
        ),
        (
            "error type 1.5",
            BlockWeights {
                error_type: 1.5,
                ..BlockWeights::default()
            },
        ),
        (
            "category 1.0",
            BlockWeights {
                category: 1.0,
                ..BlockWeights::default()
            },
        ),
        (
            "category 0.0",
            BlockWeights {
                category: 0.0,
                ..BlockWeights::default()
            },
        ),
    ] {
        row(
            name,
            &ClusterOptions {
                weights,
                ..base.clone()
            },
            &text,
        );
    }
    println!("\n== dimensions and k");
    for dims in [4, 8, 32] {
        row(
            &format!("dims {dims}"),
            &ClusterOptions {
                dims,
                ..base.clone()
            },
            &text,
        );
    }
    for k in [6, 10, 14] {
        row(
            &format!("k fixed {k}"),
            &ClusterOptions {
                k: Some(k),
                ..base.clone()
            },
            &text,
        );
    }
    for buckets in [512, 1024, 4096] {
        row(
            &format!("buckets {buckets}"),
            &ClusterOptions {
                buckets,
                ..base.clone()
            },
            &text,
        );
    }

    println!("\n== methods on the same reduced vectors (default featurizer, 16 dims)");
    let (mut gmm, mut db, mut n) = ((0.0, 0.0), Vec::new(), 0.0);
    for (org, patterns) in &text {
        let x = reduced(org, patterns, &base);
        let modes: Vec<&str> = patterns.iter().map(|p| p.mode).collect();
        let inputs: Vec<PatternInput> = patterns.iter().map(|p| p.input.clone()).collect();
        let k = fit_org(org, &inputs, &Previous::default(), &base)
            .expect("fit")
            .summary
            .k;
        let dataset = DatasetBase::from(x.clone());
        let labels: Vec<usize> = match GaussianMixtureModel::params(k)
            .n_runs(3)
            .with_rng(Xoshiro256Plus::seed_from_u64(7))
            .fit(&dataset)
        {
            Ok(model) => model.predict(&x).to_vec(),
            Err(e) => {
                println!("  gmm {org}: {e}");
                vec![0; x.nrows()]
            }
        };
        let a = agreement(&labels, &modes).expect("same length");
        let w = patterns.len() as f64;
        gmm.0 += a.purity * w;
        gmm.1 += a.adjusted_rand_index * w;
        for (i, eps) in [0.05, 0.1, 0.15, 0.2, 0.3].iter().enumerate() {
            let Ok(labels) = Dbscan::params(5).tolerance(*eps).transform(&x) else {
                continue;
            };
            let noise = labels.iter().filter(|l| l.is_none()).count() as f64 / w;
            let labels: Vec<usize> = labels.iter().map(|l| l.unwrap_or(usize::MAX)).collect();
            let clusters = labels
                .iter()
                .filter(|l| **l != usize::MAX)
                .max()
                .map_or(0, |m| m + 1);
            let a = agreement(&labels, &modes).expect("same length");
            if db.len() <= i {
                db.push((*eps, 0.0, 0.0, 0.0, 0.0));
            }
            db[i].1 += a.purity * w;
            db[i].2 += a.adjusted_rand_index * w;
            db[i].3 += noise * w;
            db[i].4 += clusters as f64 * w;
        }
        n += w;
    }
    println!(
        "{:<52} purity {:.3}  ARI {:.3}  (k = k-means' k)",
        "gaussian mixture (full covariance)",
        gmm.0 / n,
        gmm.1 / n
    );
    for (eps, p, a, noise, k) in db {
        println!(
            "{:<52} purity {:.3}  ARI {:.3}  noise {:.3}  mean clusters {:.1}",
            format!("dbscan min_points 5, eps {eps}"),
            p / n,
            a / n,
            noise / n,
            k / n
        );
    }

    println!("\n== request-time placement of held-out failures (text only)");
    let (accuracy, micros) = request_time_accuracy(&text, &base);
    println!("default: majority-mode accuracy {accuracy:.3}, {micros:.1} µs per assign");
    let message_only = ClusterOptions {
        weights: BlockWeights {
            error_type: 0.0,
            ..BlockWeights::default()
        },
        ..base.clone()
    };
    let (accuracy, micros) = request_time_accuracy(&text, &message_only);
    println!(
        "no error-type block: majority-mode accuracy {accuracy:.3}, {micros:.1} µs per assign"
    );

    println!("\n== client embeddings (the world's synthetic error_embedding)");
    for dim in [64, 1536] {
        let started = Instant::now();
        let orgs = world_patterns(42, 20_000, Some(dim));
        let (purity, ari, k) = measure(&orgs, &base);
        println!(
            "{:<52} purity {purity:.3}  ARI {ari:.3}  mean k {k:>5.1}  ({:.1} s)",
            format!("embedding dim {dim}"),
            started.elapsed().as_secs_f64()
        );
    }
}
