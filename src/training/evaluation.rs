//! Held-out evaluation of a run's models (`arc-rec eval`): n samples and one greedy completion
//! per validation prompt, graded; unbiased pass@k and maj@k for every k ≤ n, format validity and,
//! with the world grader, the true acceptance probability of the greedy recommendation and of the
//! best of k samples, and the true reliability gain.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use objectives::estimate;
use trainer::chat_policy::ChatPolicy;
use trainer::device::Runtime;
use trainer::peft::load_adapter;

use super::rollout::{PromptTokens, Sampling, rollout};
use super::run_dir::{FINAL_ADAPTER_DIR, WARMUP_MODEL_DIR};
use super::session::{derive_seed, lora_config, rl_base};
use super::settings::TrainSettings;
use crate::rft::Grader;

/// Which of a run's models (`arc-rec eval --models`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum RunModel {
    /// The checkpoint the run started from.
    Base,
    /// After the supervised warm-up.
    Warmup,
    /// The warm-up model with RL's adapters.
    Rl,
}

impl RunModel {
    pub fn label(self) -> &'static str {
        match self {
            RunModel::Base => "base",
            RunModel::Warmup => "warm-up",
            RunModel::Rl => "RL",
        }
    }
}

/// The models a finished run has, in order, with the directory each loads from (the adapter's
/// for RL).
pub fn run_models(settings: &TrainSettings, root: &Path) -> Vec<(RunModel, PathBuf)> {
    let mut models = vec![(RunModel::Base, settings.model.clone())];
    let warmup = root.join(WARMUP_MODEL_DIR);
    if settings.sft_steps > 0 && warmup.is_dir() {
        models.push((RunModel::Warmup, warmup));
    }
    let adapter = root.join(FINAL_ADAPTER_DIR);
    if adapter.is_dir() {
        models.push((RunModel::Rl, adapter));
    }
    models
}

/// Loads one of a run's models.
pub fn load_run_model(
    which: RunModel,
    settings: &TrainSettings,
    root: &Path,
    runtime: Runtime,
) -> anyhow::Result<ChatPolicy> {
    let dir = match which {
        RunModel::Base => settings.model.clone(),
        RunModel::Warmup => root.join(WARMUP_MODEL_DIR),
        RunModel::Rl => rl_base(settings, root),
    };
    let (mut policy, _report) = ChatPolicy::load(&dir, runtime)
        .with_context(|| format!("cannot load the {} model {}", which.label(), dir.display()))?;
    if which == RunModel::Rl {
        let adapter = root.join(FINAL_ADAPTER_DIR);
        policy.model.attach_lora(&lora_config(settings))?;
        load_adapter(policy.model.var_store(), &adapter)
            .with_context(|| format!("cannot load the adapter {}", adapter.display()))?;
    }
    Ok(policy)
}

/// How the evaluation samples.
#[derive(Debug, Clone, Copy)]
pub struct EvalSettings {
    /// Samples per prompt (pass@k and maj@k for k = 1..n).
    pub n: usize,
    pub max_new_tokens: usize,
    pub temperature: f64,
    pub seed: u64,
    /// Prompts per generation batch.
    pub batch_prompts: usize,
}

/// One model's figures on the held-out prompts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelReport {
    pub model: RunModel,
    pub path: PathBuf,
    pub prompts: usize,
    /// Share of the sampled completions that are well-formed recommendations.
    pub format_validity: f64,
    /// `pass_at[k − 1]`: unbiased pass@k (accepted), k = 1..n.
    pub pass_at: Vec<f64>,
    /// `maj_at[k − 1]`: maj@k, the acceptance of the most frequent answer of k samples.
    pub maj_at: Vec<f64>,
    /// The greedy completion's figures.
    pub greedy: GreedyFigures,
    /// World grader: `best_of[k − 1]` is the expected true acceptance probability of the best of
    /// k samples (unbiased over k-subsets of the n; a malformed sample counts 0).
    pub best_of: Option<Vec<f64>>,
    /// World grader: the mean true reliability gain of the samples (0 for a malformed one).
    pub reliability_gain: Option<f64>,
    /// Tokens generated.
    pub new_tokens: u64,
    pub seconds: f64,
}

/// Figures of the greedy (temperature 0) recommendation, the model's top answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GreedyFigures {
    pub format_validity: f64,
    pub accepted: f64,
    /// World grader: its mean true acceptance probability.
    pub acceptance_probability: Option<f64>,
    /// World grader: its mean true reliability gain.
    pub reliability_gain: Option<f64>,
}

