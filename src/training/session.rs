//! The training loop: a supervised warm-up on accepted recommendations, then RL steps (rollouts
//! graded and turned into advantages, a clipped policy update over them, the KL guard), with
//! checkpoints, exact resume and rollback. Each concern has its own room: [`super::warmup`],
//! [`super::rollout`], [`super::update`], [`super::guard`], [`super::seeds`] and
//! [`super::run_dir`] (what a checkpoint keeps); this file strings them together.
//!
//! Determinism: every step draws from seeds derived from (`--seed`, step, salt) (see
//! [`super::seeds`]), so a checkpoint needs only the adapters, AdamW's state and its
//! [`CheckpointState`] (step, learning-rate scale, salt, prompt cursor, KL state) to continue
//! exactly as an uninterrupted run would.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};

use trainer::chat_policy::ChatPolicy;
use trainer::device::Runtime;
use trainer::model::{LORA_TARGETS, LoraConfig};
use trainer::peft::{
    AdapterConfig, DEFAULT_MAX_SHARD_BYTES, save_adapter, save_checkpoint, save_merged_checkpoint,
};
use trainer::tch;
use trainer::train_step::{TrainError, Trainer, TrainerConfig};

use super::guard::GuardState;
use super::metrics::{MetricsLine, Phase, Rollback, StepMetrics};
use super::rollout::{
    PromptTokens, RlRolloutContext, collect_rl_batch, recommendation_grammar, tokenize_prompts,
};
use super::run_dir::{
    Checkpoint, CheckpointState, FINAL_ADAPTER_DIR, RunDir, WARMUP_MODEL_DIR, run_grader,
};
use super::seeds::{EpochOrder, StepSeeds, Stream, derive_seed, salted_seed};
use super::selection::{
    Choice, EVAL_POINT_PREFIX, HeldOutMenus, Scored, SelectionPoint, choose, eval_point_dir,
};
use super::settings::TrainSettings;
use super::update::{policy_update, score_batch};
use super::warmup::{SftExample, sft_examples, warmup_step};
use crate::export::Split;
use crate::rft::{RftDataset, RftPrompt};

