//! Unbiased estimates of k-sample metrics from n ≥ k samples, for evaluation and training
//! metrics: pass@k from a success count, the expected best of k for real-valued scores, the
//! expected value of what a ranker picks among k, maj@k.

use crate::ObjectiveError;
use crate::advantage::{MAX_GROUP, Votes};
use crate::binomial::binomial;

fn check(n: usize, k: usize) -> Result<(), ObjectiveError> {
    if k == 0 {
        return Err(ObjectiveError::KTooSmall { k });
    }
    if n < k {
        return Err(ObjectiveError::TooFewSamples { n, k });
    }
    if n > MAX_GROUP {
        return Err(ObjectiveError::TooManySamples { n, max: MAX_GROUP });
    }
    Ok(())
}

/// The unbiased pass@k of n samples with c correct: 1 − C(n−c, k)/C(n, k) (Chen et al. 2021),
/// the probability that k of the n drawn without replacement include a correct one.
pub fn pass_at_k(n: usize, correct: usize, k: usize) -> Result<f64, ObjectiveError> {
    check(n, k)?;
    let correct = correct.min(n);
    Ok(1.0 - binomial((n - correct) as i64, k as i64) / binomial(n as i64, k as i64))
}

/// The unbiased estimate of E[max of k draws] from n samples of a real score (PKPO's ρ^(g)):
/// sorted ascending, the p-th value is the maximum of C(p−1, k−1) of the C(n, k) subsets.
/// With 0/1 scores it equals [`pass_at_k`].
pub fn expected_best_of_k(values: &[f64], k: usize) -> Result<f64, ObjectiveError> {
    check(values.len(), k)?;
    if let Some(index) = values.iter().position(|v| !v.is_finite()) {
        return Err(ObjectiveError::NonFiniteReward {
            index,
            value: values[index],
        });
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let total = binomial(values.len() as i64, k as i64);
    Ok(sorted
        .iter()
        .enumerate()
        .map(|(position, v)| binomial(position as i64, k as i64 - 1) / total * v)
        .sum())
}

/// The unbiased estimate of E[value of the sample a ranker picks among k draws] from n samples:
/// over the C(n, k) subsets, the value of the subset's greatest-`keys` sample, ties shared
/// equally among the tied samples of the subset (a ranker that cannot tell them apart picks one
/// at random). A key group g of m samples with a samples keyed strictly above it is the subset's
/// greatest in C(n−a, k) − C(n−a−m, k) subsets and gives its mean value there. With
/// `keys == values` it is [`expected_best_of_k`]; it measures how much of best-of-k a reward
/// model recovers when it, not the truth, chooses (`arc-rec eval`'s `learned_pick_of`).
pub fn expected_pick_of_k(keys: &[f64], values: &[f64], k: usize) -> Result<f64, ObjectiveError> {
    check(values.len(), k)?;
    if keys.len() != values.len() {
        return Err(ObjectiveError::AnswerCountMismatch {
            answers: keys.len(),
            rewards: values.len(),
        });
    }
    for scores in [keys, values] {
        if let Some(index) = scores.iter().position(|v| !v.is_finite()) {
            return Err(ObjectiveError::NonFiniteReward {
                index,
                value: scores[index],
            });
        }
    }
    let n = values.len();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| keys[b].total_cmp(&keys[a]));
    let total = binomial(n as i64, k as i64);
    let mut expected = 0.0;
    let mut above = 0;
    for group in order.chunk_by(|&a, &b| keys[a] == keys[b]) {
        let m = group.len();
        let mean = group.iter().map(|&i| values[i]).sum::<f64>() / m as f64;
        let greatest =
            binomial((n - above) as i64, k as i64) - binomial((n - above - m) as i64, k as i64);
        expected += greatest / total * mean;
        above += m;
    }
    Ok(expected)
}

/// The unbiased estimate of E[reward of the majority answer of k draws] (maj@k) from n samples,
/// ties broken by `priority` (lower rank wins; see [`crate::majority_loo`]). With k = 1 it is the
/// mean reward.
pub fn majority_at_k(
    rewards: &[f64],
    answers: &[u32],
    priority: &[usize],
    k: usize,
) -> Result<f64, ObjectiveError> {
    check(rewards.len(), k)?;
    let votes = Votes::new(rewards, answers)?;
    Ok(votes.mean_over_subsets(priority, k))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pass_at_k_edges() {
        assert_eq!(pass_at_k(10, 0, 3).unwrap(), 0.0);
        assert_eq!(pass_at_k(10, 10, 3).unwrap(), 1.0);
        assert!((pass_at_k(10, 1, 1).unwrap() - 0.1).abs() < 1e-15);
        // n − c < k: every k-subset holds a success.
        assert_eq!(pass_at_k(5, 3, 3).unwrap(), 1.0);
        assert_eq!(
            pass_at_k(3, 1, 4),
            Err(ObjectiveError::TooFewSamples { n: 3, k: 4 })
        );
    }

    #[test]
    fn best_of_k_equals_pass_at_k_on_binary_scores() {
        for (n, c, k) in [
            (16usize, 3usize, 1usize),
            (16, 3, 4),
            (16, 3, 16),
            (8, 0, 2),
        ] {
            let values: Vec<f64> = (0..n)
                .map(|i| f64::from(u8::from(i % 5 < 1 && i / 5 < c)))
                .collect();
            let c = values.iter().filter(|&&v| v == 1.0).count();
            let got = expected_best_of_k(&values, k).unwrap();
            let want = pass_at_k(n, c, k).unwrap();
            assert!((got - want).abs() < 1e-12, "n={n} c={c} k={k}");
        }
    }

    #[test]
    fn a_ranker_s_pick_spans_a_sample_to_the_best() {
        let values = [0.1, 0.9, 0.4, 0.0, 0.6];
        for k in 1..=values.len() {
            let best = expected_best_of_k(&values, k).unwrap();
            let truth_ranks = expected_pick_of_k(&values, &values, k).unwrap();
            assert!((truth_ranks - best).abs() < 1e-12, "k={k}");
            // Keys that cannot tell the samples apart pick one at random: the mean.
            let blind = expected_pick_of_k(&[0.5; 5], &values, k).unwrap();
            assert!((blind - 0.4).abs() < 1e-12, "k={k}");
        }
        // The reversed ranker picks the worst of the whole group at k = n.
        let reversed: Vec<f64> = values.iter().map(|v| -v).collect();
        assert_eq!(expected_pick_of_k(&reversed, &values, 5).unwrap(), 0.0);
        assert_eq!(
            expected_pick_of_k(&[1.0], &values, 1),
            Err(ObjectiveError::AnswerCountMismatch {
                answers: 1,
                rewards: 5
            })
        );
        assert!(matches!(
            expected_pick_of_k(&[f64::NAN, 0.0, 0.0, 0.0, 0.0], &values, 2),
            Err(ObjectiveError::NonFiniteReward { index: 0, .. })
        ));
    }

    #[test]
    fn majority_at_one_is_the_mean_reward() {
        let rewards = [1.0, -1.0, -1.0, 0.5];
        let got = majority_at_k(&rewards, &[3, 4, 4, 5], &[0, 1, 2], 1).unwrap();
        assert!((got + 0.125).abs() < 1e-12);
    }
}
