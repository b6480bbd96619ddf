//! `arc-rec train`'s library side: the RFT loop over a chat checkpoint (feature `rft`; links
//! libtorch through `trainer`).
//!
//! - [`settings`]: the resolved run configuration (`RUN_DIR/config.json`) and its schedule.
//! - [`run_dir`]: the run directory, atomic checkpoints and `metrics.jsonl` truncation on resume.
//! - [`metrics`]: the lines of `metrics.jsonl`.
//! - [`session`]: the loop (warm-up, RL steps, checkpoints, rollback).
//! - [`rollout`]: n sampled completions of each prompt, graded (RL's batches and eval's).
//! - [`curves`]: the PNG of a run's main curves.
//! - [`evaluation`]: a run's base, warm-up and RL models on the held-out prompts.
//!
//! Data and grading come from [`crate::rft`], advantages from `objectives`, the model, sampling,
//! loss and optimizer from `trainer`. Nothing here touches the database: the command records
//! runs in `training_runs` / `model_versions`.

pub mod curves;
pub mod evaluation;
pub mod metrics;
pub mod rollout;
pub mod run_dir;
pub mod session;
pub mod settings;

pub use metrics::{MetricsLine, Phase, RlMetrics, Rollback, StepMetrics};
pub use run_dir::{CheckpointState, RunDir, read_metrics};
pub use session::{FaultHooks, Observer, TrainOutcome, train};
pub use settings::{DeviceChoice, LrSchedule, TrainSettings, WarmupMode};
