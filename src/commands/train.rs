//! `arc-rec train`: reinforcement fine-tuning of the recommender from an export file: a
//! supervised warm-up on accepted recommendations, then pass@k-aware policy-gradient steps, into a
//! run directory that `--resume` continues exactly after a crash. Records the run in
//! `training_runs` / `model_versions` unless `--no-record`.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use indicatif::ProgressBar;
use serde_json::{Value, json};

use objectives::Objective;

use super::DatabaseArgs;
use crate::rft::{GraderError, GraderKind, RftDataset, WorldReward, WorldTruths};
use crate::storage::training_runs::{self, RunStatus};
use crate::training::learned_grader_fit::FitOn;
use crate::training::run_dir::{
    Checkpoint, LEARNED_GRADER_FILE, RUN_ID_FILE, absolute, read_run_id,
};
use crate::training::selection::Criterion;
use crate::training::summary::{summarize, write_report};
use crate::training::{
    Constrained, DeviceChoice, FaultHooks, LrSchedule, Observer, RunDir, StepMetrics, TrainOutcome,
    TrainSettings, WarmupMode, read_metrics,
};
/// Hidden fault injection for the crash tests: SIGKILL while writing this step's checkpoint.
const KILL_IN_CHECKPOINT_ENV: &str = "ARC_REC_TEST_KILL_IN_CHECKPOINT";
/// Hidden fault injection for the rollback test: a NaN loss at this step.
const NAN_LOSS_ENV: &str = "ARC_REC_TEST_NAN_LOSS_AT";
/// Hidden fault injection for the selection gate's test: RL with negated advantages (`1`).
const INVERT_ADVANTAGES_ENV: &str = "ARC_REC_TEST_INVERT_ADVANTAGES";

