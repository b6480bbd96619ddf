//! Every objective's advantages and every estimate against brute-force enumeration of the
//! k-subsets of a group, on random rewards, for k ∈ {2, 4, 8} and n ∈ {k, 2k}.

use objectives::estimate::{expected_best_of_k, expected_pick_of_k, majority_at_k, pass_at_k};
use objectives::{Estimator, Group, Objective, binomial, majority_loo};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The k-subsets of 0..n as lists of indices.
fn subsets(n: usize, k: usize) -> Vec<Vec<usize>> {
    (0u32..1 << n)
        .filter(|mask| mask.count_ones() as usize == k)
        .map(|mask| (0..n).filter(|i| mask & (1 << i) != 0).collect())
        .collect()
}

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len() as f64
}

/// f over a subset of sample indices.
type Aggregate<'a> = dyn Fn(&[usize]) -> f64 + 'a;

/// The majority answer's reward with ties to the lowest priority rank (classes numbered by
/// first appearance in `answers`).
fn majority(answers: &[u32], rewards: &[f64], priority: &[usize], members: &[usize]) -> f64 {
    let mut classes: Vec<u32> = Vec::new();
    for &a in answers {
        if !classes.contains(&a) {
            classes.push(a);
        }
    }
    let class = |i: usize| classes.iter().position(|&c| c == answers[i]).unwrap();
    let mut counts = vec![0usize; classes.len()];
    for &i in members {
        counts[class(i)] += 1;
    }
    let best = (0..classes.len())
        .filter(|&c| counts[c] > 0)
        .max_by_key(|&c| (counts[c], std::cmp::Reverse(priority[c])))
        .unwrap();
    let sample = members.iter().find(|&&i| class(i) == best).unwrap();
    rewards[*sample]
}

/// A_i = (1/C(n,k)) Σ_{|I|=k, i∈I} [f(I) − f(I∖i)], by enumeration.
fn brute_force_advantages(n: usize, k: usize, f: &Aggregate<'_>) -> Vec<f64> {
    let total = binomial(n as i64, k as i64);
    let mut advantages = vec![0.0; n];
    for subset in subsets(n, k) {
        let all = f(&subset);
        for &i in &subset {
            let rest: Vec<usize> = subset.iter().copied().filter(|&j| j != i).collect();
            advantages[i] += (all - f(&rest)) / total;
        }
    }
    advantages
}

fn assert_close(got: &[f64], want: &[f64], context: &str) {
    assert_eq!(got.len(), want.len(), "{context}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-10 * (1.0 + w.abs()),
            "{context}: sample {i}: got {g}, brute force {w}\n got {got:?}\nwant {want:?}"
        );
    }
}

/// Reward kinds that matter: ±1 (the trainer's), a few levels (ties), continuous.
#[derive(Debug, Clone, Copy)]
enum RewardKind {
    Binary,
    Levels,
    Continuous,
}

fn draw_group(rng: &mut ChaCha8Rng, n: usize, kind: RewardKind) -> (Vec<f64>, Vec<u32>) {
    // Answers from a small vocabulary so majorities, ties and singletons all occur; the reward
    // is a function of the answer, as majority voting requires.
    let vocabulary = rng.random_range(1..=n.min(5) as u32 + 1);
    let answer_reward: Vec<f64> = (0..vocabulary)
        .map(|_| match kind {
            RewardKind::Binary => {
                if rng.random_bool(0.4) {
                    1.0
                } else {
                    -1.0
                }
            }
            RewardKind::Levels => f64::from(rng.random_range(0..3u8)) - 1.0,
            RewardKind::Continuous => rng.random_range(-2.0..2.0),
        })
        .collect();
    let answers: Vec<u32> = (0..n).map(|_| rng.random_range(0..vocabulary)).collect();
    let rewards = answers.iter().map(|&a| answer_reward[a as usize]).collect();
    (rewards, answers)
}

