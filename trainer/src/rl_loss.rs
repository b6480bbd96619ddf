//! The policy-gradient loss of an RL step over sampled completions, as a function of the
//! per-token policy log-probs (what [`crate::train_step::Trainer::step`] hands a loss).
//!
//! With one advantage A_i per completion (from the `objectives` crate) the loss is
//!
//! ```text
//! L = −(1/P) Σ_i Σ_t∈y_i min(ρ_t A_i, clip(ρ_t, 1−ε_low, 1+ε_high) A_i)  +  β (1/P) Σ_i Σ_t k3_t
//! ρ_t = exp(log π(t) − log π_sample(t)),  k3_t = exp(log π_ref(t) − log π(t)) − (log π_ref(t) − log π(t)) − 1
//! ```
//!
//! over P prompts. **Normalisation: per sequence** (token log-probs summed within a completion,
//! completions summed within a group, groups averaged). At ρ = 1 its gradient is
//! (1/P) Σ_i A_i ∇log π(y_i), exactly the paper's estimator, whose unbiasedness needs the whole
//! sequence log-probability; a per-token mean (DAPO's) would weight each token by 1/length and
//! change the objective (shorter completions would count more per token). The `Token` variant is
//! there for comparison. Without clipping (ε = None) the surrogate is ρ_t A_i, whose gradient is
//! the same at ρ = 1. The KL term uses Schulman's k3 estimator against the reference policy (the
//! same model with its adapters off), summed per sequence like the policy term.
//!
//! The clip binds only once the policy has moved away from the one that sampled, i.e. from the
//! second minibatch or epoch over a rollout batch on; ε_high > ε_low is DAPO's clip-higher (a
//! rare token with a positive advantage may grow further than a common one may shrink).

use tch::{Kind, Tensor};

use crate::train_step::TrainError;

/// How token terms are combined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Aggregation {
    /// Σ over a completion's tokens, Σ over a group's completions, mean over groups (unbiased for
    /// the sequence-level objective).
    #[default]
    Sequence,
    /// Mean over every scored token of the batch (DAPO-style; length-weighted).
    Token,
}

/// The loss's settings.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PolicyLossConfig {
    /// PPO clipping ε of the ratio to the sampling policy (its lower side, 1 − ε); `None` for the
    /// plain policy gradient.
    pub clip_epsilon: Option<f64>,
    /// The upper side's ε (1 + ε_high); `None` is `clip_epsilon` (symmetric).
    pub clip_epsilon_high: Option<f64>,
    /// β of the k3 KL penalty to the reference policy (0 disables it).
    pub kl_coef: f64,
    pub aggregation: Aggregation,
}

/// One batch's per-completion inputs, aligned with the `[b, t − 1]` log-probs.
#[derive(Debug)]
pub struct PolicyLossInputs<'a> {
    /// `[b]` f32: each completion's advantage.
    pub advantages: &'a Tensor,
    /// `[b, t − 1]` f32: the log-probs the completions were sampled with (0 off the mask).
    pub sampling_logprobs: &'a Tensor,
    /// `[b, t − 1]` f32: the reference policy's log-probs; required when `kl_coef > 0`, and
    /// measured (KL statistic only) when given with `kl_coef = 0`.
    pub reference_logprobs: Option<&'a Tensor>,
    /// Prompts the batch covers (the `P` above).
    pub prompts: i64,
}

/// What the loss saw, for metrics (computed without a graph).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PolicyLossStats {
    /// The policy term alone.
    pub policy_loss: f64,
    /// Mean k3 KL per scored token (0 without a reference).
    pub kl_per_token: f64,
    /// Share of scored tokens whose ratio was clipped.
    pub clip_fraction: f64,
    /// −mean log π of the scored tokens: a sample estimate of the per-token entropy.
    pub entropy: f64,
    /// The largest |log ρ_t| over the scored tokens: 0 up to rounding when the policy scored
    /// here is the one that sampled (the first minibatch of a batch), which checks that sampling
    /// and training use one distribution (temperature, dropout, masks).
    pub max_abs_log_ratio: f64,
    /// Scored tokens.
    pub tokens: f64,
}