/// Arguments of `arc-rec train`. The defaults suit the tiny preset on a CPU.
#[derive(Debug, Args)]
pub struct TrainArgs {
    /// Continue the run in this directory from its last checkpoint, with its recorded settings
    /// (the training options are ignored; --no-record still applies).
    #[arg(long, value_name = "RUN_DIR", conflicts_with_all = ["data", "model", "out"])]
    pub resume: Option<PathBuf>,
    /// Training examples in arc format (`arc-rec export --out FILE`).
    #[arg(long, required_unless_present = "resume")]
    pub data: Option<PathBuf>,
    /// Base checkpoint directory (Hugging Face layout; `arc-rec model init` writes one).
    #[arg(long, required_unless_present = "resume")]
    pub model: Option<PathBuf>,
    /// Run directory to create (must not exist or be empty).
    #[arg(long, required_unless_present = "resume")]
    pub out: Option<PathBuf>,
    /// What the advantages optimise: mean (RLOO), pass@k, biased-pass@k or majority (maj@k).
    #[arg(long, default_value = "pass@k", value_parser = parse_objective)]
    pub objective: Objective,
    /// k of pass@k and maj@k (≥ 2).
    #[arg(long, default_value_t = 4)]
    pub k: usize,
    /// Samples per prompt (≥ k; n > k uses PKPO's estimator).
    #[arg(long, default_value_t = 8)]
    pub n: usize,
    /// Prompts per RL step.
    #[arg(long, default_value_t = 4)]
    pub prompts_per_step: usize,
    /// RL steps. 200 is the measured recipe's (docs/experiments/rft-defaults-world1-world7.md):
    /// a run's acceptance often dips below its warm-up's before it gains, and a shorter run can
    /// end in the dip.
    #[arg(long, default_value_t = 200)]
    pub steps: u64,
    /// Supervised warm-up steps on accepted recommendations before RL.
    #[arg(long, default_value_t = 300)]
    pub sft_steps: u64,
    /// Examples per warm-up step.
    #[arg(long, default_value_t = 16)]
    pub sft_batch: usize,
    /// What the warm-up trains: every weight (full), LoRA adapters merged in afterwards (lora),
    /// or full up to 100M parameters and lora above (auto). RL always trains fresh LoRA adapters
    /// on the warm-up model.
    #[arg(long, value_enum, default_value_t = WarmupMode::Auto)]
    pub warmup: WarmupMode,
    /// Where rewards come from: exact matches with logged approvals (logged), the synthetic
    /// world's ground truth (world), or a reward model fitted on the train split's logged
    /// approvals and rejections that scores any diff (learned; reads each organization's
    /// candidate index from the database once, then keeps the fit in RUN_DIR/grader.json).
    /// Default: world when every configuration of the data is one the world of --world-seed and
    /// --world-outcomes simulated, else learned (a platform's own data).
    #[arg(long, value_enum)]
    pub grader: Option<GraderKind>,
    /// κ of `--grader learned`: the owner accepts with the pessimistic probability σ(μ − κ·s)
    /// of the reward model's posterior (log-odds mean μ, standard deviation s), so a diff far
    /// from anything logged earns little whatever its mean says.
    #[arg(long, default_value_t = crate::rft::learned_grader::DEFAULT_LCB_Z)]
    pub learned_lcb_z: f64,
    /// What `--grader learned` rewards as p = 0 (the floor) rather than by σ(μ − κ·s): diffs
    /// bringing in a model or tool the organization never ran and diffs with a feature beyond
    /// the range of the logged decisions (ranges), or only the first (models). Serving priors
    /// from `candidates` keep both floors either way.
    #[arg(long, value_enum, default_value_t = crate::rft::learned_grader::LearnedFloor::Ranges)]
    pub learned_floor: crate::rft::learned_grader::LearnedFloor,
    /// How `--grader learned`'s fit weighs answers to recommendations arc-rec served: as they
    /// came (none), or by 1/logged propensity, self-normalised and capped at 20 (ips), to fit
    /// as if every candidate had been shown alike. See docs/experiments/served-weighting.md.
    #[arg(long, value_enum, default_value_t = crate::rft::learned_grader::ServedWeighting::None)]
    pub learned_served_weighting: crate::rft::learned_grader::ServedWeighting,
    /// Seed of the synthetic world the data came from (`--grader world`).
    #[arg(long, default_value_t = 1)]
    pub world_seed: u64,
    /// Outcomes of that world (`arc-rec simulate --outcomes`).
    #[arg(long, default_value_t = crate::world::WorldParams::default().outcomes)]
    pub world_outcomes: usize,
    /// The world and learned graders' reward: +1/−1 from one acceptance draw (sampled, the
    /// plan's binary reward), or its expectation 2p − 1 under the acceptance probability p (the
    /// world's true one, or the learned grader's lower bound; expected: no draw noise). Verdicts
    /// and pass@k figures come from the draw either way.
    #[arg(long, value_enum, default_value_t = WorldReward::Sampled)]
    pub world_reward: WorldReward,
    /// Leave out the +0.1 reward for a well-formed recommendation.
    #[arg(long)]
    pub no_format_bonus: bool,
    /// Seeds data order, sampling, verdict draws and tie-breaks.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Peak learning rate of the RL phase.
    #[arg(long, default_value_t = 2e-3)]
    pub learning_rate: f64,
    /// Peak learning rate of the warm-up.
    #[arg(long, default_value_t = 5e-3)]
    pub sft_learning_rate: f64,
    #[arg(long, value_enum, default_value_t = LrSchedule::Cosine)]
    pub lr_schedule: LrSchedule,
    /// Linear warm-up steps of each phase's learning rate.
    #[arg(long, default_value_t = 5)]
    pub lr_warmup_steps: u64,
    /// Clip the global gradient norm of the trained weights to this.
    #[arg(long, default_value_t = 1.0)]
    pub max_grad_norm: f64,
    /// AdamW's decoupled weight decay.
    #[arg(long, default_value_t = 0.0)]
    pub weight_decay: f64,
    /// Recompute each decoder layer in the backward pass instead of keeping its activations:
    /// the same gradients, about a third more compute, activation memory down to one hidden
    /// state per layer (what a 7B model with k = 8 × 512-token completions needs on an 80 GB GPU).
    #[arg(long)]
    pub gradient_checkpointing: bool,
    /// LoRA rank.
    #[arg(long, default_value_t = 16)]
    pub lora_r: i64,
    #[arg(long, default_value_t = 32.0)]
    pub lora_alpha: f64,
    /// Dropout on the LoRA adapters' input in the warm-up's steps; RL scores its samples with
    /// it off, as they were drawn.
    #[arg(long, default_value_t = 0.0)]
    pub lora_dropout: f64,
    /// Most tokens per sampled completion. The world's longest accepted recommendation is 110
    /// tokens of the tiny preset's tokenizer (a whole tool list); 96 cut 1% of them. Under the
    /// grammar a sample near the limit is closed by the grammar's shortest way, not cut.
    #[arg(long, default_value_t = 128)]
    pub max_new_tokens: usize,
    /// Sampling temperature of the RL samples (their log-probs, the loss's and the reference's
    /// are all taken at it).
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f64,
    /// Draw RL's samples under the recommendation's JSON grammar (llguidance over the model's
    /// tokenizer): every sample is well-formed, and the loss scores the masked distribution
    /// the samples came from.
    #[arg(long, value_enum, default_value_t = Constrained::On)]
    pub constrained: Constrained,
    /// PPO clipping ε against the sampling policy.
    #[arg(long, default_value_t = 0.2)]
    pub clip_epsilon: f64,
    /// The upper side's clipping ε (clip-higher, DAPO's 0.28): lets rare tokens with a positive
    /// advantage grow further than common ones may shrink. Default: --clip-epsilon.
    #[arg(long)]
    pub clip_epsilon_high: Option<f64>,
    /// Plain policy gradient without the clipped surrogate.
    #[arg(long)]
    pub no_clip: bool,
    /// Policy-update passes over each rollout batch (μ). Above 1 (or with --minibatches above 1)
    /// the policy moves away from the one that sampled and the clip bounds each step.
    #[arg(long, default_value_t = 1)]
    pub update_epochs: usize,
    /// Minibatches of whole groups per pass, one optimizer step each (≤ --prompts-per-step).
    #[arg(long, default_value_t = 1)]
    pub minibatches: usize,
    /// Weight of the forbidden-mass penalty in the RL update: the mean −log P(the grammar's
    /// allowed tokens) under the unmasked model, added to the loss, so the adapter keeps its
    /// mass on the grammar's tokens and stays usable without the grammar (constrained runs
    /// only; the metrics' forbidden_mass shows that mass either way). 0 is off.
    #[arg(long, default_value_t = 0.0)]
    pub forbidden_mass_coef: f64,
    /// β of the k3 KL penalty to the warm-up model (RL's adapters off); with --kl-target, its
    /// starting value. Default: 0 (no penalty), but under `--grader learned` 0.05 with
    /// --kl-target 0.1 (a KL budget: a free policy over-optimises the learned reward model);
    /// `--kl-coef 0` turns it off.
    #[arg(long)]
    pub kl_coef: Option<f64>,
    /// Adapt β towards this KL per token (Ziegler et al.'s controller); needs --kl-coef > 0.
    /// Default: none, but 0.1 under `--grader learned` when --kl-coef is not given either.
    #[arg(long)]
    pub kl_target: Option<f64>,
    /// The KL controller's horizon in samples: β moves by at most ±20 % × samples / horizon a step.
    #[arg(long, default_value_t = crate::training::settings::DEFAULT_KL_HORIZON)]
    pub kl_horizon: u64,
    /// Dynamic sampling (DAPO): draw more rounds of --prompts-per-step prompts until that many
    /// groups carry signal (not all advantages zero), at most --max-sampling-rounds rounds.
    #[arg(long)]
    pub dynamic_sampling: bool,
    /// Most rounds of --prompts-per-step prompts a step draws with --dynamic-sampling.
    #[arg(long, default_value_t = 3)]
    pub max_sampling_rounds: usize,
    /// Keep groups whose advantages are all zero in the update (they add nothing but cost).
    #[arg(long)]
    pub keep_zero_advantage_groups: bool,
    /// Checkpoint every this many steps (and at the end of each phase).
    #[arg(long, default_value_t = 10)]
    pub checkpoint_every: u64,
    /// Score the policy every this many RL steps (and at RL's first step, the warm-up model,
    /// and its last) on the validation split's logged decisions, with no world, and keep the
    /// checkpoint that scores best as the run's RL adapter (0: keep the last one). When none
    /// beats the warm-up by more than its noise (the best of m points: z_m standard errors, 1
    /// for one, 1.94 for six), the run keeps the warm-up itself, the summary says so and
    /// `candidates` refuses the run's ideas without --force.
    #[arg(long, default_value_t = 25)]
    pub eval_every: u64,
    /// What checkpoints are chosen by: how much more log-probability the policy gained since the
    /// warm-up on accepted held-out answers than on rejected ones (logprob-margin), the
    /// self-normalised estimate of acceptance over each held-out context's logged answers
    /// (menu-acceptance), or the share of its (accepted, rejected) pairs the policy orders right
    /// (pair-accuracy).
    #[arg(long, value_enum, default_value_t = Criterion::LogprobMargin)]
    pub select_by: Criterion,
    /// Keep every scored checkpoint's adapter (RUN_DIR/eval-point-STEP) after the run, not
    /// only the chosen one (as RUN_DIR/adapter).
    #[arg(long)]
    pub keep_eval_points: bool,
    /// Moving average (weight 0.2 on the newest step) of the KL per token to the warm-up model
    /// above which the run counts as diverged and rolls back: to the newest calm checkpoint (KL
    /// average at most half this, newest step's KL within it), with the learning rate halved, the
    /// KL coefficient doubled (at least 0.02) and the retried steps drawing other prompts and
    /// samples.
    #[arg(long, default_value_t = 2.0)]
    pub max_kl: f64,
    /// Rollbacks before the run gives up.
    #[arg(long, default_value_t = 3)]
    pub max_rollbacks: u32,
    #[arg(long, value_enum, default_value_t = DeviceChoice::Auto)]
    pub device: DeviceChoice,
    /// Do not record the run in the database (`training_runs`, `model_versions`).
    #[arg(long)]
    pub no_record: bool,
}