const KINDS: [RewardKind; 3] = [
    RewardKind::Binary,
    RewardKind::Levels,
    RewardKind::Continuous,
];
const SHAPES: [(usize, usize); 6] = [(2, 2), (2, 4), (4, 4), (4, 8), (8, 8), (8, 16)];
const TRIALS: usize = 12;

#[test]
fn every_objective_matches_brute_force() {
    let mut rng = ChaCha8Rng::seed_from_u64(2025);
    for (k, n) in SHAPES {
        for kind in KINDS {
            for trial in 0..TRIALS {
                let (rewards, answers) = draw_group(&mut rng, n, kind);
                let context = format!("k={k} n={n} {kind:?} trial {trial} rewards {rewards:?}");
                let group = Group {
                    rewards: &rewards,
                    answers: &answers,
                };

                let mean_f = |s: &[usize]| mean(&s.iter().map(|&i| rewards[i]).collect::<Vec<_>>());
                let max_f = |s: &[usize]| s.iter().map(|&i| rewards[i]).fold(f64::MIN, f64::max);
                let mean_want = brute_force_advantages(n, k, &mean_f);
                let max_want = brute_force_advantages(n, k, &max_f);
                let max_mean = mean(&max_want);
                let biased_want: Vec<f64> = max_want.iter().map(|a| a - max_mean).collect();

                let mut none = ChaCha8Rng::seed_from_u64(0);
                let get = |objective, rng: &mut ChaCha8Rng| {
                    Estimator::new(objective, k)
                        .unwrap()
                        .advantages(group, rng)
                        .unwrap()
                };
                assert_close(
                    &get(Objective::Mean, &mut none),
                    &mean_want,
                    &format!("mean {context}"),
                );
                assert_close(
                    &get(Objective::PassAtK, &mut none),
                    &max_want,
                    &format!("pass@k {context}"),
                );
                assert_close(
                    &get(Objective::BiasedPassAtK, &mut none),
                    &biased_want,
                    &format!("biased {context}"),
                );

                // Majority: the estimator draws its tie-break priority from the seeded stream;
                // the same draw gives the same priority to the brute force.
                let seed = rng.random::<u64>();
                let got = get(Objective::Majority, &mut ChaCha8Rng::seed_from_u64(seed));
                let classes = {
                    let mut seen: Vec<u32> = Vec::new();
                    for &a in &answers {
                        if !seen.contains(&a) {
                            seen.push(a);
                        }
                    }
                    seen.len()
                };
                let priority = {
                    use rand::seq::SliceRandom;
                    let mut p: Vec<usize> = (0..classes).collect();
                    p.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
                    p
                };
                let majority_f = |s: &[usize]| majority(&answers, &rewards, &priority, s);
                let majority_want = brute_force_advantages(n, k, &majority_f);
                assert_close(
                    &got,
                    &majority_want,
                    &format!("majority {context} priority {priority:?}"),
                );
                assert_close(
                    &majority_loo(&rewards, &answers, &priority, k).unwrap(),
                    &majority_want,
                    &format!("majority_loo {context}"),
                );

                // The unbiased estimates are the subset averages of f.
                let all = subsets(n, k);
                let average =
                    |f: &Aggregate<'_>| all.iter().map(|s| f(s)).sum::<f64>() / all.len() as f64;
                let best = expected_best_of_k(&rewards, k).unwrap();
                assert!(
                    (best - average(&max_f)).abs() < 1e-10,
                    "best-of-k {context}"
                );
                let maj = majority_at_k(&rewards, &answers, &priority, k).unwrap();
                assert!(
                    (maj - average(&majority_f)).abs() < 1e-10,
                    "maj@k {context}"
                );
                if matches!(kind, RewardKind::Binary) {
                    let correct = rewards.iter().filter(|&&r| r > 0.0).count();
                    let pass = pass_at_k(n, correct, k).unwrap();
                    let success_f =
                        |s: &[usize]| f64::from(u8::from(s.iter().any(|&i| rewards[i] > 0.0)));
                    assert!(
                        (pass - average(&success_f)).abs() < 1e-12,
                        "pass@k {context}"
                    );
                }
            }
        }
    }
}

