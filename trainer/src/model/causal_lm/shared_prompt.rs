//! Scoring the samples of one prompt over a prompt computed once: the RL step scores each
//! prompt's n samples (reference log-probs, then the update's forward and backward), and the
//! prompt is most of every sequence, so computing it once per group instead of once per sample
//! removes most of the step's work. Exact up to floating-point summation order: the prompt's
//! tokens see only the prompt (causal attention), so they are the same in every row, and a
//! sample's tokens attend to the prompt's keys and values as they would in its own row.

use std::ops::Range;

use tch::{Kind, Tensor};

use super::{CausalLm, ModelError};
use crate::model::blocks::{AttentionMask, Past};

/// Consecutive rows of a batch that continue one prompt: each row's first `prompt_len` tokens are
/// the same real tokens, its scored tokens follow, and its padding (if any) comes last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptGroup {
    /// The rows, consecutive.
    pub rows: Range<i64>,
    /// Tokens of the shared prompt (the first scored token's column).
    pub prompt_len: i64,
}

/// The groups of `input_ids`' rows that share their prompt (the tokens before each row's first
/// `completion_mask` token), or `None` when sharing buys nothing: no two consecutive rows share
/// one, or a row is not laid out as prompt, completion, right padding (left padding, no prompt,
/// no scored token), which the plain forward handles.
pub fn prompt_groups(
    input_ids: &Tensor,
    attention_mask: Option<&Tensor>,
    completion_mask: &Tensor,
) -> Result<Option<Vec<PromptGroup>>, ModelError> {
    let (rows, width) = input_ids.size2().map_err(|_| {
        ModelError::Input(format!(
            "input_ids must be [batch, seq], got shape {:?}",
            input_ids.size()
        ))
    })?;
    if completion_mask.size() != [rows, width] {
        return Err(ModelError::Input(format!(
            "completion_mask has shape {:?}, expected [{rows}, {width}] like input_ids",
            completion_mask.size()
        )));
    }
    let host = |t: &Tensor| -> Result<Vec<i64>, ModelError> {
        let flat = t
            .f_to_kind(Kind::Int64)?
            .f_reshape([-1])?
            .f_to_device(tch::Device::Cpu)?;
        Ok(Vec::<i64>::try_from(&flat)?)
    };
    let ids = host(input_ids)?;
    let completion = host(completion_mask)?;
    let real = match attention_mask {
        Some(mask) if mask.size() == [rows, width] => Some(host(mask)?),
        Some(mask) => {
            return Err(ModelError::Input(format!(
                "attention_mask has shape {:?}, expected [{rows}, {width}] like input_ids",
                mask.size()
            )));
        }
        None => None,
    };
    let width = width as usize;
    let mut prompts = Vec::with_capacity(rows as usize);
    for row in 0..rows as usize {
        let cells = row * width..(row + 1) * width;
        let Some(prompt_len) = completion[cells.clone()].iter().position(|&c| c != 0) else {
            return Ok(None);
        };
        if prompt_len == 0 {
            return Ok(None);
        }
        if let Some(real) = &real {
            // Real tokens first, then padding only.
            let real = &real[cells.clone()];
            let length = real.iter().take_while(|&&r| r != 0).count();
            if length <= prompt_len || real[length..].iter().any(|&r| r != 0) {
                return Ok(None);
            }
        }
        prompts.push(&ids[row * width..row * width + prompt_len]);
    }
    let mut groups: Vec<PromptGroup> = Vec::new();
    for (row, prompt) in prompts.iter().enumerate() {
        let row = row as i64;
        match groups.last_mut() {
            Some(group) if prompts[group.rows.start as usize] == *prompt => {
                group.rows.end = row + 1;
            }
            _ => groups.push(PromptGroup {
                rows: row..row + 1,
                prompt_len: prompt.len() as i64,
            }),
        }
    }
    Ok((groups.len() < prompts.len()).then_some(groups))
}