fn parse_objective(text: &str) -> Result<Objective, String> {
    text.parse::<Objective>().map_err(|e| e.to_string())
}

impl TrainArgs {
    /// The run's settings with `grader` (the flag's, or the one the data called for).
    fn settings(&self, grader: GraderKind) -> Option<TrainSettings> {
        let (kl_coef, kl_target) =
            crate::training::settings::kl_budget(grader, self.kl_coef, self.kl_target);
        Some(TrainSettings {
            data: self.data.clone()?,
            model: self.model.clone()?,
            objective: self.objective,
            k: self.k,
            n: self.n,
            prompts_per_step: self.prompts_per_step,
            steps: self.steps,
            sft_steps: self.sft_steps,
            sft_batch: self.sft_batch,
            warmup: self.warmup,
            grader,
            world_seed: self.world_seed,
            world_outcomes: self.world_outcomes,
            world_reward: self.world_reward,
            learned_lcb_z: self.learned_lcb_z,
            learned_floor: self.learned_floor,
            learned_served_weighting: self.learned_served_weighting,
            format_bonus: !self.no_format_bonus,
            seed: self.seed,
            learning_rate: self.learning_rate,
            sft_learning_rate: self.sft_learning_rate,
            lr_schedule: self.lr_schedule,
            lr_warmup_steps: self.lr_warmup_steps,
            max_grad_norm: self.max_grad_norm,
            weight_decay: self.weight_decay,
            gradient_checkpointing: self.gradient_checkpointing,
            lora_r: self.lora_r,
            lora_alpha: self.lora_alpha,
            lora_dropout: self.lora_dropout,
            max_new_tokens: self.max_new_tokens,
            temperature: self.temperature,
            constrained: self.constrained,
            clip_epsilon: (!self.no_clip).then_some(self.clip_epsilon),
            clip_epsilon_high: self.clip_epsilon_high,
            update_epochs: self.update_epochs,
            forbidden_mass_coef: self.forbidden_mass_coef,
            minibatches: self.minibatches,
            kl_target,
            kl_horizon: self.kl_horizon,
            dynamic_sampling: self.dynamic_sampling,
            max_sampling_rounds: self.max_sampling_rounds,
            kl_coef,
            skip_zero_advantage_groups: !self.keep_zero_advantage_groups,
            checkpoint_every: self.checkpoint_every,
            eval_every: self.eval_every,
            select_by: self.select_by,
            keep_eval_points: self.keep_eval_points,
            max_kl: self.max_kl,
            max_rollbacks: self.max_rollbacks,
            device: self.device,
        })
    }
}

