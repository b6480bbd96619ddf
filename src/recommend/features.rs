//! The bandit's feature layout: what the context vector z and the candidate vector c hold.
//!
//! z = [1 | cluster | config | user] and the model learns on x = vec(z ⊗ c), so every context
//! feature interacts with every candidate feature and new clusters borrow strength from old ones.
//! Sizes are kept small on purpose (d = |z|·|c| = 720): a Thompson sampler explores in
//! proportion to its dimension, and the platform gives thousands, not millions, of decisions.
//!
//! - cluster (19): the share of the context's failures showing each failure signal (11, see
//!   `candidates::FailureSignal`), then the failure-cluster embedding reduced to 8 dimensions
//!   (zeros until a clustering model exists for the organization);
//! - config (4): temperature, ln max_attempts, ln timeout_s, model price tier;
//! - user (12): role one-hot (6) and domain one-hot (6); unknown values are all zeros;
//! - candidate (20): `candidates::candidate_features` whole: type one-hot (8), expected
//!   reliability and cost deltas, evidence, model/provider change, source, and the size and
//!   direction of the change (retry, timeout and tool-timeout ratios, temperature and tool-count
//!   deltas, fields touched). Dropping the last six cost 0.015 acceptance in `bench bandit`:
//!   raising and lowering the temperature fix different failures.

use bandit::FeatureLayout;

use crate::candidates::{FailureSignal, SignalProfile};
use crate::domain::segments::{DOMAINS, ROLES};

/// Reduced failure-cluster embedding dimensions in the cluster block.
pub const EMBEDDING_DIMS: usize = 8;
/// Indices of `candidates::config_features` kept in the config block.
const CONFIG_PICK: [usize; 4] = [0, 1, 3, 7];
/// Leading entries of `candidates::candidate_features` kept in the candidate block.
const CANDIDATE_PICK: usize = crate::candidates::CANDIDATE_FEATURES;

/// The posterior scale the service ranks with. Measured with `arc-rec bench bandit` over 5 policy
/// seeds of 6,000 rounds with the warm start against Vowpal Wabbit on the same lists
/// (docs/experiments/bandit-vs-vowpal-wabbit.md): 0.125 did better than 0.25 on both
/// tuning worlds (world A: first 500 rounds 0.428 vs 0.401, last quarter 0.550 vs 0.539; world
/// B: 0.464 vs 0.440, 0.550 vs 0.543) and was then measured once on a fresh world (D: 1.110 ±
/// 0.027× the best VW configuration in the last quarter, +0.050 in the first 500). (Before the
/// warm start, at 20,000 rounds on world A alone, 0.25 had beaten 0.5 and 0.15 had been no
/// better: without a log to start from, the posterior is wide for longer.)
pub const NOISE_SCALE: f64 = 0.125;

/// The policy configuration of the service: the linear model (Bayesian linear regression on
/// accept = 1 / reject = 0). The logistic Laplace model measured the same (0.561 vs 0.560), and
/// the linear model's updates commute, so replicas that see feedback in different orders agree
/// exactly and a rebuild from the feedback log reproduces the state.
pub fn policy_config() -> bandit::PolicyConfig {
    bandit::PolicyConfig {
        model: bandit::ModelKind::Linear,
        noise_scale: NOISE_SCALE,
        ..bandit::PolicyConfig::default()
    }
}

/// The layout every policy of this version uses.
pub fn layout() -> FeatureLayout {
    FeatureLayout::new(
        FailureSignal::COUNT + EMBEDDING_DIMS,
        CONFIG_PICK.len(),
        ROLES.len() + DOMAINS.len(),
        CANDIDATE_PICK,
    )
    .expect("the fixed layout is valid")
}

/// The context vector z.
pub fn context_vector(
    signals: &SignalProfile,
    reduced_embedding: Option<&[f64]>,
    config_features: &[f64],
    user_role: Option<&str>,
    domain: Option<&str>,
) -> Vec<f64> {
    let mut cluster = Vec::with_capacity(FailureSignal::COUNT + EMBEDDING_DIMS);
    cluster.extend_from_slice(&signals.weights);
    let mut embedding = [0.0; EMBEDDING_DIMS];
    if let Some(reduced) = reduced_embedding {
        for (slot, value) in embedding.iter_mut().zip(reduced) {
            *slot = if value.is_finite() {
                value.clamp(-10.0, 10.0)
            } else {
                0.0
            };
        }
    }
    cluster.extend_from_slice(&embedding);
    let config: Vec<f64> = CONFIG_PICK
        .iter()
        .map(|&i| config_features.get(i).copied().unwrap_or(0.0))
        .collect();
    let mut user = vec![0.0; ROLES.len() + DOMAINS.len()];
    if let Some(i) = user_role.and_then(|r| ROLES.iter().position(|x| *x == r)) {
        user[i] = 1.0;
    }
    if let Some(i) = domain.and_then(|d| DOMAINS.iter().position(|x| *x == d)) {
        user[ROLES.len() + i] = 1.0;
    }
    let mut z = Vec::with_capacity(layout().context_dims());
    z.push(1.0);
    z.extend(cluster);
    z.extend(config);
    z.extend(user);
    z
}

/// The candidate vector c from `candidates::candidate_features`.
pub fn candidate_vector(full: &[f64]) -> Vec<f64> {
    let mut c: Vec<f64> = full.iter().take(CANDIDATE_PICK).copied().collect();
    c.resize(CANDIDATE_PICK, 0.0);
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectors_fit_the_layout() {
        let layout = layout();
        let signals = SignalProfile {
            weights: [0.0; FailureSignal::COUNT],
            categories: Default::default(),
            observations: vec![],
            failing_tools: vec![],
            requested_tools: vec![],
        };
        let z = context_vector(
            &signals,
            Some(&[f64::NAN; 3]),
            &[0.7; 11],
            Some("ml_engineer"),
            Some("nowhere"),
        );
        layout.check_context(&z).unwrap();
        assert_eq!(z[0], 1.0);
        assert_eq!(
            z.iter().filter(|v| **v == 1.0).count(),
            2,
            "bias and the role"
        );
        layout
            .check_candidate(0, &candidate_vector(&[0.5; 20]))
            .unwrap();
        assert_eq!(layout.dim(), 36 * 20);
    }
}
