//! `arc-rec bench model`'s library side: the phases it measures (generation at batch 1 and of k
//! samples, a LoRA training step, an RL step, and their grammar-constrained forms) on our tch
//! model, the figures each reports, the PyTorch reference's arguments for the same work, and the
//! comparison of the two. The command (`commands::bench_model`) resolves the arguments, decides
//! where each side runs and prints.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::ValueEnum;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use trainer::bench_model::{
    GenerationThroughput, RlStepThroughput, RlUpdate, Throughput,
    constrained_generation_throughput, constrained_rl_step_throughput, generation_throughput,
    median, parameter_count, qwen2_5_0_5b_config, qwen2_5_7b_config, random_model, random_prompt,
    rl_step_throughput, seed_torch, train_step_throughput_with,
};
use trainer::device::Runtime;
use trainer::generate::GrammarSchedule;
use trainer::grammar::Grammar;
use trainer::model::{CausalLm, Config, LoraConfig};
use trainer::rl_loss::{Aggregation, PolicyLossConfig};

/// The goal of every phase: at least as many tokens/s as PyTorch.
pub const GOAL_RATIO: f64 = 1.0;
/// Seed of the tiny preset's weights and tokenizer corpus (what `arc-rec model init` writes).
pub const TINY_SEED: u64 = 1;
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
    pub const ALL: [Phase; 6] = [
        Phase::GenerateBatch1,
        Phase::GenerateK,
        Phase::LoraTrainStep,
        Phase::RlStep,
        Phase::GenerateKConstrained,
        Phase::RlStepConstrained,
    ];

    pub fn name(self) -> &'static str {
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
    pub fn has_reference(self) -> bool {
        !self.needs_grammar()
    }

    /// Whether the phase compiles the recommendation grammar (and so needs a tokenizer).
    pub fn needs_grammar(self) -> bool {
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
    pub fn name(self) -> &'static str {
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

/// The work both sides do.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Settings {
    pub model: String,
    pub shape: Option<ModelShape>,
    pub device: String,
    pub dtype: String,
    pub torch_threads: u32,
    pub prompt_tokens: u32,
    pub new_tokens: u32,
    pub samples: u32,
    pub train_batch: u32,
    pub train_seq: u32,
    /// The phases run.
    #[serde(default)]
    pub phases: Vec<String>,
    /// Whether the training phases recompute the decoder layers in the backward pass.
    #[serde(default)]
    pub gradient_checkpointing: bool,
    pub lora_r: i64,
    pub lora_alpha: f64,
    pub lora_targets: Vec<String>,
    pub warmup: u32,
    pub repeats: u32,
    pub seed: u64,
    pub parameters: i64,
}