/// Runs `arc-rec train`.
pub async fn run(args: &TrainArgs, database: &DatabaseArgs) -> anyhow::Result<()> {
    let Prepared {
        run,
        settings,
        start,
        run_id,
        dataset,
    } = match &args.resume {
        Some(dir) => Prepared::resume(dir)?,
        None => Prepared::create(args, database).await?,
    };
    let root = run.root().to_path_buf();
    let record = RunRecord::start(args.no_record, database, &dataset, &run_id, &settings).await?;
    print_plan(&settings, &root);
    let hooks = FaultHooks {
        kill_in_checkpoint: env_step(KILL_IN_CHECKPOINT_ENV),
        nan_loss_at: env_step(NAN_LOSS_ENV),
        invert_advantages: std::env::var(INVERT_ADVANTAGES_ENV).is_ok_and(|v| v == "1"),
    };
    let mut observer = Console::new(settings.total_steps());
    let outcome = tokio::task::block_in_place(|| {
        crate::training::train(run, &settings, &dataset, start, hooks, &mut observer)
    });
    observer.finish();
    let lines = read_metrics(&root)?;
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err(error) => {
            record.failed(database, &error, summarize(&lines)).await;
            return Err(error);
        }
    };
    let report = write_report(&root, &run_id, &outcome, &lines)?;
    record
        .succeeded(database, &outcome, &settings, &report.summary)
        .await?;
    let overoptimisation = report
        .overoptimisation
        .map(|path| format!("; learned reward vs truth {}", path.display()))
        .unwrap_or_default();
    println!(
        "done: {} steps on {} ({} rollbacks); adapter {}; curves {}{overoptimisation}; metrics {}",
        outcome.steps,
        outcome.device,
        outcome.rollbacks,
        outcome.final_adapter.display(),
        report.curves.display(),
        root.join(crate::training::run_dir::METRICS_FILE).display()
    );
    Ok(())
}