/// The loss (a differentiable scalar) and its statistics.
pub fn policy_loss(
    logprobs: &Tensor,
    mask: &Tensor,
    inputs: &PolicyLossInputs<'_>,
    config: &PolicyLossConfig,
) -> Result<(Tensor, PolicyLossStats), TrainError> {
    let size = logprobs.size();
    if size.len() != 2 {
        return Err(TrainError::Batch(format!(
            "log-probs must be [b, t], got {size:?}"
        )));
    }
    let rows = size[0];
    if inputs.advantages.size() != [rows] {
        return Err(TrainError::Batch(format!(
            "{rows} completions but advantages of shape {:?}",
            inputs.advantages.size()
        )));
    }
    if inputs.sampling_logprobs.size() != size {
        return Err(TrainError::Batch(format!(
            "sampling log-probs of shape {:?} for log-probs of shape {size:?}",
            inputs.sampling_logprobs.size()
        )));
    }
    if inputs.prompts <= 0 {
        return Err(TrainError::Batch(
            "a batch covers at least one prompt".into(),
        ));
    }
    let reference = match (config.kl_coef > 0.0, inputs.reference_logprobs) {
        (true, None) => {
            return Err(TrainError::Batch(
                "a KL penalty needs the reference log-probs".into(),
            ));
        }
        (_, Some(reference)) if reference.size() != size => {
            return Err(TrainError::Batch(format!(
                "reference log-probs of shape {:?} for log-probs of shape {size:?}",
                reference.size()
            )));
        }
        // Without a penalty a given reference still yields the KL statistic.
        (_, reference) => reference,
    };
    let mask = mask.f_to_kind(Kind::Float)?;
    let advantages = inputs.advantages.f_to_kind(Kind::Float)?.f_unsqueeze(1)?;
    let log_ratio = (logprobs - inputs.sampling_logprobs).f_mul(&mask)?;
    let ratio = log_ratio.f_exp()?;
    let unclipped = ratio.f_mul(&advantages)?;
    let (surrogate, clipped_tokens) = match config.clip_epsilon {
        Some(eps) => {
            let high = config.clip_epsilon_high.unwrap_or(eps);
            let clipped = ratio.f_clamp(1.0 - eps, 1.0 + high)?.f_mul(&advantages)?;
            let surrogate = unclipped.f_minimum(&clipped)?;
            let binding = tch::no_grad(|| -> Result<Tensor, TrainError> {
                Ok(clipped.f_lt_tensor(&unclipped)?.f_to_kind(Kind::Float)?)
            })?;
            (surrogate, Some(binding))
        }
        None => (unclipped, None),
    };
    let tokens = mask.f_sum(Kind::Float)?;
    let aggregate = |per_token: &Tensor| -> Result<Tensor, TrainError> {
        let total = per_token.f_mul(&mask)?.f_sum(Kind::Float)?;
        Ok(match config.aggregation {
            Aggregation::Sequence => total.f_div_scalar(inputs.prompts as f64)?,
            Aggregation::Token => total.f_div(&tokens.f_clamp_min(1.0)?)?,
        })
    };
    let policy = aggregate(&surrogate)?.f_neg()?;
    let (loss, kl_per_token) = match reference {
        Some(reference) => {
            let k3 = k3_terms(logprobs, reference, &mask)?;
            let kl_mean = tch::no_grad(|| masked_mean(&k3, &mask))?;
            if config.kl_coef > 0.0 {
                let penalty = aggregate(&k3)?.f_mul_scalar(config.kl_coef)?;
                (policy.f_add(&penalty)?, kl_mean)
            } else {
                (policy.shallow_clone(), kl_mean)
            }
        }
        None => (policy.shallow_clone(), 0.0),
    };
    let stats = tch::no_grad(|| -> Result<PolicyLossStats, TrainError> {
        let count = tokens.f_double_value(&[])?.max(1.0);
        let clip_fraction = match &clipped_tokens {
            Some(binding) => {
                binding
                    .f_mul(&mask)?
                    .f_sum(Kind::Float)?
                    .f_double_value(&[])?
                    / count
            }
            None => 0.0,
        };
        let entropy = -(logprobs
            .f_mul(&mask)?
            .f_sum(Kind::Float)?
            .f_double_value(&[])?)
            / count;
        let max_abs_log_ratio = log_ratio
            .f_abs()?
            .f_max()?
            .f_to_kind(Kind::Double)?
            .f_double_value(&[])?;
        Ok(PolicyLossStats {
            policy_loss: policy.f_double_value(&[])?,
            kl_per_token,
            clip_fraction,
            entropy,
            max_abs_log_ratio,
            tokens: count,
        })
    })?;
    Ok((loss, stats))
}