/// One phase of our side.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PhaseFigures {
    /// Tokens counted per run: new tokens of every sequence, or batch × sequence for training.
    pub tokens_per_run: i64,
    pub seconds: Vec<f64>,
    pub seconds_median: f64,
    pub tokens_per_s: f64,
    /// `None`: not readable (tch exposes no CUDA allocator statistics).
    pub peak_memory_bytes: Option<u64>,
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
pub struct RlStepFigures {
    #[serde(flatten)]
    pub step: PhaseFigures,
    /// k × new tokens.
    pub generated_tokens: i64,
    /// k × (prompt + new tokens): the positions of the training forward and backward.
    pub trained_tokens: i64,
    pub generate_seconds: Vec<f64>,
    pub train_seconds: Vec<f64>,
    pub generate_seconds_median: f64,
    pub train_seconds_median: f64,
    pub gradient_checkpointing: bool,
    /// Every step's loss, warm-up included.
    pub losses: Vec<f64>,
    /// Every step's gradient norm before clipping, warm-up included.
    pub grad_norms: Vec<f64>,
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
pub struct ConstrainedFigures {
    #[serde(flatten)]
    pub generation: PhaseFigures,
    /// The grammar's host seconds in every timed run that the decode loop spent on it (its
    /// allowed sets computed beside the forward, so only what outlasted the forward counts).
    pub mask_seconds: Vec<f64>,
    /// New tokens of every timed run (each run draws its own samples).
    #[serde(default)]
    pub tokens: Vec<i64>,
    /// The grammar's median share of a run's wall time.
    pub mask_share: f64,
    /// The grammar's milliseconds per generated token over the timed runs.
    pub mask_ms_per_token: f64,
    /// Milliseconds per generated token of grammar work hidden beside the forward.
    #[serde(default)]
    pub beside_forward_ms_per_token: f64,
    /// The same runs (same seeds) with the allowed sets computed after the forward instead.
    #[serde(default)]
    pub after_forward: Option<AfterForwardFigures>,
    /// Which of the two generation uses by default here (`GrammarSchedule::Auto`):
    /// `beside_forward` or `after_forward`.
    #[serde(default)]
    pub default_schedule: String,
    /// Samples that completed the grammar (ended on a stop token) rather than hit the limit.
    pub completed: usize,
    /// The tokenizer the grammar was compiled over, and its vocabulary.
    pub tokenizer: String,
    pub tokenizer_vocab: usize,
}

/// Constrained generation with the grammar's allowed sets computed after each forward, on the
/// decode loop's thread: what computing them beside the forward is measured against.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AfterForwardFigures {
    #[serde(flatten)]
    pub generation: PhaseFigures,
    pub mask_seconds: Vec<f64>,
    pub tokens: Vec<i64>,
    pub mask_share: f64,
    pub mask_ms_per_token: f64,
}

/// The RL step with the training update: its figures (tokens are generated + every pass's
/// trained positions, see `ConstrainedRlStep`), its parts and what the update saw.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ConstrainedRlStepFigures {
    #[serde(flatten)]
    pub step: PhaseFigures,
    pub update_epochs: usize,
    pub minibatches: usize,
    pub optimizer_steps: usize,
    /// Per timed step: tokens sampled, and prompt + completion positions of one pass.
    pub generated_tokens: Vec<i64>,
    pub trained_tokens: Vec<i64>,
    pub generate_seconds_median: f64,
    pub reference_seconds_median: f64,
    pub update_seconds_median: f64,
    /// The grammar's median share of a step's generation time.
    pub mask_share_of_generation: f64,
    /// Samples of the timed steps that completed the grammar.
    pub completed: usize,
    pub gradient_checkpointing: bool,
    /// Per step, warm-up included.
    pub losses: Vec<f64>,
    pub clip_fractions: Vec<f64>,
    pub first_max_abs_log_ratios: Vec<f64>,
    /// Below f32, per step: the sampler-vs-trainer |Δ log p| the update removed.
    #[serde(default)]
    pub sampler_gaps: Vec<f64>,
    pub tokenizer: String,
    pub tokenizer_vocab: usize,
}

/// Our phases; a phase not run (`--phases`) is `null`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct OurFigures {
    pub generate_batch1: Option<PhaseFigures>,
    pub generate_k: Option<PhaseFigures>,
    pub lora_train_step: Option<PhaseFigures>,
    #[serde(default)]
    pub rl_step: Option<RlStepFigures>,
    #[serde(default)]
    pub generate_k_constrained: Option<ConstrainedFigures>,
    #[serde(default)]
    pub rl_step_constrained: Option<ConstrainedRlStepFigures>,
    /// Values AdamW updates in the training phases.
    pub trainable_parameters: Option<i64>,
    /// lora_train_step's losses.
    pub train_losses: Vec<f64>,
}