/// A run ready to train: its directory, settings, the checkpoint it resumes from, its id and its
/// data. Everything that can be checked without the model is checked before a run directory is
/// made, so a typo does not leave a half-made run behind.
struct Prepared {
    run: RunDir,
    settings: TrainSettings,
    start: Option<Checkpoint>,
    run_id: String,
    dataset: RftDataset,
}

impl Prepared {
    fn resume(dir: &Path) -> anyhow::Result<Self> {
        let (run, settings, start) = RunDir::resume(dir)?;
        let run_id = read_run_id(dir, "--resume")?;
        let dataset = load_data(&settings)?;
        Ok(Self {
            run,
            settings,
            start,
            run_id,
            dataset,
        })
    }

    async fn create(args: &TrainArgs, database: &DatabaseArgs) -> anyhow::Result<Self> {
        let required = "--data, --model and --out are required";
        // The data decides the default grader; every other setting is checked first, so a typo
        // is named before the data is read.
        let provisional = args
            .settings(args.grader.unwrap_or(GraderKind::World))
            .context(required)?;
        provisional.validate().map_err(anyhow::Error::msg)?;
        let dataset = load_data(&provisional)?;
        let grader = choose_grader(args.grader, &provisional, &dataset)?;
        let settings = args.settings(grader).context(required)?;
        settings.validate().map_err(anyhow::Error::msg)?;
        if !settings.model.join("config.json").is_file() {
            anyhow::bail!(
                "--model {}: not a model checkpoint (no config.json); write one with `arc-rec model init --preset tiny --out DIR`",
                settings.model.display()
            );
        }
        let learned = match settings.grader {
            GraderKind::Learned => Some(
                super::fit_learned_grader(database, &settings, &dataset, FitOn::TrainSplit).await?,
            ),
            GraderKind::Logged | GraderKind::World => None,
        };
        let out = args.out.clone().context("--out is required")?;
        let run = RunDir::create(&out, &settings)?;
        if let Some(grader) = learned {
            run.write_file(LEARNED_GRADER_FILE, &serde_json::to_vec(&grader.to_file())?)?;
        }
        let run_id = format!("rft-{}", uuid::Uuid::now_v7());
        run.write_file(RUN_ID_FILE, run_id.as_bytes())?;
        Ok(Self {
            run,
            settings,
            start: None,
            run_id,
            dataset,
        })
    }
}

