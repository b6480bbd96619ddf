//! A training run's resolved settings: what `RUN_DIR/config.json` holds, checked once, so a
//! resumed run continues with exactly what it started with.

use std::path::PathBuf;

use objectives::{Estimator, Objective};
use serde::{Deserialize, Serialize};

use super::guard::KlControl;
use super::selection::Criterion;
use crate::rft::WorldTruths;
use crate::rft::learned_grader::{DEFAULT_LCB_Z, LearnedFloor, Pessimism, ServedWeighting};
use crate::rft::{Grader, GraderError, GraderKind, LearnedGrader, RftPrompt, WorldReward};
use crate::world::WorldParams;

fn default_lcb_z() -> f64 {
    DEFAULT_LCB_Z
}

/// `--device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceChoice {
    /// CUDA when libtorch sees a device, else the CPU.
    Auto,
    /// The CPU (f32).
    Cpu,
    /// CUDA device 0 (bf16).
    Cuda,
}

impl DeviceChoice {
    pub fn request(self) -> trainer::device::DeviceRequest {
        use trainer::device::DeviceRequest;
        match self {
            DeviceChoice::Auto => DeviceRequest::Auto,
            DeviceChoice::Cpu => DeviceRequest::Cpu,
            DeviceChoice::Cuda => DeviceRequest::Cuda,
        }
    }
}

/// How the learning rate moves over a phase's steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum LrSchedule {
    /// Linear warm-up, then constant.
    Constant,
    /// Linear warm-up, then cosine decay to a tenth of the peak.
    Cosine,
}

/// `--warmup`: what the supervised warm-up trains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum WarmupMode {
    /// Every weight for models up to 100M parameters, LoRA adapters above.
    Auto,
    /// Every weight (AdamW state: 8 bytes per parameter in f32).
    Full,
    /// LoRA adapters on the frozen base, merged into it at the end of the warm-up.
    Lora,
}

/// Up to this many parameters `--warmup auto` trains every weight. Measured on the tiny preset
/// (0.9M parameters, random init): a LoRA warm-up of 150 steps left the NLL per token at 4.76 and
/// not one sampled completion parsed; a randomly initialised model has no features for low-rank
/// adapters to steer. Pre-trained models of 100M+ parameters know the format's syntax already.
pub const AUTO_FULL_WARMUP_MAX_PARAMETERS: i64 = 100_000_000;

impl WarmupMode {
    fn lora() -> Self {
        WarmupMode::Lora
    }

    /// Whether a model of `parameters` parameters warms up fully.
    pub fn is_full(self, parameters: i64) -> bool {
        match self {
            WarmupMode::Auto => parameters <= AUTO_FULL_WARMUP_MAX_PARAMETERS,
            WarmupMode::Full => true,
            WarmupMode::Lora => false,
        }
    }
}

/// `--constrained`: whether completions are drawn under the recommendation grammar (the JSON
/// schema of `crate::rft::schema`, compiled over the model's tokenizer by llguidance), so every
/// sample is well-formed JSON of the right shape and RL's reward is about its content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Constrained {
    On,
    Off,
}

impl Constrained {
    /// Runs made before the option existed sampled freely.
    fn off() -> Self {
        Constrained::Off
    }

    pub fn is_on(self) -> bool {
        self == Constrained::On
    }
}

