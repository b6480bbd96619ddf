//! A chat checkpoint as the RL loop uses it: the model, its tokenizer and chat template loaded from
//! one Hugging Face directory; turning (system, user) turns into prompt ids and completions into
//! training targets; and packing prompt + completion sequences into one right-padded batch.

use std::path::Path;

use tch::{Kind, Tensor};

use crate::chat_template::{ChatMessage, ChatTemplate, ChatTemplateError};
use crate::device::Runtime;
use crate::grammar::{Grammar, GrammarError, TokenSet};
use crate::logprobs::{TrainBatch, score_logprobs};
use crate::model::{CausalLm, LoadReport, ModelError};
use crate::tokenizer::{Tokenizer, TokenizerError};
use crate::train_step::TrainError;

/// Why a checkpoint cannot serve as a chat policy.
#[derive(Debug, thiserror::Error)]
pub enum ChatPolicyError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Template(#[from] ChatTemplateError),
    /// The constraint cannot be compiled over this checkpoint's tokenizer.
    #[error("constrained generation: {0}")]
    Grammar(#[from] GrammarError),
    /// The checkpoint lacks something chat generation needs.
    #[error("{dir}: {problem}")]
    Incomplete { dir: String, problem: String },
}

/// Model, tokenizer and chat template of one checkpoint directory.
#[derive(Debug)]
pub struct ChatPolicy {
    pub model: CausalLm,
    pub tokenizer: Tokenizer,
    template: ChatTemplate,
    /// Ends a completion: the token the template writes after an assistant turn.
    end_of_turn: i64,
    /// Every id that stops generation.
    pub stop_ids: Vec<i64>,
    /// Fills padding (always masked).
    pub pad_id: i64,
}

impl ChatPolicy {
    /// Loads `dir` (config.json, safetensors weights, tokenizer.json, a chat template and an eos
    /// token) onto `runtime`'s device.
    pub fn load(dir: &Path, runtime: Runtime) -> Result<(Self, LoadReport), ChatPolicyError> {
        let incomplete = |problem: &str| ChatPolicyError::Incomplete {
            dir: dir.display().to_string(),
            problem: problem.to_owned(),
        };
        if !dir.join(crate::tokenizer::MODEL_CONFIG_FILE).is_file() {
            return Err(incomplete(
                "not a model checkpoint: no config.json (write one with `arc-rec model init --preset tiny --out DIR`)",
            ));
        }
        let (model, report) = CausalLm::from_pretrained(dir, runtime)?;
        let tokenizer = Tokenizer::from_dir(dir)?;
        let template = ChatTemplate::from_dir(dir)?
            .ok_or_else(|| incomplete("the checkpoint has no chat template"))?;
        let special = tokenizer.special_tokens();
        let end_of_turn = special
            .eos
            .as_ref()
            .map(|token| i64::from(token.id))
            .ok_or_else(|| incomplete("the tokenizer has no eos token to end a completion"))?;
        let stop_ids: Vec<i64> = special.stop_ids.iter().map(|&id| i64::from(id)).collect();
        let pad_id = special
            .pad
            .as_ref()
            .map_or(end_of_turn, |token| i64::from(token.id));
        Ok((
            Self {
                model,
                tokenizer,
                template,
                end_of_turn,
                stop_ids,
                pad_id,
            },
            report,
        ))
    }

    /// The prompt's token ids: the system and user turns rendered by the chat template with the
    /// assistant turn opened.
    pub fn prompt_ids(&self, system: &str, user: &str) -> Result<Vec<i64>, ChatPolicyError> {
        let text = self.template.render(
            &[
                ChatMessage::new("system", system),
                ChatMessage::new("user", user),
            ],
            true,
        )?;
        self.encode(&text)
    }

    /// A supervised target: the completion's tokens followed by the end-of-turn token, what the
    /// model must generate after [`Self::prompt_ids`] to give `completion` and stop.
    pub fn target_ids(&self, completion: &str) -> Result<Vec<i64>, ChatPolicyError> {
        let mut ids = self.encode(completion)?;
        ids.push(self.end_of_turn);
        Ok(ids)
    }

    /// `schema` compiled over this checkpoint's tokenizer, ending at its stop ids, for
    /// constrained generation ([`crate::generate::GenerationRequest::grammar`]).
    pub fn grammar(&self, schema: &serde_json::Value) -> Result<Grammar, ChatPolicyError> {
        let vocab_size = usize::try_from(self.model.config().vocab_size).unwrap_or(0);
        Ok(Grammar::over_tokenizer(
            &self.tokenizer,
            schema,
            vocab_size,
        )?)
    }

    /// A completion's text without special tokens.
    pub fn decode(&self, ids: &[i64]) -> String {
        let ids: Vec<u32> = ids
            .iter()
            .filter_map(|&id| u32::try_from(id).ok())
            .collect();
        self.tokenizer.decode(&ids, true).unwrap_or_default()
    }

    fn encode(&self, text: &str) -> Result<Vec<i64>, ChatPolicyError> {
        Ok(self
            .tokenizer
            .encode(text, false)?
            .into_iter()
            .map(i64::from)
            .collect())
    }
}

/// One training sequence: a prompt, a completion after it and, for sampled completions, the
/// log-prob each completion token was sampled with.
#[derive(Debug, Clone, Copy)]
pub struct Sequence<'a> {
    pub prompt: &'a [i64],
    pub completion: &'a [i64],
    pub sampling_logprobs: Option<&'a [f32]>,
    /// For a grammar-constrained sample, the set each completion token was drawn from.
    pub allowed: Option<&'a [TokenSet]>,
}

