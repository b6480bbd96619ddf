//! The contextual bandit that ranks recommendations: Thompson sampling over a shared Bayesian
//! model of (context, candidate) features, Monte-Carlo propensities and off-policy estimators.
//!
//! Pure by design: no IO, no async, no SQL. Callers hand in features and a random number
//! generator (or a seed) and get numbers back, so everything here is testable against simple
//! oracles. Bad input is an [`BanditError`] naming the field, never a panic.
//!
//! # Features ([`features`])
//!
//! Context z = [1 | cluster | config | user] ([`FeatureLayout::context`]), candidate c (any
//! bounded reals: type one-hot, expected reliability/cost deltas, evidence, source, a bias 1).
//! The model's input is x = vec(z ⊗ c), d = |z|·|c|, so every context block interacts with every
//! candidate feature and a new cluster borrows strength from nearby ones. x splits into the
//! groups "candidate" (z's 1 × c), "cluster", "config" and "user", the keys of explanations.
//!
//! # Model ([`ModelKind`])
//!
//! A Gaussian posterior θ ~ N(μ, v²Λ⁻¹), prior Λ = λI, μ = 0, kept as Λ, its Cholesky factor L
//! (rank-1 updated per observation, O(d²)) and η = Λμ:
//!
//! - **Linear** (LinTS, Agrawal & Goyal 2013): Λ = λI + Σ w xxᵀ, η = b = Σ w r x, μ = Λ⁻¹b.
//!   Sums commute, so replicas applying the same feedback in any order agree up to rounding;
//!   [`ThompsonPolicy::rebuild`] sorts by (timestamp, id) for bit-identical state.
//! - **Logistic** (Chapelle & Li 2011, Laplace approximation): per observation, p = σ(xᵀμ),
//!   Λ += w p(1−p) xxᵀ and one Newton step μ += Λ⁻¹ w(y − p)x. Order-dependent; replicas agree
//!   through `rebuild`.
//!
//! Draws are θ̃ = μ + v·L⁻ᵀe with e ~ N(0, I) (a triangular solve, never an inverse).
//!
//! **Discounting** (D-LinTS, Russac et al. 2019) with a half-life h: [`ThompsonPolicy::decay_to`]
//! sets γ = 0.5^(Δt/h), Λ ← γΛ + (1−γ)λI, η ← γη and refactors L (O(d³), call it periodically).
//! An observation at time t is weighted 2^((t − clock)/h) relative to the decay clock, so a late
//! event counts as if it had arrived in time: the linear state is a function of the observation
//! set and the clock, and replicas that decay at the same epoch boundaries agree.
//!
//! # Ranking ([`ThompsonPolicy`])
//!
//! A bank of M draws is refreshed after updates ([`ThompsonPolicy::refresh_bank_seeded`]). Per
//! request ([`ThompsonPolicy::rank`]): with probability 1−ε one draw chosen uniformly from the
//! bank orders the candidates by x·θ̃; with probability ε the order is uniformly random. The
//! propensity of candidate a at position p is (1−ε)·(share of bank draws placing a at p) + ε/K —
//! exact for the policy as run, at least ε/K, summing to 1 over candidates. Each shown item
//! carries its sampled and mean scores, propensity, per-group contributions x_g·θ̃_g and the
//! posterior sd v·sqrt(xᵀΛ⁻¹x). The Kronecker structure of x makes a request cost
//! O(M·d + K·|c|·M), well under the naive K×d·d×M product.
//!
//! An [`ExplorationFloor`] ([`ThompsonPolicy::rank_with_floor`]) gives a share of requests'
//! first slot to one of a set of candidates drawn uniformly (a new model's unanswered ideas),
//! the rest of the list the policy's own; the propensities stay exact for that mixture.
//!
//! # Off-policy evaluation ([`ope`]) and state ([`state`])
//!
//! IPS, SNIPS, effective sample size and seeded percentile-bootstrap intervals over logged
//! (reward, logging propensity, target probability) records. [`PolicyState`] is a versioned serde
//! snapshot, checked on load ([`ThompsonPolicy::from_state`]).
//!
//! [`interval`] holds the Wilson interval the acceptance analytics report with.

pub mod error;
pub mod features;
pub mod interval;
mod linalg;
pub mod model;
pub mod ope;
pub mod policy;
pub mod state;

pub use error::{BanditError, MAX_ABS_VALUE, Result};
pub use features::{FeatureLayout, GROUP_NAMES, MAX_DIM};
pub use model::{ModelKind, Observation};
pub use ope::{BootstrapConfig, ConfidenceInterval, Estimator, LoggedRecord, OpeReport};
pub use policy::{
    Explanation, ExplorationFloor, PolicyConfig, RankedItem, Ranking, ScoreOffset, ThompsonPolicy,
};
pub use state::{FORMAT_VERSION, PolicyState};
