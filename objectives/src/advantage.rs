//! Leave-one-out advantages of one group of samples under each k-sample objective (see the
//! crate docs for the estimator and why each closed form holds).

use std::fmt;
use std::str::FromStr;

use rand::Rng;
use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};

use crate::ObjectiveError;
use crate::binomial::binomial;

/// The most samples one group may hold (C(512, 256) ≈ 5e152 still fits an f64).
pub const MAX_GROUP: usize = 512;

/// What the k samples of a prompt are trained for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Objective {
    /// The average reward (RLOO).
    #[serde(rename = "mean")]
    Mean,
    /// The best of k (pass@k with binary rewards), unbiased leave-one-out (PKPO for n > k).
    #[serde(rename = "pass@k")]
    PassAtK,
    /// pass@k's advantages minus their group mean: lower variance, biased towards the
    /// average of the (k−1)-sample objective.
    #[serde(rename = "biased-pass@k")]
    BiasedPassAtK,
    /// The reward of the most frequent answer among k, ties broken at random.
    #[serde(rename = "majority")]
    Majority,
}

impl Objective {
    /// Every objective, in the order the CLI lists them.
    pub const ALL: [Objective; 4] = [
        Objective::Mean,
        Objective::PassAtK,
        Objective::BiasedPassAtK,
        Objective::Majority,
    ];

    /// The CLI and metrics name.
    pub fn as_str(self) -> &'static str {
        match self {
            Objective::Mean => "mean",
            Objective::PassAtK => "pass@k",
            Objective::BiasedPassAtK => "biased-pass@k",
            Objective::Majority => "majority",
        }
    }
}

impl fmt::Display for Objective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Objective {
    type Err = ObjectiveError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Objective::ALL
            .into_iter()
            .find(|o| o.as_str() == s)
            .ok_or_else(|| ObjectiveError::UnknownObjective(s.to_owned()))
    }
}

/// One prompt's samples: a reward each and, for majority voting, a canonical answer each
/// (equal ids mean the same answer; any ids will do).
#[derive(Debug, Clone, Copy)]
pub struct Group<'a> {
    pub rewards: &'a [f64],
    pub answers: &'a [u32],
}

/// An objective over k samples, validated once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Estimator {
    objective: Objective,
    k: usize,
}

impl Estimator {
    /// The estimator for `objective` over `k` samples; every objective is leave-one-out, so
    /// k ≥ 2.
    pub fn new(objective: Objective, k: usize) -> Result<Self, ObjectiveError> {
        if k < 2 {
            return Err(ObjectiveError::KTooSmall { k });
        }
        if k > MAX_GROUP {
            return Err(ObjectiveError::TooManySamples {
                n: k,
                max: MAX_GROUP,
            });
        }
        Ok(Estimator { objective, k })
    }

    pub fn objective(&self) -> Objective {
        self.objective
    }

    pub fn k(&self) -> usize {
        self.k
    }

    /// Checks that groups of `n` samples suit this estimator (n ≥ k, n ≤ [`MAX_GROUP`]).
    pub fn check_group_size(&self, n: usize) -> Result<(), ObjectiveError> {
        if n < self.k {
            return Err(ObjectiveError::TooFewSamples { n, k: self.k });
        }
        if n > MAX_GROUP {
            return Err(ObjectiveError::TooManySamples { n, max: MAX_GROUP });
        }
        Ok(())
    }

    /// One advantage per sample of `group`. `rng` draws majority voting's tie-break priority
    /// (the other objectives draw nothing).
    pub fn advantages<R: Rng + ?Sized>(
        &self,
        group: Group<'_>,
        rng: &mut R,
    ) -> Result<Vec<f64>, ObjectiveError> {
        let rewards = group.rewards;
        self.check_group_size(rewards.len())?;
        check_finite(rewards)?;
        Ok(match self.objective {
            Objective::Mean => mean_loo(rewards),
            Objective::PassAtK => max_loo(rewards, self.k),
            Objective::BiasedPassAtK => center(&max_loo(rewards, self.k)),
            Objective::Majority => {
                let votes = Votes::new(rewards, group.answers)?;
                let priority = votes.draw_priority(rng);
                votes.leave_one_out(&priority, self.k)
            }
        })
    }
}

/// Whether a group's advantages move the policy at all (a group of all zeros carries no signal).
pub fn carries_signal(advantages: &[f64]) -> bool {
    advantages.iter().any(|a| a.abs() > 1e-12)
}