/// Fault injection for the crash and rollback tests (set from hidden environment variables by
/// the command; never in normal use).
#[derive(Debug, Clone, Copy, Default)]
pub struct FaultHooks {
    /// SIGKILL this process halfway through writing the checkpoint of this step.
    pub kill_in_checkpoint: Option<u64>,
    /// Make this step's loss NaN (once: not after a rollback).
    pub nan_loss_at: Option<u64>,
    /// Negate every RL advantage: an RL phase that learns to be rejected (the gate's test of a
    /// run that only gets worse).
    pub invert_advantages: bool,
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
    /// The checkpoint `--eval-every` kept and whether it beat the warm-up; `None` when the run
    /// selected nothing (`--eval-every 0`, no RL steps, or no validation context to score on).
    pub selection: Option<Choice>,
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
    run.keep_calm_checkpoints(settings.max_kl);
    let runtime = Runtime::select(settings.device.request())?;
    let train_prompts = train_split(dataset, &settings.data)?;
    let grader = run_grader(
        run.root(),
        "--out",
        settings,
        dataset,
        settings.grader,
        train_prompts.iter().copied(),
    )?;
    let start_step = start.as_ref().map_or(0, |(_, state)| state.step);
    let mut learner = Learner::open(settings, runtime, phase_of(settings, start_step), &run)?;
    let prompts = tokenize_prompts(&learner.policy, dataset, &train_prompts)?;
    let examples = sft_examples(&learner.policy, &prompts)?;
    if settings.sft_steps > 0 && examples.is_empty() {
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
    // Warm-up and RL models share the base's tokenizer, so one compiled grammar serves both.
    let grammar = recommendation_grammar(
        &learner.policy,
        settings.constrained.is_on(),
        &dataset.catalogues(),
    )?;
    let context = RlRolloutContext {
        settings,
        estimator: settings.estimator().map_err(anyhow::Error::msg)?,
        grader: &grader,
        prompts: &prompts,
        grammar: grammar.as_ref(),
    };
    let mut selector = Selector::open(settings, &learner.policy, dataset, observer)?;
    let mut orders = Orders::new(settings, &prompts, &examples, state.salt);
    let total = settings.total_steps();
    while state.step < total {
        if let Some(selector) = &mut selector {
            selector.score_if_due(&mut run, settings, &learner, state.step, observer)?;
        }
        let step = state.step;
        let learning_rate = settings.learning_rate_at(step) * state.lr_scale;
        learner.trainer.set_learning_rate(learning_rate)?;
        let seeds = StepSeeds {
            seed: settings.seed,
            step,
            salt: state.salt,
        };
        tch::manual_seed(seeds.of(Stream::Torch, &[]) as i64);
        let outcome = match phase_of(settings, step) {
            Phase::Warmup => warmup_step(
                &mut learner.trainer,
                &learner.policy,
                &prompts,
                &examples,
                &mut orders.sft,
                settings.sft_batch,
                step,
                learning_rate,
            )
            .map_err(StepFailure::from),
            Phase::Rl => {
                let poison = hooks.nan_loss_at == Some(step) && state.rollbacks == 0;
                rl_step(
                    &mut learner,
                    &context,
                    &mut orders.rl,
                    &mut state,
                    seeds,
                    learning_rate,
                    RlFaults {
                        poison,
                        invert: hooks.invert_advantages,
                    },
                )
            }
        };
        match outcome {
            Ok(metrics) => {
                run.append(&MetricsLine::Step(Box::new(metrics.clone())))?;
                observer.step(&metrics, total);
                state.step += 1;
            }
            Err(StepFailure::Fatal(error)) => {
                return Err(error.context(format!("step {step} failed")));
            }
            Err(StepFailure::Diverged(reason)) => {
                state = roll_back(
                    &mut run,
                    settings,
                    runtime,
                    &mut learner,
                    &state,
                    step,
                    &reason,
                    observer,
                )?;
                orders = Orders::new(settings, &prompts, &examples, state.salt);
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
    let selection = match &mut selector {
        Some(selector) => {
            selector.score_if_due(&mut run, settings, &learner, state.step, observer)?;
            selector.choose(&run, settings)?
        }
        None => None,
    };
    let final_adapter = match &selection {
        Some(choice) => {
            let chosen = run.root().join(eval_point_dir(choice.step));
            run.replace_dir(FINAL_ADAPTER_DIR, |dir| copy_files(&chosen, dir))?
        }
        None => {
            let base = rl_base(settings, run.root());
            run.replace_dir(FINAL_ADAPTER_DIR, |dir| {
                Ok(save_adapter(
                    learner.policy.model.var_store(),
                    &adapter_config(settings, &base),
                    dir,
                )?)
            })?
        }
    };
    if !settings.keep_eval_points {
        remove_eval_points(run.root())?;
    }
    if let Some(choice) = &selection {
        observer.note(&choice.describe());
    }
    Ok(TrainOutcome {
        final_adapter,
        steps: total,
        rollbacks: state.rollbacks,
        device: runtime.describe(),
        train_prompts: prompts.len(),
        trainable_parameters: learner.trainer.trainable_parameters(),
        selection,
    })
}

/// `--eval-every`: the validation contexts the checkpoints are scored on.
struct Selector<'p> {
    menus: HeldOutMenus<'p>,
    every: u64,
    /// The warm-up's scores (RL step 0), which every later point's margin is measured from:
    /// kept when scored, or read once from the metrics after a resume.
    warmup: Option<Scored>,
}

impl<'p> Selector<'p> {
    /// `None` when the run selects nothing: `--eval-every 0`, no RL steps, or no validation
    /// context with both an accepted and a rejected logged answer (said as a note).
    fn open(
        settings: &TrainSettings,
        policy: &ChatPolicy,
        dataset: &'p RftDataset,
        observer: &mut dyn Observer,
    ) -> anyhow::Result<Option<Self>> {
        if settings.eval_every == 0 || settings.steps == 0 {
            return Ok(None);
        }
        let validation = dataset.split(Split::Validation);
        let prompts = tokenize_prompts(policy, dataset, &validation)?;
        let menus = HeldOutMenus::new(policy, prompts)?;
        if menus.contexts() == 0 {
            observer.note(&format!(
                "--eval-every: none of the {} validation contexts has both an accepted and a rejected logged answer, so nothing can tell checkpoints apart; keeping the last one",
                validation.len()
            ));
            return Ok(None);
        }
        observer.note(&format!(
            "checkpoint selection: every {} RL steps by held-out {} on {} validation contexts ({} logged answers)",
            settings.eval_every,
            settings.select_by.as_str(),
            menus.contexts(),
            menus.answers()
        ));
        Ok(Some(Self {
            menus,
            every: settings.eval_every,
            warmup: None,
        }))
    }

    /// Scores the policy standing at global step `step` when that is a selection point (RL's
    /// first step, every `every` RL steps, its last), keeping its adapter beside the line.
    /// A point is scored again after a resume or rollback to before it (its line was truncated).
    fn score_if_due(
        &mut self,
        run: &mut RunDir,
        settings: &TrainSettings,
        learner: &Learner,
        step: u64,
        observer: &mut dyn Observer,
    ) -> anyhow::Result<()> {
        let Some(rl_step) = step.checked_sub(settings.sft_steps) else {
            return Ok(());
        };
        if rl_step % self.every != 0 && step != settings.total_steps() {
            return Ok(());
        }
        let started = Instant::now();
        let scores = self
            .menus
            .score(&learner.policy, settings.temperature)
            .with_context(|| format!("scoring the checkpoint of RL step {rl_step}"))?;
        if rl_step == 0 {
            self.warmup = Some(scores.clone());
        } else if self.warmup.is_none() {
            // Resumed after the warm-up's point: its scores are in the metrics.
            let lines = super::run_dir::read_metrics(run.root())?;
            self.warmup = super::metrics::selection_points(&lines)
                .find(|point| point.rl_step == 0)
                .map(|point| point.scored.clone());
        }
        let warmup = self.warmup.as_ref().filter(|_| rl_step > 0);
        let point = SelectionPoint::new(
            step,
            rl_step,
            scores,
            warmup,
            started.elapsed().as_secs_f64(),
        );
        let base = rl_base(settings, run.root());
        run.replace_dir(&eval_point_dir(step), |dir| {
            Ok(save_adapter(
                learner.policy.model.var_store(),
                &adapter_config(settings, &base),
                dir,
            )?)
        })?;
        run.append(&MetricsLine::Selection(point.clone()))?;
        observer.note(&format!(
            "RL step {rl_step}: held-out log-probability margin {:+.3}, menu acceptance {:.3}, pair accuracy {:.3} ({:.1} s)",
            point.logprob_margin, point.menu_acceptance, point.pair_accuracy, point.seconds
        ));
        Ok(())
    }

    /// The run's choice among the points its metrics keep.
    fn choose(&self, run: &RunDir, settings: &TrainSettings) -> anyhow::Result<Option<Choice>> {
        let lines = super::run_dir::read_metrics(run.root())?;
        let points: Vec<&SelectionPoint> = super::metrics::selection_points(&lines).collect();
        Ok(choose(&points, settings.select_by))
    }
}

/// Copies the files of `from` (an adapter directory: flat) into `to`.
fn copy_files(from: &Path, to: &Path) -> anyhow::Result<()> {
    for entry in
        std::fs::read_dir(from).with_context(|| format!("cannot read {}", from.display()))?
    {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name()))
                .with_context(|| format!("cannot copy {}", entry.path().display()))?;
        }
    }
    Ok(())
}

