//! Measurements behind `arc-rec bench model`: LoRA training-step throughput of our tch model on
//! random token batches, random-initialised models of real shapes (no checkpoint needed), and the
//! PyTorch reference (`bench/model_reference.py`) run in the same process so ratios compare like
//! with like.
//!
//! Generation throughput ([`generation_throughput`]) times whole [`generate`] calls with the same
//! [`measure`] loop and reports the same [`Throughput`] as the training step.
//!
//! One RL step ([`rl_step_throughput`]) is what a training run repeats: k sampled completions of
//! one prompt by [`generate`], then one policy-gradient [`Trainer::step`] on them
//! ([`policy_gradient_loss`] with fixed advantages), timed as a whole with the same loop.
//!
//! Peak memory: tch 0.24 exposes none of libtorch's CUDA caching-allocator statistics
//! (`torch.cuda.max_memory_allocated`), so [`Throughput::peak_memory_bytes`] is `None` for now on
//! every device; the Python reference reports its own figure. Filling it needs a small C++ shim
//! over `c10::cuda::CUDACachingAllocator::getDeviceStats` (not part of this slice).

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tch::{Device, Kind, Tensor};

use crate::chat_policy::{Sequence, pack, split_evenly};
use crate::device::Runtime;
use crate::generate::{FinishedRows, GenerateError, GenerationRequest, GrammarSchedule, generate};
use crate::logprobs::{TrainBatch, reference_logprobs};
use crate::model::{Architecture, CausalLm, Config, LoraConfig, ModelError, Rope, RopeScaling};
use crate::rl_loss::{PolicyLossConfig, PolicyLossInputs, policy_loss};
use crate::train_step::{Measure, TrainError, Trainer, TrainerConfig};

/// Why a benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The model failed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The training step failed.
    #[error(transparent)]
    Train(#[from] TrainError),
    /// Generation failed.
    #[error(transparent)]
    Generate(#[from] GenerateError),
    /// libtorch failed.
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
    /// The requested sizes cannot be measured.
    #[error("benchmark settings: {0}")]
    Settings(String),
    /// The reference script could not be started.
    #[error("cannot run {python} {script}: {source}")]
    Spawn {
        /// The interpreter.
        python: String,
        /// The script.
        script: String,
        /// Why it did not start.
        source: std::io::Error,
    },
    /// The reference script exited with an error.
    #[error("{script} exited with {status}; stderr:\n{stderr}")]
    ReferenceFailed {
        /// The script.
        script: String,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// What it printed on stderr.
        stderr: String,
    },
    /// The reference script's stdout is not one JSON object.
    #[error("{script} printed no JSON object on stdout: {source}")]
    ReferenceOutput {
        /// The script.
        script: String,
        /// The parse failure.
        source: serde_json::Error,
    },
}

/// Timings of one repeated workload.
#[derive(Debug, Clone, PartialEq)]
pub struct Throughput {
    /// Wall-clock seconds of every timed repetition.
    pub seconds: Vec<f64>,
    /// Median of `seconds`.
    pub median_s: f64,
    /// Tokens processed per repetition.
    pub tokens_per_repeat: i64,
    /// `tokens_per_repeat / median_s`.
    pub tokens_per_s: f64,
    /// Peak device memory allocated by tensors during the workload; `None` where it cannot be read
    /// (see the module docs: tch exposes no allocator statistics).
    pub peak_memory_bytes: Option<u64>,
}

/// The LoRA training step's figures.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainStepThroughput {
    /// Timings; tokens are `batch × seq_len` per step.
    pub throughput: Throughput,
    /// Sequences per step.
    pub batch: i64,
    /// Tokens per sequence.
    pub seq_len: i64,
    /// Values AdamW updates.
    pub trainable_parameters: i64,
    /// The loss of every step, warm-up included.
    pub losses: Vec<f64>,
}

/// One generation phase's figures.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationThroughput {
    /// Timings; tokens are the new tokens of every sequence (prompt tokens are not counted).
    pub throughput: Throughput,
    /// Sequences generated per run (1, or k samples of the one prompt).
    pub sequences: usize,
    /// Tokens of the prompt.
    pub prompt_tokens: usize,
    /// New tokens of every sequence (eos is disabled, so each runs to the limit).
    pub new_tokens_per_sequence: usize,
    /// Sampled at temperature 1 (no top-k/top-p) rather than greedy.
    pub sampled: bool,
}

/// One RL step's figures: k completions of one prompt, then one policy-gradient step on them.
#[derive(Debug, Clone, PartialEq)]
pub struct RlStepThroughput {
    /// Timings of whole steps; tokens are `generated_tokens + trained_tokens` per step.
    pub throughput: Throughput,
    /// Completions per step (k).
    pub samples: usize,
    /// Tokens of the prompt.
    pub prompt_tokens: usize,
    /// New tokens of every completion (eos is disabled, so each runs to the limit).
    pub new_tokens_per_sequence: usize,
    /// `samples × new_tokens`: the tokens sampled.
    pub generated_tokens: i64,
    /// `samples × (prompt + new_tokens)`: every position the training forward and backward run
    /// over (the loss scores the `samples × new_tokens` completion tokens among them).
    pub trained_tokens: i64,
    /// Seconds of the generation part of every timed step (building the batch included).
    pub generate_seconds: Vec<f64>,
    /// Seconds of the training part (forward, backward, clipping, AdamW) of every timed step.
    pub train_seconds: Vec<f64>,
    /// Values AdamW updates.
    pub trainable_parameters: i64,
    /// Whether the training forward kept only each layer's input and recomputed the layer in the
    /// backward pass.
    pub gradient_checkpointing: bool,
    /// The loss of every step, warm-up included.
    pub losses: Vec<f64>,
    /// The gradient norm (before clipping) of every step, warm-up included.
    pub grad_norms: Vec<f64>,
}

