//! Per-token log-probabilities of sequences under the policy (LoRA on) or the reference model (LoRA
//! off), with the LM head applied in chunks of scored tokens so that `[b, t, vocab]` logits in f32
//! never exist at once (for a 152k vocabulary that alone would be 2.5 GB per 4096 tokens).
//!
//! Conventions shared by every function here:
//! * `input_ids` `[b, t]` i64 with `t ≥ 2`; `attention_mask` `[b, t]` (bool or 0/1) or `None`;
//! * `completion_mask` `[b, t]` (bool or 0/1) marks the tokens to score, normally the completion
//!   after the prompt; a token is scored when it is marked and real (attention mask true) and is
//!   not the first column (nothing precedes it);
//! * the result is `[b, t - 1]` f32 on the model's device, column `j` holding
//!   `log p(input_ids[:, j + 1] | input_ids[:, ..= j])` where token `j + 1` is scored and 0 elsewhere.
//!
//! Only scored positions go through the LM head, so prompts cost no logits at all.
//!
//! `temperature` is the policy's: a sample drawn at temperature T came from softmax(logits / T),
//! so the RL loss's ratio, its "old" log-probs and the KL reference must all score at that T, or
//! the gradient is off-policy by the temperature alone. 1.0 is the model's own distribution (the
//! supervised warm-up, and the same floating-point operations as before temperatures existed).

use tch::{Device, Kind, Tensor};

use crate::grammar::{TokenSet, stack_token_sets};
use crate::model::{CausalLm, ModelError};

/// Token sequences to train on (the masks' meaning is in this module's header).
#[derive(Debug)]
pub struct TrainBatch {
    /// `[b, t]` i64.
    pub input_ids: Tensor,
    /// `[b, t]` bool or 0/1, false on padding; `None` when every token is real.
    pub attention_mask: Option<Tensor>,
    /// `[b, t]` bool or 0/1: the tokens whose log-probs the loss sees.
    pub completion_mask: Tensor,
    /// For grammar-constrained samples, per row the set each scored token was drawn from, in
    /// order: the log-probs are then those of the masked distribution, as the sampler's were.
    pub allowed: Option<Vec<Vec<TokenSet>>>,
}

/// Scored tokens per LM-head chunk: one chunk's f32 logits are `chunk × vocab × 4` bytes
/// (0.6 GB for Qwen2.5's 152k vocabulary), small next to a 7B model's activations.
pub const DEFAULT_CHUNK_TOKENS: i64 = 1024;

/// Which positions of a batch are scored, flattened for the chunked LM head.
#[derive(Debug)]
pub struct ScoredTokens {
    /// Batch rows.
    pub batch: i64,
    /// Columns of the log-prob matrix (`t - 1`).
    pub columns: i64,
    /// `[n]` i64: flat indices into the `[b, t - 1]` log-prob matrix of the scored positions.
    pub flat_index: Tensor,
    /// `[n]` i64: the token each scored position predicts.
    pub targets: Tensor,
    /// `[b, t - 1]` f32: 1 at scored positions, 0 elsewhere (for masked means in losses).
    pub mask: Tensor,
}

impl ScoredTokens {
    /// Validates the shapes and finds the scored positions on `device` (one device sync, for
    /// their count).
    pub fn new(
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        completion_mask: &Tensor,
        device: Device,
    ) -> Result<Self, ModelError> {
        let (batch, seq) = input_ids.size2().map_err(|_| {
            ModelError::Input(format!(
                "input_ids must be [batch, seq], got shape {:?}",
                input_ids.size()
            ))
        })?;
        if seq < 2 {
            return Err(ModelError::Input(format!(
                "log-probs need at least two tokens per row, input_ids has shape [{batch}, {seq}]"
            )));
        }
        let columns = seq - 1;
        let as_bool_targets = |mask: &Tensor, name: &str| -> Result<Tensor, ModelError> {
            if mask.size() != [batch, seq] {
                return Err(ModelError::Input(format!(
                    "{name} has shape {:?}, expected [{batch}, {seq}] like input_ids",
                    mask.size()
                )));
            }
            Ok(mask
                .f_to_device(device)?
                .f_to_kind(Kind::Bool)?
                .f_narrow(1, 1, columns)?)
        };
        let mut scored = as_bool_targets(completion_mask, "completion_mask")?;
        if let Some(attention_mask) = attention_mask {
            scored = scored.f_logical_and(&as_bool_targets(attention_mask, "attention_mask")?)?;
        }
        let flat_index = scored.f_reshape([-1])?.f_nonzero()?.f_squeeze_dim(1)?;
        let targets = input_ids
            .f_to_device(device)?
            .f_narrow(1, 1, columns)?
            .f_reshape([-1])?
            .f_index_select(0, &flat_index)?;
        Ok(Self {
            batch,
            columns,
            flat_index,
            targets,
            mask: scored.f_to_kind(Kind::Float)?,
        })
    }

    /// How many tokens are scored.
    pub fn count(&self) -> i64 {
        self.flat_index.size()[0]
    }

