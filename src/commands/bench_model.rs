//! `arc-rec bench model`: generation tokens/s (batch 1 and k samples), LoRA training-step tokens/s
//! and one RL step (k sampled completions, then a policy-gradient step on them) of our tch model,
//! each next to PyTorch + transformers + peft doing the same work on the same device in the same
//! run (`bench/model_reference.py`), with the ratio. Needs no database.
//!
//! When the reference runs, our side is measured in a child process (this binary again, with
//! `--no-reference --json`): libtorch's CUDA caching allocator keeps what it reserved until the
//! process exits and tch cannot empty it, so a 7B run in this process would leave the reference
//! without room. The child exits before the reference starts, so the two never share the device.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;
use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use trainer::bench_model::{
    GenerationThroughput, RlStepThroughput, RlUpdate, Throughput,
    constrained_generation_throughput, constrained_rl_step_throughput, generation_throughput,
    median, parameter_count, qwen2_5_0_5b_config, qwen2_5_7b_config, random_model, random_prompt,
    rl_step_throughput, run_reference_bench, seed_torch, train_step_throughput_with,
    use_torch_threads,
};
use trainer::device::Runtime;
use trainer::generate::GrammarSchedule;

pub use crate::training::DeviceChoice;
use trainer::model::{CausalLm, Config, LoraConfig};
use trainer::rl_loss::{Aggregation, PolicyLossConfig};

/// The goal of every phase: at least as many tokens/s as PyTorch.
const GOAL_RATIO: f64 = 1.0;
/// Seed of the tiny preset's weights and tokenizer corpus (what `arc-rec model init` writes).
const TINY_SEED: u64 = 1;
/// Outcomes of the synthetic world behind the tiny preset's tokenizer (`model init`'s default).
const TINY_CORPUS_OUTCOMES: usize = 3_000;
/// Above this many parameters `--gradient-checkpointing auto` turns checkpointing on (the
/// reference's own rule: the 7B shape).
const CHECKPOINTING_ABOVE_PARAMETERS: i64 = 1_000_000_000;

/// A phase of the benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Phase {
    /// `generate` at batch 1, greedy.
    #[value(name = "generate_batch1")]
    GenerateBatch1,
    /// `generate` of k samples of one prompt, temperature 1.
    #[value(name = "generate_k")]
    GenerateK,
    /// Forward + backward + AdamW on the LoRA adapters over a random batch.
    #[value(name = "lora_train_step")]
    LoraTrainStep,
    /// k samples, then one policy-gradient step on them.
    #[value(name = "rl_step")]
    RlStep,
    /// `generate` of k samples under the recommendation grammar (`--constrained on`),
    /// temperature 1, each ending where the grammar does: the grammar mask's cost per token,
    /// with the allowed sets beside the forward and, on the same seeds, after it. arc-rec only
    /// (the reference has no grammar).
    #[value(name = "generate_k_constrained")]
    GenerateKConstrained,
    /// The RL step as `train` runs it: k samples under the recommendation grammar (each ending
    /// where the grammar does, at most --new-tokens), the reference's log-probs (adapters off),
    /// then --update-epochs passes of --minibatches clipped-surrogate steps (ε 0.2, ε_high 0.28,
    /// KL β 0.05). arc-rec only.
    #[value(name = "rl_step_constrained")]
    RlStepConstrained,
}

impl Phase {
    /// Every phase, in report order.
    const ALL: [Phase; 6] = [
        Phase::GenerateBatch1,
        Phase::GenerateK,
        Phase::LoraTrainStep,
        Phase::RlStep,
        Phase::GenerateKConstrained,
        Phase::RlStepConstrained,
    ];

    fn name(self) -> &'static str {
        match self {
            Phase::GenerateBatch1 => "generate_batch1",
            Phase::GenerateK => "generate_k",
            Phase::LoraTrainStep => "lora_train_step",
            Phase::RlStep => "rl_step",
            Phase::GenerateKConstrained => "generate_k_constrained",
            Phase::RlStepConstrained => "rl_step_constrained",
        }
    }

    /// Whether the PyTorch reference runs this phase too.
    fn has_reference(self) -> bool {
        !self.needs_grammar()
    }

    /// Whether the phase compiles the recommendation grammar (and so needs a tokenizer).
    fn needs_grammar(self) -> bool {
        matches!(self, Phase::GenerateKConstrained | Phase::RlStepConstrained)
    }
}

/// `--gradient-checkpointing`: recompute each decoder layer in the backward pass of the training
/// phases, on both sides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Checkpointing {
    /// On for models over 1B parameters (the reference's rule).
    Auto,
    /// Always.
    On,
    /// Never.
    Off,
}

/// Models `bench model` can build.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
pub enum ModelShape {
    /// The `tiny` preset (`arc-rec model init --preset tiny`, seed 1), written to a temporary
    /// directory and loaded from there by both sides.
    Tiny,
    /// Qwen2.5-0.5B's shapes with random weights, built on the device (f32 on the CPU, bf16 on
    /// CUDA); each side draws its own weights, which does not change the cost of the work.
    #[value(name = "qwen2.5-0.5b")]
    #[serde(rename = "qwen2.5-0.5b")]
    Qwen2_5_0_5b,
    /// Qwen2.5-7B's shapes with random weights, built on the device (bf16 on CUDA only).
    #[value(name = "qwen2.5-7b")]
    #[serde(rename = "qwen2.5-7b")]
    Qwen2_5_7b,
}

impl ModelShape {
    /// The `--shape` value (and the reference script's).
    fn name(self) -> &'static str {
        match self {
            ModelShape::Tiny => "tiny",
            ModelShape::Qwen2_5_0_5b => "qwen2.5-0.5b",
            ModelShape::Qwen2_5_7b => "qwen2.5-7b",
        }
    }

    /// The config of a random-initialised shape; `None` for the tiny preset (a checkpoint).
    fn random_config(self) -> Option<Config> {
        match self {
            ModelShape::Tiny => None,
            ModelShape::Qwen2_5_0_5b => Some(qwen2_5_0_5b_config()),
            ModelShape::Qwen2_5_7b => Some(qwen2_5_7b_config()),
        }
    }
}

