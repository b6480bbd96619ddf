//! Score offsets (a candidate's own prior): none reproduces the plain ranking, a confident high
//! prior wins, its noise explores, the propensities stay the policy's probabilities, and bad
//! offsets are errors.

use bandit::{BanditError, ScoreOffset, ThompsonPolicy};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::helpers::{fresh_policy, random_request};

/// A policy with no data (every θ̃ from the prior) and a fresh bank.
fn fresh(epsilon: f64, mc_samples: usize) -> ThompsonPolicy {
    fresh_policy(epsilon, mc_samples, 0.05, 7)
}

fn request(policy: &ThompsonPolicy, n: usize) -> (Vec<f64>, Vec<Vec<f64>>) {
    random_request(policy, n, 11)
}

/// `rank_with_offsets` with a ChaCha8 generator seeded from `seed`.
fn ranked(
    policy: &ThompsonPolicy,
    z: &[f64],
    candidates: &[Vec<f64>],
    offsets: &[ScoreOffset],
    k: usize,
    seed: u64,
) -> bandit::Result<bandit::Ranking> {
    policy.rank_with_offsets(
        z,
        candidates,
        offsets,
        k,
        &mut ChaCha8Rng::seed_from_u64(seed),
    )
}

#[test]
fn no_offsets_rank_exactly_as_rank() {
    let policy = fresh(0.1, 32);
    let (z, candidates) = request(&policy, 6);
    for seed in 0..50 {
        let plain = policy
            .rank(&z, &candidates, 3, &mut ChaCha8Rng::seed_from_u64(seed))
            .unwrap();
        let none = ranked(&policy, &z, &candidates, &[], 3, seed).unwrap();
        assert_eq!(plain, none);
        // Zero offsets draw no noise and add nothing: the same order, scores and propensities.
        let zeros = vec![ScoreOffset::default(); 6];
        let zero = ranked(&policy, &z, &candidates, &zeros, 3, seed).unwrap();
        assert_eq!(plain.propensities, zero.propensities);
        let order = |r: &bandit::Ranking| r.items.iter().map(|i| i.candidate).collect::<Vec<_>>();
        assert_eq!(order(&plain), order(&zero));
        assert!(
            zero.items
                .iter()
                .all(|i| !i.explanation.contributions.contains_key("prior"))
        );
    }
}

#[test]
fn a_confident_high_prior_comes_first_and_its_mean_is_reported() {
    let policy = fresh(0.0, 64);
    let (z, candidates) = request(&policy, 5);
    let mut offsets = vec![ScoreOffset::default(); 5];
    offsets[3] = ScoreOffset {
        mean: 10.0,
        sd: 0.01,
    };
    let ranking = ranked(&policy, &z, &candidates, &offsets, 2, 1).unwrap();
    assert_eq!(ranking.items[0].candidate, 3);
    assert!((ranking.propensities[3][0] - 1.0).abs() < 1e-12);
    let plain_mean = policy.mean_score(&z, &candidates[3]).unwrap();
    assert!((ranking.items[0].mean_score - (plain_mean + 10.0)).abs() < 1e-12);
    let contributions = &ranking.items[0].explanation.contributions;
    let total: f64 = contributions.values().sum();
    assert!((total - ranking.items[0].score).abs() < 1e-9);
    assert!((contributions["prior"] - 10.0).abs() < 0.1);
    // A confident low prior is never first.
    offsets[3].mean = -10.0;
    let ranking = ranked(&policy, &z, &candidates, &offsets, 2, 1).unwrap();
    assert!(ranking.propensities[3][0] < 1e-12);
}

#[test]
fn an_uncertain_prior_is_explored_in_proportion_to_its_sd() {
    // Two candidates level in mean: with sd 0 the tie goes one way every time; an sd puts the
    // other first about half the time, and the logged propensities track what happens.
    let policy = fresh(0.0, 256);
    let (z, _) = request(&policy, 0);
    let candidates = vec![vec![0.0; 3], vec![0.0; 3]];
    let offsets = [ScoreOffset::default(), ScoreOffset { mean: 0.0, sd: 1.0 }];
    let runs = 4000;
    let (mut first, mut propensity) = (0u32, 0.0);
    for seed in 0..runs {
        let ranking = ranked(&policy, &z, &candidates, &offsets, 1, seed).unwrap();
        first += u32::from(ranking.items[0].candidate == 1);
        propensity += ranking.propensities[1][0];
    }
    let freq = f64::from(first) / runs as f64;
    let mean_propensity = propensity / runs as f64;
    assert!((freq - 0.5).abs() < 0.04, "shown first {freq}");
    // The average logged propensity is the marginal probability of the event.
    assert!(
        (mean_propensity - freq).abs() < 0.03,
        "{mean_propensity} vs {freq}"
    );
    let certain = [ScoreOffset::default(), ScoreOffset::default()];
    let ranking = ranked(&policy, &z, &candidates, &certain, 1, 0).unwrap();
    assert_eq!(ranking.items[0].candidate, 0);
}

#[test]
fn propensities_with_offsets_are_probabilities() {
    let policy = fresh(0.2, 16);
    let (z, candidates) = request(&policy, 4);
    let offsets: Vec<ScoreOffset> = (0..4)
        .map(|i| ScoreOffset {
            mean: 0.1 * i as f64,
            sd: 0.2,
        })
        .collect();
    for seed in 0..20 {
        let ranking = ranked(&policy, &z, &candidates, &offsets, 2, seed).unwrap();
        for p in 0..2 {
            let column: f64 = ranking.propensities.iter().map(|row| row[p]).sum();
            assert!((column - 1.0).abs() < 1e-9);
            for row in &ranking.propensities {
                assert!(row[p] >= 0.2 / 4.0 - 1e-12);
            }
        }
        // The same seed reproduces the ranking, noise included.
        let again = ranked(&policy, &z, &candidates, &offsets, 2, seed).unwrap();
        assert_eq!(ranking, again);
    }
}

#[test]
fn bad_offsets_are_errors() {
    let policy = fresh(0.05, 8);
    let (z, candidates) = request(&policy, 3);
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let short = [ScoreOffset::default(); 2];
    assert!(matches!(
        policy.rank_with_offsets(&z, &candidates, &short, 1, &mut rng),
        Err(BanditError::Dimension { .. })
    ));
    for bad in [
        ScoreOffset {
            mean: f64::NAN,
            sd: 0.0,
        },
        ScoreOffset {
            mean: 0.0,
            sd: -1.0,
        },
        ScoreOffset {
            mean: 0.0,
            sd: f64::INFINITY,
        },
        ScoreOffset { mean: 1e9, sd: 0.0 },
    ] {
        let offsets = [ScoreOffset::default(), bad, ScoreOffset::default()];
        let error = policy
            .rank_with_offsets(&z, &candidates, &offsets, 1, &mut rng)
            .unwrap_err();
        assert!(
            matches!(&error, BanditError::Invalid { field: "offsets", reason } if reason.starts_with("candidate 1")),
            "{error:?}"
        );
    }
}