    /// The rows' allowed sets ([`TrainBatch::allowed`]) flattened in scored order (row by row,
    /// each row's scored tokens in order), checked to be one per scored token.
    pub fn allowed<'s>(
        &self,
        rows: Option<&'s [Vec<TokenSet>]>,
    ) -> Result<Option<Vec<&'s TokenSet>>, ModelError> {
        let Some(rows) = rows else {
            return Ok(None);
        };
        if rows.len() as i64 != self.batch {
            return Err(ModelError::Input(format!(
                "allowed token sets for {} rows, the batch has {}",
                rows.len(),
                self.batch
            )));
        }
        let flat: Vec<&TokenSet> = rows.iter().flatten().collect();
        if flat.len() as i64 != self.count() {
            return Err(ModelError::Input(format!(
                "{} allowed token sets for {} scored tokens",
                flat.len(),
                self.count()
            )));
        }
        Ok(Some(flat))
    }

    /// The hidden states `[n, hidden]` that predict the scored tokens, from `[b, t, hidden]`.
    pub fn select_rows(&self, hidden: &Tensor) -> Result<Tensor, ModelError> {
        let width = hidden.size().last().copied().unwrap_or(0);
        Ok(hidden
            .f_narrow(1, 0, self.columns)?
            .f_reshape([-1, width])?
            .f_index_select(0, &self.flat_index)?)
    }

    /// Places per-token values `[n]` into a zero `[b, t - 1]` f32 matrix (differentiable).
    pub fn scatter(&self, values: &Tensor) -> Result<Tensor, ModelError> {
        let device = values.device();
        let zeros = Tensor::f_zeros([self.batch * self.columns], (Kind::Float, device))?;
        Ok(zeros
            .f_index_copy(0, &self.flat_index, values)?
            .f_view([self.batch, self.columns])?)
    }
}

/// `log p(target)` `[n]` f32 for hidden rows `[n, hidden]` at `temperature`, over the tokens of
/// `allowed` (one set per row) when given: the LM head runs on `chunk_tokens` rows at a time and
/// each chunk's log-softmax is taken in f32, so the largest temporary is one chunk's
/// `[chunk, vocab]` f32 logits. Differentiable with respect to `rows` when autograd is on. The
/// logits are masked, then upcast, then divided, as the sampler does, so a sampled token scores
/// here what the sampler drew it with.
pub fn head_logprobs(
    model: &CausalLm,
    rows: &Tensor,
    targets: &Tensor,
    chunk_tokens: i64,
    temperature: f64,
    allowed: Option<&[&TokenSet]>,
) -> Result<Tensor, ModelError> {
    let scored = head_logprobs_and_allowed_mass(
        model,
        rows,
        targets,
        chunk_tokens,
        temperature,
        allowed,
        false,
    )?;
    Ok(scored.0)
}

/// [`head_logprobs`], and with `allowed` and `with_mass` also each row's `log P(allowed set)`
/// `[n]` f32 under the unmasked distribution at `temperature` (≤ 0; 0 when the model puts no mass
/// on the tokens the grammar forbids), from the same logits. Its negative is the forbidden-mass
/// penalty ([`crate::train_step::TrainerConfig::forbidden_mass_coef`]).
pub fn head_logprobs_and_allowed_mass(
    model: &CausalLm,
    rows: &Tensor,
    targets: &Tensor,
    chunk_tokens: i64,
    temperature: f64,
    allowed: Option<&[&TokenSet]>,
    with_mass: bool,
) -> Result<(Tensor, Option<Tensor>), ModelError> {
    if chunk_tokens <= 0 {
        return Err(ModelError::Input(format!(
            "chunk_tokens must be positive, got {chunk_tokens}"
        )));
    }
    check_temperature(temperature)?;
    let count = rows.size()[0];
    if let Some(allowed) = allowed
        && allowed.len() as i64 != count
    {
        return Err(ModelError::Input(format!(
            "{} allowed token sets for {count} rows",
            allowed.len()
        )));
    }
    let targets = targets.f_to_device(rows.device())?;
    if count == 0 {
        let empty = Tensor::f_zeros([0], (Kind::Float, rows.device()))?;
        let mass = allowed.filter(|_| with_mass).map(|_| empty.shallow_clone());
        return Ok((empty, mass));
    }
    let mut pieces = Vec::new();
    let mut masses = Vec::new();
    let mut start = 0;
    while start < count {
        let len = chunk_tokens.min(count - start);
        let mut logits = model.lm_head(&rows.f_narrow(0, start, len)?);
        if let Some(allowed) = allowed {
            let chunk = &allowed[start as usize..(start + len) as usize];
            let mask = stack_token_sets(chunk, logits.device())?;
            if with_mass {
                let scaled = logits.f_to_kind(Kind::Float)?.f_div_scalar(temperature)?;
                let every = scaled.f_logsumexp([-1], false)?;
                let kept = scaled
                    .f_masked_fill(&mask.f_logical_not()?, f64::NEG_INFINITY)?
                    .f_logsumexp([-1], false)?;
                // ≤ 0 up to rounding: the allowed set is part of the vocabulary.
                masses.push(kept.f_sub(&every)?.f_clamp_max(0.0)?);
            }
            logits = logits.f_masked_fill(&mask.f_logical_not()?, f64::NEG_INFINITY)?;
        }
        let log_probs = if temperature == 1.0 {
            logits.f_log_softmax(-1, Kind::Float)?
        } else {
            logits
                .f_to_kind(Kind::Float)?
                .f_div_scalar(temperature)?
                .f_log_softmax(-1, Kind::Float)?
        };
        let chosen = targets.f_narrow(0, start, len)?.f_unsqueeze(1)?;
        pieces.push(log_probs.f_gather(1, &chosen, false)?.f_squeeze_dim(1)?);
        start += len;
    }
    let mass = if masses.is_empty() {
        None
    } else {
        Some(Tensor::f_cat(&masses, 0)?)
    };
    Ok((Tensor::f_cat(&pieces, 0)?, mass))
}

