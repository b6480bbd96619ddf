//! The training loop: a supervised warm-up on accepted recommendations, then policy-gradient
//! steps whose advantages come from the chosen objective over n graded samples per prompt, with
//! checkpoints, exact resume and rollback.
//!
//! Determinism: nothing random carries state from one step to the next. Step `s` draws its data
//! positions, sampling streams, world verdicts, majority tie-breaks and libtorch's generator (LoRA
//! dropout) from seeds derived from (`--seed`, `s`), and the data order of an epoch from
//! (`--seed`, epoch). A checkpoint therefore needs only the adapters, AdamW's state, the step and
//! the learning-rate scale to continue exactly as an uninterrupted run would.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

use objectives::{Estimator, Group, carries_signal, estimate};
use trainer::chat_policy::{ChatPolicy, Sequence, pack};
use trainer::device::Runtime;
use trainer::logprobs::reference_logprobs;
use trainer::model::{LORA_TARGETS, LoraConfig};
use trainer::peft::{
    AdapterConfig, DEFAULT_MAX_SHARD_BYTES, save_adapter, save_checkpoint, save_merged_checkpoint,
};
use trainer::rl_loss::{Aggregation, PolicyLossConfig, PolicyLossInputs, mean_k3_kl, policy_loss};
use trainer::tch::{self, Tensor};
use trainer::train_step::{TrainError, Trainer, TrainerConfig};

use super::metrics::{MetricsLine, Phase, RlMetrics, Rollback, StepMetrics};
use super::rollout::{PromptTokens, Sampling, rollout, tokenize_prompts};
use super::run_dir::{Checkpoint, CheckpointState, FINAL_ADAPTER_DIR, RunDir, WARMUP_MODEL_DIR};
use super::settings::TrainSettings;
use crate::export::Split;
use crate::rft::{Grader, GraderKind, RftDataset, RftPrompt};

/// Fault injection for the crash and rollback tests (set from hidden environment variables by
/// the command; never in normal use).
#[derive(Debug, Clone, Copy, Default)]
pub struct FaultHooks {
    /// SIGKILL this process halfway through writing the checkpoint of this step.
    pub kill_in_checkpoint: Option<u64>,
    /// Make this step's loss NaN (once: not after a rollback).
    pub nan_loss_at: Option<u64>,
}

/// Receives progress as the run goes.
pub trait Observer {
    /// A step finished.
    fn step(&mut self, metrics: &StepMetrics, total_steps: u64);
    /// Something the user should read (rollbacks, checkpoints of phases).
    fn note(&mut self, message: &str);
}

/// What a finished run produced.
#[derive(Debug)]
pub struct TrainOutcome {
    pub final_adapter: PathBuf,
    pub steps: u64,
    pub rollbacks: u32,
    pub device: String,
    pub train_prompts: usize,
    pub trainable_parameters: i64,
}

/// Seeds of the independent random streams of a step.
#[derive(Debug, Clone, Copy)]
enum Stream {
    RlOrder = 1,
    SftOrder = 2,
    Sampling = 3,
    Verdicts = 4,
    TieBreak = 5,
    Torch = 6,
}

/// SplitMix64 over the parts: a well-mixed seed for each (stream, step, …).
pub(super) fn derive_seed(parts: &[u64]) -> u64 {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    for &part in parts {
        state ^= part;
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        state = z ^ (z >> 31);
    }
    state
}

/// An endless sequence of shuffled epochs over `0..len`, reshuffled per epoch from the seed.
#[derive(Debug)]
struct EpochOrder {
    len: usize,
    seed: u64,
    cached: Option<(u64, Vec<usize>)>,
}

impl EpochOrder {
    fn new(len: usize, seed: u64) -> Self {
        Self {
            len,
            seed,
            cached: None,
        }
    }

    fn at(&mut self, position: u64) -> usize {
        let len = self.len as u64;
        let epoch = position / len;
        if self.cached.as_ref().is_none_or(|(e, _)| *e != epoch) {
            let mut order: Vec<usize> = (0..self.len).collect();
            order.shuffle(&mut ChaCha8Rng::seed_from_u64(derive_seed(&[
                self.seed, epoch,
            ])));
            self.cached = Some((epoch, order));
        }
        self.cached
            .as_ref()
            .map_or(0, |(_, order)| order[(position % len) as usize])
    }
}

