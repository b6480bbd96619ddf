//! The supervised warm-up: next-token likelihood of accepted recommendations, before RL.

use std::time::Instant;

use trainer::chat_policy::{ChatPolicy, Sequence, pack};
use trainer::train_step::{TrainError, Trainer};

use super::metrics::{Phase, StepMetrics};
use super::rollout::PromptTokens;
use super::seeds::EpochOrder;

/// A warm-up example: a prompt and one accepted completion as target tokens.
#[derive(Debug)]
pub struct SftExample {
    /// Index into the run's prompts.
    pub prompt: usize,
    pub target: Vec<i64>,
}

/// Every accepted completion of every prompt, tokenized.
pub fn sft_examples(
    policy: &ChatPolicy,
    prompts: &[PromptTokens<'_>],
) -> anyhow::Result<Vec<SftExample>> {
    let mut examples = Vec::new();
    for (prompt, tokens) in prompts.iter().enumerate() {
        for completion in &tokens.prompt.accepted_completions {
            examples.push(SftExample {
                prompt,
                target: policy.target_ids(completion)?,
            });
        }
    }
    Ok(examples)
}

/// One warm-up step over the `batch` examples at `order`'s positions of step `step`.
#[expect(
    clippy::too_many_arguments,
    reason = "the step's inputs, each from a different owner"
)]
pub fn warmup_step(
    trainer: &mut Trainer,
    policy: &ChatPolicy,
    prompts: &[PromptTokens<'_>],
    examples: &[SftExample],
    order: &mut EpochOrder,
    batch: usize,
    step: u64,
    learning_rate: f64,
) -> Result<StepMetrics, TrainError> {
    let started = Instant::now();
    let batch = batch as u64;
    let sequences: Vec<Sequence<'_>> = (0..batch)
        .map(|j| &examples[order.at(step * batch + j)])
        .map(|example| Sequence {
            prompt: &prompts[example.prompt].ids,
            completion: &example.target,
            sampling_logprobs: None,
            allowed: None,
        })
        .collect();
    let packed = pack(&sequences, policy.pad_id, policy.model.runtime().device)?;
    let stats = trainer.supervised_step(&policy.model, &packed.batch)?;
    let seconds = started.elapsed().as_secs_f64();
    Ok(StepMetrics {
        step,
        phase: Phase::Warmup,
        learning_rate,
        loss: stats.loss,
        grad_norm: stats.grad_norm,
        updated: true,
        tokens: stats.tokens,
        rl: None,
        step_seconds: seconds,
        tokens_per_second: stats.tokens as f64 / seconds.max(1e-9),
    })
}
