//! The exploration floor: off or empty ranks exactly as without it, the logged propensities are
//! the frequencies the policy as run shows each candidate at each position (counted over many
//! seeded requests), share 1 always puts an eligible candidate first, and bad floors are named.

use bandit::{BanditError, ExplorationFloor, Ranking, ThompsonPolicy};
use proptest::prelude::*;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::helpers::{fresh_policy, random_request as request};

/// A policy with no data (every θ̃ from the prior) and a fresh bank.
fn fresh(epsilon: f64, mc_samples: usize) -> ThompsonPolicy {
    fresh_policy(epsilon, mc_samples, 0.3, 5)
}

fn ranked(
    policy: &ThompsonPolicy,
    z: &[f64],
    candidates: &[Vec<f64>],
    floor: Option<&ExplorationFloor>,
    k: usize,
    seed: u64,
) -> bandit::Result<Ranking> {
    policy.rank_with_floor(
        z,
        candidates,
        &[],
        floor,
        k,
        &mut ChaCha8Rng::seed_from_u64(seed),
    )
}

#[test]
fn no_floor_an_empty_one_or_share_zero_rank_as_before() {
    let policy = fresh(0.1, 32);
    let (z, candidates) = request(&policy, 6, 11);
    let empty = ExplorationFloor {
        share: 0.5,
        eligible: vec![],
    };
    let zero = ExplorationFloor {
        share: 0.0,
        eligible: vec![1, 2],
    };
    for seed in 0..50 {
        let plain = policy
            .rank(&z, &candidates, 3, &mut ChaCha8Rng::seed_from_u64(seed))
            .unwrap();
        for floor in [None, Some(&empty), Some(&zero)] {
            assert_eq!(
                ranked(&policy, &z, &candidates, floor, 3, seed).unwrap(),
                plain
            );
        }
        assert!(!plain.floor_pick);
    }
}

#[test]
fn logged_propensities_are_the_frequencies_of_the_policy_as_run() {
    // ε and the floor both large, so every branch (TS, ε shuffle, floor over each) is taken often.
    let policy = fresh(0.2, 64);
    let (n, k) = (6, 3);
    let (z, candidates) = request(&policy, n, 3);
    let floor = ExplorationFloor {
        share: 0.3,
        eligible: vec![1, 4],
    };
    let requests = 40_000;
    let mut seen = vec![vec![0u32; k]; n];
    let mut logged: Option<Vec<Vec<f64>>> = None;
    let mut picks = 0;
    for seed in 0..requests {
        let ranking = ranked(&policy, &z, &candidates, Some(&floor), k, seed).unwrap();
        for item in &ranking.items {
            seen[item.candidate][item.position] += 1;
            assert_eq!(
                item.propensity, ranking.propensities[item.candidate][item.position],
                "an item carries its own cell of the matrix"
            );
        }
        if ranking.floor_pick {
            picks += 1;
            assert!(floor.eligible.contains(&ranking.items[0].candidate));
        }
        // Without offsets the propensities depend on the bank only: the same for every request.
        match &logged {
            None => logged = Some(ranking.propensities.clone()),
            Some(first) => assert_eq!(first, &ranking.propensities),
        }
    }
    let logged = logged.unwrap();
    for p in 0..k {
        let total: f64 = logged.iter().map(|row| row[p]).sum();
        assert!((total - 1.0).abs() < 1e-9, "position {p} sums to {total}");
    }
    for (a, row) in logged.iter().enumerate() {
        for (p, &probability) in row.iter().enumerate() {
            let frequency = f64::from(seen[a][p]) / requests as f64;
            // Four standard errors of a binomial frequency, plus a little for rounding.
            let tolerance =
                4.0 * (probability * (1.0 - probability) / requests as f64).sqrt() + 1e-4;
            assert!(
                (frequency - probability).abs() <= tolerance,
                "candidate {a} at {p}: logged {probability:.4}, shown {frequency:.4}"
            );
        }
    }
    let share = f64::from(picks) / requests as f64;
    assert!(
        (share - 0.3).abs() < 0.015,
        "the floor chose {share:.3} of the firsts"
    );
}

#[test]
fn share_one_always_puts_an_eligible_candidate_first() {
    let policy = fresh(0.05, 32);
    let (z, candidates) = request(&policy, 5, 8);
    let floor = ExplorationFloor {
        share: 1.0,
        eligible: vec![2],
    };
    for seed in 0..30 {
        let ranking = ranked(&policy, &z, &candidates, Some(&floor), 3, seed).unwrap();
        assert!(ranking.floor_pick);
        assert_eq!(ranking.items[0].candidate, 2);
        assert_eq!(ranking.items[0].propensity, 1.0);
        // The rest are the policy's, without repeats.
        let order: Vec<usize> = ranking.items.iter().map(|i| i.candidate).collect();
        assert_eq!(order.len(), 3);
        assert!(!order[1..].contains(&2));
    }
}

#[test]
fn bad_floors_are_named() {
    let policy = fresh(0.05, 16);
    let (z, candidates) = request(&policy, 4, 1);
    for (floor, says) in [
        (
            ExplorationFloor {
                share: 1.5,
                eligible: vec![0],
            },
            "share",
        ),
        (
            ExplorationFloor {
                share: f64::NAN,
                eligible: vec![0],
            },
            "share",
        ),
        (
            ExplorationFloor {
                share: 0.1,
                eligible: vec![4],
            },
            "does not exist",
        ),
        (
            ExplorationFloor {
                share: 0.1,
                eligible: vec![1, 1],
            },
            "twice",
        ),
    ] {
        match ranked(&policy, &z, &candidates, Some(&floor), 2, 0) {
            Err(BanditError::Invalid {
                field: "floor",
                reason,
            }) => {
                assert!(reason.contains(says), "{reason}");
            }
            other => panic!("{floor:?} gave {other:?}"),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// For any menu, list length, ε, share and eligible set: every position's propensities sum
    /// to 1, an eligible candidate is first with at least s/|U|, and the shown list has no repeats.
    #[test]
    fn propensities_are_distributions_over_each_position(
        n in 1usize..8,
        k in 1usize..5,
        epsilon in 0.0f64..1.0,
        share in 0.0f64..=1.0,
        mask in 0u32..256,
        seed in 0u64..1_000,
    ) {
        let policy = fresh(epsilon, 16);
        let (z, candidates) = request(&policy, n, seed);
        let eligible: Vec<usize> = (0..n).filter(|a| mask & (1 << a) != 0).collect();
        let floor = ExplorationFloor { share, eligible: eligible.clone() };
        let ranking = ranked(&policy, &z, &candidates, Some(&floor), k, seed).unwrap();
        for p in 0..k.min(n) {
            let total: f64 = ranking.propensities.iter().map(|row| row[p]).sum();
            prop_assert!((total - 1.0).abs() < 1e-9, "position {} sums to {}", p, total);
        }
        for &u in &eligible {
            prop_assert!(ranking.propensities[u][0] >= share / eligible.len() as f64 - 1e-12);
        }
        let mut order: Vec<usize> = ranking.items.iter().map(|i| i.candidate).collect();
        prop_assert_eq!(order.len(), k.min(n));
        order.sort_unstable();
        order.dedup();
        prop_assert_eq!(order.len(), k.min(n));
    }
}
