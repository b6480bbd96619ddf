//! The lines of `RUN_DIR/metrics.jsonl`: one per step, plus one per rollback and one per
//! checkpoint scored for selection.

use serde::{Deserialize, Serialize};

use super::selection::SelectionPoint;

/// Which phase a step belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Supervised warm-up on accepted recommendations.
    Warmup,
    /// Policy-gradient steps on graded samples.
    Rl,
}

/// One line of `metrics.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum MetricsLine {
    /// Boxed: a step line is several times the size of a rollback line.
    Step(Box<StepMetrics>),
    /// A NaN loss or a KL blow-up: the run went back to `to_step`'s checkpoint, lowered the
    /// learning rate, raised the KL coefficient and salted its random streams.
    Rollback(Rollback),
    /// A checkpoint scored on the validation split's logged decisions (`--eval-every`).
    Selection(SelectionPoint),
}

/// What a rollback did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rollback {
    /// The step that failed.
    pub at_step: u64,
    /// The checkpoint the run went back to (the step it resumes at).
    pub to_step: u64,
    pub reason: String,
    /// The factor on every learning rate from now on.
    pub lr_scale: f64,
    /// The salt the retried steps draw with (absent in older runs: none).
    #[serde(default)]
    pub salt: u32,
    /// The KL coefficient the retry starts with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kl_coef: Option<f64>,
}

/// What one step did. RL-only fields are absent on warm-up steps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepMetrics {
    /// 0-based over warm-up then RL.
    pub step: u64,
    pub phase: Phase,
    pub learning_rate: f64,
    /// The loss the update minimised (0 when no update was made).
    pub loss: f64,
    /// Global gradient norm before clipping (0 when no update was made).
    pub grad_norm: f64,
    /// Whether the optimizer stepped (an RL batch whose groups all carry no signal does not).
    pub updated: bool,
    /// Completion tokens the loss scored.
    pub tokens: i64,
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub rl: Option<RlMetrics>,
    /// Wall time of the step.
    pub step_seconds: f64,
    /// Generated (RL) or trained (warm-up) tokens per second of the step.
    pub tokens_per_second: f64,
}

/// The RL batch's figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RlMetrics {
    pub reward_mean: f64,
    pub reward_std: f64,
    /// Share of samples accepted.
    pub pass_at_1: f64,
    /// Unbiased pass@k from each prompt's n samples, averaged over prompts.
    pub pass_at_k: f64,
    /// Unbiased maj@k (acceptance of the majority answer of k samples), averaged over prompts.
    pub maj_at_k: f64,
    /// Share of groups whose advantages are not all zero.
    pub nonzero_advantage_fraction: f64,
    /// Mean k3 KL per completion token to the adapters-off reference.
    pub kl: f64,
    /// −mean log-prob of the completion tokens.
    pub entropy: f64,
    pub clip_fraction: f64,
    /// Share of samples that parse as a valid recommendation.
    pub format_validity: f64,
    pub completion_tokens_mean: f64,
    pub completion_tokens_max: usize,
    /// The mean true acceptance probability of the samples (malformed ones count 0), when the
    /// data comes from a world: the world grader's, or the truth beside a learned grader.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acceptance_probability: Option<f64>,
    /// Learned grader: the mean of its posterior-mean acceptance probability σ(μ) over the
    /// samples (malformed ones count 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub learned_probability: Option<f64>,
    /// Learned grader: the mean of its pessimistic probability σ(μ − κ·s), which the reward is
    /// made of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub learned_lower_bound: Option<f64>,
    /// Prompts drawn this step (more than `--prompts-per-step` with dynamic sampling).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompts_drawn: Option<usize>,
    /// The KL coefficient β the update used (adaptive with `--kl-target`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kl_coef: Option<f64>,
    /// The guard's moving average of `kl`, this step included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kl_average: Option<f64>,
    /// The largest |log ratio| of a token at the update's first minibatch, where the policy is
    /// still the one that sampled: rounding-sized unless sampling and training disagree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_abs_log_ratio: Option<f64>,
    /// Below f32 only: the largest |Δ log p| between the sampler's log-probs and the trainer's
    /// forward of the same tokens, which the update replaced them with (rounding of the two
    /// code paths, not a policy change; see `PackedBatch::rescore_in_reduced_precision`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampler_gap: Option<f64>,
    /// Constrained samples: the probability the unmasked model puts on tokens the grammar
    /// forbids, mean over the first minibatch's tokens before the update (what keeps the adapter
    /// usable without the grammar; `--forbidden-mass-coef` penalizes it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forbidden_mass: Option<f64>,
    /// Optimizer steps the update took (epochs × minibatches; 0 without a group to train on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimizer_steps: Option<usize>,
}

/// The step lines of a run's metrics, in order (rollback lines left out).
pub fn steps(lines: &[MetricsLine]) -> impl Iterator<Item = &StepMetrics> {
    lines.iter().filter_map(|line| match line {
        MetricsLine::Step(step) => Some(step.as_ref()),
        MetricsLine::Rollback(_) | MetricsLine::Selection(_) => None,
    })
}

/// The selection points of a run's metrics, in order.
pub fn selection_points(lines: &[MetricsLine]) -> impl Iterator<Item = &SelectionPoint> {
    lines.iter().filter_map(|line| match line {
        MetricsLine::Selection(point) => Some(point),
        MetricsLine::Step(_) | MetricsLine::Rollback(_) => None,
    })
}

impl MetricsLine {
    /// The line without its wall-clock figures: what must agree between a resumed and an
    /// uninterrupted run.
    pub fn without_timings(&self) -> MetricsLine {
        match self {
            MetricsLine::Step(step) => MetricsLine::Step(Box::new(StepMetrics {
                step_seconds: 0.0,
                tokens_per_second: 0.0,
                ..step.as_ref().clone()
            })),
            MetricsLine::Rollback(rollback) => MetricsLine::Rollback(rollback.clone()),
            MetricsLine::Selection(point) => MetricsLine::Selection(SelectionPoint {
                seconds: 0.0,
                ..point.clone()
            }),
        }
    }
}