impl CausalLm {
    /// The final-norm hidden states `[b, t, hidden]` of a batch whose rows fall into `groups`
    /// (every row in one, in order; see [`prompt_groups`]), each group's prompt computed once.
    /// Adapter dropout off: a shared prompt would share its dropout mask too.
    pub fn hidden_states_shared_prompts(
        &self,
        input_ids: &Tensor,
        groups: &[PromptGroup],
    ) -> Result<Tensor, ModelError> {
        let (batch, width) = self.check_ids(input_ids)?;
        let covered = groups
            .iter()
            .map(|g| g.rows.end - g.rows.start)
            .sum::<i64>();
        let in_order = groups
            .iter()
            .zip(groups.iter().skip(1))
            .all(|(a, b)| a.rows.end == b.rows.start);
        if covered != batch || !in_order || groups.first().is_some_and(|g| g.rows.start != 0) {
            return Err(ModelError::Input(format!(
                "prompt groups must cover the batch's {batch} rows in order, got {groups:?}"
            )));
        }
        if let Some(bad) = groups
            .iter()
            .find(|g| g.rows.is_empty() || g.prompt_len < 1 || g.prompt_len > width)
        {
            return Err(ModelError::Input(format!(
                "prompt group {bad:?} is empty or its prompt does not fit {width} columns"
            )));
        }
        let device = self.runtime.device;
        let input_ids = input_ids.f_to_device(device)?;
        let mut parts = Vec::with_capacity(groups.len());
        for group in groups {
            let rows = group.rows.end - group.rows.start;
            let ids = input_ids.f_narrow(0, group.rows.start, rows)?;
            let prompt =
                self.shared_prompt(&ids.f_narrow(0, 0, 1)?.f_narrow(1, 0, group.prompt_len)?)?;
            let prompt_hidden = prompt
                .hidden
                .f_expand([rows, group.prompt_len, -1], false)?;
            let rest = width - group.prompt_len;
            parts.push(if rest == 0 {
                prompt_hidden
            } else {
                let continued =
                    self.continue_prompt(&prompt, &ids.f_narrow(1, group.prompt_len, rest)?)?;
                Tensor::f_cat(&[prompt_hidden, continued], 1)?
            });
        }
        Ok(self.norm.forward(&Tensor::f_cat(&parts, 0)?))
    }

    /// The hidden states a scoring forward needs (`train`: adapter dropout on): over shared
    /// prompts where rows share them and dropout is off, else the plain forward. The same values
    /// either way, up to summation order.
    pub fn scoring_hidden_states(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        completion_mask: &Tensor,
        train: bool,
    ) -> Result<Tensor, ModelError> {
        if !train && let Some(groups) = prompt_groups(input_ids, attention_mask, completion_mask)? {
            return self.hidden_states_shared_prompts(input_ids, &groups);
        }
        self.hidden_states(input_ids, attention_mask, None, train)
    }

    /// One prompt `[1, p]` through every layer: its last layer's output and each layer's keys and
    /// values.
    fn shared_prompt(&self, prompt_ids: &Tensor) -> Result<SharedPrompt, ModelError> {
        let len = prompt_ids.size()[1];
        let positions =
            Tensor::f_arange(len, (Kind::Int64, self.runtime.device))?.f_unsqueeze(0)?;
        let (cos, sin) = self.rotary.cos_sin(&positions, self.runtime.kind);
        let mut xs = Tensor::f_embedding(&self.embed_tokens, prompt_ids, -1, false, false)?;
        let mut keys_values = Vec::with_capacity(self.layers.len());
        for layer in &self.layers {
            let (next, keys, values) =
                layer.forward_with(&xs, &cos, &sin, &AttentionMask::Causal, Past::None, false);
            keys_values.push((keys, values));
            xs = next;
        }
        Ok(SharedPrompt {
            len,
            hidden: xs,
            keys_values,
        })
    }

    /// The rows' tokens after the shared prompt `[g, s]` (right-padded), attending to the prompt
    /// and causally to themselves: the last layer's output `[g, s, hidden]`.
    fn continue_prompt(&self, prompt: &SharedPrompt, ids: &Tensor) -> Result<Tensor, ModelError> {
        let device = self.runtime.device;
        let (past, len) = (prompt.len, ids.size()[1]);
        let positions =
            Tensor::f_arange_start(past, past + len, (Kind::Int64, device))?.f_unsqueeze(0)?;
        let (cos, sin) = self.rotary.cos_sin(&positions, self.runtime.kind);
        // Query i sits at position past + i and sees every key up to it; padding comes after a
        // row's real tokens, so no real token sees it.
        let query_at = positions.f_reshape([len, 1])?;
        let key_at = Tensor::f_arange(past + len, (Kind::Int64, device))?.f_unsqueeze(0)?;
        let mask = key_at
            .f_le_tensor(&query_at)?
            .f_unsqueeze(0)?
            .f_unsqueeze(0)?;
        let mask = AttentionMask::Explicit(mask);
        let mut xs = Tensor::f_embedding(&self.embed_tokens, ids, -1, false, false)?;
        for (layer, (keys, values)) in self.layers.iter().zip(&prompt.keys_values) {
            xs = layer
                .forward_with(&xs, &cos, &sin, &mask, Past::Shared { keys, values }, false)
                .0;
        }
        Ok(xs)
    }
}

/// A prompt computed once: its last layer's output `[1, p, hidden]` (before the final norm) and
/// each layer's rotated keys and values `[1, kv_heads, p, head_dim]`.
struct SharedPrompt {
    len: i64,
    hidden: Tensor,
    keys_values: Vec<(Tensor, Tensor)>,
}
