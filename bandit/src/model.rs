//! The Gaussian posterior over the weight vector θ, shared by the linear and logistic models.
//!
//! Both models keep the posterior in natural parameters: the precision Λ (with its Cholesky
//! factor L) and η = Λμ. For the linear model η is the classic b = Σ w·r·x. Every observation adds
//! a weighted rank-1 term to Λ and a multiple of x to η:
//!
//! - **linear** (Agrawal & Goyal 2013): Λ += w·x xᵀ, η += w·r·x. Both are plain sums, so the
//!   state after a set of observations does not depend on their order (up to float rounding).
//! - **logistic, Laplace approximation** (Chapelle & Li 2011, full-covariance variant, one
//!   observation per batch): with p = σ(xᵀμ) at the current mean, one Newton step on the
//!   weighted log-loss gives Λ' = Λ + w·p(1−p)·x xᵀ and μ' = μ + Λ'⁻¹ w(y − p)x, i.e.
//!   η' = η + (w·p(1−p)·xᵀμ + w(y − p))·x. The step depends on μ, so this model is
//!   order-dependent; replicas agree by rebuilding in a fixed order.
//!
//! Discounting toward the prior, Λ ← γΛ + (1−γ)λI and η ← γη (Russac et al. 2019), keeps the
//! prior term λI intact and scales all evidence by γ.

use rand::Rng;
use rand_distr::StandardNormal;
use serde::{Deserialize, Serialize};

use crate::error::{BanditError, Result};
use crate::linalg::Cholesky;

/// Which likelihood the posterior assumes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelKind {
    /// Bayesian linear regression on the reward (accepted → 1, rejected → 0); scores are
    /// expected rewards. Order-independent updates.
    #[default]
    Linear,
    /// Bayesian logistic regression with a Laplace approximation; rewards are labels in [0, 1]
    /// and scores are log-odds of acceptance.
    Logistic,
}

/// One piece of feedback: the logged context z and candidate c, the reward, and when the event
/// happened. `id` (the decision's event id) breaks timestamp ties in [`crate::ThompsonPolicy::rebuild`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// Stable identifier of the feedback event; only its ordering matters here.
    pub id: String,
    /// Event time in seconds (any fixed epoch, e.g. Unix time).
    pub timestamp_s: f64,
    /// The context vector z the ranking was computed with.
    pub context: Vec<f64>,
    /// The candidate's feature vector c.
    pub candidate: Vec<f64>,
    /// 1 for accepted, 0 for rejected. The linear model accepts any bounded real, the
    /// logistic model a value in [0, 1].
    pub reward: f64,
}

impl Observation {
    /// An accept (reward 1) or reject (reward 0).
    pub fn binary(
        id: impl Into<String>,
        timestamp_s: f64,
        context: Vec<f64>,
        candidate: Vec<f64>,
        accepted: bool,
    ) -> Self {
        Self {
            id: id.into(),
            timestamp_s,
            context,
            candidate,
            reward: if accepted { 1.0 } else { 0.0 },
        }
    }
}

/// N(μ, v²Λ⁻¹) over θ, in natural parameters.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Posterior {
    pub(crate) kind: ModelKind,
    pub(crate) d: usize,
    pub(crate) prior_precision: f64,
    /// Λ, row-major d×d, exactly symmetric (each update adds the same product to both halves).
    pub(crate) precision: Vec<f64>,
    pub(crate) chol: Cholesky,
    /// η = Λμ.
    pub(crate) eta: Vec<f64>,
    /// μ = Λ⁻¹η, kept current after every change.
    pub(crate) mean: Vec<f64>,
}

impl Posterior {
    /// The prior N(0, v²λ⁻¹I).
    pub(crate) fn prior(kind: ModelKind, d: usize, prior_precision: f64) -> Self {
        let mut precision = vec![0.0; d * d];
        for i in 0..d {
            precision[i * d + i] = prior_precision;
        }
        Self {
            kind,
            d,
            prior_precision,
            precision,
            chol: Cholesky::scaled_identity(d, prior_precision),
            eta: vec![0.0; d],
            mean: vec![0.0; d],
        }
    }

    /// Checks that `reward` is a valid label for this model.
    pub(crate) fn check_reward(&self, reward: f64) -> Result<()> {
        let ok = match self.kind {
            ModelKind::Linear => reward.is_finite() && reward.abs() <= crate::MAX_ABS_VALUE,
            ModelKind::Logistic => (0.0..=1.0).contains(&reward),
        };
        if ok {
            Ok(())
        } else {
            Err(BanditError::BadValue {
                block: "reward".into(),
                index: 0,
                value: reward,
            })
        }
    }

