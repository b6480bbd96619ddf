//! k-sample objectives for RL fine-tuning and their leave-one-out advantages (Tang et al. 2025,
//! Walder & Karkhanis 2025), the unbiased pass@k / maj@k estimates that evaluation reports, and
//! the paper's bandit experiment (its Figure 1).
//!
//! Pure by design, like `bandit/`: no IO, no async, no libtorch. The trainer hands in one group's
//! rewards (and canonical answers) and gets one advantage per sample back; every number here is
//! checked against brute-force enumeration over subsets in the tests.
//!
//! # The estimator
//!
//! For an objective f over k samples and a group of n ≥ k samples of one prompt, the advantage of
//! sample i is
//!
//! ```text
//! A_i = (1 / C(n, k)) · Σ_{I ⊆ [n], |I| = k, i ∈ I} [ f(y_I) − f(y_{I∖i}) ]
//! ```
//!
//! and Σ_i A_i ∇log π(y_i) is an unbiased estimate of ∇ E[f(y_1..y_k)]. With n = k it is the
//! paper's Eq. 2, A_i = f(y) − f(y₋ᵢ); with n > k and f = max it is PKPO's s^(loo−1). The
//! objectives ([`Objective`]):
//!
//! - **mean** (f = average): A_i = (r_i − mean of the others) / n, RLOO averaged over the group.
//!   The paper's Eq. 2 carries this 1/k at n = k; the advantages of every objective are on the
//!   scale of its own f, so equal learning rates mean equal step sizes in objective units.
//! - **pass@k** (f = max): only a sample that is the strict best of some k-subset gets credit;
//!   O(n log n) from the sorted rewards ([`max_loo`]). For ±1 rewards with c successes it is
//!   2·C(n−c, k−1)/C(n, k) for a success and 0 otherwise.
//! - **biased pass@k**: the pass@k advantages minus their mean over the group (Eq. 3), which
//!   optimises the average of the leave-one-out (k−1)-sample objective (Eq. 4).
//! - **majority** (f = reward of the most frequent answer, ties broken at random): computed by a
//!   dynamic programme over answer counts ([`majority_loo`]); the random tie break is a seeded
//!   random priority over the group's distinct answers, drawn once per group and shared by every
//!   subset, so it is independent of which sample is left out and the estimate stays unbiased.
//!
//! A group whose advantages are all zero carries no signal ([`carries_signal`]): with ±1 rewards
//! and n = k, pass@k is silent unless exactly one sample succeeded.

mod binomial;
pub mod estimate;
pub mod paper_bandit;

mod advantage;

pub use advantage::{
    Estimator, Group, MAX_GROUP, Objective, carries_signal, center, majority_loo, max_loo, mean_loo,
};
pub use binomial::binomial;

/// Bad input to an estimator, naming what was wrong.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ObjectiveError {
    /// k < 2: leaving one sample out of one leaves nothing to compare with.
    #[error("k = {k}: a leave-one-out objective needs k >= 2")]
    KTooSmall { k: usize },
    /// Fewer samples in a group than the objective's k.
    #[error("{n} samples per group for k = {k}: the objective needs n >= k")]
    TooFewSamples { n: usize, k: usize },
    /// More samples in a group than the estimators support.
    #[error("{n} samples per group: at most {max} are supported")]
    TooManySamples { n: usize, max: usize },
    /// A reward that is NaN or infinite.
    #[error("reward of sample {index} is {value}: rewards must be finite")]
    NonFiniteReward { index: usize, value: f64 },
    /// The answers do not line up with the rewards.
    #[error("{answers} answers for {rewards} rewards: give one answer per sample")]
    AnswerCountMismatch { answers: usize, rewards: usize },
    /// Majority voting needs the reward to be a function of the answer.
    #[error(
        "samples {first} and {second} give the same answer but different rewards ({first_reward} and {second_reward})"
    )]
    InconsistentAnswer {
        first: usize,
        second: usize,
        first_reward: f64,
        second_reward: f64,
    },
    /// An objective name that is not one of ours.
    #[error("unknown objective `{0}` (expected mean, pass@k, biased-pass@k or majority)")]
    UnknownObjective(String),
}