/// A warm-up example: a prompt and one accepted completion as target tokens.
#[derive(Debug)]
struct SftExample {
    prompt: usize,
    target: Vec<i64>,
}

/// Why a step failed: a numerical blow-up rolls back, anything else ends the run.
enum StepFailure {
    Diverged(String),
    Fatal(anyhow::Error),
}

impl From<anyhow::Error> for StepFailure {
    fn from(error: anyhow::Error) -> Self {
        StepFailure::Fatal(error)
    }
}

impl From<TrainError> for StepFailure {
    fn from(error: TrainError) -> Self {
        match error {
            TrainError::NonFinite { .. } => StepFailure::Diverged(error.to_string()),
            other => StepFailure::Fatal(other.into()),
        }
    }
}

/// Loads the model and data of `settings` and trains from `start` (a checkpoint) or from scratch.
pub fn train(
    mut run: RunDir,
    settings: &TrainSettings,
    dataset: &RftDataset,
    start: Option<Checkpoint>,
    hooks: FaultHooks,
    observer: &mut dyn Observer,
) -> anyhow::Result<TrainOutcome> {
    settings.validate().map_err(anyhow::Error::msg)?;
    let estimator = settings.estimator().map_err(anyhow::Error::msg)?;
    let runtime = Runtime::select(settings.device.request())?;
    let train_prompts = train_split(dataset, &settings.data)?;
    let grader = settings.grader(settings.grader, train_prompts.iter().copied())?;

    let phase_of = |step: u64| {
        if step < settings.sft_steps {
            Phase::Warmup
        } else {
            Phase::Rl
        }
    };
    let start_step = start.as_ref().map_or(0, |(_, state)| state.step);
    let mut learner = Learner::open(settings, runtime, phase_of(start_step), &run)?;
    let policy = &learner.policy;
    let prompts = tokenize_prompts(policy, dataset, &train_prompts)?;
    let sft_examples = prompts
        .iter()
        .enumerate()
        .flat_map(|(index, tokens)| {
            tokens
                .prompt
                .accepted_completions
                .iter()
                .map(move |completion| (index, completion))
        })
        .map(|(prompt, completion)| {
            Ok(SftExample {
                prompt,
                target: policy.target_ids(completion)?,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    if settings.sft_steps > 0 && sft_examples.is_empty() {
        bail!(
            "--sft-steps {}: the train split of {} has no accepted recommendation to warm up on (use --sft-steps 0)",
            settings.sft_steps,
            settings.data.display()
        );
    }

    let mut state = match &start {
        Some((dir, state)) => {
            learner
                .load_state(dir)
                .with_context(|| format!("cannot restore the checkpoint {}", dir.display()))?;
            observer.note(&format!(
                "resuming at step {} from {}",
                state.step,
                dir.display()
            ));
            *state
        }
        None => {
            let state = CheckpointState::start();
            run.checkpoint(&state, |dir| learner.save_state(dir))?;
            state
        }
    };

    let mut loop_state = Loop {
        settings,
        estimator,
        grader: &grader,
        prompts: &prompts,
        sft_examples: &sft_examples,
        rl_order: EpochOrder::new(
            prompts.len(),
            derive_seed(&[settings.seed, Stream::RlOrder as u64]),
        ),
        sft_order: EpochOrder::new(
            sft_examples.len().max(1),
            derive_seed(&[settings.seed, Stream::SftOrder as u64]),
        ),
        hooks,
    };
    let total = settings.total_steps();
    while state.step < total {
        let step = state.step;
        let learning_rate = settings.learning_rate_at(step) * state.lr_scale;
        learner.trainer.set_learning_rate(learning_rate)?;
        tch::manual_seed(derive_seed(&[settings.seed, Stream::Torch as u64, step]) as i64);
        let outcome = match phase_of(step) {
            Phase::Warmup => loop_state.warmup_step(&mut learner, step, learning_rate),
            Phase::Rl => loop_state.rl_step(&mut learner, step, learning_rate, state.rollbacks),
        };
        let metrics = match outcome {
            Ok(metrics) => match metrics.rl.as_ref().map(|rl| rl.kl) {
                Some(kl) if kl > settings.max_kl => Err(StepFailure::Diverged(format!(
                    "KL per token {kl:.4} exceeds --max-kl {}",
                    settings.max_kl
                ))),
                _ => Ok(metrics),
            },
            Err(failure) => Err(failure),
        };
        match metrics {
            Ok(metrics) => {
                run.append(&MetricsLine::Step(metrics.clone()))?;
                observer.step(&metrics, total);
                state.step += 1;
            }
            Err(StepFailure::Fatal(error)) => {
                return Err(error.context(format!("step {step} failed")));
            }
            Err(StepFailure::Diverged(reason)) => {
                if state.rollbacks >= settings.max_rollbacks {
                    bail!(
                        "step {step}: {reason}; giving up after {} rollbacks (--max-rollbacks)",
                        state.rollbacks
                    );
                }
                let Some((dir, good)) = run.checkpoint_at_or_before(step)? else {
                    bail!("step {step}: {reason}; no checkpoint to roll back to");
                };
                if phase_of(good.step) != phase_of(step) {
                    learner = Learner::open(settings, runtime, phase_of(good.step), &run)?;
                }
                learner.load_state(&dir)?;
                run.truncate_metrics(good.metrics_lines)?;
                let rollback = Rollback {
                    at_step: step,
                    to_step: good.step,
                    reason: reason.clone(),
                    lr_scale: state.lr_scale * 0.5,
                };
                run.append(&MetricsLine::Rollback(rollback.clone()))?;
                observer.note(&format!(
                    "step {step}: {reason}; rolled back to step {} with the learning rate scaled by {}",
                    good.step, rollback.lr_scale
                ));
                state = CheckpointState {
                    step: good.step,
                    lr_scale: rollback.lr_scale,
                    rollbacks: state.rollbacks + 1,
                    metrics_lines: run.metrics_lines(),
                };
                run.checkpoint(&state, |dir| learner.save_state(dir))?;
                continue;
            }
        }
        let phase_end = state.step == settings.sft_steps || state.step == total;
        if settings.sft_steps > 0 && state.step == settings.sft_steps {
            let dir = run.replace_dir(WARMUP_MODEL_DIR, |dir| learner.save_model(settings, dir))?;
            observer.note(&format!("warm-up done; model in {}", dir.display()));
            learner = Learner::open(settings, runtime, Phase::Rl, &run)?;
        }
        if phase_end || state.step % settings.checkpoint_every == 0 {
            state.metrics_lines = run.metrics_lines();
            let kill = hooks.kill_in_checkpoint == Some(state.step);
            run.checkpoint(&state, |dir| {
                learner.save_state(dir)?;
                if kill {
                    // The adapters are on disk, the optimizer state and state.json are not.
                    nix::sys::signal::kill(nix::unistd::getpid(), nix::sys::signal::SIGKILL)?;
                }
                Ok(())
            })?;
        }
    }
    let base = rl_base(settings, run.root());
    let final_adapter = run.replace_dir(FINAL_ADAPTER_DIR, |dir| {
        Ok(save_adapter(
            learner.policy.model.var_store(),
            &adapter_config(settings, &base),
            dir,
        )?)
    })?;
    Ok(TrainOutcome {
        final_adapter,
        steps: total,
        rollbacks: state.rollbacks,
        device: runtime.describe(),
        train_prompts: prompts.len(),
        trainable_parameters: learner.trainer.trainable_parameters(),
    })
}

/// The prompts a run trains on; an empty train split is an error naming the file.
pub fn train_split<'a>(dataset: &'a RftDataset, path: &Path) -> anyhow::Result<Vec<&'a RftPrompt>> {
    let prompts = dataset.split(Split::Train);
    if prompts.is_empty() {
        bail!(
            "--data {}: the train split is empty ({} prompts in all, none in train)",
            path.display(),
            dataset.prompts.len()
        );
    }
    Ok(prompts)
}

/// The PEFT config of the run's adapters over `base`.
fn adapter_config(settings: &TrainSettings, base: &Path) -> AdapterConfig {
    let mut config = AdapterConfig::new(settings.lora_r, settings.lora_alpha, &LORA_TARGETS);
    config.lora_dropout = settings.lora_dropout;
    config.base_model_name_or_path = Some(base.display().to_string());
    config
}

/// The checkpoint RL's adapters sit on (and the KL reference): the warm-up model, or the base
/// when there is no warm-up.
pub(super) fn rl_base(settings: &TrainSettings, root: &Path) -> PathBuf {
    if settings.sft_steps > 0 {
        let dir = root.join(WARMUP_MODEL_DIR);
        std::path::absolute(&dir).unwrap_or(dir)
    } else {
        settings.model.clone()
    }
}

/// RL's adapters.
pub(super) fn lora_config(settings: &TrainSettings) -> LoraConfig {
    LoraConfig {
        r: settings.lora_r,
        alpha: settings.lora_alpha,
        dropout: settings.lora_dropout,
        target_modules: LORA_TARGETS.iter().map(|&t| t.to_owned()).collect(),
    }
}

/// The model of the current phase and its optimizer.
struct Learner {
    policy: ChatPolicy,
    trainer: Trainer,
    /// Every weight trains (a full warm-up), not LoRA adapters.
    full: bool,
}

impl Learner {
    /// The warm-up trains the base model (fully, or through LoRA adapters); RL trains fresh LoRA
    /// adapters on the warm-up model, which with the adapters off is also the KL reference.
    fn open(
        settings: &TrainSettings,
        runtime: Runtime,
        phase: Phase,
        run: &RunDir,
    ) -> anyhow::Result<Self> {
        let (dir, learning_rate) = match phase {
            Phase::Warmup => (settings.model.clone(), settings.sft_learning_rate),
            Phase::Rl => (rl_base(settings, run.root()), settings.learning_rate),
        };
        // LoRA A's initial values come from libtorch's generator: seed it per phase so a fresh
        // start (and a resume that finds no checkpoint of the phase) draws the same adapters.
        tch::manual_seed(derive_seed(&[
            settings.seed,
            Stream::Torch as u64,
            u64::MAX - phase as u64,
        ]) as i64);
        let (mut policy, _report) = ChatPolicy::load(&dir, runtime)
            .with_context(|| format!("cannot load the model {}", dir.display()))?;
        let parameters: i64 = policy
            .model
            .var_store()
            .variables()
            .values()
            .map(|tensor| tensor.numel() as i64)
            .sum();
        let full = phase == Phase::Warmup && settings.warmup.is_full(parameters);
        if full {
            policy.model.set_base_trainable(true);
        } else {
            policy.model.attach_lora(&lora_config(settings))?;
        }
        let trainer = Trainer::new(
            &policy.model,
            TrainerConfig {
                learning_rate,
                weight_decay: settings.weight_decay,
                max_grad_norm: Some(settings.max_grad_norm),
                gradient_checkpointing: settings.gradient_checkpointing,
                ..TrainerConfig::default()
            },
        )?;
        Ok(Self {
            policy,
            trainer,
            full,
        })
    }

    fn save_state(&self, dir: &Path) -> anyhow::Result<()> {
        Ok(self.trainer.save_state(&self.policy.model, dir)?)
    }

    fn load_state(&mut self, dir: &Path) -> anyhow::Result<()> {
        Ok(self.trainer.load_state(&self.policy.model, dir)?)
    }

    /// The warm-up model as a Hugging Face checkpoint in `dir` (LoRA adapters merged in).
    fn save_model(&self, settings: &TrainSettings, dir: &Path) -> anyhow::Result<()> {
        let store = self.policy.model.var_store();
        if self.full {
            save_checkpoint(store, &settings.model, dir, DEFAULT_MAX_SHARD_BYTES)?;
        } else {
            let config = adapter_config(settings, &settings.model);
            save_merged_checkpoint(
                store,
                &config,
                &settings.model,
                dir,
                DEFAULT_MAX_SHARD_BYTES,
            )?;
        }
        Ok(())
    }
}

/// What every step reads.
struct Loop<'a> {
    settings: &'a TrainSettings,
    estimator: Estimator,
    grader: &'a Grader,
    prompts: &'a [PromptTokens<'a>],
    sft_examples: &'a [SftExample],
    rl_order: EpochOrder,
    sft_order: EpochOrder,
    hooks: FaultHooks,
}