impl<'a> Sequence<'a> {
    /// A sampled completion of `prompt` as the RL update scores it: the log-probs it was drawn
    /// with and, when it was drawn under a grammar (`allowed` not empty), the set of each token.
    pub fn sampled(
        prompt: &'a [i64],
        completion: &'a [i64],
        logprobs: &'a [f32],
        allowed: &'a [TokenSet],
    ) -> Self {
        Self {
            prompt,
            completion,
            sampling_logprobs: Some(logprobs),
            allowed: (!allowed.is_empty()).then_some(allowed),
        }
    }
}

/// Sequences packed for [`crate::train_step::Trainer::step`].
#[derive(Debug)]
pub struct PackedBatch {
    pub batch: TrainBatch,
    /// `[b, t − 1]` f32: at position j the sampling log-prob of token j + 1 when it is a
    /// completion token, 0 elsewhere (aligned with the log-probs a loss receives).
    pub sampling_logprobs: Tensor,
}

impl PackedBatch {
    /// Makes the trainer's own forward the behaviour policy when `model` runs below f32 (bf16 on
    /// CUDA): the sampler's incremental decode and the trainer's full forward round differently
    /// there (|Δ log p| up to 0.2 per token measured on the Qwen2.5-7B shape), and that noise
    /// would sit in every PPO ratio and eat the clip range before any update. Replaces the
    /// sampling log-probs with [`score_logprobs`] (adapters as switched, dropout off, the batch's
    /// allowed sets, `temperature`), scored `rows_per_pass` rows at a time: the update's
    /// minibatch size, because a bf16 matrix product's rounding depends on how many rows it
    /// multiplies. Returns the largest |Δ| it removed. verl and TRL recompute their "old"
    /// log-probs the same way. In f32 the two agree to ~1e-6: nothing is recomputed and `None`
    /// is returned.
    pub fn rescore_in_reduced_precision(
        &mut self,
        model: &CausalLm,
        temperature: f64,
        rows_per_pass: usize,
    ) -> Result<Option<f64>, TrainError> {
        if model.runtime().kind == Kind::Float {
            return Ok(None);
        }
        let rows = self.batch.input_ids.size()[0];
        let chunk = i64::try_from(rows_per_pass.max(1)).unwrap_or(rows);
        let mut parts = Vec::new();
        let mut start = 0;
        while start < rows {
            let chunk_rows: Vec<i64> = (start..(start + chunk).min(rows)).collect();
            let part = self.select_rows(&chunk_rows)?;
            parts.push(score_logprobs(model, &part.batch, temperature)?.f_to_kind(Kind::Float)?);
            start += chunk;
        }
        let width = self.batch.completion_mask.size()[1];
        let scored = self
            .batch
            .completion_mask
            .f_narrow(1, 1, width - 1)?
            .f_to_kind(Kind::Float)?;
        let trainer = Tensor::f_cat(&parts, 0)?.f_mul(&scored)?;
        let gap = (&trainer - &self.sampling_logprobs)
            .f_abs()?
            .f_max()?
            .f_double_value(&[])?;
        self.sampling_logprobs = trainer;
        Ok(Some(gap))
    }