/// The advantage of completion `index` in the benchmark's RL step: +1, −1, +1, … Fixed, so both
/// sides of the comparison train on the same loss whatever they sampled.
pub fn bench_advantage(index: usize) -> f32 {
    if index.is_multiple_of(2) { 1.0 } else { -1.0 }
}

/// `−Σ_i A_i Σ_t log π(y_i,t)`: the policy-gradient loss of completions with advantages `A`
/// (`[b]`), summed over each completion's scored tokens and over the completions. `logprobs` and
/// `scored_mask` are what [`Trainer::step`] hands a loss (`[b, t − 1]`).
pub fn policy_gradient_loss(
    logprobs: &Tensor,
    scored_mask: &Tensor,
    advantages: &Tensor,
) -> Result<Tensor, TrainError> {
    let rows = logprobs.size().first().copied().unwrap_or(0);
    if advantages.size() != [rows] {
        return Err(TrainError::Batch(format!(
            "{rows} completions but advantages of shape {:?}",
            advantages.size()
        )));
    }
    let per_sequence =
        (logprobs * scored_mask).f_sum_dim_intlist(Some(&[1i64][..]), false, Kind::Float)?;
    Ok((per_sequence * advantages).f_sum(Kind::Float)?.f_neg()?)
}

/// Times one RL step `warmup + repeats` times: [`generate`] `samples` completions of `prompt`,
/// `new_tokens` each, at temperature 1 without top-k/top-p or eos (so every completion has the
/// same length and both sides of the comparison do the same work), then one [`Trainer::step`] on
/// the `samples` sequences (prompt + completion, completion tokens scored) with
/// [`policy_gradient_loss`] and the advantages of [`bench_advantage`]: AdamW at the trainer's
/// defaults (learning rate 1e-4, weight decay 0.01) with the gradient norm clipped at 1. Attach the
/// adapters first; they change as it runs. Each step draws with a new seed (`seed`, `seed + 1`, …).
#[allow(clippy::too_many_arguments)]
pub fn rl_step_throughput(
    model: &CausalLm,
    prompt: &[i64],
    samples: usize,
    new_tokens: usize,
    gradient_checkpointing: bool,
    warmup: usize,
    repeats: usize,
    seed: u64,
) -> Result<RlStepThroughput, BenchError> {
    if samples == 0 || new_tokens == 0 || prompt.is_empty() {
        return Err(BenchError::Settings(format!(
            "an RL step needs a prompt, at least one sample and one new token, got a prompt of {} tokens, {samples} × {new_tokens}",
            prompt.len()
        )));
    }
    let device = model.runtime().device;
    let (k, prompt_len, new_len) = (samples as i64, prompt.len() as i64, new_tokens as i64);
    let seq_len = prompt_len + new_len;
    let generated_tokens = k * new_len;
    let trained_tokens = k * seq_len;

    let mut request = GenerationRequest::new(vec![prompt.to_vec()]);
    request.num_samples = samples;
    request.max_new_tokens = new_tokens;
    request.temperature = 1.0;
    request.finished_rows = FinishedRows::KeepStepping;
    let mut trainer = Trainer::new(
        model,
        TrainerConfig {
            gradient_checkpointing,
            // As `train`'s RL phase scores: adapter dropout off, so the samples of the prompt are
            // scored over the prompt computed once (`CausalLm::scoring_hidden_states`).
            adapter_dropout: false,
            ..TrainerConfig::default()
        },
    )?;
    let advantages: Vec<f32> = (0..samples).map(bench_advantage).collect();
    let advantages = Tensor::f_from_slice(&advantages)?.f_to_device(device)?;
    let completion_mask = Tensor::f_cat(
        &[
            Tensor::f_zeros([k, prompt_len], (Kind::Bool, device))?,
            Tensor::f_ones([k, new_len], (Kind::Bool, device))?,
        ],
        1,
    )?;

    let mut draws = 0u64;
    let mut parts = Vec::with_capacity(warmup + repeats);
    let mut losses = Vec::with_capacity(warmup + repeats);
    let mut grad_norms = Vec::with_capacity(warmup + repeats);
    let throughput = measure(
        device,
        warmup,
        repeats,
        generated_tokens + trained_tokens,
        || {
            request.seed = seed.wrapping_add(draws);
            draws += 1;
            let start = Instant::now();
            let generation = generate(model, &request)?;
            let mut ids = Vec::with_capacity((k * seq_len) as usize);
            for sample in &generation.samples {
                if sample.tokens.len() != new_tokens {
                    return Err(BenchError::Settings(format!(
                        "sample {} has {} new tokens instead of {new_tokens}",
                        sample.sample_index,
                        sample.tokens.len()
                    )));
                }
                ids.extend_from_slice(prompt);
                ids.extend_from_slice(&sample.tokens);
            }
            if generation.samples.len() != samples {
                return Err(BenchError::Settings(format!(
                    "generation returned {} samples instead of {samples}",
                    generation.samples.len()
                )));
            }
            let input_ids = Tensor::f_from_slice(&ids)?
                .f_view([k, seq_len])?
                .f_to_device(device)?;
            synchronize(device);
            let generated = start.elapsed().as_secs_f64();
            let batch = TrainBatch {
                input_ids,
                attention_mask: None,
                completion_mask: completion_mask.shallow_clone(),
                allowed: None,
            };
            let stats = trainer.step(model, &batch, Measure::LossOnly, |logprobs, mask| {
                policy_gradient_loss(logprobs, mask, &advantages)
            })?;
            synchronize(device);
            parts.push((generated, start.elapsed().as_secs_f64() - generated));
            losses.push(stats.loss);
            grad_norms.push(stats.grad_norm);
            Ok(())
        },
    )?;
    let timed = &parts[parts.len() - repeats..];
    Ok(RlStepThroughput {
        throughput,
        samples,
        prompt_tokens: prompt.len(),
        new_tokens_per_sequence: new_tokens,
        generated_tokens,
        trained_tokens,
        generate_seconds: timed.iter().map(|part| part.0).collect(),
        train_seconds: timed.iter().map(|part| part.1).collect(),
        trainable_parameters: trainer.trainable_parameters(),
        gradient_checkpointing,
        losses,
        grad_norms,
    })
}

