//! One optimisation step: policy log-probs, a loss over them, backward, gradient-norm clipping and
//! AdamW over the model's trainable variables: its LoRA adapters (the base frozen, the usual case),
//! or every weight after [`CausalLm::set_base_trainable`] (full fine-tuning of small models).
//!
//! The backward pass recomputes the LM head chunk by chunk instead of keeping every chunk's
//! `[chunk, vocab]` f32 log-softmax alive for autograd: the forward computes the log-probs without
//! a graph through the head, the loss's gradient with respect to them is pushed back through one
//! head chunk at a time into the final hidden states, and from there through the decoder. Every
//! loss the trainer supports is a function of per-token log-probs (supervised NLL now, the RL
//! objectives later), so this costs one extra LM-head forward and saves `n × vocab × 4` bytes.

use std::path::Path;

use tch::{Kind, TchError, Tensor};

use crate::adamw::{AdamW, AdamWParams, OptimizerStateError};
use crate::logprobs::{
    DEFAULT_CHUNK_TOKENS, ScoredTokens, TrainBatch, head_logprobs_and_allowed_mass,
};
use crate::model::{CausalLm, ModelError};

/// Why a training step could not run.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The model rejected the batch or failed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// libtorch failed.
    #[error("libtorch: {0}")]
    Torch(#[from] TchError),
    /// The trainer's settings are unusable.
    #[error("trainer config: {0}")]
    Config(String),
    /// The model has nothing to train, or its saved state does not match its trainable variables.
    #[error("trainable variables: {0}")]
    Trainable(String),
    /// The batch scores no token or the loss is unusable.
    #[error("training batch: {0}")]
    Batch(String),
    /// Optimizer or parameter state could not be saved or restored.
    #[error(transparent)]
    State(#[from] OptimizerStateError),
    /// The loss or the gradient norm is NaN or infinite; the step was not applied.
    #[error("non-finite {what} ({value}); the optimizer step was skipped")]
    NonFinite {
        /// `loss` or `gradient norm`.
        what: &'static str,
        /// The offending value.
        value: f64,
    },
}

/// AdamW and clipping settings. Defaults are PyTorch's AdamW (betas 0.9/0.999, eps 1e-8, weight
/// decay 0.01) with a LoRA-typical learning rate and gradient norm clipped at 1.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainerConfig {
    /// Learning rate.
    pub learning_rate: f64,
    /// AdamW β₁.
    pub beta1: f64,
    /// AdamW β₂.
    pub beta2: f64,
    /// AdamW ε.
    pub eps: f64,
    /// Decoupled weight decay on the trainable variables.
    pub weight_decay: f64,
    /// Clip the global L2 norm of the gradients to this; `None` disables clipping (the
    /// norm is still measured and reported).
    pub max_grad_norm: Option<f64>,
    /// Scored tokens per LM-head chunk (see [`DEFAULT_CHUNK_TOKENS`]).
    pub chunk_tokens: i64,
    /// Keep only each decoder layer's input through the forward and recompute the layer in the
    /// backward pass ([`CausalLm::checkpointed_hidden_states`]): the same gradients for about
    /// one more forward, with activation memory cut to one `[b, t, hidden]` per layer.
    pub gradient_checkpointing: bool,
    /// The temperature the policy's log-probs are taken at: an RL step's samples' (see
    /// [`crate::logprobs`]); 1 for supervised steps.
    pub temperature: f64,
    /// Apply the LoRA adapters' dropout in the training forward. Supervised steps may; an RL
    /// step must not: its samples and their "old" log-probs come from the dropout-free policy,
    /// and a loss scored with dropout on would see a ratio ≠ 1 before any update.
    pub adapter_dropout: bool,
    /// Weight of the forbidden-mass penalty on batches with allowed sets (constrained samples):
    /// the mean over scored tokens of `−log P(allowed)` under the unmasked distribution, added to
    /// the loss. The policy's log-probs are those of the masked distribution, so without it
    /// nothing holds the logits of the tokens the grammar forbids; with it the model keeps its
    /// mass on the grammar's tokens and stays usable without the grammar. 0 turns it off.
    pub forbidden_mass_coef: f64,
}

impl Default for TrainerConfig {
    fn default() -> Self {
        Self {
            learning_rate: 1e-4,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            max_grad_norm: Some(1.0),
            chunk_tokens: DEFAULT_CHUNK_TOKENS,
            gradient_checkpointing: false,
            temperature: 1.0,
            adapter_dropout: true,
            forbidden_mass_coef: 0.0,
        }
    }
}

