//! The posterior learns what it should: convergence, rank-1 updates versus a full refit, order
//! independence and deterministic rebuilds.

use bandit::{FeatureLayout, ModelKind, Observation, PolicyConfig, ThompsonPolicy};
use proptest::prelude::*;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;

use crate::helpers::{
    config, gauss_solve, max_rel_diff, policy, random_context, random_observations, small_layout,
    uniform_vec,
};

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8))]

    /// Noisy linear rewards r = xᵀw + N(0, 0.1²): after 1500 samples μ is within 0.05 of w.
    #[test]
    fn posterior_mean_converges_to_the_true_weights(seed in any::<u64>()) {
        let layout = FeatureLayout::new(2, 0, 0, 2).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let truth = uniform_vec(&mut rng, layout.dim());
        let mut policy = ThompsonPolicy::new(layout, config(ModelKind::Linear, None)).unwrap();
        for i in 0..1500 {
            let z = random_context(&layout, &mut rng);
            let c = vec![1.0, rng.random_range(-1.0..1.0)];
            let x = layout.interaction(&z, &c).unwrap();
            let noise: f64 = rng.sample(StandardNormal);
            let reward = x.iter().zip(&truth).map(|(a, b)| a * b).sum::<f64>() + 0.1 * noise;
            let obs = Observation { id: i.to_string(), timestamp_s: 0.0, context: z, candidate: c, reward };
            policy.update(&obs).unwrap();
        }
        for (m, w) in policy.mean().iter().zip(&truth) {
            prop_assert!((m - w).abs() < 0.05, "mean {:?} truth {truth:?}", policy.mean());
        }
    }

    /// Λ, μ and the posterior sd after rank-1 updates equal those of a full refit:
    /// Λ = λI + Σ xxᵀ, b = Σ r x, solved by Gaussian elimination.
    #[test]
    fn rank_one_updates_equal_a_full_refit(seed in any::<u64>(), n in 1usize..40, lambda in 0.1f64..4.0) {
        let layout = small_layout();
        let d = layout.dim();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let config = PolicyConfig { prior_precision: lambda, ..config(ModelKind::Linear, None) };
        let mut policy = ThompsonPolicy::new(layout, config).unwrap();
        let observations = random_observations(&layout, &mut rng, n, 1.0);
        let mut precision = vec![0.0; d * d];
        let mut b = vec![0.0; d];
        for i in 0..d {
            precision[i * d + i] = lambda;
        }
        for obs in &observations {
            policy.update(obs).unwrap();
            let x = layout.interaction(&obs.context, &obs.candidate).unwrap();
            for i in 0..d {
                b[i] += obs.reward * x[i];
                for j in 0..d {
                    precision[i * d + j] += x[i] * x[j];
                }
            }
        }
        prop_assert!(max_rel_diff(policy.precision(), &precision) < 1e-12);
        let mean = gauss_solve(&precision, &b);
        prop_assert!(max_rel_diff(policy.mean(), &mean) < 1e-8, "{:?} vs {mean:?}", policy.mean());
        // posterior_sd = v·sqrt(xᵀΛ⁻¹x), through the Cholesky factor, against the oracle solve.
        let z = random_context(&layout, &mut rng);
        let c = uniform_vec(&mut rng, 3);
        let x = layout.interaction(&z, &c).unwrap();
        let quad: f64 = x.iter().zip(gauss_solve(&precision, &x)).map(|(a, b)| a * b).sum();
        let sd = policy.posterior_sd(&z, &c).unwrap();
        prop_assert!((sd - config.noise_scale * quad.sqrt()).abs() < 1e-9 * (1.0 + sd));
        // mean_score = x·μ against the oracle mean.
        let oracle: f64 = x.iter().zip(&mean).map(|(a, b)| a * b).sum();
        let score = policy.mean_score(&z, &c).unwrap();
        prop_assert!((score - oracle).abs() < 1e-8 * (1.0 + oracle.abs()), "{score} vs {oracle}");
        // mean_score_of_sum(Σx) = Σ x·μ over the observations, against the oracle mean.
        let mut sum = vec![0.0; d];
        let mut oracle_total = 0.0;
        for obs in &observations {
            let x = layout.interaction(&obs.context, &obs.candidate).unwrap();
            oracle_total += x.iter().zip(&mean).map(|(a, b)| a * b).sum::<f64>();
            for (s, v) in sum.iter_mut().zip(&x) {
                *s += v;
            }
        }
        let total = policy.mean_score_of_sum(&sum).unwrap();
        prop_assert!((total - oracle_total).abs() < 1e-7 * (1.0 + oracle_total.abs()), "{total} vs {oracle_total}");
        prop_assert_eq!(policy.mean_score_of_sum(&[]).unwrap(), 0.0);
        prop_assert!(policy.mean_score_of_sum(&sum[1..]).is_err());
    }

    /// The incrementally updated factor equals a fresh factor of the stored Λ for both models
    /// (for the logistic model Λ's weights depend on the path, so compare with its own Λ).
    #[test]
    fn the_factor_always_factors_the_precision(seed in any::<u64>(), logistic in any::<bool>()) {
        let model = if logistic { ModelKind::Logistic } else { ModelKind::Linear };
        let layout = small_layout();
        let d = layout.dim();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut policy = policy(model, Some(100.0));
        for obs in random_observations(&layout, &mut rng, 30, 50.0) {
            policy.update(&obs).unwrap();
        }
        policy.decay_to(60.0).unwrap();
        for obs in random_observations(&layout, &mut rng, 10, 50.0) {
            policy.update(&obs).unwrap();
        }
        let state = policy.to_state();
        let oracle = naive_cholesky_upper(&state.precision, d);
        prop_assert!(max_rel_diff(&state.cholesky_upper, &oracle) < 1e-10);
    }

    /// Replica agreement: two replicas applying the same feedback in different orders, one of
    /// them with a decay in between (so some events arrive "late"), end in the same linear state.
    #[test]
    fn update_order_does_not_change_the_linear_state(seed in any::<u64>(), n in 2usize..40) {
        let layout = small_layout();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let observations = random_observations(&layout, &mut rng, n, 100.0);
        let mut shuffled = observations.clone();
        shuffled.shuffle(&mut rng);

        let mut a = policy(ModelKind::Linear, Some(80.0));
        a.decay_to(0.0).unwrap();
        for obs in &observations[..n / 2] {
            a.update(obs).unwrap();
        }
        a.decay_to(100.0).unwrap();
        for obs in &observations[n / 2..] {
            a.update(obs).unwrap();
        }
        let mut b = policy(ModelKind::Linear, Some(80.0));
        b.decay_to(0.0).unwrap();
        b.decay_to(100.0).unwrap();
        for obs in &shuffled {
            b.update(obs).unwrap();
        }
        for p in [&mut a, &mut b] {
            p.decay_to(150.0).unwrap();
        }
        prop_assert!(max_rel_diff(a.precision(), b.precision()) < 1e-12);
        prop_assert!(max_rel_diff(a.natural_mean(), b.natural_mean()) < 1e-12);
        prop_assert!(max_rel_diff(a.mean(), b.mean()) < 1e-9);
        // And both equal a rebuild from the log at the same clock.
        let mut c = policy(ModelKind::Linear, Some(80.0));
        c.rebuild(&shuffled, 150.0).unwrap();
        prop_assert!(max_rel_diff(a.precision(), c.precision()) < 1e-12);
        prop_assert!(max_rel_diff(a.mean(), c.mean()) < 1e-9);
    }
}

