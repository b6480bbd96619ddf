//! AdamW over named tensors with its state in the open, so a training run can checkpoint and
//! resume it bit for bit (tch's `nn::Optimizer` keeps Adam's moments inside libtorch, unreachable).
//!
//! The update is PyTorch's `torch.optim.AdamW` (single-tensor path, `amsgrad=False`):
//!
//! ```text
//! p ← p · (1 − lr · wd)
//! m ← β₁ m + (1 − β₁) g          v ← β₂ v + (1 − β₂) g²
//! p ← p − (lr / (1 − β₁ᵗ)) · m / (√v / √(1 − β₂ᵗ) + ε)
//! ```
//!
//! The moments have the parameters' kind, as in PyTorch.

use std::path::Path;

use tch::{Kind, TchError, Tensor};

/// AdamW's hyper-parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWParams {
    pub learning_rate: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

/// Why optimizer state could not be saved or restored.
#[derive(Debug, thiserror::Error)]
pub enum OptimizerStateError {
    /// libtorch or the safetensors file failed.
    #[error("optimizer state: {0}")]
    Torch(#[from] TchError),
    /// The file does not describe this optimizer's parameters.
    #[error("optimizer state {path}: {problem}")]
    Mismatch { path: String, problem: String },
}

/// The optimizer: parameters by name, their two moments and the step count.
#[derive(Debug)]
pub struct AdamW {
    params: Vec<(String, Tensor)>,
    exp_avg: Vec<Tensor>,
    exp_avg_sq: Vec<Tensor>,
    steps: i64,
    hyper: AdamWParams,
}

/// Name of the scalar tensor holding the step count in a state file.
const STEP_KEY: &str = "__step__";

impl AdamW {
    /// An optimizer over `params` (leaf tensors that require gradients) with zero moments.
    pub fn new(params: Vec<(String, Tensor)>, hyper: AdamWParams) -> Result<Self, TchError> {
        let zeros = |tensor: &Tensor| tch::no_grad(|| tensor.f_zeros_like());
        let exp_avg = params
            .iter()
            .map(|(_, p)| zeros(p))
            .collect::<Result<_, _>>()?;
        let exp_avg_sq = params
            .iter()
            .map(|(_, p)| zeros(p))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            params,
            exp_avg,
            exp_avg_sq,
            steps: 0,
            hyper,
        })
    }

    /// The parameters, in the order given.
    pub fn params(&self) -> impl Iterator<Item = &Tensor> {
        self.params.iter().map(|(_, tensor)| tensor)
    }

    /// Updates taken so far.
    pub fn steps(&self) -> i64 {
        self.steps
    }

    pub fn hyper(&self) -> AdamWParams {
        self.hyper
    }

    pub fn set_learning_rate(&mut self, learning_rate: f64) {
        self.hyper.learning_rate = learning_rate;
    }

    /// Clears every parameter's gradient.
    pub fn zero_grad(&mut self) {
        for (_, param) in &mut self.params {
            let mut grad = param.grad();
            if grad.defined() {
                let _ = grad.detach_();
                let _ = grad.zero_();
            }
        }
    }

    /// One update from the parameters' current gradients (parameters without one are skipped,
    /// as PyTorch does).
    pub fn step(&mut self) -> Result<(), TchError> {
        self.steps += 1;
        let AdamWParams {
            learning_rate: lr,
            beta1,
            beta2,
            eps,
            weight_decay,
        } = self.hyper;
        let t = self.steps as f64;
        let bias_correction1 = 1.0 - beta1.powf(t);
        let bias_correction2_sqrt = (1.0 - beta2.powf(t)).sqrt();
        let step_size = lr / bias_correction1;
        tch::no_grad(|| {
            for (((_, param), exp_avg), exp_avg_sq) in self
                .params
                .iter()
                .zip(&mut self.exp_avg)
                .zip(&mut self.exp_avg_sq)
            {
                let grad = param.grad();
                if !grad.defined() {
                    continue;
                }
                let mut param = param.shallow_clone();
                let _ = param.f_mul_scalar_(1.0 - lr * weight_decay)?;
                let _ = exp_avg.f_lerp_(&grad, 1.0 - beta1)?;
                let _ = exp_avg_sq
                    .f_mul_scalar_(beta2)?
                    .f_addcmul_(&grad, &grad.f_mul_scalar(1.0 - beta2)?)?;
                let denom = exp_avg_sq
                    .f_sqrt()?
                    .f_div_scalar(bias_correction2_sqrt)?
                    .f_add_scalar(eps)?;
                let update = exp_avg.f_div(&denom)?.f_mul_scalar(step_size)?;
                let _ = param.f_sub_(&update)?;
            }
            Ok(())
        })
    }

    /// Writes the moments and the step count to a safetensors file (`NAME.exp_avg`,
    /// `NAME.exp_avg_sq`, `__step__`).
    pub fn save(&self, path: &Path) -> Result<(), OptimizerStateError> {
        let step = Tensor::from_slice(&[self.steps]);
        let mut tensors: Vec<(String, &Tensor)> = Vec::with_capacity(2 * self.params.len() + 1);
        for ((name, _), (avg, avg_sq)) in self
            .params
            .iter()
            .zip(self.exp_avg.iter().zip(&self.exp_avg_sq))
        {
            tensors.push((format!("{name}.exp_avg"), avg));
            tensors.push((format!("{name}.exp_avg_sq"), avg_sq));
        }
        tensors.push((STEP_KEY.to_owned(), &step));
        Tensor::write_safetensors(&tensors, path)?;
        Ok(())
    }

    /// Restores what [`Self::save`] wrote; the file must hold exactly this optimizer's
    /// parameters with their shapes.
    pub fn load(&mut self, path: &Path) -> Result<(), OptimizerStateError> {
        let mismatch = |problem: String| OptimizerStateError::Mismatch {
            path: path.display().to_string(),
            problem,
        };
        let mut stored: std::collections::HashMap<String, Tensor> =
            Tensor::read_safetensors(path)?.into_iter().collect();
        let step = stored
            .remove(STEP_KEY)
            .ok_or_else(|| mismatch(format!("no {STEP_KEY} entry")))?;
        let steps = step.f_to_kind(Kind::Int64)?.f_int64_value(&[0])?;
        if stored.len() != 2 * self.params.len() {
            return Err(mismatch(format!(
                "{} moment tensors for {} parameters",
                stored.len(),
                self.params.len()
            )));
        }
        tch::no_grad(|| {
            for ((name, param), (avg, avg_sq)) in self
                .params
                .iter()
                .zip(self.exp_avg.iter_mut().zip(self.exp_avg_sq.iter_mut()))
            {
                for (suffix, target) in [("exp_avg", avg), ("exp_avg_sq", avg_sq)] {
                    let key = format!("{name}.{suffix}");
                    let value = stored
                        .get(&key)
                        .ok_or_else(|| mismatch(format!("no entry {key}")))?;
                    if value.size() != param.size() {
                        return Err(mismatch(format!(
                            "{key} has shape {:?}, the parameter {:?}",
                            value.size(),
                            param.size()
                        )));
                    }
                    target.f_copy_(value)?;
                }
            }
            Ok::<(), OptimizerStateError>(())
        })?;
        self.steps = steps;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> Vec<(String, Tensor)> {
        vec![
            (
                "a".to_owned(),
                Tensor::from_slice(&[0.5f32, -1.0, 2.0]).set_requires_grad(true),
            ),
            (
                "b".to_owned(),
                Tensor::from_slice(&[3.0f32]).set_requires_grad(true),
            ),
        ]
    }

    const HYPER: AdamWParams = AdamWParams {
        learning_rate: 0.1,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
    };

    fn run_steps(optimizer: &mut AdamW, steps: usize) {
        for _ in 0..steps {
            optimizer.zero_grad();
            let loss = optimizer
                .params()
                .map(|p| (p * p).sum(Kind::Float))
                .fold(Tensor::from(0.0f32), |acc, x| acc + x);
            loss.backward();
            optimizer.step().unwrap();
        }
    }

    #[test]
    fn matches_the_formula_on_the_first_step() {
        // Step 1: m̂ = g, v̂ = g², so the update is lr · g / (|g| + ε) = lr · sign(g) after decay.
        let mut optimizer = AdamW::new(params(), HYPER).unwrap();
        run_steps(&mut optimizer, 1);
        let a: Vec<f32> = Vec::try_from(optimizer.params().next().unwrap()).unwrap();
        for (got, start) in a.iter().zip([0.5f32, -1.0, 2.0]) {
            let decayed = start * (1.0 - 0.1 * 0.01);
            let expected = decayed - 0.1 * start.signum();
            assert!((got - expected).abs() < 1e-6, "{got} vs {expected}");
        }
    }

    #[test]
    fn saved_state_resumes_bit_for_bit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("optimizer.safetensors");
        let mut straight = AdamW::new(params(), HYPER).unwrap();
        run_steps(&mut straight, 5);

        let mut first = AdamW::new(params(), HYPER).unwrap();
        run_steps(&mut first, 3);
        first.save(&path).unwrap();
        let values: Vec<Tensor> = first.params().map(Tensor::copy).collect();
        let resumed_params = params();
        for ((_, target), value) in resumed_params.iter().zip(&values) {
            tch::no_grad(|| target.shallow_clone().copy_(value));
        }
        let mut resumed = AdamW::new(resumed_params, HYPER).unwrap();
        resumed.load(&path).unwrap();
        assert_eq!(resumed.steps(), 3);
        run_steps(&mut resumed, 2);
        for (a, b) in straight.params().zip(resumed.params()) {
            assert!(a.equal(b), "{a} vs {b}");
        }
        let mut other = AdamW::new(vec![params().remove(0)], HYPER).unwrap();
        assert!(matches!(
            other.load(&path),
            Err(OptimizerStateError::Mismatch { .. })
        ));
    }
}
