//! The shared fixture of `integrations/verl/`: reward groups and arc-rec's advantages for them,
//! which the Python estimators registered with verl must reproduce to 1e-9. This test fails when
//! the committed file differs from what the estimators compute now, so the Python side is always
//! checked against the current Rust figures (`ARC_REC_UPDATE_FIXTURES=1` rewrites it).

use std::collections::BTreeMap;
use std::path::PathBuf;

use objectives::{Estimator, Group, Objective};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

/// The file's shape. Structs and a BTreeMap fix the key order whatever serde_json's features
/// (`preserve_order` is on when the whole workspace builds), so the text compares exactly.
#[derive(Serialize)]
struct Fixture {
    about: &'static str,
    cases: Vec<Case>,
}

#[derive(Serialize)]
struct Case {
    advantages: BTreeMap<&'static str, Vec<f64>>,
    k: usize,
    rewards: Vec<f64>,
}

fn fixture_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../integrations/verl/tests/fixtures/advantages.json")
}

/// Groups of the shapes a run meets: the plan's ±1 rewards (ties everywhere), with the +0.1
/// format bonus, the expected reward 2p − 1 (continuous), all equal, one success, n = k and
/// n > k, small and large groups.
fn groups() -> Vec<Vec<f64>> {
    let mut rng = ChaCha8Rng::seed_from_u64(20_261_127);
    let mut groups = vec![
        vec![1.0, -1.0],
        vec![-1.0, -1.0, -1.0, -1.0],
        vec![1.0, 1.0, 1.0, 1.0],
        vec![-1.0, -1.0, 1.0, -1.0],
        vec![1.1, -1.0, -0.9, 1.1, -1.0, -1.0, -1.0, 1.1],
    ];
    for n in [2usize, 3, 4, 5, 8, 12, 16, 32] {
        // ±1 with a random success rate.
        let p: f64 = rng.random();
        groups.push(
            (0..n)
                .map(|_| if rng.random::<f64>() < p { 1.0 } else { -1.0 })
                .collect(),
        );
        // The format bonus on some well-formed samples (−1, −0.9, +1.1).
        groups.push(
            (0..n)
                .map(|_| [-1.0, -0.9, 1.1][rng.random_range(0..3)])
                .collect(),
        );
        // The expected reward: continuous, no ties.
        groups.push((0..n).map(|_| 2.0 * rng.random::<f64>() - 1.0).collect());
    }
    groups
}

fn cases() -> Fixture {
    let mut cases = Vec::new();
    for rewards in groups() {
        let n = rewards.len();
        let mut ks: Vec<usize> = [2, 4, 8, n].into_iter().filter(|&k| k <= n).collect();
        ks.dedup();
        for k in ks {
            let mut advantages = BTreeMap::new();
            for objective in [
                Objective::Mean,
                Objective::PassAtK,
                Objective::BiasedPassAtK,
            ] {
                let estimator = Estimator::new(objective, k).unwrap();
                let answers: Vec<u32> = (0..n as u32).collect();
                let mut rng = ChaCha8Rng::seed_from_u64(0);
                let values = estimator
                    .advantages(
                        Group {
                            rewards: &rewards,
                            answers: &answers,
                        },
                        &mut rng,
                    )
                    .unwrap();
                advantages.insert(objective.as_str(), values);
            }
            cases.push(Case {
                advantages,
                k,
                rewards: rewards.clone(),
            });
        }
    }
    Fixture {
        about: "arc-rec's leave-one-out advantages (objectives crate) for the Python estimators \
                of integrations/verl to match; written by objectives/tests/verl_fixture.rs",
        cases,
    }
}

#[test]
fn the_verl_fixture_holds_the_current_rust_advantages() {
    let expected = cases();
    // Compared as text: serde_json writes the shortest round-trip form of each f64, while its
    // default parser may miss the last bit.
    let text = serde_json::to_string_pretty(&expected).unwrap() + "\n";
    let path = fixture_path();
    if std::env::var_os("ARC_REC_UPDATE_FIXTURES").is_some() {
        std::fs::write(&path, &text).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (ARC_REC_UPDATE_FIXTURES=1 cargo test -p objectives --test verl_fixture writes it)",
            path.display()
        )
    });
    assert!(
        committed == text,
        "{} is stale: rerun with ARC_REC_UPDATE_FIXTURES=1",
        path.display()
    );
    // The file exercises every objective the estimators register, with n > k and n = k.
    assert!(expected.cases.len() > 40);
    assert!(expected.cases.iter().any(|c| c.k < c.rewards.len()));
    assert!(expected.cases.iter().any(|c| c.k == c.rewards.len()));
}