/// The values minus their mean.
pub fn center(values: &[f64]) -> Vec<f64> {
    if values.is_empty() {
        return Vec::new();
    }
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    values.iter().map(|v| v - mean).collect()
}

/// f = mean: A_i = (r_i − mean of the others) / n, whatever k is. For n = k this is the paper's
/// Eq. 2 with its 1/k; for n > k each sample is in a share k/n of the k-subsets and its
/// contribution to a subset's mean is 1/k of its difference to the others.
pub fn mean_loo(rewards: &[f64]) -> Vec<f64> {
    let n = rewards.len();
    if n < 2 {
        return vec![0.0; n];
    }
    let total: f64 = rewards.iter().sum();
    let n_f = n as f64;
    rewards
        .iter()
        .map(|&r| (n_f * r - total) / (n_f * (n_f - 1.0)))
        .collect()
}

/// f = max (PKPO's s^(loo−1), Tang et al.'s A_i at n = k).
///
/// Sort the rewards ascending (ties by index) into g_1..g_n. Sample p is the top of a k-subset
/// exactly when the other k−1 members come from positions below p, and then it adds
/// g_p − max(others); counting the subsets whose second member sits at q < p (C(q−1, k−2) of
/// them) gives
///
/// ```text
/// A_p = (1/C(n,k)) · Σ_{q<p} C(q−1, k−2) · (g_p − g_q)
/// ```
///
/// Ties give zero, as they must: a sample tied with the best of its subset adds nothing.
pub fn max_loo(rewards: &[f64], k: usize) -> Vec<f64> {
    let n = rewards.len();
    let mut advantages = vec![0.0; n];
    if k < 2 || n < k {
        return advantages;
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| rewards[a].total_cmp(&rewards[b]).then(a.cmp(&b)));
    let total = binomial(n as i64, k as i64);
    let k = k as i64;
    // Running Σ_{q<p} w_q and Σ_{q<p} w_q g_q with w_q = C(q−1, k−2)/C(n, k).
    let (mut weight, mut weighted) = (0.0f64, 0.0f64);
    for (position, &index) in order.iter().enumerate() {
        let g = rewards[index];
        advantages[index] = weight * g - weighted;
        // `position` is 0-based: sample at 1-based q = position + 1 has C(q−1, k−2) above it.
        let w = binomial(position as i64, k - 2) / total;
        weight += w;
        weighted += w * g;
    }
    advantages
}

/// f = reward of the most frequent answer, ties broken by `priority` (lower wins); see
/// [`Votes::leave_one_out`]. `priority[c]` is the rank of the c-th distinct answer in order of
/// first appearance.
pub fn majority_loo(
    rewards: &[f64],
    answers: &[u32],
    priority: &[usize],
    k: usize,
) -> Result<Vec<f64>, ObjectiveError> {
    let votes = Votes::new(rewards, answers)?;
    Ok(votes.leave_one_out(priority, k))
}

fn check_finite(rewards: &[f64]) -> Result<(), ObjectiveError> {
    match rewards.iter().position(|r| !r.is_finite()) {
        Some(index) => Err(ObjectiveError::NonFiniteReward {
            index,
            value: rewards[index],
        }),
        None => Ok(()),
    }
}

/// A group's answers as dense classes in order of first appearance, with each class's count
/// and reward.
#[derive(Debug, Clone)]
pub(crate) struct Votes {
    /// The class of each sample.
    class_of: Vec<usize>,
    /// Samples per class.
    count: Vec<usize>,
    /// The reward of each class's answer.
    reward: Vec<f64>,
}

impl Votes {
    pub(crate) fn new(rewards: &[f64], answers: &[u32]) -> Result<Self, ObjectiveError> {
        if answers.len() != rewards.len() {
            return Err(ObjectiveError::AnswerCountMismatch {
                answers: answers.len(),
                rewards: rewards.len(),
            });
        }
        check_finite(rewards)?;
        let mut ids: Vec<u32> = Vec::new();
        let mut first: Vec<usize> = Vec::new();
        let mut votes = Votes {
            class_of: Vec::with_capacity(answers.len()),
            count: Vec::new(),
            reward: Vec::new(),
        };
        for (index, (&answer, &reward)) in answers.iter().zip(rewards).enumerate() {
            let class = match ids.iter().position(|&id| id == answer) {
                Some(class) => {
                    if votes.reward[class].to_bits() != reward.to_bits() {
                        return Err(ObjectiveError::InconsistentAnswer {
                            first: first[class],
                            second: index,
                            first_reward: votes.reward[class],
                            second_reward: reward,
                        });
                    }
                    votes.count[class] += 1;
                    class
                }
                None => {
                    ids.push(answer);
                    first.push(index);
                    votes.count.push(1);
                    votes.reward.push(reward);
                    ids.len() - 1
                }
            };
            votes.class_of.push(class);
        }
        Ok(votes)
    }