/// The run's grader: `--grader` when given (the world's checked against the data here, before
/// a run directory or a database row exists), else world for data the world of `--world-seed`
/// and `--world-outcomes` simulated (its configurations are seeded UUIDs no platform shares) and
/// learned for anything else.
fn choose_grader(
    flag: Option<GraderKind>,
    settings: &TrainSettings,
    dataset: &RftDataset,
) -> anyhow::Result<GraderKind> {
    let fits_world = || WorldTruths::new(settings.world_params(), &dataset.prompts);
    match flag {
        Some(GraderKind::World) => {
            fits_world().map_err(GraderError::from)?;
            Ok(GraderKind::World)
        }
        Some(kind) => Ok(kind),
        None => Ok(match fits_world() {
            Ok(_) => GraderKind::World,
            Err(_) => {
                println!(
                    "grader: learned (the data's configurations are not those of the world of --world-seed {} and --world-outcomes {}; give --grader to choose)",
                    settings.world_seed, settings.world_outcomes
                );
                GraderKind::Learned
            }
        }),
    }
}

fn load_data(settings: &TrainSettings) -> anyhow::Result<RftDataset> {
    let dataset = RftDataset::load(&settings.data)
        .with_context(|| format!("--data {}", settings.data.display()))?;
    crate::training::session::train_split(&dataset, &settings.data)?;
    Ok(dataset)
}

fn print_plan(settings: &TrainSettings, root: &Path) {
    println!(
        "training {} on {} ({} warm-up + {} RL steps, objective {} with k = {}, n = {}) into {}",
        settings.model.display(),
        settings.data.display(),
        settings.sft_steps,
        settings.steps,
        settings.objective.as_str(),
        settings.k,
        settings.n,
        root.display()
    );
    if settings.steps > 0 && settings.kl_coef > 0.0 {
        match settings.kl_target {
            Some(target) => println!(
                "KL penalty: β {} to start, adapted towards {target} per token",
                settings.kl_coef
            ),
            None => println!("KL penalty: β {}", settings.kl_coef),
        }
    }
}

/// The run's rows in `training_runs` / `model_versions`, for each organization of its data
/// (none with `--no-record`).
struct RunRecord {
    orgs: Vec<String>,
    run_id: String,
    config: Value,
}

impl RunRecord {
    /// Records the run as running; an error when an organization of the data is unknown.
    async fn start(
        no_record: bool,
        database: &DatabaseArgs,
        dataset: &RftDataset,
        run_id: &str,
        settings: &TrainSettings,
    ) -> anyhow::Result<Self> {
        let config = serde_json::to_value(settings)?;
        let mut record = RunRecord {
            orgs: Vec::new(),
            run_id: run_id.to_owned(),
            config,
        };
        if no_record {
            return Ok(record);
        }
        let orgs = dataset.organizations();
        let (run_id, config) = (record.run_id.clone(), record.config.clone());
        record.orgs = super::with_database(database, |pool| async move {
            let unknown = training_runs::unknown_orgs(&pool, &orgs).await?;
            if !unknown.is_empty() {
                anyhow::bail!(
                    "cannot record the run: organization(s) {} of --data are not in the database (pass --no-record to train without recording)",
                    unknown.join(", ")
                );
            }
            training_runs::upsert_run(&pool, &orgs, &run_id, &config, RunStatus::Running, None)
                .await?;
            Ok(orgs)
        })
        .await?;
        Ok(record)
    }