/// Arguments of `arc-rec bench model`.
#[derive(Debug, Args)]
pub struct BenchModelArgs {
    /// Which model to measure.
    #[arg(long, value_enum, default_value_t = ModelShape::Tiny, conflicts_with = "checkpoint")]
    pub shape: ModelShape,
    /// Measure this Hugging Face checkpoint directory instead of a built-in shape (the
    /// reference loads the same directory).
    #[arg(long)]
    pub checkpoint: Option<PathBuf>,
    /// Where to run (CUDA runs bf16, the CPU f32).
    #[arg(long, value_enum, default_value_t = DeviceChoice::Auto)]
    pub device: DeviceChoice,
    /// Prompt length of the generation phases and the RL step [default: 64].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub prompt_tokens: Option<u32>,
    /// New tokens per generated sequence [default: 32 for tiny, 64 for qwen2.5-0.5b, 512 for
    /// qwen2.5-7b].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub new_tokens: Option<u32>,
    /// Samples of the one prompt in the k-sample phase and the RL step (one shared prefill).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    pub samples: u32,
    /// Sequences per training step [default: --samples].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub train_batch: Option<u32>,
    /// Tokens per training sequence of lora_train_step [default: 128 for tiny, prompt + new for
    /// the qwen2.5 shapes].
    #[arg(long, value_parser = clap::value_parser!(u32).range(2..))]
    pub train_seq: Option<u32>,
    /// Timed repetitions of each phase, the median is reported [default: 10 for tiny, whose
    /// phases take tens of milliseconds and jitter with the machine's load; 3 otherwise].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub repeats: Option<u32>,
    /// Untimed repetitions before timing.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub warmup: u32,
    /// Run the PyTorch reference and fail when it cannot run (default: run it, and when it
    /// cannot, report our figures and why the ratios are missing).
    #[arg(long, overrides_with = "no_reference")]
    pub reference: bool,
    /// Measure only arc-rec.
    #[arg(long, overrides_with = "reference")]
    pub no_reference: bool,
    /// Python with torch, transformers and peft [default: $ARC_REC_PYTHON, else .venv/bin/python
    /// of the repository].
    #[arg(long)]
    pub python: Option<PathBuf>,
    /// The reference script [default: bench/model_reference.py of the repository].
    #[arg(long)]
    pub reference_script: Option<PathBuf>,
    /// Torch CPU threads, for both sides [default: libtorch's choice, the physical cores].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub threads: Option<u32>,
    /// Seed of the random prompt, training batch, samples and (qwen2.5 shapes) weights.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Phases to run, comma-separated [default: all of them].
    #[arg(long, value_enum, value_delimiter = ',', num_args = 1..)]
    pub phases: Vec<Phase>,
    /// Recompute each decoder layer in the backward pass of lora_train_step and rl_step, on both
    /// sides (auto: on above 1B parameters, as the reference decides by itself).
    #[arg(long, value_enum, default_value_t = Checkpointing::Auto)]
    pub gradient_checkpointing: Checkpointing,
    /// The tokenizer directory (tokenizer.json, tokenizer_config.json) the
    /// generate_k_constrained phase compiles the recommendation grammar over [default: the
    /// checkpoint's; for the qwen2.5 shapes the tiny preset's, whose 1,024 tokens make the mask
    /// cheaper than Qwen2.5's 151,665 would: pass a Qwen2.5 checkpoint's directory for its cost].
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// rl_step_constrained's passes over each step's samples (μ; `train --update-epochs`).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub update_epochs: u32,
    /// rl_step_constrained's minibatches of samples per pass, one optimizer step each (at most
    /// --samples).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub minibatches: u32,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// The work both sides do.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Settings {
    model: String,
    shape: Option<ModelShape>,
    device: String,
    dtype: String,
    torch_threads: u32,
    prompt_tokens: u32,
    new_tokens: u32,
    samples: u32,
    train_batch: u32,
    train_seq: u32,
    /// The phases run.
    #[serde(default)]
    phases: Vec<String>,
    /// Whether the training phases recompute the decoder layers in the backward pass.
    #[serde(default)]
    gradient_checkpointing: bool,
    lora_r: i64,
    lora_alpha: f64,
    lora_targets: Vec<String>,
    warmup: u32,
    repeats: u32,
    seed: u64,
    parameters: i64,
}

/// One phase of our side.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct PhaseFigures {
    /// Tokens counted per run: new tokens of every sequence, or batch × sequence for training.
    tokens_per_run: i64,
    seconds: Vec<f64>,
    seconds_median: f64,
    tokens_per_s: f64,
    /// `None`: not readable (tch exposes no CUDA allocator statistics).
    peak_memory_bytes: Option<u64>,
}

impl From<&Throughput> for PhaseFigures {
    fn from(throughput: &Throughput) -> Self {
        Self {
            tokens_per_run: throughput.tokens_per_repeat,
            seconds: throughput.seconds.clone(),
            seconds_median: throughput.median_s,
            tokens_per_s: throughput.tokens_per_s,
            peak_memory_bytes: throughput.peak_memory_bytes,
        }
    }
}

/// The RL step of our side: the step's figures (tokens are generated + trained tokens) and how
/// the step divides.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct RlStepFigures {
    #[serde(flatten)]
    step: PhaseFigures,
    /// k × new tokens.
    generated_tokens: i64,
    /// k × (prompt + new tokens): the positions of the training forward and backward.
    trained_tokens: i64,
    generate_seconds: Vec<f64>,
    train_seconds: Vec<f64>,
    generate_seconds_median: f64,
    train_seconds_median: f64,
    gradient_checkpointing: bool,
    /// Every step's loss, warm-up included.
    losses: Vec<f64>,
    /// Every step's gradient norm before clipping, warm-up included.
    grad_norms: Vec<f64>,
}

impl From<&RlStepThroughput> for RlStepFigures {
    fn from(report: &RlStepThroughput) -> Self {
        Self {
            step: (&report.throughput).into(),
            generated_tokens: report.generated_tokens,
            trained_tokens: report.trained_tokens,
            generate_seconds_median: median(&report.generate_seconds),
            train_seconds_median: median(&report.train_seconds),
            generate_seconds: report.generate_seconds.clone(),
            train_seconds: report.train_seconds.clone(),
            gradient_checkpointing: report.gradient_checkpointing,
            losses: report.losses.clone(),
            grad_norms: report.grad_norms.clone(),
        }
    }
}