/// Everything a run needs besides its data and model files' contents.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainSettings {
    /// The arc-format export the prompts come from.
    pub data: PathBuf,
    /// The base checkpoint directory.
    pub model: PathBuf,
    pub objective: Objective,
    /// k of pass@k / maj@k.
    pub k: usize,
    /// Samples per prompt (n ≥ k).
    pub n: usize,
    /// Prompts per RL step.
    pub prompts_per_step: usize,
    /// RL steps after the warm-up.
    pub steps: u64,
    /// Supervised warm-up steps on accepted recommendations.
    pub sft_steps: u64,
    /// Examples per warm-up step.
    pub sft_batch: usize,
    /// What the warm-up trains (runs made before the option existed warmed up LoRA adapters).
    #[serde(default = "WarmupMode::lora")]
    pub warmup: WarmupMode,
    pub grader: GraderKind,
    pub world_seed: u64,
    pub world_outcomes: usize,
    /// The world grader's reward: one acceptance draw, or its expectation (absent from older
    /// runs' config.json: the draw).
    #[serde(default)]
    pub world_reward: WorldReward,
    /// The learned grader's κ: its reward is made of σ(μ − κ·s) (absent from older runs'
    /// config.json: the default).
    #[serde(default = "default_lcb_z")]
    pub learned_lcb_z: f64,
    /// What the learned grader's reward floors (absent from older runs' config.json: ranges).
    #[serde(default)]
    pub learned_floor: LearnedFloor,
    /// How the learned grader's fit weighs served answers (absent from older runs' config.json:
    /// none).
    #[serde(default)]
    pub learned_served_weighting: ServedWeighting,
    /// +0.1 for a well-formed recommendation.
    pub format_bonus: bool,
    /// Seeds the data order, sampling, the world's draws and majority tie-breaks.
    pub seed: u64,
    pub learning_rate: f64,
    pub sft_learning_rate: f64,
    pub lr_schedule: LrSchedule,
    /// Linear warm-up steps of each phase's learning rate.
    pub lr_warmup_steps: u64,
    pub max_grad_norm: f64,
    pub weight_decay: f64,
    /// Recompute each decoder layer in the backward pass instead of keeping its activations
    /// (absent from older runs' config.json: off).
    #[serde(default)]
    pub gradient_checkpointing: bool,
    pub lora_r: i64,
    pub lora_alpha: f64,
    pub lora_dropout: f64,
    pub max_new_tokens: usize,
    pub temperature: f64,
    /// Draw RL's samples under the recommendation grammar (absent in older runs: off).
    #[serde(default = "Constrained::off")]
    pub constrained: Constrained,
    /// PPO clipping ε; `None` is the plain policy gradient.
    pub clip_epsilon: Option<f64>,
    /// β of the k3 KL penalty to the adapters-off reference (0 skips the reference pass).
    pub kl_coef: f64,
    /// The upper clip ε (clip-higher); `None` is `clip_epsilon`.
    #[serde(default)]
    pub clip_epsilon_high: Option<f64>,
    /// Policy-update passes over each rollout batch (μ; older runs: 1).
    #[serde(default = "one")]
    pub update_epochs: usize,
    /// Weight of the forbidden-mass penalty (`trainer::train_step::TrainerConfig::
    /// forbidden_mass_coef`) in the RL update; 0 (older runs) is off.
    #[serde(default)]
    pub forbidden_mass_coef: f64,
    /// Minibatches (of whole groups) per pass, one optimizer step each (older runs: 1).
    #[serde(default = "one")]
    pub minibatches: usize,
    /// Target per-token KL of the adaptive KL controller; `None` keeps β fixed.
    #[serde(default)]
    pub kl_target: Option<f64>,
    /// The adaptive controller's horizon in samples.
    #[serde(default = "default_kl_horizon")]
    pub kl_horizon: u64,
    /// Draw more prompts until the step has `prompts_per_step` groups that carry signal (DAPO's
    /// dynamic sampling), at most `max_sampling_rounds` rounds of `prompts_per_step` prompts.
    #[serde(default)]
    pub dynamic_sampling: bool,
    #[serde(default = "one")]
    pub max_sampling_rounds: usize,
    /// Leave groups whose advantages are all zero out of the update.
    pub skip_zero_advantage_groups: bool,
    /// Checkpoint every this many steps (and at the end of each phase).
    pub checkpoint_every: u64,
    /// Score the policy on the validation split's logged decisions every this many RL steps
    /// (and at RL's first and last step) and keep the best checkpoint as the run's adapter; 0
    /// (older runs) keeps the last one.
    #[serde(default)]
    pub eval_every: u64,
    /// The criterion checkpoints are chosen by.
    #[serde(default)]
    pub select_by: Criterion,
    /// Keep every scored checkpoint's adapter (`RUN_DIR/eval-point-N`) after the run.
    #[serde(default)]
    pub keep_eval_points: bool,
    /// A moving average of the KL per token above this counts as a blow-up and rolls back.
    pub max_kl: f64,
    /// Rollbacks allowed before the run gives up.
    pub max_rollbacks: u32,
    pub device: DeviceChoice,
}

fn one() -> usize {
    1
}

/// `--kl-horizon`'s default: β can move by up to ±2 % a step at 32 samples.
pub const DEFAULT_KL_HORIZON: u64 = 320;

/// `--kl-coef`'s default under `--grader learned`: the starting β of a KL budget. A free policy
/// over-optimises a reward model fitted on ~1,300 logged decisions: on the world, learned-grader
/// runs without a budget lost up to 0.23 of true acceptance held out as their KL per token
/// climbed towards 1, and with this one they stayed near their warm-up
/// (docs/experiments/learned-grader-kl-budget.md).
pub const LEARNED_KL_COEF: f64 = 0.05;
/// `--kl-target`'s default under `--grader learned` (when `--kl-coef` is not given either).
pub const LEARNED_KL_TARGET: f64 = 0.1;