    /// Records the failure, best effort: the training error is what the user needs to see.
    async fn failed(&self, database: &DatabaseArgs, error: &anyhow::Error, last: Value) {
        if self.orgs.is_empty() {
            return;
        }
        let failed = json!({"error": format!("{error:#}"), "last": last});
        let _ = super::with_database(database, |pool| async move {
            training_runs::upsert_run(
                &pool,
                &self.orgs,
                &self.run_id,
                &self.config,
                RunStatus::Failed,
                Some(&failed),
            )
            .await?;
            Ok(())
        })
        .await;
    }

    /// Records the run as succeeded and its model version (base checkpoint + adapter).
    async fn succeeded(
        &self,
        database: &DatabaseArgs,
        outcome: &TrainOutcome,
        settings: &TrainSettings,
        summary: &Value,
    ) -> anyhow::Result<()> {
        if self.orgs.is_empty() {
            return Ok(());
        }
        let adapter = absolute(&outcome.final_adapter).display().to_string();
        let base = absolute(&settings.model).display().to_string();
        super::with_database(database, |pool| async move {
            training_runs::upsert_run(
                &pool,
                &self.orgs,
                &self.run_id,
                &self.config,
                RunStatus::Succeeded,
                Some(summary),
            )
            .await?;
            training_runs::upsert_model_version(
                &pool,
                &self.orgs,
                &self.run_id,
                &base,
                &adapter,
                summary,
            )
            .await?;
            Ok(())
        })
        .await?;
        println!(
            "recorded run and model version for {} organization(s)",
            self.orgs.len()
        );
        Ok(())
    }
}

fn env_step(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.parse().ok()
}

/// Progress: a bar on a terminal, one line per ten steps otherwise.
struct Console {
    bar: Option<ProgressBar>,
}

impl Console {
    fn new(total: u64) -> Self {
        let bar = std::io::stderr()
            .is_terminal()
            .then(|| crate::progress::bar(total, "train", false));
        Self { bar }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

impl Observer for Console {
    fn step(&mut self, metrics: &StepMetrics, total_steps: u64) {
        let line = match &metrics.rl {
            Some(rl) => format!(
                "step {}/{} rl: reward {:+.3} pass@1 {:.3} pass@k {:.3} maj@k {:.3} valid {:.2} signal {:.2} kl {:.4} ({:.1} s, {:.0} tok/s)",
                metrics.step + 1,
                total_steps,
                rl.reward_mean,
                rl.pass_at_1,
                rl.pass_at_k,
                rl.maj_at_k,
                rl.format_validity,
                rl.nonzero_advantage_fraction,
                rl.kl,
                metrics.step_seconds,
                metrics.tokens_per_second
            ),
            None => format!(
                "step {}/{} warm-up: loss {:.4} grad norm {:.3} lr {:.2e}",
                metrics.step + 1,
                total_steps,
                metrics.loss,
                metrics.grad_norm,
                metrics.learning_rate
            ),
        };
        match &self.bar {
            Some(bar) => {
                bar.set_position(metrics.step + 1);
                bar.set_message(if metrics.rl.is_some() {
                    "rl"
                } else {
                    "warm-up"
                });
                if (metrics.step + 1).is_multiple_of(10) {
                    bar.println(line);
                }
            }
            None => {
                if (metrics.step + 1).is_multiple_of(10) || metrics.step + 1 == total_steps {
                    println!("{line}");
                }
            }
        }
    }

    fn note(&mut self, message: &str) {
        match &self.bar {
            Some(bar) => bar.println(message),
            None => println!("{message}"),
        }
    }
}