/// The constrained generation phase: its throughput and the grammar's share of it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ConstrainedFigures {
    #[serde(flatten)]
    generation: PhaseFigures,
    /// The grammar's host seconds in every timed run that the decode loop spent on it (its
    /// allowed sets computed beside the forward, so only what outlasted the forward counts).
    mask_seconds: Vec<f64>,
    /// New tokens of every timed run (each run draws its own samples).
    #[serde(default)]
    tokens: Vec<i64>,
    /// The grammar's median share of a run's wall time.
    mask_share: f64,
    /// The grammar's milliseconds per generated token over the timed runs.
    mask_ms_per_token: f64,
    /// Milliseconds per generated token of grammar work hidden beside the forward.
    #[serde(default)]
    beside_forward_ms_per_token: f64,
    /// The same runs (same seeds) with the allowed sets computed after the forward instead.
    #[serde(default)]
    after_forward: Option<AfterForwardFigures>,
    /// Which of the two generation uses by default here (`GrammarSchedule::Auto`):
    /// `beside_forward` or `after_forward`.
    #[serde(default)]
    default_schedule: String,
    /// Samples that completed the grammar (ended on a stop token) rather than hit the limit.
    completed: usize,
    /// The tokenizer the grammar was compiled over, and its vocabulary.
    tokenizer: String,
    tokenizer_vocab: usize,
}

/// Constrained generation with the grammar's allowed sets computed after each forward, on the
/// decode loop's thread: what computing them beside the forward is measured against.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct AfterForwardFigures {
    #[serde(flatten)]
    generation: PhaseFigures,
    mask_seconds: Vec<f64>,
    tokens: Vec<i64>,
    mask_share: f64,
    mask_ms_per_token: f64,
}

/// The RL step with the training update: its figures (tokens are generated + every pass's
/// trained positions, see `ConstrainedRlStep`), its parts and what the update saw.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ConstrainedRlStepFigures {
    #[serde(flatten)]
    step: PhaseFigures,
    update_epochs: usize,
    minibatches: usize,
    optimizer_steps: usize,
    /// Per timed step: tokens sampled, and prompt + completion positions of one pass.
    generated_tokens: Vec<i64>,
    trained_tokens: Vec<i64>,
    generate_seconds_median: f64,
    reference_seconds_median: f64,
    update_seconds_median: f64,
    /// The grammar's median share of a step's generation time.
    mask_share_of_generation: f64,
    /// Samples of the timed steps that completed the grammar.
    completed: usize,
    gradient_checkpointing: bool,
    /// Per step, warm-up included.
    losses: Vec<f64>,
    clip_fractions: Vec<f64>,
    first_max_abs_log_ratios: Vec<f64>,
    /// Below f32, per step: the sampler-vs-trainer |Δ log p| the update removed.
    #[serde(default)]
    sampler_gaps: Vec<f64>,
    tokenizer: String,
    tokenizer_vocab: usize,
}

/// Our phases; a phase not run (`--phases`) is `null`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct OurFigures {
    generate_batch1: Option<PhaseFigures>,
    generate_k: Option<PhaseFigures>,
    lora_train_step: Option<PhaseFigures>,
    #[serde(default)]
    rl_step: Option<RlStepFigures>,
    #[serde(default)]
    generate_k_constrained: Option<ConstrainedFigures>,
    #[serde(default)]
    rl_step_constrained: Option<ConstrainedRlStepFigures>,
    /// Values AdamW updates in the training phases.
    trainable_parameters: Option<i64>,
    /// lora_train_step's losses.
    train_losses: Vec<f64>,
}

impl OurFigures {
    fn phase(&self, name: &str) -> Option<&PhaseFigures> {
        match name {
            "generate_batch1" => self.generate_batch1.as_ref(),
            "generate_k" => self.generate_k.as_ref(),
            "lora_train_step" => self.lora_train_step.as_ref(),
            "rl_step" => self.rl_step.as_ref().map(|rl| &rl.step),
            "generate_k_constrained" => self
                .generate_k_constrained
                .as_ref()
                .map(|constrained| &constrained.generation),
            "rl_step_constrained" => self.rl_step_constrained.as_ref().map(|rl| &rl.step),
            _ => None,
        }
    }
}

/// One row of the comparison.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Comparison {
    phase: String,
    arc_rec_tokens_per_s: f64,
    reference_tokens_per_s: f64,
    /// Median seconds per run (per step for the training phases and the RL step).
    arc_rec_seconds: f64,
    reference_seconds: f64,
    /// arc-rec / PyTorch tokens/s.
    ratio: f64,
    goal: f64,
    meets_goal: bool,
}

/// What `--json` prints.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Report {
    settings: Settings,
    arc_rec: OurFigures,
    /// The reference script's JSON object, as it printed it.
    reference: Option<Value>,
    /// Why the reference is missing, when it is.
    reference_error: Option<String>,
    comparison: Vec<Comparison>,
}

/// The sizes after defaults.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    prompt_tokens: u32,
    new_tokens: u32,
    samples: u32,
    train_batch: u32,
    train_seq: u32,
    repeats: u32,
}

impl Sizes {
    fn resolve(args: &BenchModelArgs) -> Self {
        let shape = if args.checkpoint.is_none() {
            args.shape
        } else {
            ModelShape::Tiny
        };
        let large = shape != ModelShape::Tiny;
        let prompt_tokens = args.prompt_tokens.unwrap_or(64);
        let new_tokens = args.new_tokens.unwrap_or(match shape {
            ModelShape::Tiny => 32,
            ModelShape::Qwen2_5_0_5b => 64,
            ModelShape::Qwen2_5_7b => 512,
        });
        Self {
            prompt_tokens,
            new_tokens,
            samples: args.samples,
            train_batch: args.train_batch.unwrap_or(args.samples),
            train_seq: args.train_seq.unwrap_or(if large {
                prompt_tokens + new_tokens
            } else {
                128
            }),
            repeats: args.repeats.unwrap_or(if large { 3 } else { 10 }),
        }
    }
}

/// The phases `--phases` names, in report order (all of them when it names none).
fn selected_phases(args: &BenchModelArgs) -> Vec<Phase> {
    Phase::ALL
        .into_iter()
        .filter(|phase| args.phases.is_empty() || args.phases.contains(phase))
        .collect()
}