impl TrainerConfig {
    fn validate(&self) -> Result<(), TrainError> {
        let positive_finite = |value: f64| value.is_finite() && value > 0.0;
        let problem = if !positive_finite(self.learning_rate) {
            Some(format!(
                "learning_rate must be positive and finite, got {}",
                self.learning_rate
            ))
        } else if !(0.0..1.0).contains(&self.beta1) || !(0.0..1.0).contains(&self.beta2) {
            Some(format!(
                "betas must be in [0, 1), got ({}, {})",
                self.beta1, self.beta2
            ))
        } else if !positive_finite(self.eps) {
            Some(format!("eps must be positive, got {}", self.eps))
        } else if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            Some(format!(
                "weight_decay must be non-negative, got {}",
                self.weight_decay
            ))
        } else if self
            .max_grad_norm
            .is_some_and(|norm| !positive_finite(norm))
        {
            Some(format!(
                "max_grad_norm must be positive, got {:?}",
                self.max_grad_norm
            ))
        } else if !positive_finite(self.temperature) {
            Some(format!(
                "temperature must be positive and finite, got {}",
                self.temperature
            ))
        } else if self.chunk_tokens <= 0 {
            Some(format!(
                "chunk_tokens must be positive, got {}",
                self.chunk_tokens
            ))
        } else if !(self.forbidden_mass_coef.is_finite() && self.forbidden_mass_coef >= 0.0) {
            Some(format!(
                "forbidden_mass_coef must be a finite number ≥ 0, got {}",
                self.forbidden_mass_coef
            ))
        } else {
            None
        };
        problem.map_or(Ok(()), |message| Err(TrainError::Config(message)))
    }
}

/// Whether a step measures the forbidden mass ([`StepStats::forbidden_mass`]) on a batch with
/// allowed sets. Measuring builds each scored token's allowed-set mask and takes a log-sum-exp
/// over it, one more pass over the LM head's logits: worth it once per rollout batch for the
/// metrics, not on every minibatch. A step with a forbidden-mass penalty measures it anyway (the
/// penalty is that measure).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Measure {
    /// Report the forbidden mass.
    ForbiddenMass,
    /// Only the loss (the forbidden mass too when the step is penalized).
    LossOnly,
}

impl Measure {
    /// An RL update's choice: the forbidden mass is a per-rollout-batch metric, so only the
    /// update's first minibatch (`first`) measures it.
    pub fn on_first_minibatch(first: bool) -> Self {
        if first {
            Self::ForbiddenMass
        } else {
            Self::LossOnly
        }
    }
}

/// What one step did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepStats {
    /// The loss before the update.
    pub loss: f64,
    /// Global L2 norm of the gradients before clipping.
    pub grad_norm: f64,
    /// Tokens the loss scored.
    pub tokens: i64,
    /// On batches with allowed sets, when measured (see [`Measure`]): the mean probability,
    /// over the scored tokens and before the update, that the unmasked model puts on tokens the
    /// grammar forbids.
    pub forbidden_mass: Option<f64>,
}

/// What [`accumulate_gradients`] measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Accumulated {
    /// The loss, the forbidden-mass penalty included.
    pub loss: f64,
    /// Tokens the loss scored.
    pub tokens: i64,
    /// See [`StepStats::forbidden_mass`].
    pub forbidden_mass: Option<f64>,
}

/// File of [`Trainer::save_state`] holding the trainable variables' values (the adapters, or every
/// weight when fine-tuning fully).
pub const TRAINABLE_STATE_FILE: &str = "trainable.safetensors";
/// File of [`Trainer::save_state`] holding AdamW's moments and step count.
pub const OPTIMIZER_STATE_FILE: &str = "optimizer.safetensors";

/// AdamW over a model's trainable variables.
#[derive(Debug)]
pub struct Trainer {
    /// Over the trainable variables, by name (sorted), so its state can be saved and restored.
    optimizer: AdamW,
    config: TrainerConfig,
}

