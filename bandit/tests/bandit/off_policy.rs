//! Off-policy evaluation recovers a target policy's value from data another policy logged.

use bandit::ope::{self, BootstrapConfig, Estimator};
use bandit::{FeatureLayout, LoggedRecord, ModelKind, Observation, PolicyConfig, ThompsonPolicy};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::helpers::{config, random_context, uniform_vec};

const LOGGING: [f64; 5] = [0.4, 0.25, 0.15, 0.1, 0.1];
const TARGET: [f64; 5] = [0.1, 0.1, 0.2, 0.2, 0.4];
const MEANS: [f64; 5] = [0.2, 0.3, 0.5, 0.6, 0.8];

fn value(policy: &[f64; 5]) -> f64 {
    policy.iter().zip(MEANS).map(|(p, r)| p * r).sum()
}

fn simulate(seed: u64, n: usize) -> Vec<LoggedRecord> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let u: f64 = rng.random();
            let mut acc = 0.0;
            let a = LOGGING
                .iter()
                .position(|p| {
                    acc += p;
                    u < acc
                })
                .unwrap_or(4);
            LoggedRecord {
                reward: f64::from(u8::from(rng.random_bool(MEANS[a]))),
                logging_propensity: LOGGING[a],
                target_probability: TARGET[a],
            }
        })
        .collect()
}

/// SNIPS on data from a known stochastic logging policy: the 95% bootstrap interval holds the
/// target's true value (0.59) and not the logging policy's (0.37), and over 20 independent logs
/// it covers the truth about 95% of the time.
#[test]
fn snips_recovers_the_target_value_within_its_interval() {
    let truth = value(&TARGET);
    assert!((truth - 0.59).abs() < 1e-12 && (value(&LOGGING) - 0.37).abs() < 1e-12);
    let config = BootstrapConfig {
        resamples: 400,
        level: 0.95,
        seed: 1,
    };
    let log = simulate(0, 4000);
    let ci = ope::bootstrap(&log, Estimator::Snips, &config).unwrap();
    assert!(ci.lower <= truth && truth <= ci.upper, "{ci:?}");
    assert!(
        ci.upper < value(&LOGGING) || ci.lower > value(&LOGGING),
        "{ci:?}"
    );
    let ess = ope::effective_sample_size(&log).unwrap();
    assert!(ess > 1000.0 && ess < 4000.0, "{ess}");

    let covered = (1..=20)
        .filter(|&seed| {
            let log = simulate(seed, 2000);
            let ci = ope::bootstrap(&log, Estimator::Snips, &BootstrapConfig { seed, ..config })
                .unwrap();
            ci.lower <= truth && truth <= ci.upper
        })
        .count();
    assert!(covered >= 16, "covered {covered} of 20");
    let report = ope::evaluate(&log, &config).unwrap();
    assert!(
        report.ips.lower <= truth && truth <= report.ips.upper,
        "{report:?}"
    );
}

/// The bandit's own logged top-1 propensities support OPE: evaluating the uniform-random policy
/// (probability 1/K at position 0) on data the trained policy logged recovers the uniform
/// policy's true acceptance rate.
#[test]
fn bandit_propensities_support_off_policy_evaluation() {
    let layout = FeatureLayout::new(2, 0, 0, 3).unwrap();
    let weights = [0.5, 0.3, -0.2];
    let truth = |c: &[f64]| {
        (0.5 + c.iter().zip(weights).map(|(a, b)| a * b).sum::<f64>() / 2.0).clamp(0.0, 1.0)
    };
    let config = PolicyConfig {
        epsilon: 0.3,
        mc_samples: 64,
        ..config(ModelKind::Linear, None)
    };
    let mut policy = ThompsonPolicy::new(layout, config).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(77);
    for i in 0..200 {
        let z = random_context(&layout, &mut rng);
        let c = uniform_vec(&mut rng, 3);
        let accepted = rng.random_bool(truth(&c));
        policy
            .update(&Observation::binary(i.to_string(), 0.0, z, c, accepted))
            .unwrap();
    }
    policy.refresh_bank(&mut rng);
    let (mut log, mut true_value) = (Vec::new(), 0.0);
    let rounds = 3000;
    for _ in 0..rounds {
        let z = random_context(&layout, &mut rng);
        let candidates: Vec<Vec<f64>> = (0..5).map(|_| uniform_vec(&mut rng, 3)).collect();
        true_value += candidates.iter().map(|c| truth(c)).sum::<f64>() / 5.0;
        let ranking = policy.rank(&z, &candidates, 1, &mut rng).unwrap();
        let item = &ranking.items[0];
        log.push(LoggedRecord {
            reward: f64::from(u8::from(
                rng.random_bool(truth(&candidates[item.candidate])),
            )),
            logging_propensity: item.propensity,
            target_probability: 0.2,
        });
    }
    let true_value = true_value / rounds as f64;
    let ci = ope::bootstrap(
        &log,
        Estimator::Snips,
        &BootstrapConfig {
            resamples: 400,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(
        ci.lower <= true_value && true_value <= ci.upper,
        "truth {true_value}, {ci:?}"
    );
}