/// The training update the constrained RL step runs: μ passes over the k samples, each in
/// minibatches of rows, one clipped-surrogate AdamW step per minibatch (what `train
/// --update-epochs μ --minibatches m` does over its groups).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RlUpdate {
    /// Passes over the samples (μ).
    pub epochs: usize,
    /// Minibatches per pass.
    pub minibatches: usize,
    /// The loss: clip ε (and ε_high), β of the KL to the reference (adapters off).
    pub loss: PolicyLossConfig,
}

/// One RL step's figures with the training update: k samples under a grammar, the reference's
/// log-probs, then [`RlUpdate`]'s optimizer steps.
#[derive(Debug, Clone, PartialEq)]
pub struct ConstrainedRlStep {
    /// Timings of whole steps. The samples end where the grammar does, so the work differs from
    /// step to step: `tokens_per_repeat` is the timed steps' mean tokens (generated + every
    /// pass's trained positions) and `tokens_per_s` their total over their total time.
    pub throughput: Throughput,
    /// Completions per step (k).
    pub samples: usize,
    pub prompt_tokens: usize,
    /// The generation limit per completion.
    pub max_new_tokens: usize,
    /// Per timed step: the tokens sampled.
    pub generated_tokens: Vec<i64>,
    /// Per timed step: prompt + completion positions one pass trains (padding left out);
    /// the update runs `epochs` passes over them.
    pub trained_tokens: Vec<i64>,
    /// Per timed step, seconds of generation (grammar included), of the scoring passes (the
    /// reference's, and below f32 the trainer's own behaviour log-probs) and of the optimizer
    /// steps.
    pub generate_seconds: Vec<f64>,
    pub reference_seconds: Vec<f64>,
    pub update_seconds: Vec<f64>,
    /// Per timed step, the grammar's host seconds inside generation.
    pub mask_seconds: Vec<f64>,
    /// Samples of the timed steps that completed the grammar (ended on a stop token).
    pub completed: usize,
    /// Optimizer steps per RL step (epochs × minibatches).
    pub optimizer_steps: usize,
    pub update: RlUpdate,
    pub trainable_parameters: i64,
    pub gradient_checkpointing: bool,
    /// Per step (warm-up included): the mean loss, the mean clipped share of tokens over its
    /// optimizer steps, and |log ρ| at its first minibatch (0 up to rounding: sampler and trainer
    /// score one masked distribution).
    pub losses: Vec<f64>,
    pub clip_fractions: Vec<f64>,
    pub first_max_abs_log_ratios: Vec<f64>,
    /// Per step below f32: the largest |Δ log p| between the sampler's log-probs and the
    /// trainer's forward, which the update uses instead
    /// ([`crate::chat_policy::PackedBatch::rescore_in_reduced_precision`]; its time is in
    /// `reference_seconds`). Empty in f32.
    pub sampler_gaps: Vec<f64>,
}