/// Whether the training phases checkpoint, for a model of `parameters` values.
fn checkpointing_for(choice: Checkpointing, parameters: i64) -> bool {
    match choice {
        Checkpointing::On => true,
        Checkpointing::Off => false,
        Checkpointing::Auto => parameters > CHECKPOINTING_ABOVE_PARAMETERS,
    }
}

/// Runs `arc-rec bench model`.
pub fn run(args: &BenchModelArgs) -> anyhow::Result<()> {
    let threads = use_torch_threads(args.threads);
    let runtime = Runtime::select(args.device.request())?;
    if args.checkpoint.is_none()
        && args.shape == ModelShape::Qwen2_5_7b
        && !runtime.device.is_cuda()
    {
        anyhow::bail!(
            "refusing qwen2.5-7b on the CPU: its 7.6 billion parameters are 30 GB in f32 and every phase would take hours; run it on a CUDA machine (--device cuda), or use --shape tiny here"
        );
    }
    let sizes = Sizes::resolve(args);
    let phases = selected_phases(args);
    let reference_phases = phases.iter().any(|phase| phase.has_reference());
    let reference_wanted = !args.no_reference && reference_phases;

    // The tiny preset lives in a temporary directory both sides load.
    let scratch = tempfile::tempdir().context("cannot create a scratch directory")?;
    let checkpoint = match (&args.checkpoint, args.shape) {
        (Some(dir), _) => Some(dir.clone()),
        (None, ModelShape::Tiny) => Some(write_tiny_preset(&scratch.path().join("tiny"))?),
        (None, _) => None,
    };
    // The grammar of generate_k_constrained needs a tokenizer; the random shapes have none.
    let tokenizer = match (&args.tokenizer, &checkpoint) {
        _ if !phases.iter().any(|phase| phase.needs_grammar()) => None,
        (Some(dir), _) => Some(dir.clone()),
        (None, Some(dir)) => Some(dir.clone()),
        (None, None) => Some(write_tiny_preset(&scratch.path().join("tiny-tokenizer"))?),
    };
    let sources = Sources {
        checkpoint: checkpoint.as_deref(),
        tokenizer: tokenizer.as_deref(),
    };

    let (mut settings, mut ours) = if reference_wanted {
        measure_in_child(args, runtime, threads, sizes, sources)?
    } else {
        measure_here(args, runtime, threads, sizes, sources)?
    };
    // The measuring code saw a directory; name the preset instead of a temporary path.
    if args.checkpoint.is_none() {
        settings.shape = Some(args.shape);
        if args.shape == ModelShape::Tiny {
            settings.model = format!("tiny preset, seed {TINY_SEED}");
        }
        if args.tokenizer.is_none() {
            let preset = format!("the tiny preset's (seed {TINY_SEED})");
            if let Some(constrained) = &mut ours.generate_k_constrained {
                constrained.tokenizer.clone_from(&preset);
            }
            if let Some(rl) = &mut ours.rl_step_constrained {
                rl.tokenizer = preset;
            }
        }
    }

    let (reference, reference_error) = if reference_wanted {
        match run_reference(args, &settings, runtime, checkpoint.as_deref()) {
            Ok(value) => (Some(value), None),
            Err(err) => (None, Some(format!("{err:#}"))),
        }
    } else if args.no_reference {
        (None, Some("not run (--no-reference)".to_owned()))
    } else {
        (
            None,
            Some("not run: none of the phases asked for has a PyTorch counterpart".to_owned()),
        )
    };
    let comparison = match &reference {
        Some(reference) => compare(&settings, &ours, reference)?,
        None => Vec::new(),
    };
    let report = Report {
        settings,
        arc_rec: ours,
        reference,
        reference_error,
        comparison,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report);
    }
    if args.reference
        && let Some(reason) = &report.reference_error
    {
        anyhow::bail!("--reference was asked for but the PyTorch reference did not run: {reason}");
    }
    Ok(())
}

/// Writes the tiny preset (what `arc-rec model init --preset tiny` writes) into `dir`.
fn write_tiny_preset(dir: &Path) -> anyhow::Result<PathBuf> {
    progress("writing the tiny preset");
    let corpus = crate::export::tokenizer_corpus::tokenizer_corpus(TINY_SEED, TINY_CORPUS_OUTCOMES)?;
    trainer::preset::write_tiny_checkpoint(dir, TINY_SEED, &corpus)
        .with_context(|| format!("cannot write the tiny preset to {}", dir.display()))?;
    Ok(dir.to_owned())
}

fn progress(message: &str) {
    eprintln!("bench model: {message}");
}

/// Where the measured model and the constrained phase's tokenizer come from.
#[derive(Debug, Clone, Copy)]
struct Sources<'a> {
    /// The checkpoint to load; `None` for a random shape.
    checkpoint: Option<&'a Path>,
    /// The tokenizer directory of generate_k_constrained (when it runs).
    tokenizer: Option<&'a Path>,
}

