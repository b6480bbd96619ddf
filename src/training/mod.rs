//! `arc-rec train`'s library side: the RFT loop over a chat checkpoint (feature `rft`; links
//! libtorch through `trainer`).
//!
//! - [`settings`]: the resolved run configuration (`RUN_DIR/config.json`) and its schedule.
//! - [`run_dir`]: the run directory, atomic checkpoints and `metrics.jsonl` truncation on resume.
//! - [`metrics`]: the lines of `metrics.jsonl`.
//! - [`session`]: the loop (warm-up, RL steps, checkpoints, rollback), stringing together:
//! - [`warmup`]: the supervised warm-up step;
//! - [`rollout`]: n sampled completions of each prompt, graded (RL's batches, with advantages and
//!   dynamic sampling, and eval's);
//! - [`update`]: the clipped policy update, epochs × minibatches over a rollout batch;
//! - [`guard`]: the adaptive KL coefficient, the divergence guard and what a rollback changes;
//! - [`seeds`]: the random streams (seed, step, salt) and the data orders.
//! - [`curves`]: the PNG of a run's main curves.
//! - [`selection`]: the world-free checkpoint criterion (`--eval-every`, `--select-by`) and the
//!   choice of the run's RL adapter.
//! - [`summary`]: a finished run's `summary.json` and curves.
//! - [`evaluation`]: a run's base, warm-up and RL models on the held-out prompts.
//! - [`eval_run`]: `arc-rec eval`'s prompts, graders, models and report (`eval.json`, `eval.png`).
//! - [`baselines`]: eval's floors and ceiling (logged heuristic, random pick, menu oracle).
//! - [`candidates`]: a finished run's model writing candidates for serving (`arc-rec candidates`).
//! - [`model_bench`]: `arc-rec bench model`'s phases, figures and comparison with the reference.
//!
//! Data and grading come from [`crate::rft`], advantages from `objectives`, the model, sampling,
//! loss and optimizer from `trainer`. Nothing here touches the database: the command records
//! runs in `training_runs` / `model_versions`.

pub mod baselines;
pub mod candidates;
pub mod curves;
pub mod eval_run;
pub mod evaluation;
pub mod guard;
pub mod learned_grader_fit;
pub mod metrics;
pub mod model_bench;
pub mod rollout;
pub mod run_dir;
pub mod seeds;
pub mod selection;
pub mod session;
pub mod settings;
pub mod summary;
pub mod update;
pub mod warmup;

pub use metrics::{MetricsLine, Phase, RlMetrics, Rollback, StepMetrics};
pub use run_dir::{CheckpointState, RunDir, read_metrics};
pub use session::{FaultHooks, Observer, TrainOutcome, train};
pub use settings::{Constrained, DeviceChoice, LrSchedule, TrainSettings, WarmupMode};