impl Trainer {
    /// An optimizer over `model`'s trainable variables: attach LoRA adapters first
    /// ([`CausalLm::attach_lora`]) to train them alone, or make the base trainable
    /// ([`CausalLm::set_base_trainable`]) to train every weight.
    pub fn new(model: &CausalLm, config: TrainerConfig) -> Result<Self, TrainError> {
        config.validate()?;
        let trainable = named_trainable(model);
        if trainable.is_empty() {
            return Err(TrainError::Trainable(
                "the model has no trainable variables; attach LoRA adapters or make the base trainable first".into(),
            ));
        }
        let optimizer = AdamW::new(
            trainable,
            AdamWParams {
                learning_rate: config.learning_rate,
                beta1: config.beta1,
                beta2: config.beta2,
                eps: config.eps,
                weight_decay: config.weight_decay,
            },
        )?;
        Ok(Self { optimizer, config })
    }

    /// Optimizer updates applied so far.
    pub fn steps(&self) -> i64 {
        self.optimizer.steps()
    }

    /// Writes the trainable variables' values ([`TRAINABLE_STATE_FILE`]) and AdamW's state
    /// ([`OPTIMIZER_STATE_FILE`]) into `dir`, exactly (no dtype conversion), for resuming.
    pub fn save_state(&self, model: &CausalLm, dir: &Path) -> Result<(), TrainError> {
        let trainable = named_trainable(model);
        Tensor::write_safetensors(&trainable, dir.join(TRAINABLE_STATE_FILE))?;
        self.optimizer.save(&dir.join(OPTIMIZER_STATE_FILE))?;
        Ok(())
    }

    /// Restores what [`Self::save_state`] wrote into the model's trainable variables and the
    /// optimizer.
    pub fn load_state(&mut self, model: &CausalLm, dir: &Path) -> Result<(), TrainError> {
        let path = dir.join(TRAINABLE_STATE_FILE);
        let stored: std::collections::HashMap<String, Tensor> =
            Tensor::read_safetensors(&path)?.into_iter().collect();
        let trainable = named_trainable(model);
        if stored.len() != trainable.len() {
            return Err(TrainError::Trainable(format!(
                "{} holds {} tensors but the model has {} trainable variables",
                path.display(),
                stored.len(),
                trainable.len()
            )));
        }
        tch::no_grad(|| {
            for (name, tensor) in &trainable {
                let value = stored.get(name).ok_or_else(|| {
                    TrainError::Trainable(format!("{} has no {name}", path.display()))
                })?;
                if value.size() != tensor.size() {
                    return Err(TrainError::Trainable(format!(
                        "{} has {name} of shape {:?}, the model {:?}",
                        path.display(),
                        value.size(),
                        tensor.size()
                    )));
                }
                tensor.shallow_clone().f_copy_(value)?;
            }
            Ok(())
        })?;
        self.optimizer.load(&dir.join(OPTIMIZER_STATE_FILE))?;
        Ok(())
    }

    /// The settings.
    pub fn config(&self) -> &TrainerConfig {
        &self.config
    }

    /// Changes the learning rate (schedules).
    pub fn set_learning_rate(&mut self, learning_rate: f64) -> Result<(), TrainError> {
        if !(learning_rate.is_finite() && learning_rate > 0.0) {
            return Err(TrainError::Config(format!(
                "learning_rate must be positive and finite, got {learning_rate}"
            )));
        }
        self.optimizer.set_learning_rate(learning_rate);
        self.config.learning_rate = learning_rate;
        Ok(())
    }

    /// How many values the optimizer updates.
    pub fn trainable_parameters(&self) -> i64 {
        self.optimizer.params().map(Tensor::numel).sum::<usize>() as i64
    }

    /// Supervised fine-tuning step: the mean negative log-likelihood of the scored tokens.
    pub fn supervised_step(
        &mut self,
        model: &CausalLm,
        batch: &TrainBatch,
    ) -> Result<StepStats, TrainError> {
        self.step(model, batch, Measure::LossOnly, masked_mean_nll)
    }

    /// One step with any loss of the policy log-probs: `loss_fn(logprobs, scored_mask)` gets the
    /// `[b, t - 1]` f32 log-probs (differentiable) and the matching 0/1 mask of scored positions,
    /// and returns a scalar. The gradients are clipped, AdamW updates the trainable variables and the
    /// gradients are cleared. A non-finite loss or gradient norm skips the update and errs.
    /// `measure` says whether to report the forbidden mass.
    pub fn step<F>(
        &mut self,
        model: &CausalLm,
        batch: &TrainBatch,
        measure: Measure,
        loss_fn: F,
    ) -> Result<StepStats, TrainError>
    where
        F: FnOnce(&Tensor, &Tensor) -> Result<Tensor, TrainError>,
    {
        self.optimizer.zero_grad();
        let outcome = self.backward_and_update(model, batch, measure, loss_fn);
        // Never leave gradients behind: a failed step must not leak into the next one.
        self.optimizer.zero_grad();
        outcome
    }