/// Rebuilds are bit-identical whatever the order of the log, for the order-dependent logistic
/// model too, and incremental updates in (timestamp, id) order reproduce them.
#[test]
fn rebuild_is_deterministic_for_both_models() {
    let layout = small_layout();
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let mut observations = random_observations(&layout, &mut rng, 60, 1000.0);
    // Timestamp ties must be broken by id.
    observations[1].timestamp_s = observations[0].timestamp_s;
    for model in [ModelKind::Linear, ModelKind::Logistic] {
        let mut first = policy(model, Some(500.0));
        first.rebuild(&observations, 1000.0).unwrap();
        let mut shuffled = observations.clone();
        shuffled.shuffle(&mut rng);
        let mut second = policy(model, Some(500.0));
        second.rebuild(&shuffled, 1000.0).unwrap();
        assert_eq!(first.to_state(), second.to_state(), "{model:?}");
        assert_eq!(first.observations(), 60);
    }
}

/// A weight of 2 counts as the observation twice (exactly, for the linear model), and bad
/// weights are named.
#[test]
fn a_weighted_rebuild_counts_an_observation_w_times() {
    let layout = small_layout();
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let observations = random_observations(&layout, &mut rng, 20, 100.0);
    let mut twice = observations.clone();
    let mut copy = observations[3].clone();
    copy.id = format!("{}-copy", copy.id);
    twice.push(copy);
    let mut weights = vec![1.0; observations.len()];
    weights[3] = 2.0;
    let mut weighted = policy(ModelKind::Linear, None);
    weighted
        .rebuild_weighted(&observations, &weights, 100.0)
        .unwrap();
    let mut duplicated = policy(ModelKind::Linear, None);
    duplicated.rebuild(&twice, 100.0).unwrap();
    assert!(max_rel_diff(weighted.precision(), duplicated.precision()) < 1e-12);
    assert!(max_rel_diff(weighted.mean(), duplicated.mean()) < 1e-9);
    for bad in [vec![1.0; 3], {
        let mut w = weights.clone();
        w[0] = 0.0;
        w
    }] {
        assert!(
            policy(ModelKind::Linear, None)
                .rebuild_weighted(&observations, &bad, 100.0)
                .is_err()
        );
    }
}