impl Loop<'_> {
    fn warmup_step(
        &mut self,
        learner: &mut Learner,
        step: u64,
        learning_rate: f64,
    ) -> Result<StepMetrics, StepFailure> {
        let started = Instant::now();
        let batch = self.settings.sft_batch as u64;
        let examples: Vec<&SftExample> = (0..batch)
            .map(|j| &self.sft_examples[self.sft_order.at(step * batch + j)])
            .collect();
        let sequences: Vec<Sequence<'_>> = examples
            .iter()
            .map(|example| Sequence {
                prompt: &self.prompts[example.prompt].ids,
                completion: &example.target,
                sampling_logprobs: None,
            })
            .collect();
        let policy = &learner.policy;
        let packed = pack(&sequences, policy.pad_id, policy.model.runtime().device)?;
        let stats = learner
            .trainer
            .supervised_step(&policy.model, &packed.batch)?;
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

    fn rl_step(
        &mut self,
        learner: &mut Learner,
        step: u64,
        learning_rate: f64,
        rollbacks: u32,
    ) -> Result<StepMetrics, StepFailure> {
        let started = Instant::now();
        let settings = self.settings;
        let policy = &learner.policy;
        let (n, k) = (settings.n, settings.k);
        let per_step = settings.prompts_per_step as u64;
        let rl_index = step - settings.sft_steps;
        let picks: Vec<&PromptTokens<'_>> = (0..per_step)
            .map(|j| &self.prompts[self.rl_order.at(rl_index * per_step + j)])
            .collect();

        let sampling = Sampling {
            n,
            max_new_tokens: settings.max_new_tokens,
            temperature: settings.temperature,
            seed: derive_seed(&[settings.seed, Stream::Sampling as u64, step]),
        };
        let verdict_key = derive_seed(&[settings.seed, Stream::Verdicts as u64, step]);
        let rollout = rollout(policy, &picks, sampling, self.grader, verdict_key)?;
        let mut advantages = Vec::with_capacity(picks.len() * n);
        let mut signal_groups = Vec::with_capacity(picks.len());
        let mut batch = BatchFigures::default();
        for (index, group) in rollout.groups.iter().enumerate() {
            for sample in &group.samples {
                batch.add_sample(&sample.verdict, sample.tokens.len(), &sample.logprobs);
            }
            let accepted = group.accepted();
            let mut rng = ChaCha8Rng::seed_from_u64(derive_seed(&[
                settings.seed,
                Stream::TieBreak as u64,
                step,
                index as u64,
            ]));
            let group_advantages = self
                .estimator
                .advantages(
                    Group {
                        rewards: &group.rewards(),
                        answers: &group.answers,
                    },
                    &mut rng,
                )
                .map_err(anyhow::Error::from)?;
            signal_groups.push(carries_signal(&group_advantages));
            advantages.extend(group_advantages);
            let correct = accepted.iter().filter(|&&a| a > 0.0).count();
            batch.pass_at_k += estimate::pass_at_k(n, correct, k).map_err(anyhow::Error::from)?;
            let mut priority: Vec<usize> = (0..group.answer_classes()).collect();
            priority.shuffle(&mut rng);
            batch.maj_at_k += estimate::majority_at_k(&accepted, &group.answers, &priority, k)
                .map_err(anyhow::Error::from)?;
        }

        let keep: Vec<usize> = (0..picks.len())
            .filter(|&g| signal_groups[g] || !settings.skip_zero_advantage_groups)
            .collect();
        let device = policy.model.runtime().device;
        let sequences: Vec<Sequence<'_>> = picks
            .iter()
            .zip(&rollout.groups)
            .flat_map(|(pick, group)| {
                group.samples.iter().map(move |sample| Sequence {
                    prompt: &pick.ids,
                    completion: &sample.tokens,
                    sampling_logprobs: Some(&sample.logprobs),
                })
            })
            .collect();
        let packed = pack(&sequences, policy.pad_id, device)?;
        let reference = reference_logprobs(
            &policy.model,
            &packed.batch.input_ids,
            packed.batch.attention_mask.as_ref(),
            &packed.batch.completion_mask,
        )
        .map_err(anyhow::Error::from)?;
        // The [b, t − 1] log-probs score tokens 1..t: the completion mask shifts by one column.
        let width = packed.batch.completion_mask.size()[1];
        let scored = packed
            .batch
            .completion_mask
            .f_narrow(1, 1, width - 1)
            .map_err(TrainError::from)?;
        let kl = mean_k3_kl(&packed.sampling_logprobs, &reference, &scored)?;

        let mut loss = 0.0;
        let mut grad_norm = 0.0;
        let mut tokens = 0;
        let mut clip_fraction = 0.0;
        let updated = !keep.is_empty();
        if updated {
            let rows: Vec<i64> = keep
                .iter()
                .flat_map(|&g| (g * n..(g + 1) * n).map(|row| row as i64))
                .collect();
            let index = Tensor::from_slice(&rows).to_device(device);
            let select = |t: &Tensor| t.f_index_select(0, &index);
            let sub_batch = trainer::train_step::TrainBatch {
                input_ids: select(&packed.batch.input_ids).map_err(TrainError::from)?,
                attention_mask: packed
                    .batch
                    .attention_mask
                    .as_ref()
                    .map(select)
                    .transpose()
                    .map_err(TrainError::from)?,
                completion_mask: select(&packed.batch.completion_mask).map_err(TrainError::from)?,
            };
            let sampling = select(&packed.sampling_logprobs).map_err(TrainError::from)?;
            let reference = select(&reference).map_err(TrainError::from)?;
            let kept_advantages: Vec<f32> = rows
                .iter()
                .map(|&row| advantages[row as usize] as f32)
                .collect();
            let advantages = Tensor::from_slice(&kept_advantages).to_device(device);
            let inputs = PolicyLossInputs {
                advantages: &advantages,
                sampling_logprobs: &sampling,
                reference_logprobs: Some(&reference),
                prompts: keep.len() as i64,
            };
            let config = PolicyLossConfig {
                clip_epsilon: settings.clip_epsilon,
                kl_coef: settings.kl_coef,
                aggregation: Aggregation::Sequence,
            };
            let poison = self.hooks.nan_loss_at == Some(step) && rollbacks == 0;
            let mut loss_stats = None;
            let stats = learner
                .trainer
                .step(&policy.model, &sub_batch, |logprobs, mask| {
                    let (loss, stats) = policy_loss(logprobs, mask, &inputs, &config)?;
                    loss_stats = Some(stats);
                    Ok(if poison {
                        loss.f_mul_scalar(f64::NAN)?
                    } else {
                        loss
                    })
                })?;
            loss = stats.loss;
            grad_norm = stats.grad_norm;
            tokens = stats.tokens;
            clip_fraction = loss_stats.map_or(0.0, |s| s.clip_fraction);
        }
        let seconds = started.elapsed().as_secs_f64();
        let groups = picks.len() as f64;
        let samples = (picks.len() * n) as f64;
        let reward_mean = batch.reward_sum / samples;
        let rl = RlMetrics {
            reward_mean,
            reward_std: (batch.reward_sq_sum / samples - reward_mean * reward_mean)
                .max(0.0)
                .sqrt(),
            pass_at_1: batch.accepted / samples,
            pass_at_k: batch.pass_at_k / groups,
            maj_at_k: batch.maj_at_k / groups,
            nonzero_advantage_fraction: signal_groups.iter().filter(|&&s| s).count() as f64
                / groups,
            kl,
            entropy: batch.negative_logprob_sum / (batch.tokens as f64).max(1.0),
            clip_fraction,
            format_validity: batch.valid / samples,
            completion_tokens_mean: batch.tokens as f64 / samples,
            completion_tokens_max: batch.longest,
            acceptance_probability: (self.grader.kind() == GraderKind::World)
                .then(|| batch.acceptance_probability / samples),
        };
        Ok(StepMetrics {
            step,
            phase: Phase::Rl,
            learning_rate,
            loss,
            grad_norm,
            updated,
            tokens,
            rl: Some(rl),
            step_seconds: seconds,
            tokens_per_second: rollout.new_tokens as f64 / seconds.max(1e-9),
        })
    }
}

/// Sums over an RL batch's samples.
#[derive(Debug, Default)]
struct BatchFigures {
    reward_sum: f64,
    reward_sq_sum: f64,
    accepted: f64,
    valid: f64,
    acceptance_probability: f64,
    tokens: usize,
    longest: usize,
    negative_logprob_sum: f64,
    pass_at_k: f64,
    maj_at_k: f64,
}

impl BatchFigures {
    fn add_sample(&mut self, verdict: &crate::rft::Verdict, tokens: usize, logprobs: &[f32]) {
        self.reward_sum += verdict.reward;
        self.reward_sq_sum += verdict.reward * verdict.reward;
        self.accepted += f64::from(u8::from(verdict.accepted));
        self.valid += f64::from(u8::from(verdict.format_valid));
        self.acceptance_probability += verdict.acceptance_probability.unwrap_or(0.0);
        self.tokens += tokens;
        self.longest = self.longest.max(tokens);
        self.negative_logprob_sum -= logprobs.iter().map(|&l| f64::from(l)).sum::<f64>();
    }
}