    fn backward_and_update<F>(
        &mut self,
        model: &CausalLm,
        batch: &TrainBatch,
        measure: Measure,
        loss_fn: F,
    ) -> Result<StepStats, TrainError>
    where
        F: FnOnce(&Tensor, &Tensor) -> Result<Tensor, TrainError>,
    {
        let Accumulated {
            loss,
            tokens,
            forbidden_mass,
        } = accumulate_gradients(model, batch, &self.config, measure, loss_fn)?;
        if !loss.is_finite() {
            return Err(TrainError::NonFinite {
                what: "loss",
                value: loss,
            });
        }
        let grad_norm = self.clip_gradients()?;
        if !grad_norm.is_finite() {
            return Err(TrainError::NonFinite {
                what: "gradient norm",
                value: grad_norm,
            });
        }
        self.optimizer.step()?;
        Ok(StepStats {
            loss,
            grad_norm,
            tokens,
            forbidden_mass,
        })
    }

    /// Measures the global gradient norm (in f32) and, when it exceeds `max_grad_norm`, scales
    /// every gradient by `max / (norm + 1e-6)` as `torch.nn.utils.clip_grad_norm_` does.
    fn clip_gradients(&self) -> Result<f64, TrainError> {
        let grads: Vec<Tensor> = self
            .optimizer
            .params()
            .map(Tensor::grad)
            .filter(Tensor::defined)
            .collect();
        if grads.is_empty() {
            return Err(TrainError::Batch(
                "the loss produced no gradient for any trainable variable".into(),
            ));
        }
        tch::no_grad(|| {
            let norms = grads
                .iter()
                .map(|grad| grad.f_to_kind(Kind::Float)?.f_norm())
                .collect::<Result<Vec<_>, _>>()?;
            let total = Tensor::f_stack(&norms, 0)?.f_norm()?.f_double_value(&[])?;
            if let Some(max) = self.config.max_grad_norm {
                let coefficient = max / (total + 1e-6);
                if coefficient < 1.0 {
                    for grad in &grads {
                        let _ = grad.shallow_clone().f_mul_scalar_(coefficient)?;
                    }
                }
            }
            Ok(total)
        })
    }
}

/// The model's trainable variables by name, sorted: the optimizer's parameters in
/// the order its state is saved.
fn named_trainable(model: &CausalLm) -> Vec<(String, Tensor)> {
    let mut trainable: Vec<(String, Tensor)> = model
        .var_store()
        .variables()
        .into_iter()
        .filter(|(_, tensor)| tensor.requires_grad())
        .collect();
    trainable.sort_by(|a, b| a.0.cmp(&b.0));
    trainable
}

/// `-Σ logprob · mask / Σ mask`: the mean negative log-likelihood of the scored tokens (what
/// transformers' causal-LM loss computes when the labels are the scored tokens).
pub fn masked_mean_nll(logprobs: &Tensor, scored_mask: &Tensor) -> Result<Tensor, TrainError> {
    let total = (logprobs * scored_mask).f_sum(Kind::Float)?;
    let count = scored_mask.f_sum(Kind::Float)?.f_clamp_min(1.0)?;
    Ok(total.f_neg()?.f_div(&count)?)
}