/// Times `warmup + repeats` RL steps as `train` runs them: [`generate`] `samples` completions of
/// `prompt` under `grammar` at temperature 1 (each ending at the grammar's stop ids or after
/// `max_new_tokens`), [`reference_logprobs`] of them with the adapters off (below f32 also the
/// trainer's own log-probs, as `train` does), then `update.epochs`
/// passes of `update.minibatches` [`policy_loss`] steps with the advantages of
/// [`bench_advantage`], AdamW at the trainer's defaults. Each step draws with a new seed.
#[expect(
    clippy::too_many_arguments,
    reason = "a benchmark's knobs, each set by a different flag"
)]
pub fn constrained_rl_step_throughput(
    model: &CausalLm,
    prompt: &[i64],
    samples: usize,
    max_new_tokens: usize,
    grammar: &crate::grammar::Grammar,
    update: RlUpdate,
    gradient_checkpointing: bool,
    warmup: usize,
    repeats: usize,
    seed: u64,
) -> Result<ConstrainedRlStep, BenchError> {
    if samples == 0 || max_new_tokens == 0 || prompt.is_empty() || repeats == 0 {
        return Err(BenchError::Settings(format!(
            "an RL step needs a prompt, at least one sample, one new token and one timed step, got a prompt of {} tokens, {samples} × {max_new_tokens}, {repeats} timed",
            prompt.len()
        )));
    }
    if update.epochs == 0 || update.minibatches == 0 || update.minibatches > samples {
        return Err(BenchError::Settings(format!(
            "the update needs at least one pass and between 1 and {samples} minibatches (one per sample at most), got {} passes of {} minibatches",
            update.epochs, update.minibatches
        )));
    }
    let device = model.runtime().device;
    let mut request = constrained_request(prompt, samples, max_new_tokens, grammar);
    let mut trainer = Trainer::new(
        model,
        TrainerConfig {
            gradient_checkpointing,
            // As `train`'s RL phase scores: adapter dropout off, so the samples of the prompt are
            // scored over the prompt computed once (`CausalLm::scoring_hidden_states`).
            adapter_dropout: false,
            ..TrainerConfig::default()
        },
    )?;
    let advantages: Vec<f32> = (0..samples).map(bench_advantage).collect();
    let rows: Vec<i64> = (0..samples as i64).collect();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);

    let mut report = ConstrainedRlStep {
        // Filled by `measure_varying` below.
        throughput: Throughput {
            seconds: Vec::new(),
            median_s: 0.0,
            tokens_per_repeat: 0,
            tokens_per_s: 0.0,
            peak_memory_bytes: None,
        },
        samples,
        prompt_tokens: prompt.len(),
        max_new_tokens,
        generated_tokens: Vec::new(),
        trained_tokens: Vec::new(),
        generate_seconds: Vec::new(),
        reference_seconds: Vec::new(),
        update_seconds: Vec::new(),
        mask_seconds: Vec::new(),
        completed: 0,
        optimizer_steps: update.epochs * update.minibatches,
        update,
        trainable_parameters: trainer.trainable_parameters(),
        gradient_checkpointing,
        losses: Vec::new(),
        clip_fractions: Vec::new(),
        first_max_abs_log_ratios: Vec::new(),
        sampler_gaps: Vec::new(),
    };
    let optimizer_steps = report.optimizer_steps as f64;
    let throughput = measure_varying(device, warmup, repeats, |step| {
        let timed = step >= warmup;
        request.seed = seed.wrapping_add(step as u64);
        let start = Instant::now();
        let generation = generate(model, &request)?;
        let sequences: Vec<Sequence<'_>> = generation
            .samples
            .iter()
            .map(|sample| {
                Sequence::sampled(prompt, &sample.tokens, &sample.logprobs, &sample.allowed)
            })
            .collect();
        if sequences.len() != samples {
            return Err(BenchError::Settings(format!(
                "generation returned {} samples instead of {samples}",
                sequences.len()
            )));
        }
        let mut packed = pack(&sequences, 0, device)?;
        synchronize(device);
        let generated = start.elapsed().as_secs_f64();
        let gap = packed.rescore_in_reduced_precision(
            model,
            1.0,
            samples.div_ceil(update.minibatches),
        )?;
        let reference = reference_logprobs(model, &packed.batch, 1.0)?;
        synchronize(device);
        let referenced = start.elapsed().as_secs_f64();

        let (mut loss, mut clipped, mut first_ratio) = (0.0, 0.0, 0.0);
        let mut order = rows.clone();
        for epoch in 0..update.epochs {
            if epoch > 0 || update.minibatches > 1 {
                order.shuffle(&mut rng);
            }
            for (index, part) in split_evenly(&order, update.minibatches)
                .into_iter()
                .enumerate()
            {
                let minibatch = packed.select_rows(part)?;
                let index_tensor = Tensor::f_from_slice(part)?.f_to_device(device)?;
                let part_advantages: Vec<f32> =
                    part.iter().map(|&row| advantages[row as usize]).collect();
                let part_advantages =
                    Tensor::f_from_slice(&part_advantages)?.f_to_device(device)?;
                let part_reference = reference.f_index_select(0, &index_tensor)?;
                let inputs = PolicyLossInputs {
                    advantages: &part_advantages,
                    sampling_logprobs: &minibatch.sampling_logprobs,
                    reference_logprobs: Some(&part_reference),
                    prompts: 1,
                };
                let mut stats = None;
                // As `train` does.
                let measure = Measure::on_first_minibatch(epoch == 0 && index == 0);
                let step_stats =
                    trainer.step(model, &minibatch.batch, measure, |logprobs, mask| {
                        let (loss, loss_stats) =
                            policy_loss(logprobs, mask, &inputs, &update.loss)?;
                        stats = Some(loss_stats);
                        Ok(loss)
                    })?;
                loss += step_stats.loss;
                if let Some(stats) = stats {
                    clipped += stats.clip_fraction;
                    if epoch == 0 && index == 0 {
                        first_ratio = stats.max_abs_log_ratio;
                    }
                }
            }
        }
        synchronize(device);
        let total = start.elapsed().as_secs_f64();
        report.losses.push(loss / optimizer_steps);
        report.clip_fractions.push(clipped / optimizer_steps);
        report.first_max_abs_log_ratios.push(first_ratio);
        report.sampler_gaps.extend(gap);
        let generated_tokens: usize = generation.samples.iter().map(|s| s.tokens.len()).sum();
        let trained_tokens = generated_tokens + samples * prompt.len();
        if timed {
            report.generated_tokens.push(generated_tokens as i64);
            report.trained_tokens.push(trained_tokens as i64);
            report.generate_seconds.push(generated);
            report.reference_seconds.push(referenced - generated);
            report.update_seconds.push(total - referenced);
            report
                .mask_seconds
                .push(generation.counters.mask_time.as_secs_f64());
            report.completed += generation
                .samples
                .iter()
                .filter(|sample| sample.finish_reason == crate::generate::FinishReason::Eos)
                .count();
        }
        Ok::<_, BenchError>((generated_tokens + update.epochs * trained_tokens) as i64)
    })?;
    report.throughput = throughput;
    Ok(report)
}