/// Evaluates `policy` on `prompts`; `progress` is told how many prompts are done.
pub fn evaluate(
    which: RunModel,
    path: &Path,
    policy: &ChatPolicy,
    prompts: &[PromptTokens<'_>],
    grader: &Grader,
    settings: EvalSettings,
    progress: &mut dyn FnMut(usize),
) -> anyhow::Result<ModelReport> {
    let started = Instant::now();
    let n = settings.n;
    let world = grader.kind() == crate::rft::GraderKind::World;
    let mut sums = Sums::new(n);
    let mut done = 0;
    for batch in prompts.chunks(settings.batch_prompts.max(1)) {
        let picks: Vec<&PromptTokens<'_>> = batch.iter().collect();
        let sampled = rollout(
            policy,
            &picks,
            Sampling {
                n,
                max_new_tokens: settings.max_new_tokens,
                temperature: settings.temperature,
                seed: settings.seed,
            },
            grader,
            settings.seed,
        )?;
        let greedy = rollout(
            policy,
            &picks,
            Sampling {
                n: 1,
                max_new_tokens: settings.max_new_tokens,
                temperature: 0.0,
                seed: settings.seed,
            },
            grader,
            settings.seed,
        )?;
        sums.new_tokens += sampled.new_tokens + greedy.new_tokens;
        for (index, (group, top)) in sampled.groups.iter().zip(&greedy.groups).enumerate() {
            let accepted = group.accepted();
            let correct = accepted.iter().filter(|&&a| a > 0.0).count();
            let mut rng =
                ChaCha8Rng::seed_from_u64(derive_seed(&[settings.seed, batch[index].key]));
            let mut priority: Vec<usize> = (0..group.answer_classes()).collect();
            priority.shuffle(&mut rng);
            let probabilities: Vec<f64> = group
                .samples
                .iter()
                .map(|s| s.verdict.acceptance_probability.unwrap_or(0.0))
                .collect();
            for k in 1..=n {
                sums.pass_at[k - 1] += estimate::pass_at_k(n, correct, k)?;
                sums.maj_at[k - 1] +=
                    estimate::majority_at_k(&accepted, &group.answers, &priority, k)?;
                sums.best_of[k - 1] += estimate::expected_best_of_k(&probabilities, k)?;
            }
            for sample in &group.samples {
                sums.valid += f64::from(u8::from(sample.verdict.format_valid));
                sums.reliability_gain += sample.verdict.reliability_gain.unwrap_or(0.0);
            }
            if let Some(top) = top.samples.first() {
                let verdict = &top.verdict;
                sums.greedy_valid += f64::from(u8::from(verdict.format_valid));
                sums.greedy_accepted += f64::from(u8::from(verdict.accepted));
                sums.greedy_probability += verdict.acceptance_probability.unwrap_or(0.0);
                sums.greedy_gain += verdict.reliability_gain.unwrap_or(0.0);
            }
        }
        done += batch.len();
        progress(done);
    }
    let count = prompts.len().max(1) as f64;
    let samples = count * n as f64;
    let mean = |values: Vec<f64>| values.into_iter().map(|v| v / count).collect::<Vec<_>>();
    Ok(ModelReport {
        model: which,
        path: path.to_owned(),
        prompts: prompts.len(),
        format_validity: sums.valid / samples,
        pass_at: mean(sums.pass_at),
        maj_at: mean(sums.maj_at),
        greedy: GreedyFigures {
            format_validity: sums.greedy_valid / count,
            accepted: sums.greedy_accepted / count,
            acceptance_probability: world.then(|| sums.greedy_probability / count),
            reliability_gain: world.then(|| sums.greedy_gain / count),
        },
        best_of: world.then(|| mean(sums.best_of)),
        reliability_gain: world.then(|| sums.reliability_gain / samples),
        new_tokens: sums.new_tokens,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Running sums over prompts.
struct Sums {
    pass_at: Vec<f64>,
    maj_at: Vec<f64>,
    best_of: Vec<f64>,
    valid: f64,
    reliability_gain: f64,
    greedy_valid: f64,
    greedy_accepted: f64,
    greedy_probability: f64,
    greedy_gain: f64,
    new_tokens: u64,
}

impl Sums {
    fn new(n: usize) -> Self {
        Self {
            pass_at: vec![0.0; n],
            maj_at: vec![0.0; n],
            best_of: vec![0.0; n],
            valid: 0.0,
            reliability_gain: 0.0,
            greedy_valid: 0.0,
            greedy_accepted: 0.0,
            greedy_probability: 0.0,
            greedy_gain: 0.0,
            new_tokens: 0,
        }
    }
}
