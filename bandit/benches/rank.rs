//! Latency of the serving path (rank) and of the periodic maintenance (update, bank refresh,
//! decay) at the sizes the service targets: K = 50 candidates, d = 290, M = 256, k = 3.
//!
//! Run with `cargo bench -p bandit --bench rank`.

use std::hint::black_box;

use bandit::{FeatureLayout, ModelKind, Observation, PolicyConfig, ThompsonPolicy};
use criterion::{Criterion, criterion_group, criterion_main};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// |z| = 1 + 16 + 8 + 4 = 29, |c| = 10, d = 290.
fn layout() -> FeatureLayout {
    FeatureLayout::new(16, 8, 4, 10).unwrap()
}

fn features(rng: &mut ChaCha8Rng, n: usize) -> Vec<f64> {
    (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
}

fn context(rng: &mut ChaCha8Rng) -> Vec<f64> {
    let l = layout();
    l.context(
        &features(rng, l.cluster_dims),
        &features(rng, l.config_dims),
        &features(rng, l.user_dims),
    )
    .unwrap()
}

/// A policy after 500 observations, with a fresh bank.
fn trained(model: ModelKind, rng: &mut ChaCha8Rng) -> ThompsonPolicy {
    let config = PolicyConfig {
        model,
        ..PolicyConfig::default()
    };
    let mut policy = ThompsonPolicy::new(layout(), config).unwrap();
    for i in 0..500 {
        let obs = Observation::binary(
            i.to_string(),
            f64::from(i),
            context(rng),
            features(rng, 10),
            rng.random_bool(0.3),
        );
        policy.update(&obs).unwrap();
    }
    policy.refresh_bank(rng);
    policy
}

fn bench(c: &mut Criterion) {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let policy = trained(ModelKind::Linear, &mut rng);
    let z = context(&mut rng);
    let candidates: Vec<Vec<f64>> = (0..50).map(|_| features(&mut rng, 10)).collect();

    c.bench_function("rank K=50 d=290 M=256 k=3", |b| {
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        b.iter(|| {
            policy
                .rank(black_box(&z), black_box(&candidates), 3, &mut rng)
                .unwrap()
        });
    });
    c.bench_function("propensity_matrix K=50 d=290 M=256 k=3", |b| {
        b.iter(|| {
            policy
                .propensity_matrix(black_box(&z), black_box(&candidates), 3)
                .unwrap()
        });
    });

    let obs = Observation::binary("x", 500.0, z.clone(), candidates[0].clone(), true);
    for model in [ModelKind::Linear, ModelKind::Logistic] {
        let mut policy = trained(model, &mut rng);
        c.bench_function(&format!("update {model:?} d=290"), |b| {
            b.iter(|| policy.update(black_box(&obs)).unwrap());
        });
    }
    let mut policy = trained(ModelKind::Linear, &mut rng);
    c.bench_function("refresh_bank d=290 M=256", |b| {
        let mut seed = 0;
        b.iter(|| {
            seed += 1;
            policy.refresh_bank_seeded(seed);
        });
    });
    // Criterion calls the closure more than once (warm-up, measurement); the clock must keep
    // moving forward across calls or later decays are no-ops.
    let mut now = 1000.0;
    c.bench_function("decay_to d=290 (refactor)", |b| {
        b.iter(|| {
            now += 60.0;
            policy.decay_to(now).unwrap();
        });
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30);
    targets = bench
}
criterion_main!(benches);