/// Measures our phases in this process.
fn measure_here(
    args: &BenchModelArgs,
    runtime: Runtime,
    threads: u32,
    sizes: Sizes,
    sources: Sources<'_>,
) -> anyhow::Result<(Settings, OurFigures)> {
    let checkpoint = sources.checkpoint;
    let lora = LoraConfig::default();
    seed_torch(args.seed);
    let (model, name) = match checkpoint {
        Some(dir) => {
            progress(&format!("loading {}", dir.display()));
            let (mut model, _) = CausalLm::from_pretrained(dir, runtime)
                .with_context(|| format!("cannot load the checkpoint {}", dir.display()))?;
            model.attach_lora(&lora)?;
            (model, dir.display().to_string())
        }
        None => {
            let shape = args.shape.name();
            let config = args
                .shape
                .random_config()
                .with_context(|| format!("the {shape} shape is a checkpoint, not random"))?;
            progress(&format!("building {shape} with random weights"));
            // 0.02: Qwen2.5's initializer_range, what transformers draws a fresh model with.
            let model = random_model(config, runtime, 0.02, Some(&lora))?;
            (model, format!("random {shape}"))
        }
    };
    let config = model.config();
    let parameters = parameter_count(config);
    let checkpointing = checkpointing_for(args.gradient_checkpointing, parameters);
    let phases = selected_phases(args);
    let prompt = random_prompt(config.vocab_size, sizes.prompt_tokens as usize, args.seed)?;
    let (warmup, repeats) = (args.warmup as usize, sizes.repeats as usize);
    let generate = |sequences: u32, sampled: bool| -> anyhow::Result<GenerationThroughput> {
        Ok(generation_throughput(
            &model,
            &prompt,
            sequences as usize,
            sizes.new_tokens as usize,
            sampled,
            warmup,
            repeats,
        )?)
    };
    let mut figures = OurFigures {
        generate_batch1: None,
        generate_k: None,
        lora_train_step: None,
        rl_step: None,
        generate_k_constrained: None,
        rl_step_constrained: None,
        trainable_parameters: None,
        train_losses: Vec::new(),
    };
    for &phase in &phases {
        match phase {
            Phase::GenerateBatch1 => {
                progress("generating at batch 1 (greedy)");
                figures.generate_batch1 = Some((&generate(1, false)?.throughput).into());
            }
            Phase::GenerateK => {
                progress(&format!(
                    "generating k={} samples (temperature 1)",
                    sizes.samples
                ));
                figures.generate_k = Some((&generate(sizes.samples, true)?.throughput).into());
            }
            Phase::LoraTrainStep => {
                progress(&format!(
                    "LoRA training steps on {} × {} tokens",
                    sizes.train_batch, sizes.train_seq
                ));
                let train = train_step_throughput_with(
                    &model,
                    i64::from(sizes.train_batch),
                    i64::from(sizes.train_seq),
                    repeats,
                    warmup,
                    checkpointing,
                )?;
                figures.lora_train_step = Some((&train.throughput).into());
                figures.trainable_parameters = Some(train.trainable_parameters);
                figures.train_losses = train.losses;
            }
            Phase::RlStep => {
                progress(&format!(
                    "RL steps: k={} × {} sampled tokens, then a policy-gradient step",
                    sizes.samples, sizes.new_tokens
                ));
                let rl = rl_step_throughput(
                    &model,
                    &prompt,
                    sizes.samples as usize,
                    sizes.new_tokens as usize,
                    checkpointing,
                    warmup,
                    repeats,
                    args.seed,
                )?;
                figures.rl_step = Some((&rl).into());
                figures.trainable_parameters = Some(rl.trainable_parameters);
            }
            Phase::GenerateKConstrained => {
                let dir = grammar_tokenizer(sources, phase)?;
                let grammar = recommendation_grammar(&model, dir)?;
                progress(&format!(
                    "generating k={} samples under the recommendation grammar (tokenizer {})",
                    sizes.samples,
                    dir.display()
                ));
                figures.generate_k_constrained = Some(constrained_k(
                    &model, &prompt, &grammar, dir, sizes, warmup, repeats, args.seed,
                )?);
            }
            Phase::RlStepConstrained => {
                let dir = grammar_tokenizer(sources, phase)?;
                let grammar = recommendation_grammar(&model, dir)?;
                let update = RlUpdate {
                    epochs: args.update_epochs as usize,
                    minibatches: args.minibatches as usize,
                    loss: PolicyLossConfig {
                        clip_epsilon: Some(0.2),
                        clip_epsilon_high: Some(0.28),
                        kl_coef: 0.05,
                        aggregation: Aggregation::Sequence,
                    },
                };
                progress(&format!(
                    "RL steps: k={} samples under the recommendation grammar (≤ {} tokens), then {} passes × {} minibatches of clipped-surrogate steps",
                    sizes.samples, sizes.new_tokens, update.epochs, update.minibatches
                ));
                let rl = constrained_rl_step_throughput(
                    &model,
                    &prompt,
                    sizes.samples as usize,
                    sizes.new_tokens as usize,
                    &grammar,
                    update,
                    checkpointing,
                    warmup,
                    repeats,
                    args.seed,
                )?;
                figures.trainable_parameters = Some(rl.trainable_parameters);
                figures.rl_step_constrained = Some(ConstrainedRlStepFigures {
                    step: (&rl.throughput).into(),
                    update_epochs: update.epochs,
                    minibatches: update.minibatches,
                    optimizer_steps: rl.optimizer_steps,
                    generate_seconds_median: median(&rl.generate_seconds),
                    reference_seconds_median: median(&rl.reference_seconds),
                    update_seconds_median: median(&rl.update_seconds),
                    mask_share_of_generation: median(
                        &rl.mask_seconds
                            .iter()
                            .zip(&rl.generate_seconds)
                            .map(|(mask, total)| mask / total)
                            .collect::<Vec<_>>(),
                    ),
                    completed: rl.completed,
                    gradient_checkpointing: rl.gradient_checkpointing,
                    generated_tokens: rl.generated_tokens,
                    trained_tokens: rl.trained_tokens,
                    losses: rl.losses,
                    clip_fractions: rl.clip_fractions,
                    first_max_abs_log_ratios: rl.first_max_abs_log_ratios,
                    sampler_gaps: rl.sampler_gaps,
                    tokenizer: dir.display().to_string(),
                    tokenizer_vocab: grammar.tokenizer_vocab_size(),
                });
            }
        }
    }
    let settings = Settings {
        model: name,
        shape: args.checkpoint.is_none().then_some(args.shape),
        device: format!("{:?}", runtime.device).to_lowercase(),
        dtype: match format!("{:?}", runtime.kind).as_str() {
            "Float" => "f32".to_owned(),
            "BFloat16" => "bf16".to_owned(),
            other => other.to_lowercase(),
        },
        torch_threads: threads,
        prompt_tokens: sizes.prompt_tokens,
        new_tokens: sizes.new_tokens,
        samples: sizes.samples,
        train_batch: sizes.train_batch,
        train_seq: sizes.train_seq,
        phases: phases.iter().map(|phase| phase.name().to_owned()).collect(),
        gradient_checkpointing: checkpointing,
        lora_r: lora.r,
        lora_alpha: lora.alpha,
        lora_targets: lora.target_modules.clone(),
        warmup: args.warmup,
        repeats: sizes.repeats,
        seed: args.seed,
        parameters,
    };
    Ok((settings, figures))
}

/// The tokenizer directory a grammar phase compiles over.
fn grammar_tokenizer(sources: Sources<'_>, phase: Phase) -> anyhow::Result<&Path> {
    sources
        .tokenizer
        .with_context(|| format!("{} needs a tokenizer directory (--tokenizer)", phase.name()))
}