/// `len` token ids drawn uniformly from `[1, vocab_size)` by a ChaCha8 stream seeded with `seed`
/// (0 is left out as the reference's prompt does; it is the pad id there). The content does not
/// matter for throughput, only that it is fixed.
pub fn random_prompt(vocab_size: i64, len: usize, seed: u64) -> Result<Vec<i64>, BenchError> {
    if vocab_size < 2 || len == 0 {
        return Err(BenchError::Settings(format!(
            "a random prompt needs a vocabulary of at least 2 ids and a positive length, got vocabulary {vocab_size} and length {len}"
        )));
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    Ok((0..len).map(|_| rng.random_range(1..vocab_size)).collect())
}

/// Times [`generate`] of `sequences` completions of `prompt` (one prefill shared by all of them),
/// `new_tokens` each, without eos so every sequence runs the full length: greedy when `sampled` is
/// false, else temperature 1 without top-k/top-p, as the reference's `generate` calls do.
/// Finished rows never occur (no eos), so the finished-row policy cannot matter; it is pinned to
/// keep-stepping anyway so the batch is never copied.
pub fn generation_throughput(
    model: &CausalLm,
    prompt: &[i64],
    sequences: usize,
    new_tokens: usize,
    sampled: bool,
    warmup: usize,
    repeats: usize,
) -> Result<GenerationThroughput, BenchError> {
    let expected = sequences
        .checked_mul(new_tokens)
        .filter(|&tokens| tokens > 0)
        .ok_or_else(|| {
            BenchError::Settings(format!(
                "generation needs at least one sequence and one new token, got {sequences} × {new_tokens}"
            ))
        })?;
    let mut request = GenerationRequest::new(vec![prompt.to_vec()]);
    request.num_samples = sequences;
    request.max_new_tokens = new_tokens;
    request.temperature = if sampled { 1.0 } else { 0.0 };
    request.finished_rows = FinishedRows::KeepStepping;
    let throughput = measure(
        model.runtime().device,
        warmup,
        repeats,
        expected as i64,
        || {
            let generation = generate(model, &request)?;
            let produced = generation.counters.new_tokens;
            if produced != expected as u64 {
                return Err(BenchError::Settings(format!(
                    "generation returned {produced} new tokens instead of {sequences} × {new_tokens}"
                )));
            }
            Ok(())
        },
    )?;
    Ok(GenerationThroughput {
        throughput,
        sequences,
        prompt_tokens: prompt.len(),
        new_tokens_per_sequence: new_tokens,
        sampled,
    })
}

/// `samples` completions of `prompt` at temperature 1 under `grammar`, each ending at its stop
/// ids or after `max_new_tokens`.
fn constrained_request<'g>(
    prompt: &[i64],
    samples: usize,
    max_new_tokens: usize,
    grammar: &'g crate::grammar::Grammar,
) -> GenerationRequest<'g> {
    let mut request = GenerationRequest::new(vec![prompt.to_vec()]);
    request.num_samples = samples;
    request.max_new_tokens = max_new_tokens;
    request.temperature = 1.0;
    request.eos_token_ids = grammar.stop_ids().iter().map(|&id| i64::from(id)).collect();
    request.grammars = std::slice::from_ref(grammar);
    request
}

/// Generation of k samples under a grammar, and the share of it the grammar took.
#[derive(Debug, Clone, PartialEq)]
pub struct ConstrainedThroughput {
    /// Timings ([`measure_varying`]): tokens are the new tokens of every sample, each ending
    /// where the grammar does or at the limit.
    pub throughput: Throughput,
    /// Samples per run.
    pub sequences: usize,
    /// New tokens of every timed run.
    pub tokens: Vec<i64>,
    /// When the allowed sets were computed.
    pub schedule: GrammarSchedule,
    /// Host seconds the decode loop spent on the grammar in every timed run
    /// (`GenerationCounters::mask_time`: with [`GrammarSchedule::BesideForward`] only what
    /// outlasted the forward).
    pub mask_seconds: Vec<f64>,
    /// Seconds of grammar work that ran beside the forward in every timed run
    /// (`GenerationCounters::mask_beside_forward`; zero after the forward).
    pub beside_forward_seconds: Vec<f64>,
    /// Samples of the timed runs that ended on a stop token (the grammar complete) rather than
    /// the limit.
    pub completed: usize,
}

impl ConstrainedThroughput {
    /// The grammar's median share of a run's wall time.
    pub fn mask_share(&self) -> f64 {
        let shares: Vec<f64> = self
            .mask_seconds
            .iter()
            .zip(&self.throughput.seconds)
            .map(|(mask, total)| mask / total)
            .collect();
        median(&shares)
    }

    /// The grammar's milliseconds per generated token over the timed runs.
    pub fn mask_ms_per_token(&self) -> f64 {
        self.ms_per_token(&self.mask_seconds)
    }

    /// Milliseconds per generated token of grammar work beside the forward.
    pub fn beside_forward_ms_per_token(&self) -> f64 {
        self.ms_per_token(&self.beside_forward_seconds)
    }

    fn ms_per_token(&self, seconds: &[f64]) -> f64 {
        1e3 * seconds.iter().sum::<f64>() / self.tokens.iter().sum::<i64>() as f64
    }
}