/// Schulman's k3 estimate of KL(π‖π_ref) per token, `exp(d) − d − 1` with d = log π_ref − log π,
/// zero off `mask` (a 0/1 float tensor aligned with the log-probs). Differentiable in `logprobs`.
fn k3_terms(logprobs: &Tensor, reference: &Tensor, mask: &Tensor) -> Result<Tensor, TrainError> {
    let diff = (reference - logprobs).f_mul(mask)?;
    Ok(diff.f_exp()?.f_sub(&diff)?.f_sub_scalar(1.0)?)
}

fn masked_mean(values: &Tensor, mask: &Tensor) -> Result<f64, TrainError> {
    let count = mask.f_sum(Kind::Float)?.f_clamp_min(1.0)?;
    Ok(values
        .f_mul(mask)?
        .f_sum(Kind::Float)?
        .f_div(&count)?
        .f_double_value(&[])?)
}

/// Mean k3 KL per scored token between the `[b, t − 1]` log-probs of a policy and of the
/// reference, over the scored positions `mask` (0/1, same shape); no autograd. The figure
/// [`policy_loss`] reports, for batches that are measured but not trained on.
pub fn mean_k3_kl(logprobs: &Tensor, reference: &Tensor, mask: &Tensor) -> Result<f64, TrainError> {
    tch::no_grad(|| {
        let mask = mask.f_to_kind(Kind::Float)?;
        masked_mean(&k3_terms(logprobs, reference, &mask)?, &mask)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(values: &[f32], shape: &[i64]) -> Tensor {
        Tensor::from_slice(values).reshape(shape)
    }

    /// Two prompts' worth of completions: 3 rows of 4 positions, the last row one token shorter.
    fn batch() -> (Tensor, Tensor, Tensor, Tensor) {
        let logprobs = tensor(
            &[
                -1.0, -0.5, -2.0, 0.0, -0.3, -0.2, -0.1, -0.7, -1.5, -0.4, -0.9, 0.0,
            ],
            &[3, 4],
        )
        .set_requires_grad(true);
        let mask = tensor(&[0., 1., 1., 1., 0., 1., 1., 1., 0., 1., 1., 0.], &[3, 4]);
        let sampling = tensor(
            &[
                0.0, -0.5, -2.0, 0.0, 0.0, -0.2, -0.1, -0.7, 0.0, -0.4, -0.9, 0.0,
            ],
            &[3, 4],
        );
        let advantages = Tensor::from_slice(&[0.5f32, -0.25, 1.0]);
        (logprobs, mask, sampling, advantages)
    }

    /// The inputs of [`batch`]'s two prompts.
    fn two_prompts<'a>(
        advantages: &'a Tensor,
        sampling: &'a Tensor,
        reference: Option<&'a Tensor>,
    ) -> PolicyLossInputs<'a> {
        PolicyLossInputs {
            advantages,
            sampling_logprobs: sampling,
            reference_logprobs: reference,
            prompts: 2,
        }
    }

    fn grad_of(loss: &Tensor, of: &Tensor) -> Vec<f32> {
        loss.backward();
        Vec::<f32>::try_from(of.grad().reshape([-1])).unwrap()
    }

    #[test]
    fn on_policy_gradient_is_the_advantage_weighted_sequence_log_prob_gradient() {
        let (logprobs, mask, sampling, advantages) = batch();
        let inputs = two_prompts(&advantages, &sampling, None);
        for clip in [None, Some(0.2)] {
            let config = PolicyLossConfig {
                clip_epsilon: clip,
                ..PolicyLossConfig::default()
            };
            let leaf = logprobs.detach().set_requires_grad(true);
            let (loss, stats) = policy_loss(&leaf, &mask, &inputs, &config).unwrap();
            // d L / d log π(t) = −A_i · mask / P, whatever the clip (ρ = 1 on policy).
            let want: Vec<f32> = [0.5f32, -0.25, 1.0]
                .iter()
                .flat_map(|a| [*a; 4])
                .zip(Vec::<f32>::try_from(mask.reshape([-1])).unwrap())
                .map(|(a, m)| -a * m / 2.0)
                .collect();
            let got = grad_of(&loss, &leaf);
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() < 1e-6, "{got:?} vs {want:?}");
            }
            assert_eq!(stats.clip_fraction, 0.0);
            assert_eq!(stats.max_abs_log_ratio, 0.0);
            assert_eq!(stats.tokens, 8.0);
            // Loss = −(1/P) Σ A_i · (number of tokens of i) at ρ = 1.
            let want_loss = -(0.5 * 3.0 - 0.25 * 3.0 + 1.0 * 2.0) / 2.0;
            assert!((stats.policy_loss - want_loss).abs() < 1e-6);
        }
    }

    #[test]
    fn clipping_stops_the_gradient_where_the_ratio_left_the_trust_region() {
        let (logprobs, mask, sampling, advantages) = batch();
        // Raise row 0's last token's probability by e^0.5 > 1.2 with a positive advantage.
        let moved = logprobs.detach().copy();
        let _ = moved.get(0).get(3).fill_(0.5);
        let leaf = moved.set_requires_grad(true);
        let inputs = two_prompts(&advantages, &sampling, None);
        let config = PolicyLossConfig {
            clip_epsilon: Some(0.2),
            ..PolicyLossConfig::default()
        };
        let (loss, stats) = policy_loss(&leaf, &mask, &inputs, &config).unwrap();
        let got = grad_of(&loss, &leaf);
        assert_eq!(got[3], 0.0, "clipped token still has gradient: {got:?}");
        assert!((got[1] - (-0.25)).abs() < 1e-6);
        assert!((stats.clip_fraction - 1.0 / 8.0).abs() < 1e-9);
        assert!((stats.max_abs_log_ratio - 0.5).abs() < 1e-6);

        // Clip-higher: with ε_high = 0.7 the ratio e^0.5 ≈ 1.65 is inside the region again.
        let leaf = leaf.detach().set_requires_grad(true);
        let config = PolicyLossConfig {
            clip_epsilon: Some(0.2),
            clip_epsilon_high: Some(0.7),
            ..PolicyLossConfig::default()
        };
        let (loss, stats) = policy_loss(&leaf, &mask, &inputs, &config).unwrap();
        let got = grad_of(&loss, &leaf);
        let want = -0.5 * 0.5f64.exp() / 2.0;
        assert!((f64::from(got[3]) - want).abs() < 1e-5, "{got:?}");
        assert_eq!(stats.clip_fraction, 0.0);
    }

    #[test]
    fn k3_penalty_pulls_towards_the_reference() {
        let (logprobs, mask, sampling, _) = batch();
        let zero = Tensor::zeros([3], (Kind::Float, tch::Device::Cpu));
        let reference = logprobs.detach() - 0.1;
        let inputs = two_prompts(&zero, &sampling, Some(&reference));
        let config = PolicyLossConfig {
            kl_coef: 0.5,
            ..PolicyLossConfig::default()
        };
        let leaf = logprobs.detach().set_requires_grad(true);
        let (loss, stats) = policy_loss(&leaf, &mask, &inputs, &config).unwrap();
        let k3 = (-0.1f64).exp() + 0.1 - 1.0;
        assert!((stats.kl_per_token - k3).abs() < 1e-6);
        // d/d lp of β/P (e^(ref−lp) − (ref−lp) − 1) = β/P (1 − e^(ref−lp)) > 0: lowering lp
        // towards the reference lowers the loss.
        let want = 0.5 / 2.0 * (1.0 - (-0.1f64).exp());
        let got = grad_of(&loss, &leaf);
        assert!((f64::from(got[1]) - want).abs() < 1e-6, "{got:?}");
        assert_eq!(got[0], 0.0);
    }

    #[test]
    fn token_aggregation_divides_by_tokens() {
        let (logprobs, mask, sampling, advantages) = batch();
        let inputs = two_prompts(&advantages, &sampling, None);
        let config = PolicyLossConfig {
            aggregation: Aggregation::Token,
            ..PolicyLossConfig::default()
        };
        let (_, stats) = policy_loss(&logprobs, &mask, &inputs, &config).unwrap();
        let want = -(0.5 * 3.0 - 0.25 * 3.0 + 1.0 * 2.0) / 8.0;
        assert!((stats.policy_loss - want).abs() < 1e-6);
    }

    #[test]
    fn mismatched_inputs_are_errors() {
        let (logprobs, mask, sampling, _) = batch();
        let short = Tensor::from_slice(&[1.0f32]);
        let inputs = two_prompts(&short, &sampling, None);
        let err = policy_loss(&logprobs, &mask, &inputs, &PolicyLossConfig::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("3 completions"), "{err}");
        let advantages = Tensor::from_slice(&[0.0f32, 0.0, 0.0]);
        let inputs = two_prompts(&advantages, &sampling, None);
        let config = PolicyLossConfig {
            kl_coef: 0.1,
            ..PolicyLossConfig::default()
        };
        let err = policy_loss(&logprobs, &mask, &inputs, &config)
            .unwrap_err()
            .to_string();
        assert!(err.contains("reference"), "{err}");
    }
}
