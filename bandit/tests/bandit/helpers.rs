//! Shared fixtures: small layouts, random features and a naive dense-algebra oracle.

use bandit::{FeatureLayout, ModelKind, Observation, PolicyConfig, ThompsonPolicy};
use rand::{Rng, SeedableRng};

/// |z| = 5 (1 + 2 + 1 + 1), |c| = 3, d = 15.
pub fn small_layout() -> FeatureLayout {
    FeatureLayout::new(2, 1, 1, 3).unwrap()
}

pub fn config(model: ModelKind, half_life_s: Option<f64>) -> PolicyConfig {
    PolicyConfig {
        model,
        half_life_s,
        mc_samples: 64,
        ..PolicyConfig::default()
    }
}

pub fn policy(model: ModelKind, half_life_s: Option<f64>) -> ThompsonPolicy {
    ThompsonPolicy::new(small_layout(), config(model, half_life_s)).unwrap()
}

/// A policy with no data (every θ̃ from the prior) and a fresh bank drawn from `bank_seed`.
pub fn fresh_policy(
    epsilon: f64,
    mc_samples: usize,
    noise_scale: f64,
    bank_seed: u64,
) -> ThompsonPolicy {
    let config = PolicyConfig {
        epsilon,
        mc_samples,
        noise_scale,
        ..config(ModelKind::Linear, None)
    };
    let mut policy = ThompsonPolicy::new(small_layout(), config).unwrap();
    policy.refresh_bank_seeded(bank_seed);
    policy
}

/// A request of `n` candidates for `policy`: a random context and candidate blocks in [-1, 1),
/// drawn from ChaCha8 seeded with `seed`.
pub fn random_request(policy: &ThompsonPolicy, n: usize, seed: u64) -> (Vec<f64>, Vec<Vec<f64>>) {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let z = random_context(policy.layout(), &mut rng);
    let candidates = (0..n)
        .map(|_| uniform_vec(&mut rng, policy.layout().candidate_dims))
        .collect();
    (z, candidates)
}

pub fn uniform_vec<R: Rng>(rng: &mut R, n: usize) -> Vec<f64> {
    (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
}

pub fn random_context<R: Rng>(layout: &FeatureLayout, rng: &mut R) -> Vec<f64> {
    layout
        .context(
            &uniform_vec(rng, layout.cluster_dims),
            &uniform_vec(rng, layout.config_dims),
            &uniform_vec(rng, layout.user_dims),
        )
        .unwrap()
}

/// Random observations with timestamps in [0, span_s) and binary rewards.
pub fn random_observations<R: Rng>(
    layout: &FeatureLayout,
    rng: &mut R,
    n: usize,
    span_s: f64,
) -> Vec<Observation> {
    (0..n)
        .map(|i| {
            Observation::binary(
                format!("ev-{i:04}"),
                rng.random_range(0.0..span_s),
                random_context(layout, rng),
                uniform_vec(rng, layout.candidate_dims),
                rng.random_bool(0.5),
            )
        })
        .collect()
}

/// Solves A θ = b by Gaussian elimination with partial pivoting (the oracle; no Cholesky).
pub fn gauss_solve(a: &[f64], b: &[f64]) -> Vec<f64> {
    let d = b.len();
    let mut m: Vec<Vec<f64>> = (0..d)
        .map(|i| {
            let mut row = a[i * d..(i + 1) * d].to_vec();
            row.push(b[i]);
            row
        })
        .collect();
    for col in 0..d {
        let pivot = (col..d)
            .max_by(|&i, &j| m[i][col].abs().total_cmp(&m[j][col].abs()))
            .unwrap();
        m.swap(col, pivot);
        let (head, tail) = m.split_at_mut(col + 1);
        let pivot_row = &head[col];
        for row in tail {
            let f = row[col] / pivot_row[col];
            for (v, p) in row[col..].iter_mut().zip(&pivot_row[col..]) {
                *v -= f * p;
            }
        }
    }
    let mut x = vec![0.0; d];
    for i in (0..d).rev() {
        let s: f64 = (i + 1..d).map(|k| m[i][k] * x[k]).sum();
        x[i] = (m[i][d] - s) / m[i][i];
    }
    x
}

/// max |a − b| / (1 + |b|).
pub fn max_rel_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / (1.0 + y.abs()))
        .fold(0.0, f64::max)
}