/// The recommendation grammar over the tokenizer in `dir`, masks as wide as `model`'s vocabulary.
fn recommendation_grammar(
    model: &CausalLm,
    dir: &Path,
) -> anyhow::Result<trainer::grammar::Grammar> {
    let tokenizer = trainer::tokenizer::Tokenizer::from_dir(dir)
        .with_context(|| format!("--tokenizer {}: cannot read its tokenizer", dir.display()))?;
    let vocab_size = usize::try_from(model.config().vocab_size)?;
    trainer::grammar::Grammar::over_tokenizer(
        &tokenizer,
        &crate::rft::schema::recommendation_schema(),
        vocab_size,
    )
    .with_context(|| {
        format!(
            "--tokenizer {}: cannot compile the recommendation grammar over it",
            dir.display()
        )
    })
}

/// The generate_k_constrained phase: k samples of `prompt` under `grammar` (compiled over the
/// tokenizer in `dir`).
#[expect(
    clippy::too_many_arguments,
    reason = "the phase's inputs, as the other phases take them"
)]
fn constrained_k(
    model: &CausalLm,
    prompt: &[i64],
    grammar: &trainer::grammar::Grammar,
    dir: &Path,
    sizes: Sizes,
    warmup: usize,
    repeats: usize,
    seed: u64,
) -> anyhow::Result<ConstrainedFigures> {
    let measure = |schedule| {
        constrained_generation_throughput(
            model,
            prompt,
            sizes.samples as usize,
            sizes.new_tokens as usize,
            grammar,
            warmup,
            repeats,
            seed,
            schedule,
        )
    };
    let run = measure(GrammarSchedule::BesideForward)?;
    let after = measure(GrammarSchedule::AfterForward)?;
    Ok(ConstrainedFigures {
        generation: (&run.throughput).into(),
        mask_share: run.mask_share(),
        mask_ms_per_token: run.mask_ms_per_token(),
        beside_forward_ms_per_token: run.beside_forward_ms_per_token(),
        after_forward: Some(AfterForwardFigures {
            generation: (&after.throughput).into(),
            mask_share: after.mask_share(),
            mask_ms_per_token: after.mask_ms_per_token(),
            mask_seconds: after.mask_seconds,
            tokens: after.tokens,
        }),
        default_schedule: match GrammarSchedule::Auto.resolve(model.runtime().device) {
            GrammarSchedule::AfterForward => "after_forward",
            _ => "beside_forward",
        }
        .to_owned(),
        mask_seconds: run.mask_seconds,
        tokens: run.tokens,
        completed: run.completed,
        tokenizer: dir.display().to_string(),
        tokenizer_vocab: grammar.tokenizer_vocab_size(),
    })
}

/// Measures our side in a child process (see the module docs) and reads back its JSON.
fn measure_in_child(
    args: &BenchModelArgs,
    runtime: Runtime,
    threads: u32,
    sizes: Sizes,
    sources: Sources<'_>,
) -> anyhow::Result<(Settings, OurFigures)> {
    let exe = std::env::current_exe().context("cannot find this executable to re-run it")?;
    let mut command = Command::new(&exe);
    command.args(["bench", "model", "--no-reference", "--json"]);
    match sources.checkpoint {
        Some(dir) => command.arg("--checkpoint").arg(dir),
        None => command.args(["--shape", args.shape.name()]),
    };
    if let Some(dir) = sources.tokenizer {
        command.arg("--tokenizer").arg(dir);
    }
    let phases: Vec<&str> = selected_phases(args).into_iter().map(Phase::name).collect();
    command.arg("--phases").arg(phases.join(","));
    command.args([
        "--gradient-checkpointing",
        match args.gradient_checkpointing {
            Checkpointing::Auto => "auto",
            Checkpointing::On => "on",
            Checkpointing::Off => "off",
        },
    ]);
    let device = device_flag(runtime);
    let numbers = [
        ("--prompt-tokens", u64::from(sizes.prompt_tokens)),
        ("--new-tokens", u64::from(sizes.new_tokens)),
        ("--samples", u64::from(sizes.samples)),
        ("--train-batch", u64::from(sizes.train_batch)),
        ("--train-seq", u64::from(sizes.train_seq)),
        ("--repeats", u64::from(sizes.repeats)),
        ("--warmup", u64::from(args.warmup)),
        ("--threads", u64::from(threads)),
        ("--seed", args.seed),
        ("--update-epochs", u64::from(args.update_epochs)),
        ("--minibatches", u64::from(args.minibatches)),
    ];
    command.args(["--device", device]);
    for (flag, value) in numbers {
        command.arg(flag).arg(value.to_string());
    }
    // Progress goes straight to our stderr; stdout is the JSON report.
    let output = command
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("cannot run {}", exe.display()))?;
    anyhow::ensure!(
        output.status.success(),
        "measuring arc-rec in a child process failed ({})",
        output.status
    );
    let report: Report = serde_json::from_slice(&output.stdout)
        .context("the child process printed no report JSON")?;
    Ok((report.settings, report.arc_rec))
}

/// The interpreter: `--python`, else $ARC_REC_PYTHON, else the repository's `.venv`.
fn python_path(args: &BenchModelArgs) -> PathBuf {
    if let Some(python) = &args.python {
        return python.clone();
    }
    if let Some(python) = std::env::var_os("ARC_REC_PYTHON") {
        return PathBuf::from(python);
    }
    repository_file(".venv/bin/python")
}