impl OurFigures {
    pub fn phase(&self, name: &str) -> Option<&PhaseFigures> {
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
pub struct Comparison {
    pub phase: String,
    pub arc_rec_tokens_per_s: f64,
    pub reference_tokens_per_s: f64,
    /// Median seconds per run (per step for the training phases and the RL step).
    pub arc_rec_seconds: f64,
    pub reference_seconds: f64,
    /// arc-rec / PyTorch tokens/s.
    pub ratio: f64,
    pub goal: f64,
    pub meets_goal: bool,
}

/// What `--json` prints.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub settings: Settings,
    pub arc_rec: OurFigures,
    /// The reference script's JSON object, as it printed it.
    pub reference: Option<Value>,
    /// Why the reference is missing, when it is.
    pub reference_error: Option<String>,
    pub comparison: Vec<Comparison>,
}

/// The sizes after defaults.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    pub prompt_tokens: u32,
    pub new_tokens: u32,
    pub samples: u32,
    pub train_batch: u32,
    pub train_seq: u32,
    pub repeats: u32,
}

/// Whether the training phases checkpoint, for a model of `parameters` values.
pub fn checkpointing_for(choice: Checkpointing, parameters: i64) -> bool {
    match choice {
        Checkpointing::On => true,
        Checkpointing::Off => false,
        Checkpointing::Auto => parameters > CHECKPOINTING_ABOVE_PARAMETERS,
    }
}

/// Writes the tiny preset (what `arc-rec model init --preset tiny` writes) into `dir`.
pub fn write_tiny_preset(dir: &Path, progress: &dyn Fn(&str)) -> anyhow::Result<PathBuf> {
    progress("writing the tiny preset");
    let corpus =
        crate::export::tokenizer_corpus::tokenizer_corpus(TINY_SEED, TINY_CORPUS_OUTCOMES)?;
    trainer::preset::write_tiny_checkpoint(dir, TINY_SEED, &corpus)
        .with_context(|| format!("cannot write the tiny preset to {}", dir.display()))?;
    Ok(dir.to_owned())
}

/// Where the measured model and the constrained phase's tokenizer come from.
#[derive(Debug, Clone, Copy)]
pub struct Sources<'a> {
    /// The checkpoint to load; `None` for a random shape.
    pub checkpoint: Option<&'a Path>,
    /// The tokenizer directory of generate_k_constrained (when it runs).
    pub tokenizer: Option<&'a Path>,
}

/// What our side measures, and how.
#[derive(Debug, Clone, Copy)]
pub struct MeasurePlan<'a> {
    /// The shape built with random weights when `sources` has no checkpoint.
    pub shape: ModelShape,
    /// Whether the model was named by `--checkpoint` (the settings then name no shape).
    pub named_checkpoint: bool,
    pub sources: Sources<'a>,
    pub runtime: Runtime,
    /// Torch CPU threads in use.
    pub threads: u32,
    pub sizes: Sizes,
    /// The phases to run, in report order.
    pub phases: &'a [Phase],
    /// Untimed repetitions before timing.
    pub warmup: u32,
    pub seed: u64,
    pub gradient_checkpointing: Checkpointing,
    /// rl_step_constrained's passes over each step's samples.
    pub update_epochs: u32,
    /// rl_step_constrained's minibatches per pass.
    pub minibatches: u32,
}

/// Measures our phases in this process; `progress` hears what is being done.
pub fn measure(
    plan: &MeasurePlan<'_>,
    progress: &dyn Fn(&str),
) -> anyhow::Result<(Settings, OurFigures)> {
    let lora = LoraConfig::default();
    seed_torch(plan.seed);
    let (model, name) = load_model(plan, &lora, progress)?;
    let parameters = parameter_count(model.config());
    let checkpointing = checkpointing_for(plan.gradient_checkpointing, parameters);
    let prompt = random_prompt(
        model.config().vocab_size,
        plan.sizes.prompt_tokens as usize,
        plan.seed,
    )?;
    let bench = PhaseBench {
        model: &model,
        prompt: &prompt,
        plan,
        checkpointing,
        progress,
    };
    let mut figures = OurFigures::default();
    for &phase in plan.phases {
        bench.run(phase, &mut figures)?;
    }
    let settings = settings(plan, name, &lora, checkpointing, parameters);
    Ok((settings, figures))
}