/// The logistic model separates a candidate that is always accepted from one never accepted.
#[test]
fn logistic_model_learns_acceptance_odds() {
    let layout = small_layout();
    let mut policy = policy(ModelKind::Logistic, None);
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let good = vec![1.0, 0.0, 1.0];
    let bad = vec![0.0, 1.0, 1.0];
    for i in 0..300 {
        let z = random_context(&layout, &mut rng);
        let accepted = i % 2 == 0;
        let c = if accepted { good.clone() } else { bad.clone() };
        policy
            .update(&Observation::binary(i.to_string(), 0.0, z, c, accepted))
            .unwrap();
    }
    policy.refresh_bank_seeded(1);
    let z = random_context(&layout, &mut rng);
    let ranking = policy.rank_seeded(&z, &[bad, good], 2, 3).unwrap();
    let by_candidate = |a| ranking.items.iter().find(|i| i.candidate == a).unwrap();
    assert!(by_candidate(1).mean_score > 1.0, "{ranking:?}");
    assert!(by_candidate(0).mean_score < -1.0, "{ranking:?}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// The logistic update is exactly the documented Newton step from the current mean:
    /// p = σ(xᵀμ), Λ' = Λ + p(1−p)xxᵀ, μ' = μ + Λ'⁻¹(y − p)x, replayed with dense solves.
    #[test]
    fn logistic_update_is_one_newton_step(seed in any::<u64>(), n in 1usize..12) {
        let layout = small_layout();
        let d = layout.dim();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut policy = policy(ModelKind::Logistic, None);
        let mut precision = vec![0.0; d * d];
        for i in 0..d {
            precision[i * d + i] = policy.config().prior_precision;
        }
        let mut mean = vec![0.0; d];
        for obs in random_observations(&layout, &mut rng, n, 1.0) {
            policy.update(&obs).unwrap();
            let x = layout.interaction(&obs.context, &obs.candidate).unwrap();
            let logit: f64 = x.iter().zip(&mean).map(|(a, b)| a * b).sum();
            let p = 1.0 / (1.0 + (-logit).exp());
            for i in 0..d {
                for j in 0..d {
                    precision[i * d + j] += p * (1.0 - p) * x[i] * x[j];
                }
            }
            let gradient: Vec<f64> = x.iter().map(|v| (obs.reward - p) * v).collect();
            let step = gauss_solve(&precision, &gradient);
            for (m, s) in mean.iter_mut().zip(step) {
                *m += s;
            }
        }
        prop_assert!(max_rel_diff(policy.precision(), &precision) < 1e-12);
        prop_assert!(max_rel_diff(policy.mean(), &mean) < 1e-9, "{:?} vs {mean:?}", policy.mean());
    }
}

/// On plenty of data the online Laplace mean lands near the batch MAP (Newton iterated to
/// convergence on all observations at once; they differ by ≈ 0.01 here), and both near the
/// true weights.
#[test]
fn logistic_mean_approaches_the_batch_map() {
    let layout = FeatureLayout::new(1, 0, 0, 2).unwrap();
    let d = layout.dim();
    let truth = [0.5, -1.0, 1.5, 0.8];
    let mut rng = ChaCha8Rng::seed_from_u64(17);
    let mut policy = ThompsonPolicy::new(layout, config(ModelKind::Logistic, None)).unwrap();
    let mut data = Vec::new();
    for i in 0..3000 {
        let z = random_context(&layout, &mut rng);
        let c = vec![1.0, rng.random_range(-1.0..1.0)];
        let x = layout.interaction(&z, &c).unwrap();
        let logit: f64 = x.iter().zip(truth).map(|(a, b)| a * b).sum();
        let accepted = rng.random_bool(1.0 / (1.0 + (-logit).exp()));
        policy
            .update(&Observation::binary(i.to_string(), 0.0, z, c, accepted))
            .unwrap();
        data.push((x, f64::from(u8::from(accepted))));
    }
    let lambda = policy.config().prior_precision;
    let mut map = vec![0.0; d];
    for _ in 0..25 {
        let mut hessian = vec![0.0; d * d];
        let mut gradient: Vec<f64> = map.iter().map(|m| -lambda * m).collect();
        for i in 0..d {
            hessian[i * d + i] = lambda;
        }
        for (x, y) in &data {
            let logit: f64 = x.iter().zip(&map).map(|(a, b)| a * b).sum();
            let p = 1.0 / (1.0 + (-logit).exp());
            for i in 0..d {
                gradient[i] += (y - p) * x[i];
                for j in 0..d {
                    hessian[i * d + j] += p * (1.0 - p) * x[i] * x[j];
                }
            }
        }
        for (m, s) in map.iter_mut().zip(gauss_solve(&hessian, &gradient)) {
            *m += s;
        }
    }
    for ((online, batch), truth) in policy.mean().iter().zip(&map).zip(truth) {
        assert!(
            (online - batch).abs() < 0.03,
            "online {:?} vs MAP {map:?}",
            policy.mean()
        );
        assert!(
            (batch - truth).abs() < 0.35,
            "MAP {map:?} vs truth {truth:?}"
        );
    }
}

/// Upper Cholesky factor, packed by rows from the diagonal, computed the textbook way.
fn naive_cholesky_upper(a: &[f64], d: usize) -> Vec<f64> {
    let mut l = vec![0.0; d * d];
    for i in 0..d {
        for j in 0..=i {
            let s: f64 = (0..j).map(|k| l[i * d + k] * l[j * d + k]).sum();
            l[i * d + j] = if i == j {
                (a[i * d + i] - s).sqrt()
            } else {
                (a[i * d + j] - s) / l[j * d + j]
            };
        }
    }
    let mut packed = Vec::new();
    for i in 0..d {
        for j in i..d {
            packed.push(l[j * d + i]);
        }
    }
    packed
}