    /// Adds one observation with interaction vector `x` (finite, bounded), reward (checked) and
    /// weight w ≥ 0. `x` is used as scratch.
    pub(crate) fn update(&mut self, x: &mut [f64], reward: f64, weight: f64) {
        if weight <= 0.0 {
            // A fully discounted observation (the weight underflowed) carries no evidence.
            return;
        }
        let (curvature, eta_coef) = match self.kind {
            ModelKind::Linear => (weight, weight * reward),
            ModelKind::Logistic => {
                let logit = dot(x, &self.mean);
                let p = sigmoid(logit);
                let h = weight * p * (1.0 - p);
                (h, h * logit + weight * (reward - p))
            }
        };
        for (e, &xi) in self.eta.iter_mut().zip(x.iter()) {
            *e += eta_coef * xi;
        }
        // Scale x by √curvature once: the outer product of the scaled vector is exactly
        // symmetric (xᵢxⱼ = xⱼxᵢ bit for bit, whereas (c·xᵢ)·xⱼ need not equal (c·xⱼ)·xᵢ), and the
        // same vector feeds the rank-1 update of the factor.
        let root = curvature.sqrt();
        for xi in x.iter_mut() {
            *xi *= root;
        }
        let d = self.d;
        for (i, &xi) in x.iter().enumerate() {
            if xi != 0.0 {
                for (a, &xj) in self.precision[i * d..(i + 1) * d].iter_mut().zip(x.iter()) {
                    *a += xi * xj;
                }
            }
        }
        self.chol.rank_one_update(x);
        self.refresh_mean();
    }

    /// Λ ← γΛ + (1−γ)λI, η ← γη, then refactors Λ (O(d³)). On failure nothing changes.
    pub(crate) fn discount(&mut self, gamma: f64) -> Result<()> {
        let d = self.d;
        let mut precision: Vec<f64> = self.precision.iter().map(|a| gamma * a).collect();
        for i in 0..d {
            precision[i * d + i] += (1.0 - gamma) * self.prior_precision;
        }
        let chol = Cholesky::factor(&precision, d).ok_or(BanditError::NotPositiveDefinite)?;
        self.precision = precision;
        self.chol = chol;
        for e in &mut self.eta {
            *e *= gamma;
        }
        self.refresh_mean();
        Ok(())
    }

    fn refresh_mean(&mut self) {
        self.mean.copy_from_slice(&self.eta);
        self.chol.solve(&mut self.mean);
    }

    /// ‖L⁻¹x‖ = sqrt(xᵀΛ⁻¹x); `x` is used as scratch.
    pub(crate) fn mahalanobis(&self, x: &mut [f64]) -> f64 {
        self.chol.solve_lower(x);
        x.iter().map(|v| v * v).sum::<f64>().sqrt()
    }

    /// `count` draws θ̃ = μ + v·L⁻ᵀe, e ~ N(0, I), as the columns of a d×`count` row-major
    /// matrix. Cov(L⁻ᵀe) = L⁻ᵀL⁻¹ = Λ⁻¹, so θ̃ ~ N(μ, v²Λ⁻¹). The noise is drawn draw after
    /// draw (d normals each), so a seed fixes every draw independently of how it is solved.
    pub(crate) fn sample_columns<R: Rng + ?Sized>(
        &self,
        scale: f64,
        count: usize,
        rng: &mut R,
    ) -> Vec<f64> {
        let d = self.d;
        let mut x = vec![0.0; d * count];
        for m in 0..count {
            for i in 0..d {
                x[i * count + m] = rng.sample(StandardNormal);
            }
        }
        self.chol.solve_upper_multi(&mut x, count);
        for (row, &mu) in x.chunks_exact_mut(count.max(1)).zip(&self.mean) {
            for t in row {
                *t = mu + scale * *t;
            }
        }
        x
    }
}

pub(crate) fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The logistic function, written so neither branch overflows.
pub(crate) fn sigmoid(t: f64) -> f64 {
    if t >= 0.0 {
        1.0 / (1.0 + (-t).exp())
    } else {
        let e = t.exp();
        e / (1.0 + e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sigmoid_is_stable_at_the_extremes() {
        assert_eq!(sigmoid(0.0), 0.5);
        assert!(sigmoid(-800.0) >= 0.0 && sigmoid(-800.0) < 1e-300);
        assert_eq!(sigmoid(800.0), 1.0);
    }

    #[test]
    fn logistic_mean_moves_toward_the_label() {
        let mut post = Posterior::prior(ModelKind::Logistic, 2, 1.0);
        for _ in 0..200 {
            post.update(&mut [1.0, 0.0], 1.0, 1.0);
            post.update(&mut [0.0, 1.0], 0.0, 1.0);
        }
        // With 200 accepts the first weight's log-odds is well above 0; rejects push the second
        // below. Newton steps from the running mean approximate the MAP, which for 200 vs 0
        // under a unit prior sits near ln(200)-ish.
        assert!(post.mean[0] > 2.0, "{:?}", post.mean);
        assert!(post.mean[1] < -2.0, "{:?}", post.mean);
        assert_eq!(post.precision[1], 0.0, "the features never co-occur");
    }

    #[test]
    fn discount_to_zero_returns_the_prior() {
        let mut post = Posterior::prior(ModelKind::Linear, 3, 2.0);
        post.update(&mut [1.0, 2.0, 3.0], 1.0, 1.0);
        post.discount(0.0).unwrap();
        assert_eq!(post, Posterior::prior(ModelKind::Linear, 3, 2.0));
    }
}