/// The model with LoRA adapters attached, and its name in the report.
fn load_model(
    plan: &MeasurePlan<'_>,
    lora: &LoraConfig,
    progress: &dyn Fn(&str),
) -> anyhow::Result<(CausalLm, String)> {
    if let Some(dir) = plan.sources.checkpoint {
        progress(&format!("loading {}", dir.display()));
        let (mut model, _) = CausalLm::from_pretrained(dir, plan.runtime)
            .with_context(|| format!("cannot load the checkpoint {}", dir.display()))?;
        model.attach_lora(lora)?;
        return Ok((model, dir.display().to_string()));
    }
    let shape = plan.shape.name();
    let config = plan
        .shape
        .random_config()
        .with_context(|| format!("the {shape} shape is a checkpoint, not random"))?;
    progress(&format!("building {shape} with random weights"));
    // 0.02: Qwen2.5's initializer_range, what transformers draws a fresh model with.
    let model = random_model(config, plan.runtime, 0.02, Some(lora))?;
    Ok((model, format!("random {shape}")))
}

/// The settings both sides share, as measured here.
fn settings(
    plan: &MeasurePlan<'_>,
    model: String,
    lora: &LoraConfig,
    checkpointing: bool,
    parameters: i64,
) -> Settings {
    let sizes = plan.sizes;
    Settings {
        model,
        shape: (!plan.named_checkpoint).then_some(plan.shape),
        device: format!("{:?}", plan.runtime.device).to_lowercase(),
        dtype: match format!("{:?}", plan.runtime.kind).as_str() {
            "Float" => "f32".to_owned(),
            "BFloat16" => "bf16".to_owned(),
            other => other.to_lowercase(),
        },
        torch_threads: plan.threads,
        prompt_tokens: sizes.prompt_tokens,
        new_tokens: sizes.new_tokens,
        samples: sizes.samples,
        train_batch: sizes.train_batch,
        train_seq: sizes.train_seq,
        phases: plan
            .phases
            .iter()
            .map(|phase| phase.name().to_owned())
            .collect(),
        gradient_checkpointing: checkpointing,
        lora_r: lora.r,
        lora_alpha: lora.alpha,
        lora_targets: lora.target_modules.clone(),
        warmup: plan.warmup,
        repeats: sizes.repeats,
        seed: plan.seed,
        parameters,
    }
}

/// One model and prompt, measured phase by phase.
struct PhaseBench<'a> {
    model: &'a CausalLm,
    prompt: &'a [i64],
    plan: &'a MeasurePlan<'a>,
    /// Whether the training phases recompute the decoder layers.
    checkpointing: bool,
    progress: &'a dyn Fn(&str),
}