    pub(crate) fn classes(&self) -> usize {
        self.count.len()
    }

    /// A uniformly random priority over the distinct answers: among tied answers the one with
    /// the lowest rank wins, so each tied answer wins with equal probability.
    pub(crate) fn draw_priority<R: Rng + ?Sized>(&self, rng: &mut R) -> Vec<usize> {
        let mut priority: Vec<usize> = (0..self.classes()).collect();
        priority.shuffle(rng);
        priority
    }

    /// Classes from the highest priority (rank 0) down.
    fn by_priority(&self, priority: &[usize]) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.classes()).collect();
        order.sort_by_key(|&c| (priority.get(c).copied().unwrap_or(usize::MAX), c));
        order
    }

    /// A_i = (1/C(n,k)) [Σ_J f(J ∪ {i}) − Σ_J f(J)] over the (k−1)-subsets J of the other
    /// samples; both sums depend on i only through its class, so each class is done once.
    pub(crate) fn leave_one_out(&self, priority: &[usize], k: usize) -> Vec<f64> {
        let n = self.class_of.len();
        if k < 2 || n < k {
            return vec![0.0; n];
        }
        let order = self.by_priority(priority);
        let total = binomial(n as i64, k as i64);
        let per_class: Vec<f64> = (0..self.classes())
            .map(|class| {
                let mut others = self.count.clone();
                others[class] -= 1;
                let with = self.subset_sum(&others, &order, k - 1, Some(class));
                let without = self.subset_sum(&others, &order, k - 1, None);
                (with - without) / total
            })
            .collect();
        self.class_of.iter().map(|&c| per_class[c]).collect()
    }

    /// E[f] over the k-subsets of the whole group: the unbiased maj@k estimate.
    pub(crate) fn mean_over_subsets(&self, priority: &[usize], k: usize) -> f64 {
        let n = self.class_of.len();
        let order = self.by_priority(priority);
        self.subset_sum(&self.count, &order, k, None) / binomial(n as i64, k as i64)
    }

    /// Σ over the `size`-subsets of samples drawn from `available` (samples per class) of the
    /// majority answer's reward, where class `bonus` (if any) gets one extra vote in every
    /// subset.
    ///
    /// A dynamic programme over the classes in priority order, with state (samples chosen t,
    /// highest count so far m): a later class takes the lead only with a strictly higher count,
    /// so ties go to the higher priority and the leader's identity never matters again, only its
    /// reward. Each state keeps (number of subsets, Σ over them of the leader's reward).
    fn subset_sum(
        &self,
        available: &[usize],
        order: &[usize],
        size: usize,
        bonus: Option<usize>,
    ) -> f64 {
        let max_count = size + 1;
        let index = |t: usize, m: usize| t * (max_count + 1) + m;
        let cells = (size + 1) * (max_count + 1);
        let mut subsets = vec![0.0f64; cells];
        let mut reward_sum = vec![0.0f64; cells];
        subsets[index(0, 0)] = 1.0;
        for &class in order {
            let extra = usize::from(bonus == Some(class));
            let mut next_subsets = vec![0.0f64; cells];
            let mut next_reward = vec![0.0f64; cells];
            for t in 0..=size {
                for m in 0..=max_count {
                    let ways = subsets[index(t, m)];
                    if ways == 0.0 {
                        continue;
                    }
                    let carried = reward_sum[index(t, m)];
                    for x in 0..=available[class].min(size - t) {
                        let choose = binomial(available[class] as i64, x as i64);
                        let votes = x + extra;
                        let cell = index(t + x, m.max(votes));
                        next_subsets[cell] += ways * choose;
                        next_reward[cell] += if votes > m {
                            ways * choose * self.reward[class]
                        } else {
                            carried * choose
                        };
                    }
                }
            }
            subsets = next_subsets;
            reward_sum = next_reward;
        }
        (0..=max_count).map(|m| reward_sum[index(size, m)]).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for objective in Objective::ALL {
            assert_eq!(objective.as_str().parse::<Objective>(), Ok(objective));
            let json = format!("\"{}\"", objective.as_str());
            assert_eq!(serde_json::from_str::<Objective>(&json).unwrap(), objective);
            assert_eq!(serde_json::to_string(&objective).unwrap(), json);
        }
        assert_eq!(
            "pass@4".parse::<Objective>(),
            Err(ObjectiveError::UnknownObjective("pass@4".into()))
        );
    }

    #[test]
    fn k_below_two_and_small_groups_are_refused() {
        assert_eq!(
            Estimator::new(Objective::PassAtK, 1),
            Err(ObjectiveError::KTooSmall { k: 1 })
        );
        let estimator = Estimator::new(Objective::Mean, 4).unwrap();
        let mut rng = rand::rng();
        let err = estimator
            .advantages(
                Group {
                    rewards: &[1.0, -1.0],
                    answers: &[0, 1],
                },
                &mut rng,
            )
            .unwrap_err();
        assert_eq!(err, ObjectiveError::TooFewSamples { n: 2, k: 4 });
        assert_eq!(
            err.to_string(),
            "2 samples per group for k = 4: the objective needs n >= k"
        );
    }

    #[test]
    fn non_finite_rewards_and_inconsistent_answers_are_named() {
        let estimator = Estimator::new(Objective::Majority, 2).unwrap();
        let mut rng = rand::rng();
        let err = estimator
            .advantages(
                Group {
                    rewards: &[1.0, f64::NAN],
                    answers: &[0, 1],
                },
                &mut rng,
            )
            .unwrap_err();
        assert!(matches!(
            err,
            ObjectiveError::NonFiniteReward { index: 1, .. }
        ));
        let err = estimator
            .advantages(
                Group {
                    rewards: &[1.0, -1.0, 1.0],
                    answers: &[7, 9, 9],
                },
                &mut rng,
            )
            .unwrap_err();
        assert_eq!(
            err,
            ObjectiveError::InconsistentAnswer {
                first: 1,
                second: 2,
                first_reward: -1.0,
                second_reward: 1.0
            }
        );
        let err = estimator
            .advantages(
                Group {
                    rewards: &[1.0, -1.0],
                    answers: &[0],
                },
                &mut rng,
            )
            .unwrap_err();
        assert_eq!(
            err,
            ObjectiveError::AnswerCountMismatch {
                answers: 1,
                rewards: 2
            }
        );
    }

    #[test]
    fn pass_at_k_with_one_success_credits_only_it() {
        // The paper's n = k case with ±1 rewards: the unique success gets best − second = 2.
        assert_eq!(
            max_loo(&[-1.0, 1.0, -1.0, -1.0], 4),
            vec![0.0, 2.0, 0.0, 0.0]
        );
        // Two successes: leaving either out still leaves a success.
        assert_eq!(max_loo(&[1.0, 1.0, -1.0, -1.0], 4), vec![0.0; 4]);
    }

    #[test]
    fn pkpo_binary_closed_form() {
        // s^(loo−1) = C(n−c, k−1)/C(n, k) for a success with 0/1 rewards, 0 otherwise.
        for (n, c, k) in [(8usize, 1usize, 4usize), (8, 3, 4), (4, 2, 4), (16, 5, 8)] {
            let rewards: Vec<f64> = (0..n).map(|i| f64::from(u8::from(i < c))).collect();
            let expected = binomial((n - c) as i64, k as i64 - 1) / binomial(n as i64, k as i64);
            let got = max_loo(&rewards, k);
            for (i, a) in got.iter().enumerate() {
                let want = if i < c { expected } else { 0.0 };
                assert!((a - want).abs() < 1e-12, "n={n} c={c} k={k}: {got:?}");
            }
        }
        // The research notes' figures.
        let eight_one = max_loo(&[1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], 4);
        assert!((eight_one[0] - 0.5).abs() < 1e-12);
    }

    #[test]
    fn signal_is_any_non_zero_advantage() {
        assert!(!carries_signal(&[0.0, 0.0]));
        assert!(carries_signal(&[0.0, -0.25]));
    }
}
