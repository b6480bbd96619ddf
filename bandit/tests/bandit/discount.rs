//! Discounting forgets: silence returns the posterior to the prior, and new evidence outweighs
//! old.

use bandit::{ModelKind, Observation};
use proptest::prelude::*;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::helpers::{max_rel_diff, policy, random_context, random_observations, small_layout};

const HALF_LIFE: f64 = 3600.0;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// After many half-lives without data the mean is 0 and the precision λI again.
    #[test]
    fn long_silence_returns_to_the_prior(seed in any::<u64>(), logistic in any::<bool>()) {
        let model = if logistic { ModelKind::Logistic } else { ModelKind::Linear };
        let layout = small_layout();
        let d = layout.dim();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut p = policy(model, Some(HALF_LIFE));
        for obs in random_observations(&layout, &mut rng, 40, 1000.0) {
            p.update(&obs).unwrap();
        }
        let lambda = p.config().prior_precision;
        let mut prior = vec![0.0; d * d];
        for i in 0..d {
            prior[i * d + i] = lambda;
        }
        let far_from_prior = max_rel_diff(p.precision(), &prior);
        p.decay_to(1000.0 + 10.0 * HALF_LIFE).unwrap();
        // Ten half-lives leave 2⁻¹⁰ of the evidence...
        prop_assert!(max_rel_diff(p.precision(), &prior) < far_from_prior / 500.0);
        p.decay_to(1000.0 + 200.0 * HALF_LIFE).unwrap();
        // ...two hundred leave none that a double can hold.
        prop_assert!(max_rel_diff(p.precision(), &prior) < 1e-15);
        prop_assert!(p.mean().iter().all(|m| m.abs() < 1e-15), "{:?}", p.mean());
    }
}

/// 50 accepts an hour ago versus 50 rejects now, with a one-hour half-life: the recent rejects
/// dominate (weight 2:1), while without discounting the two cancel to about 0.5.
#[test]
fn old_evidence_weighs_less_than_new() {
    let layout = small_layout();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let z = random_context(&layout, &mut rng);
    let c = vec![1.0, 0.5, -0.5];
    let estimate = |half_life: Option<f64>| {
        let mut p = policy(ModelKind::Linear, half_life);
        for i in 0..50 {
            p.update(&Observation::binary(
                format!("old{i}"),
                0.0,
                z.clone(),
                c.clone(),
                true,
            ))
            .unwrap();
        }
        p.decay_to(HALF_LIFE).unwrap();
        for i in 0..50 {
            p.update(&Observation::binary(
                format!("new{i}"),
                HALF_LIFE,
                z.clone(),
                c.clone(),
                false,
            ))
            .unwrap();
        }
        p.refresh_bank_seeded(0);
        p.rank_seeded(&z, std::slice::from_ref(&c), 1, 0)
            .unwrap()
            .items[0]
            .mean_score
    };
    let discounted = estimate(Some(HALF_LIFE));
    let undiscounted = estimate(None);
    assert!((undiscounted - 0.5).abs() < 0.02, "{undiscounted}");
    // Weights 25 (old, halved) vs 50 (new): the estimate is about 25/75 = 1/3.
    assert!((discounted - 1.0 / 3.0).abs() < 0.02, "{discounted}");
}

/// One observation decayed by one half-life leaves exactly half its precision, and a decay to
/// the past changes nothing.
#[test]
fn one_half_life_halves_the_evidence() {
    let layout = small_layout();
    let d = layout.dim();
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    let obs = &random_observations(&layout, &mut rng, 1, 1.0)[0];
    let x = layout.interaction(&obs.context, &obs.candidate).unwrap();
    let mut p = policy(ModelKind::Linear, Some(HALF_LIFE));
    p.update(obs).unwrap();
    let t0 = obs.timestamp_s;
    p.decay_to(t0 + HALF_LIFE).unwrap();
    let lambda = p.config().prior_precision;
    let expected: Vec<f64> = (0..d * d)
        .map(|ij| {
            let (i, j) = (ij / d, ij % d);
            0.5 * x[i] * x[j] + if i == j { lambda } else { 0.0 }
        })
        .collect();
    assert!(max_rel_diff(p.precision(), &expected) < 1e-14);
    let state = p.to_state();
    p.decay_to(t0).unwrap();
    assert_eq!(p.to_state(), state);
    assert_eq!(p.clock_s(), Some(t0 + HALF_LIFE));
}