/// The KL penalty a run trains with, from `--kl-coef` and `--kl-target` as given: none by
/// default, but under `--grader learned` β starts at [`LEARNED_KL_COEF`] and, unless `--kl-coef`
/// was given, adapts towards [`LEARNED_KL_TARGET`]. What a user gives always wins (`--kl-coef 0`
/// turns the penalty off).
pub fn kl_budget(grader: GraderKind, coef: Option<f64>, target: Option<f64>) -> (f64, Option<f64>) {
    match grader {
        GraderKind::Learned => (
            coef.unwrap_or(LEARNED_KL_COEF),
            target.or(coef.is_none().then_some(LEARNED_KL_TARGET)),
        ),
        GraderKind::World | GraderKind::Logged => (coef.unwrap_or(0.0), target),
    }
}

fn default_kl_horizon() -> u64 {
    DEFAULT_KL_HORIZON
}

impl TrainSettings {
    /// How the KL coefficient evolves.
    pub fn kl_control(&self) -> KlControl {
        match self.kl_target {
            Some(target) => KlControl::Adaptive {
                target,
                horizon_samples: self.kl_horizon as f64,
            },
            None => KlControl::Fixed,
        }
    }

    /// The learned grader's κ and floor.
    pub fn learned_pessimism(&self) -> Pessimism {
        Pessimism {
            lcb_z: self.learned_lcb_z,
            floor: self.learned_floor,
            served_weighting: self.learned_served_weighting,
        }
    }

    /// The advantage estimator, checked against n.
    pub fn estimator(&self) -> Result<Estimator, String> {
        let estimator = Estimator::new(self.objective, self.k).map_err(|e| format!("--k: {e}"))?;
        estimator
            .check_group_size(self.n)
            .map_err(|e| format!("--n: {e}"))?;
        Ok(estimator)
    }

    /// Every problem with the settings, naming the flag.
    pub fn validate(&self) -> Result<(), String> {
        self.estimator()?;
        let positive = |value: f64| value.is_finite() && value > 0.0;
        let checks: [(bool, String); 23] = [
            (
                self.update_epochs >= 1,
                "--update-epochs must be at least 1".into(),
            ),
            (
                self.forbidden_mass_coef.is_finite() && self.forbidden_mass_coef >= 0.0,
                format!(
                    "--forbidden-mass-coef must be a number ≥ 0, got {}",
                    self.forbidden_mass_coef
                ),
            ),
            (
                (1..=self.prompts_per_step.max(1)).contains(&self.minibatches),
                format!(
                    "--minibatches must be between 1 and --prompts-per-step ({}), got {}",
                    self.prompts_per_step, self.minibatches
                ),
            ),
            (
                self.clip_epsilon_high
                    .is_none_or(|e| e.is_finite() && e > 0.0 && self.clip_epsilon.is_some()),
                format!(
                    "--clip-epsilon-high must be positive and needs the clip (not --no-clip), got {:?}",
                    self.clip_epsilon_high
                ),
            ),
            (
                self.kl_target
                    .is_none_or(|t| positive(t) && positive(self.kl_coef)),
                format!(
                    "--kl-target must be positive and needs a positive --kl-coef to adapt, got {:?} and {}",
                    self.kl_target, self.kl_coef
                ),
            ),
            (
                self.kl_horizon >= 1,
                "--kl-horizon must be at least 1 sample".into(),
            ),
            (
                self.max_sampling_rounds >= 1,
                "--max-sampling-rounds must be at least 1".into(),
            ),
            (
                self.prompts_per_step >= 1,
                "--prompts-per-step must be at least 1".into(),
            ),
            (self.sft_batch >= 1, "--sft-batch must be at least 1".into()),
            (
                self.steps + self.sft_steps >= 1,
                "--steps and --sft-steps are both 0: nothing to train".into(),
            ),
            (
                positive(self.learning_rate),
                format!(
                    "--learning-rate must be positive, got {}",
                    self.learning_rate
                ),
            ),
            (
                positive(self.sft_learning_rate),
                format!(
                    "--sft-learning-rate must be positive, got {}",
                    self.sft_learning_rate
                ),
            ),
            (
                positive(self.max_grad_norm),
                format!(
                    "--max-grad-norm must be positive, got {}",
                    self.max_grad_norm
                ),
            ),
            (
                self.weight_decay.is_finite() && self.weight_decay >= 0.0,
                format!(
                    "--weight-decay must be non-negative, got {}",
                    self.weight_decay
                ),
            ),
            (
                self.lora_r >= 1,
                format!("--lora-r must be at least 1, got {}", self.lora_r),
            ),
            (
                positive(self.lora_alpha),
                format!("--lora-alpha must be positive, got {}", self.lora_alpha),
            ),
            (
                (0.0..1.0).contains(&self.lora_dropout),
                format!(
                    "--lora-dropout must be in [0, 1), got {}",
                    self.lora_dropout
                ),
            ),
            (
                self.max_new_tokens >= 1,
                "--max-new-tokens must be at least 1".into(),
            ),
            (
                positive(self.temperature),
                format!(
                    "--temperature must be positive (RL needs sampling), got {}",
                    self.temperature
                ),
            ),
            (
                self.clip_epsilon.is_none_or(|e| e > 0.0 && e < 1.0),
                format!(
                    "--clip-epsilon must be in (0, 1), got {:?}",
                    self.clip_epsilon
                ),
            ),
            (
                self.learned_lcb_z.is_finite() && self.learned_lcb_z >= 0.0,
                format!(
                    "--learned-lcb-z must be a finite number ≥ 0, got {}",
                    self.learned_lcb_z
                ),
            ),
            (
                self.kl_coef.is_finite() && self.kl_coef >= 0.0,
                format!("--kl-coef must be non-negative, got {}", self.kl_coef),
            ),
            (
                self.checkpoint_every >= 1 && positive(self.max_kl),
                format!(
                    "--checkpoint-every must be at least 1 and --max-kl positive, got {} and {}",
                    self.checkpoint_every, self.max_kl
                ),
            ),
        ];
        match checks.into_iter().find(|(ok, _)| !ok) {
            Some((_, problem)) => Err(problem),
            None => Ok(()),
        }
    }