#[test]
fn the_paper_s_special_cases_hold_at_n_equals_k() {
    // Mean: Eq. 2 is RLOO divided by k. pass@k: only the best sample, by best − second best.
    let rewards = [0.3, -1.2, 0.9, 0.1];
    let mean = Estimator::new(Objective::Mean, 4)
        .unwrap()
        .advantages(
            Group {
                rewards: &rewards,
                answers: &[0, 1, 2, 3],
            },
            &mut ChaCha8Rng::seed_from_u64(0),
        )
        .unwrap();
    for (i, a) in mean.iter().enumerate() {
        let others: f64 = rewards
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, r)| r)
            .sum::<f64>()
            / 3.0;
        assert!((a - (rewards[i] - others) / 4.0).abs() < 1e-12);
    }
    let pass = objectives::max_loo(&rewards, 4);
    assert_close(&pass, &[0.0, 0.0, 0.9 - 0.3, 0.0], "pass@k");
}

#[test]
fn majority_is_silent_when_one_answer_dominates() {
    // |a_(m)| > |a_(m−1)| + 1: no single sample can change the vote.
    let rewards = [1.0, 1.0, 1.0, -1.0];
    let got = majority_loo(&rewards, &[5, 5, 5, 6], &[0, 1], 4).unwrap();
    assert!(got.iter().all(|a| a.abs() < 1e-15), "{got:?}");
    // A lead of one: the leading answer's samples carry the difference to the runner-up
    // (whose reward the vote falls back to when one of them is left out: a tie, won by rank).
    let rewards = [1.0, 1.0, -1.0, 0.5];
    let got = majority_loo(&rewards, &[5, 5, 6, 7], &[2, 1, 0], 4).unwrap();
    // Without a 5, answers 5, 6 and 7 tie at one vote and 7 (rank 0) wins: 1 − 0.5.
    assert_close(&got, &[0.5, 0.5, 0.0, 0.0], "lead of one");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// A ranker's pick of k against every k-subset, with keys drawn from few levels so that
    /// ties (shared equally among the tied samples of a subset) are common.
    #[test]
    fn a_ranker_s_pick_of_k_matches_brute_force(
        samples in prop::collection::vec((0u8..4, 0.0f64..1.0), 1..=10),
        k_seed in 0usize..100,
    ) {
        let n = samples.len();
        let k = 1 + k_seed % n;
        let keys: Vec<f64> = samples.iter().map(|&(key, _)| f64::from(key)).collect();
        let values: Vec<f64> = samples.iter().map(|&(_, value)| value).collect();
        let pick = |s: &[usize]| {
            let top = s.iter().map(|&i| keys[i]).fold(f64::MIN, f64::max);
            mean(&s.iter().filter(|&&i| keys[i] == top).map(|&i| values[i]).collect::<Vec<_>>())
        };
        let all = subsets(n, k);
        let want = all.iter().map(|s| pick(s)).sum::<f64>() / all.len() as f64;
        let got = expected_pick_of_k(&keys, &values, k).unwrap();
        prop_assert!((got - want).abs() < 1e-10, "n={} k={} got {} want {}", n, k, got, want);
    }

    /// The same check on arbitrary groups, for every k in 2..=n up to n = 10.
    #[test]
    fn pass_at_k_and_mean_match_brute_force_for_any_k(
        rewards in prop::collection::vec(-3.0f64..3.0, 2..=10),
        k_seed in 0usize..100,
    ) {
        let n = rewards.len();
        let k = 2 + k_seed % (n - 1);
        let max_f = |s: &[usize]| s.iter().map(|&i| rewards[i]).fold(f64::MIN, f64::max);
        let want = brute_force_advantages(n, k, &max_f);
        assert_close(&objectives::max_loo(&rewards, k), &want, "pass@k");
        let mean_f = |s: &[usize]| mean(&s.iter().map(|&i| rewards[i]).collect::<Vec<_>>());
        let want = brute_force_advantages(n, k, &mean_f);
        assert_close(&objectives::mean_loo(&rewards), &want, "mean");
    }
}