/// Times [`generate`] of `sequences` samples of `prompt` at temperature 1, each masked to
/// `grammar` and ending at its stop ids or after `max_new_tokens`, its allowed sets computed as
/// `schedule` says; the grammar's own host time is read from the generation's counters. Each run
/// draws with its own seed (`seed + run`): the samples, and so the work, differ from run to run
/// (and on CUDA the same seed need not draw the same samples twice). On the CPU two calls that
/// differ only in `schedule` draw the same samples, so their times compare the schedules alone.
#[expect(
    clippy::too_many_arguments,
    reason = "a benchmark's knobs, each set by a different flag"
)]
pub fn constrained_generation_throughput(
    model: &CausalLm,
    prompt: &[i64],
    sequences: usize,
    max_new_tokens: usize,
    grammar: &crate::grammar::Grammar,
    warmup: usize,
    repeats: usize,
    seed: u64,
    schedule: GrammarSchedule,
) -> Result<ConstrainedThroughput, BenchError> {
    if sequences == 0 || max_new_tokens == 0 {
        return Err(BenchError::Settings(format!(
            "constrained generation needs at least one sequence and one new token, got {sequences} × {max_new_tokens}"
        )));
    }
    let mut request = constrained_request(prompt, sequences, max_new_tokens, grammar);
    request.grammar_schedule = schedule;
    let mut runs = Vec::with_capacity(warmup + repeats);
    let throughput = measure_varying(model.runtime().device, warmup, repeats, |run| {
        request.seed = seed.wrapping_add(run as u64);
        let generation = generate(model, &request)?;
        let tokens = i64::try_from(generation.counters.new_tokens).unwrap_or(i64::MAX);
        let completed = generation
            .samples
            .iter()
            .filter(|sample| sample.finish_reason == crate::generate::FinishReason::Eos)
            .count();
        runs.push((
            tokens,
            generation.counters.mask_time.as_secs_f64(),
            completed,
            generation.counters.mask_beside_forward.as_secs_f64(),
        ));
        Ok::<_, BenchError>(tokens)
    })?;
    let timed = &runs[warmup..];
    Ok(ConstrainedThroughput {
        throughput,
        sequences,
        tokens: timed.iter().map(|run| run.0).collect(),
        schedule,
        mask_seconds: timed.iter().map(|run| run.1).collect(),
        beside_forward_seconds: timed.iter().map(|run| run.3).collect(),
        completed: timed.iter().map(|run| run.2).sum(),
    })
}

/// Sets libtorch's intra-op CPU thread count to `threads`, or leaves libtorch's default (the
/// physical cores) when `None`, and returns the count in force. Both sides of the benchmark must
/// use the same count; the reference gets it as `--threads`.
pub fn use_torch_threads(threads: Option<u32>) -> u32 {
    if let Some(threads) = threads.and_then(|n| i32::try_from(n).ok()) {
        tch::set_num_threads(threads);
    }
    u32::try_from(tch::get_num_threads()).unwrap_or(1)
}

/// Seeds libtorch's generator (random weights and training batches).
pub fn seed_torch(seed: u64) {
    // libtorch takes an i64; wrapping keeps every u64 a distinct, valid seed.
    tch::manual_seed(seed as i64);
}

/// Waits for queued device work so wall-clock readings cover it (a no-op on the CPU).
pub fn synchronize(device: Device) {
    if let Device::Cuda(index) = device {
        tch::Cuda::synchronize(index as i64);
    }
}

/// Runs `work` `warmup` times untimed, then `repeats` times timed, synchronising the device around
/// every timing; `tokens_per_repeat` converts the median into tokens per second. The seam for
/// every phase of the model benchmark (training here, generation in the generation code).
pub fn measure<E>(
    device: Device,
    warmup: usize,
    repeats: usize,
    tokens_per_repeat: i64,
    mut work: impl FnMut() -> Result<(), E>,
) -> Result<Throughput, E>
where
    E: From<BenchError>,
{
    if repeats == 0 || tokens_per_repeat <= 0 {
        return Err(BenchError::Settings(format!(
            "need at least one timed repetition and a positive token count (repeats {repeats}, tokens {tokens_per_repeat})"
        ))
        .into());
    }
    for _ in 0..warmup {
        work()?;
    }
    let mut seconds = Vec::with_capacity(repeats);
    for _ in 0..repeats {
        synchronize(device);
        let start = Instant::now();
        work()?;
        synchronize(device);
        seconds.push(start.elapsed().as_secs_f64());
    }
    let median_s = median(&seconds);
    Ok(Throughput {
        median_s,
        tokens_per_repeat,
        tokens_per_s: tokens_per_repeat as f64 / median_s,
        seconds,
        peak_memory_bytes: None,
    })
}

/// [`measure`] for work whose size differs from run to run (samples that end where a grammar
/// does): `work` gets the run's index (warm-up runs first) and returns the tokens it processed.
/// `tokens_per_repeat` is the timed runs' mean and `tokens_per_s` their total tokens over their
/// total time.
pub fn measure_varying<E>(
    device: Device,
    warmup: usize,
    repeats: usize,
    mut work: impl FnMut(usize) -> Result<i64, E>,
) -> Result<Throughput, E>
where
    E: From<BenchError>,
{
    if repeats == 0 {
        return Err(BenchError::Settings("need at least one timed repetition".into()).into());
    }
    for run in 0..warmup {
        work(run)?;
    }
    let mut seconds = Vec::with_capacity(repeats);
    let mut tokens = 0i64;
    for run in warmup..warmup + repeats {
        synchronize(device);
        let start = Instant::now();
        tokens += work(run)?;
        synchronize(device);
        seconds.push(start.elapsed().as_secs_f64());
    }
    Ok(Throughput {
        median_s: median(&seconds),
        tokens_per_repeat: tokens / repeats as i64,
        tokens_per_s: tokens as f64 / seconds.iter().sum::<f64>(),
        seconds,
        peak_memory_bytes: None,
    })
}

/// The median of a list (mean of the middle two for even lengths, as Python's
/// `statistics.median`); NaN for an empty one.
pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let middle = sorted.len() / 2;
    if sorted.is_empty() {
        f64::NAN
    } else if sorted.len().is_multiple_of(2) {
        (sorted[middle - 1] + sorted[middle]) / 2.0
    } else {
        sorted[middle]
    }
}