    /// The `kind` grader for `prompts` with the run's world and format bonus; `learned` is the
    /// run's fitted reward model (`--grader learned` only; `run_dir::read_learned_grader`).
    pub fn grader<'a>(
        &self,
        kind: GraderKind,
        prompts: impl IntoIterator<Item = &'a RftPrompt> + Clone,
        learned: Option<std::sync::Arc<LearnedGrader>>,
    ) -> Result<Grader, GraderError> {
        match (kind, learned) {
            (GraderKind::Logged, _) => Ok(Grader::logged(self.format_bonus)),
            (GraderKind::World, _) => Grader::world(
                self.world_params(),
                prompts,
                self.world_reward,
                self.format_bonus,
            ),
            (GraderKind::Learned, Some(model)) => {
                // Data from another world, or from a platform, has no truth to show beside.
                let shadow = WorldTruths::new(self.world_params(), prompts.clone()).ok();
                Grader::learned(model, prompts, shadow, self.world_reward, self.format_bonus)
            }
            (GraderKind::Learned, None) => Err(GraderError::NoLearnedModel),
        }
    }

    /// The world `--world-seed` and `--world-outcomes` describe.
    pub fn world_params(&self) -> WorldParams {
        WorldParams {
            seed: self.world_seed,
            outcomes: self.world_outcomes,
            ..WorldParams::default()
        }
    }

    /// Total steps: warm-up then RL.
    pub fn total_steps(&self) -> u64 {
        self.sft_steps + self.steps
    }

    /// The learning rate of global step `step` (0-based), before any rollback scaling.
    pub fn learning_rate_at(&self, step: u64) -> f64 {
        let (peak, index, length) = if step < self.sft_steps {
            (self.sft_learning_rate, step, self.sft_steps)
        } else {
            (self.learning_rate, step - self.sft_steps, self.steps)
        };
        let warmup = self.lr_warmup_steps.min(length);
        if index < warmup {
            return peak * (index + 1) as f64 / (warmup + 1) as f64;
        }
        match self.lr_schedule {
            LrSchedule::Constant => peak,
            LrSchedule::Cosine => {
                let span = (length - warmup).max(1) as f64;
                let progress = (index - warmup) as f64 / span;
                let floor = 0.1 * peak;
                floor + (peak - floor) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Settings for tests: the CLI's defaults with small phases.
    pub(crate) fn sample() -> TrainSettings {
        TrainSettings {
            data: "data.jsonl".into(),
            model: "model".into(),
            objective: Objective::PassAtK,
            k: 4,
            n: 8,
            prompts_per_step: 4,
            steps: 10,
            sft_steps: 5,
            sft_batch: 8,
            warmup: WarmupMode::Auto,
            grader: GraderKind::World,
            world_seed: 1,
            world_outcomes: 20_000,
            world_reward: WorldReward::Sampled,
            learned_lcb_z: DEFAULT_LCB_Z,
            learned_floor: LearnedFloor::Ranges,
            learned_served_weighting: ServedWeighting::None,
            format_bonus: true,
            seed: 1,
            learning_rate: 1e-3,
            sft_learning_rate: 3e-3,
            lr_schedule: LrSchedule::Cosine,
            lr_warmup_steps: 2,
            max_grad_norm: 1.0,
            weight_decay: 0.0,
            gradient_checkpointing: false,
            lora_r: 8,
            lora_alpha: 16.0,
            lora_dropout: 0.0,
            max_new_tokens: 64,
            temperature: 1.0,
            constrained: Constrained::On,
            clip_epsilon: Some(0.2),
            clip_epsilon_high: None,
            update_epochs: 1,
            forbidden_mass_coef: 0.0,
            minibatches: 1,
            kl_target: None,
            kl_horizon: DEFAULT_KL_HORIZON,
            dynamic_sampling: false,
            max_sampling_rounds: 1,
            kl_coef: 0.0,
            skip_zero_advantage_groups: true,
            checkpoint_every: 5,
            eval_every: 5,
            select_by: Criterion::MenuAcceptance,
            keep_eval_points: false,
            max_kl: 1.0,
            max_rollbacks: 3,
            device: DeviceChoice::Auto,
        }
    }

    #[test]
    fn validation_names_the_flag() {
        assert!(sample().validate().is_ok());
        type Change = fn(&mut TrainSettings);
        let cases: [(Change, &str); 7] = [
            (|s| s.k = 1, "--k"),
            (|s| s.n = 2, "--n"),
            (|s| s.minibatches = 5, "--minibatches"),
            (|s| s.kl_target = Some(0.05), "--kl-target"),
            (|s| s.update_epochs = 0, "--update-epochs"),
            (|s| s.temperature = 0.0, "--temperature"),
            (|s| s.lora_dropout = 1.0, "--lora-dropout"),
        ];
        for (change, flag) in cases {
            let mut settings = sample();
            change(&mut settings);
            let problem = settings.validate().unwrap_err();
            assert!(problem.contains(flag), "{problem}");
        }
    }

    #[test]
    fn schedules_warm_up_then_decay_per_phase() {
        let settings = sample();
        // Warm-up phase: steps 0..5, peak 3e-3, 2 warm-up steps.
        assert!((settings.learning_rate_at(0) - 1e-3).abs() < 1e-12);
        assert!((settings.learning_rate_at(2) - 3e-3).abs() < 1e-12);
        assert!(settings.learning_rate_at(4) < 3e-3);
        // RL phase restarts its own warm-up.
        assert!((settings.learning_rate_at(5) - 1e-3 / 3.0).abs() < 1e-12);
        assert!((settings.learning_rate_at(7) - 1e-3).abs() < 1e-12);
        let last = settings.learning_rate_at(14);
        assert!(last > 1e-4 && last < 2e-4, "{last}");
    }

    #[test]
    fn the_learned_grader_trains_under_a_kl_budget_unless_told_otherwise() {
        use GraderKind::{Learned, Logged, World};
        let budget = (LEARNED_KL_COEF, Some(LEARNED_KL_TARGET));
        assert_eq!(kl_budget(Learned, None, None), budget);
        // What the user gives wins: a fixed β, another target, or no penalty at all.
        assert_eq!(kl_budget(Learned, Some(0.02), None), (0.02, None));
        assert_eq!(
            kl_budget(Learned, None, Some(0.3)),
            (LEARNED_KL_COEF, Some(0.3))
        );
        assert_eq!(kl_budget(Learned, Some(0.0), None), (0.0, None));
        assert_eq!(kl_budget(Learned, Some(0.1), Some(0.2)), (0.1, Some(0.2)));
        // The other graders train without a penalty by default, as before.
        for grader in [World, Logged] {
            assert_eq!(kl_budget(grader, None, None), (0.0, None));
            assert_eq!(kl_budget(grader, Some(0.05), Some(0.1)), (0.05, Some(0.1)));
        }
        let mut settings = sample();
        (settings.kl_coef, settings.kl_target) = kl_budget(Learned, None, None);
        assert_eq!(settings.validate(), Ok(()));
    }
}
