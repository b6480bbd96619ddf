//! Unbiased estimates of k-sample metrics from n ≥ k samples, for evaluation and training
//! metrics: pass@k from a success count, the expected best of k for real-valued scores, maj@k.

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
    fn majority_at_one_is_the_mean_reward() {
        let rewards = [1.0, -1.0, -1.0, 0.5];
        let got = majority_at_k(&rewards, &[3, 4, 4, 5], &[0, 1, 2], 1).unwrap();
        assert!((got + 0.125).abs() < 1e-12);
    }
}