/// Runs the forward, `loss_fn` and the backward pass, leaving the trainable variables' gradients
/// in their `.grad()`; returns the loss, the number of scored tokens and, with allowed sets, the
/// forbidden mass when `measure` asks for it or the step is penalized. The LM head is run twice
/// per chunk (without a graph for the loss, with one for its backward) so at most one chunk's
/// logits are held for autograd at any time. Of
/// `config`, `chunk_tokens`, `temperature`, `adapter_dropout`, `gradient_checkpointing` (each
/// decoder layer recomputed in the backward pass instead of keeping its activations: the same
/// gradients) and `forbidden_mass_coef` apply.
pub fn accumulate_gradients<F>(
    model: &CausalLm,
    batch: &TrainBatch,
    config: &TrainerConfig,
    measure: Measure,
    loss_fn: F,
) -> Result<Accumulated, TrainError>
where
    F: FnOnce(&Tensor, &Tensor) -> Result<Tensor, TrainError>,
{
    let (chunk_tokens, temperature) = (config.chunk_tokens, config.temperature);
    let penalty = config.forbidden_mass_coef;
    let dropout = config.adapter_dropout;
    let attention_mask = batch.attention_mask.as_ref();
    let scored = ScoredTokens::new(
        &batch.input_ids,
        attention_mask,
        &batch.completion_mask,
        model.runtime().device,
    )?;
    let allowed = scored.allowed(batch.allowed.as_deref())?;
    let allowed = allowed.as_deref();
    let tokens = scored.count();
    if tokens == 0 {
        return Err(TrainError::Batch(
            "no token is scored (completion_mask is false on every real token after the first column)"
                .into(),
        ));
    }
    let (hidden, checkpointed) = if config.gradient_checkpointing {
        let (hidden, layers) =
            model.checkpointed_hidden_states(&batch.input_ids, attention_mask, dropout)?;
        (hidden, Some(layers))
    } else {
        (
            model.scoring_hidden_states(
                &batch.input_ids,
                attention_mask,
                &batch.completion_mask,
                dropout,
            )?,
            None,
        )
    };
    let rows = scored.select_rows(&hidden)?;
    // The head's input as a leaf: its gradient collects the head's backward, chunk by chunk.
    let rows_leaf = rows.f_detach()?.set_requires_grad(true);

    // Without a graph: the loss's log-probs and, with allowed sets when measured or penalized,
    // each token's log P(allowed), whose mean −log is the penalty and whose complement the
    // forbidden mass.
    let with_mass = penalty > 0.0 || measure == Measure::ForbiddenMass;
    let (values, log_allowed) = tch::no_grad(|| {
        head_logprobs_and_allowed_mass(
            model,
            &rows_leaf,
            &scored.targets,
            chunk_tokens,
            temperature,
            allowed,
            with_mass,
        )
    })?;
    let (penalty_value, forbidden_mass) = match &log_allowed {
        Some(log_allowed) => {
            let mean_nll = log_allowed
                .f_neg()?
                .f_mean(Kind::Float)?
                .f_double_value(&[])?;
            let forbidden = log_allowed
                .f_exp()?
                .f_neg()?
                .f_add_scalar(1.0)?
                .f_mean(Kind::Float)?
                .f_double_value(&[])?;
            (penalty * mean_nll, Some(forbidden))
        }
        None => (0.0, None),
    };
    // The penalty's gradient is taken in the chunked backward below, only where it counts.
    let penalized = penalty > 0.0 && log_allowed.is_some();
    let logprobs = scored.scatter(&values)?.set_requires_grad(true);
    let loss = loss_fn(&logprobs, &scored.mask)?;
    if loss.numel() != 1 {
        return Err(TrainError::Batch(format!(
            "the loss must be a scalar, got shape {:?}",
            loss.size()
        )));
    }
    let loss_value = loss.f_double_value(&[])?;
    loss.f_backward()?;
    let logprob_grad = logprobs.grad();
    if !logprob_grad.defined() {
        return Err(TrainError::Batch(
            "the loss does not depend on the log-probs it was given".into(),
        ));
    }
    let token_grad = logprob_grad
        .f_reshape([-1])?
        .f_index_select(0, &scored.flat_index)?;

    let mut start = 0;
    while start < tokens {
        let len = chunk_tokens.min(tokens - start);
        let rows_chunk = rows_leaf.f_narrow(0, start, len)?;
        let targets_chunk = scored.targets.f_narrow(0, start, len)?;
        let allowed_chunk = allowed.map(|sets| &sets[start as usize..(start + len) as usize]);
        let weights = token_grad.f_narrow(0, start, len)?;
        let (chunk, log_allowed) = head_logprobs_and_allowed_mass(
            model,
            &rows_chunk,
            &targets_chunk,
            chunk_tokens,
            temperature,
            allowed_chunk,
            penalized,
        )?;
        let mut objective = (chunk * weights).f_sum(Kind::Float)?;
        if let Some(log_allowed) = log_allowed {
            let nll = log_allowed.f_neg()?.f_sum(Kind::Float)?;
            objective = objective.f_add(&nll.f_mul_scalar(penalty / tokens as f64)?)?;
        }
        objective.f_backward()?;
        start += len;
    }
    let rows_grad = rows_leaf.grad();
    (rows * rows_grad).f_sum(Kind::Float)?.f_backward()?;
    if let Some(layers) = checkpointed {
        model.backward_checkpointed(layers)?;
    }
    Ok(Accumulated {
        loss: loss_value + penalty_value,
        tokens,
        forbidden_mass,
    })
}