/// Forward + backward + AdamW step on `model`'s LoRA adapters over a random batch of `batch`
/// sequences of `seq_len` tokens, loss = mean next-token NLL over every position (what the
/// reference's `labels=input_ids` computes), learning rate 1e-4 and no gradient clipping like the
/// reference. Attach the adapters first (`LoraConfig::default()` is the benchmark's r=16,
/// alpha=32 on all seven projections). The adapters change as it runs.
pub fn train_step_throughput(
    model: &CausalLm,
    batch: i64,
    seq_len: i64,
    steps: usize,
    warmup: usize,
) -> Result<TrainStepThroughput, BenchError> {
    train_step_throughput_with(model, batch, seq_len, steps, warmup, false)
}

/// [`train_step_throughput`], with the decoder layers recomputed in the backward pass when
/// `gradient_checkpointing` (what the reference does for models over 1B parameters).
pub fn train_step_throughput_with(
    model: &CausalLm,
    batch: i64,
    seq_len: i64,
    steps: usize,
    warmup: usize,
    gradient_checkpointing: bool,
) -> Result<TrainStepThroughput, BenchError> {
    if batch <= 0 || seq_len < 2 {
        return Err(BenchError::Settings(format!(
            "training batch needs batch ≥ 1 and seq_len ≥ 2, got {batch} × {seq_len}"
        )));
    }
    let device = model.runtime().device;
    let input_ids = Tensor::f_randint(
        model.config().vocab_size,
        [batch, seq_len],
        (Kind::Int64, device),
    )?;
    let completion_mask = Tensor::f_ones([batch, seq_len], (Kind::Bool, device))?;
    let train_batch = TrainBatch {
        input_ids,
        attention_mask: None,
        completion_mask,
        allowed: None,
    };
    let config = TrainerConfig {
        learning_rate: 1e-4,
        max_grad_norm: None,
        gradient_checkpointing,
        ..TrainerConfig::default()
    };
    let mut trainer = Trainer::new(model, config)?;
    let mut losses = Vec::with_capacity(warmup + steps);
    let throughput = measure(device, warmup, steps, batch * seq_len, || {
        let stats = trainer.supervised_step(model, &train_batch)?;
        losses.push(stats.loss);
        Ok::<(), BenchError>(())
    })?;
    Ok(TrainStepThroughput {
        throughput,
        batch,
        seq_len,
        trainable_parameters: trainer.trainable_parameters(),
        losses,
    })
}

/// Qwen2.5-7B's shapes (its config.json without tokenizer ids, which random weights do not need).
pub fn qwen2_5_7b_config() -> Config {
    Config {
        architecture: Architecture::Qwen2,
        vocab_size: 152_064,
        hidden_size: 3584,
        intermediate_size: 18_944,
        num_hidden_layers: 28,
        num_attention_heads: 28,
        num_key_value_heads: 4,
        head_dim: 3584 / 28,
        rms_norm_eps: 1e-6,
        max_position_embeddings: 32_768,
        tie_word_embeddings: false,
        qkv_bias: true,
        o_proj_bias: false,
        mlp_bias: false,
        rope: Rope {
            theta: 1_000_000.0,
            scaling: RopeScaling::Default,
        },
        bos_token_id: None,
        eos_token_ids: Vec::new(),
        stored_dtype: Some("bfloat16".to_owned()),
    }
}

/// Qwen2.5-0.5B's shapes (its config.json without tokenizer ids): small enough for an RL step on
/// a CPU in f32 (494M parameters, 2 GB).
pub fn qwen2_5_0_5b_config() -> Config {
    Config {
        architecture: Architecture::Qwen2,
        vocab_size: 151_936,
        hidden_size: 896,
        intermediate_size: 4864,
        num_hidden_layers: 24,
        num_attention_heads: 14,
        num_key_value_heads: 2,
        head_dim: 896 / 14,
        rms_norm_eps: 1e-6,
        max_position_embeddings: 32_768,
        tie_word_embeddings: true,
        qkv_bias: true,
        o_proj_bias: false,
        mlp_bias: false,
        rope: Rope {
            theta: 1_000_000.0,
            scaling: RopeScaling::Default,
        },
        bos_token_id: None,
        eos_token_ids: Vec::new(),
        stored_dtype: Some("bfloat16".to_owned()),
    }
}

/// How many values the base model of `config` holds (LoRA excluded), without allocating it:
/// 7,615,616,512 for [`qwen2_5_7b_config`], 494,032,768 for [`qwen2_5_0_5b_config`].
pub fn parameter_count(config: &Config) -> i64 {
    let hidden = config.hidden_size;
    let q_width = config.num_attention_heads * config.head_dim;
    let kv_width = config.num_key_value_heads * config.head_dim;
    let bias = |present: bool, width: i64| if present { width } else { 0 };
    let attention = hidden * q_width
        + 2 * hidden * kv_width
        + q_width * hidden
        + bias(config.qkv_bias, q_width + 2 * kv_width)
        + bias(config.o_proj_bias, hidden);
    let mlp = 3 * hidden * config.intermediate_size
        + bias(config.mlp_bias, 2 * config.intermediate_size + hidden);
    let layer = attention + mlp + 2 * hidden;
    let embeddings = config.vocab_size * hidden;
    let head = if config.tie_word_embeddings {
        0
    } else {
        embeddings
    };
    embeddings + config.num_hidden_layers * layer + hidden + head
}