/// Removes every `RUN_DIR/eval-point-*` (the chosen one lives on as the run's adapter).
fn remove_eval_points(root: &Path) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(root)? {
        let entry = entry?;
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with(EVAL_POINT_PREFIX)
        {
            std::fs::remove_dir_all(entry.path())
                .with_context(|| format!("cannot remove {}", entry.path().display()))?;
        }
    }
    Ok(())
}

fn phase_of(settings: &TrainSettings, step: u64) -> Phase {
    if step < settings.sft_steps {
        Phase::Warmup
    } else {
        Phase::Rl
    }
}

/// The data orders of both phases; the salt reshuffles them, so a retried step meets other data.
struct Orders {
    rl: EpochOrder,
    sft: EpochOrder,
}

impl Orders {
    fn new(
        settings: &TrainSettings,
        prompts: &[PromptTokens<'_>],
        examples: &[SftExample],
        salt: u32,
    ) -> Self {
        let seed_of = |stream: Stream| salted_seed(vec![settings.seed, stream as u64], salt);
        Self {
            rl: EpochOrder::new(prompts.len(), seed_of(Stream::RlOrder)),
            sft: EpochOrder::new(examples.len(), seed_of(Stream::SftOrder)),
        }
    }
}

/// The faults an RL step is told to inject ([`FaultHooks`]).
#[derive(Debug, Clone, Copy)]
struct RlFaults {
    /// A NaN loss.
    poison: bool,
    /// Negated advantages.
    invert: bool,
}

/// One RL step: rollouts, the KL guard, the update. On success `state` carries the step's prompt
/// cursor and KL state forward.
fn rl_step(
    learner: &mut Learner,
    context: &RlRolloutContext<'_, '_>,
    order: &mut EpochOrder,
    state: &mut CheckpointState,
    seeds: StepSeeds,
    learning_rate: f64,
    faults: RlFaults,
) -> Result<StepMetrics, StepFailure> {
    let started = Instant::now();
    let settings = context.settings;
    let per_step = settings.prompts_per_step as u64;
    let rl_index = seeds.step - settings.sft_steps;
    let mut cursor = state.prompt_cursor.unwrap_or(rl_index * per_step);
    let mut guard = state
        .guard
        .unwrap_or_else(|| GuardState::start(settings.kl_coef));
    let policy = &learner.policy;
    let mut batch = collect_rl_batch(policy, context, order, &mut cursor, seeds)?;
    if faults.invert {
        batch
            .advantages
            .iter_mut()
            .flatten()
            .for_each(|advantage| *advantage = -*advantage);
    }
    let scored = score_batch(
        &policy.model,
        policy.pad_id,
        &batch,
        settings.temperature,
        settings.minibatches,
    )?;
    // β of this step's update; the guard then adapts it for the next.
    let kl_coef = guard.kl_coef;
    let samples = batch.drawn.len() * settings.n;
    guard
        .observe(scored.kl, samples, settings.kl_control(), settings.max_kl)
        .map_err(StepFailure::Diverged)?;
    let update = policy_update(
        &mut learner.trainer,
        &policy.model,
        settings,
        &batch,
        &scored,
        kl_coef,
        seeds,
        faults.poison,
    )?;
    state.prompt_cursor = Some(cursor);
    state.guard = Some(guard);
    let mut rl = batch
        .figures
        .metrics(context.grader, scored.kl, update.clip_fraction);
    rl.kl_coef = Some(kl_coef);
    rl.kl_average = guard.kl_average;
    rl.optimizer_steps = Some(update.optimizer_steps);
    rl.max_abs_log_ratio = (update.optimizer_steps > 0).then_some(update.max_abs_log_ratio);
    rl.sampler_gap = scored.sampler_gap;
    rl.forbidden_mass = update.forbidden_mass;
    let seconds = started.elapsed().as_secs_f64();
    Ok(StepMetrics {
        step: seeds.step,
        phase: Phase::Rl,
        learning_rate,
        loss: update.loss,
        grad_norm: update.grad_norm,
        updated: update.optimizer_steps > 0,
        tokens: update.tokens,
        rl: Some(rl),
        step_seconds: seconds,
        tokens_per_second: batch.new_tokens as f64 / seconds.max(1e-9),
    })
}

/// Goes back to the newest calm checkpoint at or before the failed `step`
/// ([`GuardState::is_calm`]; later ones are removed): the learning rate halved,
/// the random streams salted, and in RL β raised ([`GuardState::after_rollback`]). Restores
/// `learner` (reopened when the checkpoint is in the other phase) and returns the state to
/// continue from, already checkpointed.
#[expect(
    clippy::too_many_arguments,
    reason = "the loop's state, each piece from a different owner"
)]
fn roll_back(
    run: &mut RunDir,
    settings: &TrainSettings,
    runtime: Runtime,
    learner: &mut Learner,
    state: &CheckpointState,
    step: u64,
    reason: &str,
    observer: &mut dyn Observer,
) -> anyhow::Result<CheckpointState> {
    if state.rollbacks >= settings.max_rollbacks {
        bail!(
            "step {step}: {reason}; giving up after {} rollbacks (--max-rollbacks)",
            state.rollbacks
        );
    }
    let Some((dir, good)) = run.calm_checkpoint_at_or_before(step)? else {
        bail!("step {step}: {reason}; no checkpoint to roll back to");
    };
    run.remove_checkpoints_after(good.step)?;
    if phase_of(settings, good.step) != phase_of(settings, step) {
        *learner = Learner::open(settings, runtime, phase_of(settings, good.step), run)?;
    }
    learner.load_state(&dir)?;
    run.truncate_metrics(good.metrics_lines)?;
    let guard = match phase_of(settings, step) {
        Phase::Rl => Some(
            good.guard
                .unwrap_or_else(|| GuardState::start(settings.kl_coef))
                .after_rollback(),
        ),
        Phase::Warmup => good.guard,
    };
    let rollback = Rollback {
        at_step: step,
        to_step: good.step,
        reason: reason.to_owned(),
        lr_scale: state.lr_scale * 0.5,
        salt: state.salt + 1,
        kl_coef: guard.map(|g| g.kl_coef),
    };
    run.append(&MetricsLine::Rollback(rollback.clone()))?;
    observer.note(&format!(
        "step {step}: {reason}; rolled back to step {} with the learning rate scaled by {}, salt {}{}",
        good.step,
        rollback.lr_scale,
        rollback.salt,
        rollback
            .kl_coef
            .map_or(String::new(), |beta| format!(", KL coefficient {beta}")),
    ));
    let retry = CheckpointState {
        step: good.step,
        lr_scale: rollback.lr_scale,
        rollbacks: state.rollbacks + 1,
        metrics_lines: run.metrics_lines(),
        salt: rollback.salt,
        guard,
        prompt_cursor: good.prompt_cursor,
    };
    run.checkpoint(&retry, |dir| learner.save_state(dir))?;
    Ok(retry)
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
        super::run_dir::absolute(&dir)
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
        // RL scores its samples as they were drawn: at the sampling temperature, with the
        // adapters' dropout off (the sampler's mode), so the policy ratio starts at 1.
        let (temperature, adapter_dropout, forbidden_mass_coef) = match phase {
            Phase::Warmup => (1.0, true, 0.0),
            Phase::Rl => (settings.temperature, false, settings.forbidden_mass_coef),
        };
        let trainer = Trainer::new(
            &policy.model,
            TrainerConfig {
                learning_rate,
                weight_decay: settings.weight_decay,
                max_grad_norm: Some(settings.max_grad_norm),
                gradient_checkpointing: settings.gradient_checkpointing,
                temperature,
                adapter_dropout,
                forbidden_mass_coef,
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