/// A temperature the log-probs can be taken at: positive and finite.
pub fn check_temperature(temperature: f64) -> Result<(), ModelError> {
    if temperature.is_finite() && temperature > 0.0 {
        Ok(())
    } else {
        Err(ModelError::Input(format!(
            "log-probs need a positive, finite temperature, got {temperature}"
        )))
    }
}

/// Log-probs `[b, t - 1]` under the model as it is (adapters as switched), with autograd: gradients
/// flow into the LoRA adapters. Training forward (adapter dropout on). See the module docs for the
/// arguments.
///
/// Autograd keeps each chunk's f32 log-softmax for the backward pass, so the saved activations are
/// `n × vocab × 4` bytes for n scored tokens; [`crate::train_step::Trainer`] avoids that by
/// recomputing the head chunk by chunk in its backward pass.
pub fn sequence_logprobs(
    model: &CausalLm,
    input_ids: &Tensor,
    attention_mask: Option<&Tensor>,
    completion_mask: &Tensor,
) -> Result<Tensor, ModelError> {
    sequence_logprobs_chunked(
        model,
        input_ids,
        attention_mask,
        completion_mask,
        DEFAULT_CHUNK_TOKENS,
    )
}

/// [`sequence_logprobs`] with an explicit LM-head chunk size.
pub fn sequence_logprobs_chunked(
    model: &CausalLm,
    input_ids: &Tensor,
    attention_mask: Option<&Tensor>,
    completion_mask: &Tensor,
    chunk_tokens: i64,
) -> Result<Tensor, ModelError> {
    logprobs_with(
        model,
        input_ids,
        attention_mask,
        completion_mask,
        chunk_tokens,
        1.0,
        None,
        true,
    )
}

/// Log-probs `[b, t - 1]` of `batch` at `temperature` (over its allowed sets when it has them),
/// without autograd and with adapter dropout off, adapters as switched: the behaviour policy's
/// log-probs of sampled completions (e.g. PPO's "old" log-probs).
pub fn score_logprobs(
    model: &CausalLm,
    batch: &TrainBatch,
    temperature: f64,
) -> Result<Tensor, ModelError> {
    tch::no_grad(|| {
        logprobs_with(
            model,
            &batch.input_ids,
            batch.attention_mask.as_ref(),
            &batch.completion_mask,
            DEFAULT_CHUNK_TOKENS,
            temperature,
            batch.allowed.as_deref(),
            false,
        )
    })
}

/// [`score_logprobs`] under the frozen base model (the RL reference policy): adapters are
/// switched off for this call only (restored even on error).
pub fn reference_logprobs(
    model: &CausalLm,
    batch: &TrainBatch,
    temperature: f64,
) -> Result<Tensor, ModelError> {
    let switch = model.adapters();
    let was_enabled = switch.enabled();
    switch.set_enabled(false);
    let result = score_logprobs(model, batch, temperature);
    switch.set_enabled(was_enabled);
    result
}

#[expect(
    clippy::too_many_arguments,
    reason = "the batch's pieces, as the public functions take them"
)]
fn logprobs_with(
    model: &CausalLm,
    input_ids: &Tensor,
    attention_mask: Option<&Tensor>,
    completion_mask: &Tensor,
    chunk_tokens: i64,
    temperature: f64,
    allowed: Option<&[Vec<TokenSet>]>,
    train: bool,
) -> Result<Tensor, ModelError> {
    let scored = ScoredTokens::new(
        input_ids,
        attention_mask,
        completion_mask,
        model.runtime().device,
    )?;
    let allowed = scored.allowed(allowed)?;
    let hidden = model.scoring_hidden_states(input_ids, attention_mask, completion_mask, train)?;
    let rows = scored.select_rows(&hidden)?;
    let values = head_logprobs(
        model,
        &rows,
        &scored.targets,
        chunk_tokens,
        temperature,
        allowed.as_deref(),
    )?;
    scored.scatter(&values)
}