/// `relative` under the working directory when it exists there (a checkout the binary was
/// copied into), else under the source tree this binary was built from.
fn repository_file(relative: &str) -> PathBuf {
    let here = Path::new(relative);
    if here.exists() {
        return here.to_path_buf();
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

/// Runs `bench/model_reference.py` on the same model, device, sizes and thread count.
fn run_reference(
    args: &BenchModelArgs,
    settings: &Settings,
    runtime: Runtime,
    checkpoint: Option<&Path>,
) -> anyhow::Result<Value> {
    let python = python_path(args);
    let script = args
        .reference_script
        .clone()
        .unwrap_or_else(|| repository_file("bench/model_reference.py"));
    anyhow::ensure!(
        python.exists(),
        "no python at {} (pass --python or set ARC_REC_PYTHON)",
        python.display()
    );
    anyhow::ensure!(
        script.exists(),
        "no reference script at {} (pass --reference-script)",
        script.display()
    );
    let mut owned: Vec<String> = Vec::new();
    match checkpoint {
        Some(dir) => {
            owned.push("--checkpoint".into());
            owned.push(dir.display().to_string());
        }
        None => {
            let shape = settings
                .shape
                .context("a random-initialised model without a shape")?;
            owned.push("--shape".into());
            owned.push(shape.name().into());
        }
    }
    // Decided once, on our side, so both do the same work.
    owned.push("--gradient-checkpointing".into());
    owned.push(
        if settings.gradient_checkpointing {
            "on"
        } else {
            "off"
        }
        .into(),
    );
    // Only the phases it has; the others are ours alone.
    let phases: Vec<&str> = Phase::ALL
        .into_iter()
        .filter(|phase| phase.has_reference())
        .map(Phase::name)
        .filter(|name| settings.phases.iter().any(|run| run == name))
        .collect();
    owned.push("--phases".into());
    owned.push(phases.join(","));
    let device = device_flag(runtime);
    let numbers = [
        ("--prompt-len", u64::from(settings.prompt_tokens)),
        ("--new-tokens", u64::from(settings.new_tokens)),
        ("--k", u64::from(settings.samples)),
        ("--train-batch", u64::from(settings.train_batch)),
        ("--train-len", u64::from(settings.train_seq)),
        ("--lora-r", settings.lora_r.unsigned_abs()),
        ("--warmup", u64::from(settings.warmup)),
        ("--repeats", u64::from(settings.repeats)),
        ("--threads", u64::from(settings.torch_threads)),
        ("--seed", settings.seed),
    ];
    owned.push("--device".into());
    owned.push(device.into());
    owned.push("--lora-alpha".into());
    owned.push(settings.lora_alpha.to_string());
    for (flag, value) in numbers {
        owned.push(flag.into());
        owned.push(value.to_string());
    }
    let borrowed: Vec<&str> = owned.iter().map(String::as_str).collect();
    progress(&format!(
        "running the PyTorch reference: {} {} {}",
        python.display(),
        script.display(),
        owned.join(" ")
    ));
    Ok(run_reference_bench(&python, &script, &borrowed)?)
}

/// Ratios per phase run; the token counts (and, for the training phases, gradient checkpointing)
/// of both sides must agree, or the comparison is not of the same work.
fn compare(
    settings: &Settings,
    ours: &OurFigures,
    reference: &Value,
) -> anyhow::Result<Vec<Comparison>> {
    Phase::ALL
        .iter()
        .filter(|phase| phase.has_reference())
        .map(|phase| phase.name())
        .filter(|phase| settings.phases.iter().any(|run| run == phase))
        .map(|phase| {
            let mine = ours
                .phase(phase)
                .with_context(|| format!("no arc-rec figures for {phase}"))?;
            let theirs = reference
                .get(phase)
                .with_context(|| format!("the reference reported no {phase}"))?;
            let training = matches!(phase, "lora_train_step" | "rl_step");
            let count_field = if training {
                "tokens_per_step"
            } else {
                "tokens_per_run"
            };
            if training {
                let their_checkpointing = theirs
                    .get("gradient_checkpointing")
                    .and_then(Value::as_bool);
                anyhow::ensure!(
                    their_checkpointing == Some(settings.gradient_checkpointing),
                    "{phase}: the reference ran gradient checkpointing {their_checkpointing:?}, arc-rec {}; not the same work",
                    settings.gradient_checkpointing
                );
            }
            let their_tokens = theirs.get(count_field).and_then(Value::as_i64);
            anyhow::ensure!(
                their_tokens == Some(mine.tokens_per_run),
                "{phase}: the reference counted {their_tokens:?} tokens per run, arc-rec {}; not the same work",
                mine.tokens_per_run
            );
            let reference_tokens_per_s = theirs
                .get("tokens_per_s")
                .and_then(Value::as_f64)
                .filter(|rate| *rate > 0.0)
                .with_context(|| format!("{phase}: the reference has no positive tokens_per_s"))?;
            let ratio = mine.tokens_per_s / reference_tokens_per_s;
            Ok(Comparison {
                phase: phase.to_owned(),
                arc_rec_tokens_per_s: mine.tokens_per_s,
                reference_tokens_per_s,
                arc_rec_seconds: mine.seconds_median,
                reference_seconds: theirs
                    .get("seconds_median")
                    .and_then(Value::as_f64)
                    .unwrap_or(f64::NAN),
                ratio,
                goal: GOAL_RATIO,
                meets_goal: ratio >= GOAL_RATIO,
            })
        })
        .collect()
}

fn gib(bytes: Option<u64>) -> String {
    bytes.map_or_else(
        || "n/a".to_owned(),
        |bytes| format!("{:.2} GiB", bytes as f64 / f64::from(1u32 << 30)),
    )
}

fn print_table(report: &Report) {
    let settings = &report.settings;
    println!(
        "model: {} ({:.2}M parameters) on {} ({}), {} torch CPU threads on both sides",
        settings.model,
        settings.parameters as f64 / 1e6,
        settings.device,
        settings.dtype,
        settings.torch_threads
    );
    println!(
        "work: prompt {} tokens, {} new tokens per sequence, k={} samples; training {} × {} tokens; RL step = k samples + a policy-gradient step on them (tokens: generated k·new + trained k·(prompt+new)); LoRA r={} alpha={} on {}; gradient checkpointing {}; median of {} after {} warm-up",
        settings.prompt_tokens,
        settings.new_tokens,
        settings.samples,
        settings.train_batch,
        settings.train_seq,
        settings.lora_r,
        settings.lora_alpha,
        settings.lora_targets.join(","),
        if settings.gradient_checkpointing {
            "on"
        } else {
            "off"
        },
        settings.repeats,
        settings.warmup
    );
    println!(
        "{:<22} {:>12} {:>12} {:>16} {:>16} {:>8}  goal",
        "phase", "arc-rec s", "PyTorch s", "arc-rec tok/s", "PyTorch tok/s", "ratio"
    );
    for which in Phase::ALL {
        let phase = which.name();
        let Some(mine) = report.arc_rec.phase(phase) else {
            continue;
        };
        match report.comparison.iter().find(|row| row.phase == phase) {
            Some(row) => println!(
                "{phase:<22} {:>12.4} {:>12.4} {:>16.1} {:>16.1} {:>7.2}×  ≥ {:.1}× {}",
                mine.seconds_median,
                row.reference_seconds,
                row.arc_rec_tokens_per_s,
                row.reference_tokens_per_s,
                row.ratio,
                row.goal,
                if row.meets_goal { "met" } else { "NOT met" }
            ),
            None => println!(
                "{phase:<22} {:>12.4} {:>12} {:>16.1} {:>16} {:>8}  {}",
                mine.seconds_median,
                "-",
                mine.tokens_per_s,
                "-",
                "-",
                if which.has_reference() {
                    format!("≥ {GOAL_RATIO:.1}×")
                } else {
                    "(no reference; mask share below)".to_owned()
                }
            ),
        }
    }
    if let Some(rl) = &report.arc_rec.rl_step {
        let theirs = report.reference.as_ref().and_then(|reference| {
            let part = |name: &str| {
                reference
                    .pointer(&format!("/rl_step/{name}_seconds_median"))
                    .and_then(Value::as_f64)
            };
            Some((part("generate")?, part("train")?))
        });
        println!(
            "rl_step parts (median s): arc-rec generate {:.4} + train {:.4}; PyTorch {}",
            rl.generate_seconds_median,
            rl.train_seconds_median,
            theirs.map_or_else(
                || "-".to_owned(),
                |(generate, train)| format!("generate {generate:.4} + train {train:.4}")
            )
        );
    }
    if let Some(constrained) = &report.arc_rec.generate_k_constrained {
        let free = report.arc_rec.generate_k.as_ref().map_or_else(
            || "-".to_owned(),
            |free| {
                format!(
                    "{:.4}",
                    1e3 * free.seconds_median / free.tokens_per_run as f64
                )
            },
        );
        let per_token = 1e3 / constrained.generation.tokens_per_s;
        let after = constrained.after_forward.as_ref().map_or_else(
            || "-".to_owned(),
            |after| {
                format!(
                    "{:.4} ms per token with the grammar after the forward ({:.4} ms, {:.1}% of it)",
                    1e3 / after.generation.tokens_per_s,
                    after.mask_ms_per_token,
                    100.0 * after.mask_share,
                )
            },
        );
        println!(
            "generate_k_constrained: with the grammar beside the forward it cost the decode loop {:.4} ms per token, {:.1}% of generation time (goal < 10%), {:.4} ms more ran beside the forward; {per_token:.4} ms per token constrained, {after}, {free} unconstrained (generate_k); the default here: {}; {} of {} samples completed the grammar; tokenizer {} ({} tokens)",
            constrained.mask_ms_per_token,
            100.0 * constrained.mask_share,
            constrained.beside_forward_ms_per_token,
            constrained.default_schedule,
            constrained.completed,
            settings.samples as usize * constrained.mask_seconds.len(),
            constrained.tokenizer,
            constrained.tokenizer_vocab,
        );
    }
    if let Some(rl) = &report.arc_rec.rl_step_constrained {
        let mean = |values: &[i64]| values.iter().sum::<i64>() as f64 / values.len().max(1) as f64;
        println!(
            "rl_step_constrained (median s): generate {:.4} (grammar {:.1}% of it) + reference {:.4} + update {:.4} ({} passes × {} minibatches = {} optimizer steps); mean {:.0} sampled and {:.0} trained tokens a step; {} of {} samples completed the grammar; first-minibatch |log ρ| ≤ {:.2e}{}; tokenizer {} ({} tokens)",
            rl.generate_seconds_median,
            100.0 * rl.mask_share_of_generation,
            rl.reference_seconds_median,
            rl.update_seconds_median,
            rl.update_epochs,
            rl.minibatches,
            rl.optimizer_steps,
            mean(&rl.generated_tokens),
            mean(&rl.trained_tokens),
            rl.completed,
            u64::from(settings.samples) * rl.generated_tokens.len() as u64,
            rl.first_max_abs_log_ratios
                .iter()
                .copied()
                .fold(0.0, f64::max),
            if rl.sampler_gaps.is_empty() {
                String::new()
            } else {
                format!(
                    " (sampler vs trainer |Δ log p| ≤ {:.2e}, replaced by the trainer's)",
                    rl.sampler_gaps.iter().copied().fold(0.0, f64::max)
                )
            },
            rl.tokenizer,
            rl.tokenizer_vocab,
        );
    }
    let our_peak = Phase::ALL
        .iter()
        .filter_map(|phase| report.arc_rec.phase(phase.name()))
        .filter_map(|figures| figures.peak_memory_bytes)
        .max();
    let their_peak = report
        .reference
        .as_ref()
        .and_then(|reference| reference.get("max_memory_allocated_bytes"))
        .and_then(Value::as_u64);
    let their_rl_peak = report
        .reference
        .as_ref()
        .and_then(|reference| reference.pointer("/rl_step/max_memory_allocated_bytes"))
        .and_then(Value::as_u64);
    println!(
        "peak device memory: arc-rec {} (tch exposes no CUDA allocator statistics), PyTorch {} (rl_step {})",
        gib(our_peak),
        gib(their_peak),
        gib(their_rl_peak)
    );
    if let Some(reference) = &report.reference {
        let checkpointing = ["lora_train_step", "rl_step"].iter().any(|phase| {
            reference
                .pointer(&format!("/{phase}/gradient_checkpointing"))
                .and_then(Value::as_bool)
                .unwrap_or(false)
        });
        let versions = ["torch", "transformers", "peft"]
            .map(|name| {
                let version = reference
                    .pointer(&format!("/settings/{name}"))
                    .and_then(Value::as_str)
                    .unwrap_or("?");
                format!("{name} {version}")
            })
            .join(", ");
        println!(
            "reference: {versions}; gradient checkpointing {}",
            if checkpointing { "on" } else { "off" }
        );
        let their_threads = reference
            .pointer("/settings/cpu_threads")
            .and_then(Value::as_u64);
        if their_threads != Some(u64::from(settings.torch_threads)) {
            println!(
                "warning: the reference ran {their_threads:?} torch threads, arc-rec {}",
                settings.torch_threads
            );
        }
    }
    if let Some(reason) = &report.reference_error {
        println!("no ratios: the PyTorch reference did not run: {reason}");
    }
}

/// The `--device` value both child processes (ours and the PyTorch reference) take for the
/// device this run selected.
fn device_flag(runtime: Runtime) -> &'static str {
    if runtime.device.is_cuda() {
        "cuda"
    } else {
        "cpu"
    }
}