/// A model of `config`'s shapes built directly on `runtime`'s device in its kind, with random
/// weights ([`randomize_base_weights`] with `std`) and, when `lora` is given, adapters attached.
/// Random weights cost the same per forward as trained ones, so this benchmarks a 7B model
/// without its 15 GB checkpoint.
pub fn random_model(
    config: Config,
    runtime: Runtime,
    std: f64,
    lora: Option<&LoraConfig>,
) -> Result<CausalLm, BenchError> {
    let mut model = CausalLm::new(config, runtime)?;
    randomize_base_weights(&model, std)?;
    if let Some(lora) = lora {
        model.attach_lora(lora)?;
    }
    Ok(model)
}

/// Fills the base weights in place as transformers initialises a fresh model: norm weights 1,
/// biases 0, every other weight normal(0, std). LoRA variables are left alone.
pub fn randomize_base_weights(model: &CausalLm, std: f64) -> Result<(), BenchError> {
    if !(std.is_finite() && std > 0.0) {
        return Err(BenchError::Settings(format!(
            "std must be positive, got {std}"
        )));
    }
    tch::no_grad(|| {
        for (name, mut tensor) in model.var_store().variables() {
            if name.contains(".lora_") {
                continue;
            }
            if name.ends_with("norm.weight") {
                let _ = tensor.f_fill_(1.0)?;
            } else if name.ends_with(".bias") {
                let _ = tensor.f_zero_()?;
            } else {
                let _ = tensor.f_normal_(0.0, std)?;
            }
        }
        Ok(())
    })
}

/// Runs the PyTorch reference benchmark (`script`, normally `bench/model_reference.py`) with
/// `python` and `args` (e.g. `["--tiny"]` or `["--shape", "qwen2.5-7b", "--phases",
/// "lora_train_step"]`) and returns the JSON object it prints. Its progress (stderr) is returned
/// only in errors.
pub fn run_reference_bench(
    python: &Path,
    script: &Path,
    args: &[&str],
) -> Result<serde_json::Value, BenchError> {
    let output = Command::new(python)
        .arg(script)
        .args(args)
        // No Hugging Face Hub is reachable; the reference builds or loads models locally.
        .env("HF_HUB_OFFLINE", "1")
        .env("TRANSFORMERS_VERBOSITY", "error")
        .output()
        .map_err(|source| BenchError::Spawn {
            python: python.display().to_string(),
            script: script.display().to_string(),
            source,
        })?;
    if !output.status.success() {
        return Err(BenchError::ReferenceFailed {
            script: script.display().to_string(),
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    serde_json::from_slice(&output.stdout).map_err(|source| BenchError::ReferenceOutput {
        script: script.display().to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::device::DeviceRequest;

    fn tiny_model() -> CausalLm {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-qwen2/config.json");
        let config = Config::from_file(&path).unwrap();
        let runtime = Runtime::select(DeviceRequest::Cpu).unwrap();
        tch::manual_seed(3);
        random_model(config, runtime, 0.02, Some(&LoraConfig::default())).unwrap()
    }

    #[test]
    fn qwen2_5_0_5b_has_its_published_parameter_count() {
        let config = qwen2_5_0_5b_config();
        assert_eq!(parameter_count(&config), 494_032_768);
        assert_eq!(config.head_dim, 64);
    }

    #[test]
    fn policy_gradient_loss_weighs_each_completion_by_its_advantage() {
        let logprobs = Tensor::from_slice(&[-1.0f32, -2.0, -3.0, -0.5, -0.25, -4.0]).view([2, 3]);
        let mask = Tensor::from_slice(&[0.0f32, 1.0, 1.0, 0.0, 1.0, 1.0]).view([2, 3]);
        let advantages = Tensor::from_slice(&[bench_advantage(0), bench_advantage(1)]);
        let loss = policy_gradient_loss(&logprobs, &mask, &advantages).unwrap();
        // −(1 · (−5) − 1 · (−4.25)) = 0.75
        assert!((loss.double_value(&[]) - 0.75).abs() < 1e-6);
        assert!(policy_gradient_loss(&logprobs, &mask, &Tensor::from_slice(&[1.0f32])).is_err());
    }

    #[test]
    fn rl_step_counts_generated_and_trained_tokens_and_times_both_parts() {
        let model = tiny_model();
        let prompt = random_prompt(model.config().vocab_size, 5, 0).unwrap();
        for checkpointing in [false, true] {
            let report = rl_step_throughput(&model, &prompt, 3, 4, checkpointing, 1, 2, 7).unwrap();
            let figures = &report.throughput;
            assert_eq!((report.generated_tokens, report.trained_tokens), (12, 27));
            assert_eq!(figures.tokens_per_repeat, 12 + 27);
            assert_eq!(figures.seconds.len(), 2);
            assert!(figures.tokens_per_s > 0.0 && figures.tokens_per_s.is_finite());
            assert_eq!(
                (report.generate_seconds.len(), report.train_seconds.len()),
                (2, 2)
            );
            for (i, total) in figures.seconds.iter().enumerate() {
                let parts = report.generate_seconds[i] + report.train_seconds[i];
                assert!(parts > 0.0 && parts <= *total + 1e-9, "{parts} {total}");
            }
            assert_eq!(report.losses.len(), 3, "warm-up step included");
            assert!(report.losses.iter().all(|loss| loss.is_finite()));
            assert!(report.grad_norms.iter().all(|norm| *norm > 0.0));
            assert_eq!(report.gradient_checkpointing, checkpointing);
            assert!(report.trainable_parameters > 0);
        }
        assert!(matches!(
            rl_step_throughput(&model, &prompt, 0, 4, false, 0, 1, 0),
            Err(BenchError::Settings(_))
        ));
    }
}