    /// The rows `rows` (indices into the batch, in that order) as a batch of their own: a
    /// minibatch of the update.
    pub fn select_rows(&self, rows: &[i64]) -> Result<PackedBatch, TrainError> {
        let device = self.batch.input_ids.device();
        let index = Tensor::from_slice(rows).f_to_device(device)?;
        let select = |t: &Tensor| t.f_index_select(0, &index);
        let allowed = match &self.batch.allowed {
            Some(sets) => Some(
                rows.iter()
                    .map(|&row| {
                        usize::try_from(row)
                            .ok()
                            .and_then(|row| sets.get(row))
                            .cloned()
                            .ok_or_else(|| {
                                TrainError::Batch(format!(
                                    "row {row} is not in a batch of {} rows",
                                    sets.len()
                                ))
                            })
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
            None => None,
        };
        Ok(PackedBatch {
            batch: TrainBatch {
                input_ids: select(&self.batch.input_ids)?,
                attention_mask: self.batch.attention_mask.as_ref().map(select).transpose()?,
                completion_mask: select(&self.batch.completion_mask)?,
                allowed,
            },
            sampling_logprobs: select(&self.sampling_logprobs)?,
        })
    }
}

/// `items` cut into `parts` consecutive slices whose lengths differ by at most one.
pub fn split_evenly<T>(items: &[T], parts: usize) -> Vec<&[T]> {
    let parts = parts.clamp(1, items.len().max(1));
    let (base, extra) = (items.len() / parts, items.len() % parts);
    let mut slices = Vec::with_capacity(parts);
    let mut start = 0;
    for part in 0..parts {
        let len = base + usize::from(part < extra);
        slices.push(&items[start..start + len]);
        start += len;
    }
    slices
}

/// Right-pads `sequences` with `pad_id` into `[b, t]` tensors on `device`: the attention mask
/// covers prompt and completion, the completion mask only the completion.
pub fn pack(
    sequences: &[Sequence<'_>],
    pad_id: i64,
    device: tch::Device,
) -> Result<PackedBatch, TrainError> {
    if sequences.is_empty() {
        return Err(TrainError::Batch("no sequence to pack".into()));
    }
    let width = sequences
        .iter()
        .map(|s| s.prompt.len() + s.completion.len())
        .max()
        .unwrap_or(0);
    if width < 2 {
        return Err(TrainError::Batch(
            "sequences need at least two tokens".into(),
        ));
    }
    let rows = sequences.len();
    let constrained = sequences.iter().filter(|s| s.allowed.is_some()).count();
    if constrained != 0 && constrained != rows {
        return Err(TrainError::Batch(format!(
            "{constrained} of {rows} sequences carry allowed token sets: all or none must"
        )));
    }
    let mut allowed = Vec::with_capacity(if constrained == 0 { 0 } else { rows });
    let mut ids = vec![pad_id; rows * width];
    let mut attention = vec![0i64; rows * width];
    let mut completion = vec![0i64; rows * width];
    let mut logprobs = vec![0f32; rows * (width - 1)];
    for (row, sequence) in sequences.iter().enumerate() {
        if sequence.prompt.is_empty() {
            return Err(TrainError::Batch(format!("sequence {row} has no prompt")));
        }
        let start = row * width;
        let prompt_len = sequence.prompt.len();
        for (offset, &id) in sequence
            .prompt
            .iter()
            .chain(sequence.completion)
            .enumerate()
        {
            ids[start + offset] = id;
            attention[start + offset] = 1;
            if offset >= prompt_len {
                completion[start + offset] = 1;
            }
        }
        if let Some(sampled) = sequence.sampling_logprobs {
            if sampled.len() != sequence.completion.len() {
                return Err(TrainError::Batch(format!(
                    "sequence {row}: {} sampling log-probs for {} completion tokens",
                    sampled.len(),
                    sequence.completion.len()
                )));
            }
            for (index, &value) in sampled.iter().enumerate() {
                logprobs[row * (width - 1) + prompt_len + index - 1] = value;
            }
        }
        if let Some(sets) = sequence.allowed {
            if sets.len() != sequence.completion.len() {
                return Err(TrainError::Batch(format!(
                    "sequence {row}: {} allowed token sets for {} completion tokens",
                    sets.len(),
                    sequence.completion.len()
                )));
            }
            allowed.push(sets.to_vec());
        }
    }
    let shape = [rows as i64, width as i64];
    let tensor = |values: &[i64]| -> Result<Tensor, TrainError> {
        Ok(Tensor::from_slice(values)
            .f_reshape(shape)?
            .f_to_device(device)?)
    };
    Ok(PackedBatch {
        batch: TrainBatch {
            input_ids: tensor(&ids)?,
            attention_mask: Some(tensor(&attention)?),
            completion_mask: tensor(&completion)?,
            allowed: (constrained != 0).then_some(allowed),
        },
        sampling_logprobs: Tensor::from_slice(&logprobs)
            .f_reshape([rows as i64, width as i64 - 1])?
            .f_to_kind(Kind::Float)?
            .f_to_device(device)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minibatches_split_groups_evenly_and_keep_every_one() {
        let groups: Vec<usize> = (0..7).collect();
        let parts = split_evenly(&groups, 3);
        assert_eq!(parts.iter().map(|p| p.len()).collect::<Vec<_>>(), [3, 2, 2]);
        assert_eq!(parts.concat(), groups);
        assert_eq!(split_evenly(&groups, 10).len(), 7);
        assert_eq!(split_evenly(&groups, 1), [&groups[..]]);
    }

    #[test]
    fn pack_aligns_completion_masks_and_logprobs() {
        let packed = pack(
            &[
                Sequence {
                    prompt: &[5, 6],
                    completion: &[7, 8],
                    sampling_logprobs: Some(&[-0.5, -0.25]),
                    allowed: None,
                },
                Sequence {
                    prompt: &[9],
                    completion: &[10],
                    sampling_logprobs: Some(&[-1.0]),
                    allowed: None,
                },
            ],
            0,
            tch::Device::Cpu,
        )
        .unwrap();
        let ids: Vec<i64> = Vec::try_from(packed.batch.input_ids.flatten(0, -1)).unwrap();
        assert_eq!(ids, [5, 6, 7, 8, 9, 10, 0, 0]);
        let attention: Vec<i64> =
            Vec::try_from(packed.batch.attention_mask.as_ref().unwrap().flatten(0, -1)).unwrap();
        assert_eq!(attention, [1, 1, 1, 1, 1, 1, 0, 0]);
        let completion: Vec<i64> =
            Vec::try_from(packed.batch.completion_mask.flatten(0, -1)).unwrap();
        assert_eq!(completion, [0, 0, 1, 1, 0, 1, 0, 0]);
        // Position j holds the log-prob of token j + 1.
        let logprobs: Vec<f32> = Vec::try_from(packed.sampling_logprobs.flatten(0, -1)).unwrap();
        assert_eq!(logprobs, [0.0, -0.5, -0.25, -1.0, 0.0, 0.0]);
    }

    #[test]
    fn pack_refuses_mismatched_logprobs() {
        let error = pack(
            &[Sequence {
                prompt: &[1],
                completion: &[2, 3],
                sampling_logprobs: Some(&[-1.0]),
                allowed: None,
            }],
            0,
            tch::Device::Cpu,
        )
        .unwrap_err();
        assert!(error.to_string().contains("1 sampling log-probs for 2"));
    }
}