impl PhaseBench<'_> {
    fn warmup(&self) -> usize {
        self.plan.warmup as usize
    }

    fn repeats(&self) -> usize {
        self.plan.sizes.repeats as usize
    }

    /// Runs `phase`, its figures into `figures`.
    fn run(&self, phase: Phase, figures: &mut OurFigures) -> anyhow::Result<()> {
        let sizes = self.plan.sizes;
        match phase {
            Phase::GenerateBatch1 => {
                (self.progress)("generating at batch 1 (greedy)");
                figures.generate_batch1 = Some((&self.generate(1, false)?.throughput).into());
            }
            Phase::GenerateK => {
                (self.progress)(&format!(
                    "generating k={} samples (temperature 1)",
                    sizes.samples
                ));
                figures.generate_k = Some((&self.generate(sizes.samples, true)?.throughput).into());
            }
            Phase::LoraTrainStep => self.lora_train_step(figures)?,
            Phase::RlStep => self.rl_step(figures)?,
            Phase::GenerateKConstrained => {
                let dir = grammar_tokenizer(self.plan.sources, phase)?;
                let grammar = recommendation_grammar(self.model, dir)?;
                (self.progress)(&format!(
                    "generating k={} samples under the recommendation grammar (tokenizer {})",
                    sizes.samples,
                    dir.display()
                ));
                figures.generate_k_constrained = Some(self.constrained_k(&grammar, dir)?);
            }
            Phase::RlStepConstrained => {
                let dir = grammar_tokenizer(self.plan.sources, phase)?;
                let grammar = recommendation_grammar(self.model, dir)?;
                self.rl_step_constrained(&grammar, dir, figures)?;
            }
        }
        Ok(())
    }

    /// `sequences` generated sequences of the prompt (sampled at temperature 1, or greedy).
    fn generate(&self, sequences: u32, sampled: bool) -> anyhow::Result<GenerationThroughput> {
        Ok(generation_throughput(
            self.model,
            self.prompt,
            sequences as usize,
            self.plan.sizes.new_tokens as usize,
            sampled,
            self.warmup(),
            self.repeats(),
        )?)
    }

    fn lora_train_step(&self, figures: &mut OurFigures) -> anyhow::Result<()> {
        let sizes = self.plan.sizes;
        (self.progress)(&format!(
            "LoRA training steps on {} × {} tokens",
            sizes.train_batch, sizes.train_seq
        ));
        let train = train_step_throughput_with(
            self.model,
            i64::from(sizes.train_batch),
            i64::from(sizes.train_seq),
            self.repeats(),
            self.warmup(),
            self.checkpointing,
        )?;
        figures.lora_train_step = Some((&train.throughput).into());
        figures.trainable_parameters = Some(train.trainable_parameters);
        figures.train_losses = train.losses;
        Ok(())
    }

    fn rl_step(&self, figures: &mut OurFigures) -> anyhow::Result<()> {
        let sizes = self.plan.sizes;
        (self.progress)(&format!(
            "RL steps: k={} × {} sampled tokens, then a policy-gradient step",
            sizes.samples, sizes.new_tokens
        ));
        let rl = rl_step_throughput(
            self.model,
            self.prompt,
            sizes.samples as usize,
            sizes.new_tokens as usize,
            self.checkpointing,
            self.warmup(),
            self.repeats(),
            self.plan.seed,
        )?;
        figures.rl_step = Some((&rl).into());
        figures.trainable_parameters = Some(rl.trainable_parameters);
        Ok(())
    }

    /// The generate_k_constrained phase: k samples of the prompt under `grammar` (compiled over
    /// the tokenizer in `dir`), with the allowed sets beside the forward and, on the same seeds,
    /// after it.
    fn constrained_k(&self, grammar: &Grammar, dir: &Path) -> anyhow::Result<ConstrainedFigures> {
        let sizes = self.plan.sizes;
        let measure = |schedule| {
            constrained_generation_throughput(
                self.model,
                self.prompt,
                sizes.samples as usize,
                sizes.new_tokens as usize,
                grammar,
                self.warmup(),
                self.repeats(),
                self.plan.seed,
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
            default_schedule: match GrammarSchedule::Auto.resolve(self.model.runtime().device) {
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

    /// The rl_step_constrained phase: the RL step as `train` runs it, under `grammar`.
    fn rl_step_constrained(
        &self,
        grammar: &Grammar,
        dir: &Path,
        figures: &mut OurFigures,
    ) -> anyhow::Result<()> {
        let sizes = self.plan.sizes;
        let update = RlUpdate {
            epochs: self.plan.update_epochs as usize,
            minibatches: self.plan.minibatches as usize,
            loss: PolicyLossConfig {
                clip_epsilon: Some(0.2),
                clip_epsilon_high: Some(0.28),
                kl_coef: 0.05,
                aggregation: Aggregation::Sequence,
            },
        };
        (self.progress)(&format!(
            "RL steps: k={} samples under the recommendation grammar (≤ {} tokens), then {} passes × {} minibatches of clipped-surrogate steps",
            sizes.samples, sizes.new_tokens, update.epochs, update.minibatches
        ));
        let rl = constrained_rl_step_throughput(
            self.model,
            self.prompt,
            sizes.samples as usize,
            sizes.new_tokens as usize,
            grammar,
            update,
            self.checkpointing,
            self.warmup(),
            self.repeats(),
            self.plan.seed,
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
        Ok(())
    }
}

/// The tokenizer directory a grammar phase compiles over.
fn grammar_tokenizer(sources: Sources<'_>, phase: Phase) -> anyhow::Result<&Path> {
    sources
        .tokenizer
        .with_context(|| format!("{} needs a tokenizer directory (--tokenizer)", phase.name()))
}

/// The recommendation grammar over the tokenizer in `dir`, masks as wide as `model`'s vocabulary.
fn recommendation_grammar(model: &CausalLm, dir: &Path) -> anyhow::Result<Grammar> {
    let tokenizer = trainer::tokenizer::Tokenizer::from_dir(dir)
        .with_context(|| format!("--tokenizer {}: cannot read its tokenizer", dir.display()))?;
    let vocab_size = usize::try_from(model.config().vocab_size)?;
    Grammar::over_tokenizer(
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

/// After measuring the tiny preset from a temporary directory: names the preset (and, unless
/// `--tokenizer` named one, its tokenizer) instead of the temporary path.
pub fn name_the_preset(
    settings: &mut Settings,
    ours: &mut OurFigures,
    shape: ModelShape,
    preset_tokenizer: bool,
) {
    settings.shape = Some(shape);
    if shape == ModelShape::Tiny {
        settings.model = format!("tiny preset, seed {TINY_SEED}");
    }
    if preset_tokenizer {
        let preset = format!("the tiny preset's (seed {TINY_SEED})");
        if let Some(constrained) = &mut ours.generate_k_constrained {
            constrained.tokenizer.clone_from(&preset);
        }
        if let Some(rl) = &mut ours.rl_step_constrained {
            rl.tokenizer = preset;
        }
    }
}

/// The `--device` value both child processes (ours and the PyTorch reference) take for the
/// device this run selected.
pub fn device_flag(runtime: Runtime) -> &'static str {
    if runtime.device.is_cuda() {
        "cuda"
    } else {
        "cpu"
    }
}

/// The arguments of `bench/model_reference.py` for the same model (`checkpoint`, else the
/// settings' shape), device, sizes and thread count.
pub fn reference_args(
    settings: &Settings,
    runtime: Runtime,
    checkpoint: Option<&Path>,
) -> anyhow::Result<Vec<String>> {
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
    owned.push(device_flag(runtime).into());
    owned.push("--lora-alpha".into());
    owned.push(settings.lora_alpha.to_string());
    for (flag, value) in numbers {
        owned.push(flag.into());
        owned.push(value.to_string());
    }
    Ok(owned)
}

/// Ratios per phase run; the token counts (and, for the training phases, gradient checkpointing)
/// of both sides must agree, or the comparison is not of the same work.
pub fn compare(
    settings: &Settings,
    ours: &OurFigures,
    reference: &Value,
) -> anyhow::Result<Vec<Comparison>> {
    Phase::ALL
        .iter()
        .filter(|phase| phase.has_reference())
        .map(|phase| phase.name())
        .filter(|phase| settings.phases.iter().any(|run| run == phase))
        .map(|phase| compare_phase(settings, ours, reference, phase))
        .collect()
}

/// One phase's row of [`compare`].
fn compare_phase(
    settings: &Settings,
    ours: &OurFigures,
    reference: &Value,
    phase: &str,
) -> anyhow::Result<Comparison> {
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
}
