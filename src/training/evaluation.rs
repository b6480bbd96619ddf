//! Held-out evaluation of a run's models (`arc-rec eval`): n samples and one greedy completion
//! per validation prompt, graded; unbiased pass@k and maj@k for every k ≤ n, format validity and,
//! with the world grader, the true acceptance probability of the greedy recommendation and of the
//! best of k samples, and the true reliability gain; each prompt's figures too, so runs can be
//! compared prompt by prompt (paired), and with [`super::baselines`] the share of the gap to the
//! menu oracle a model closes. A learned-grader run evaluated by the world also says how good its
//! reward model is as a chooser: the truth of the sample it ranks first among k.

use std::collections::BTreeMap;
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

use super::baselines::gap_closed;
use super::rollout::{PromptTokens, Sampling, rollout};
use super::run_dir::{FINAL_ADAPTER_DIR, WARMUP_MODEL_DIR};
use super::seeds::derive_seed;
use super::session::{lora_config, rl_base};
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

/// The k of the gap-closed figure's best of k: 4, or n when fewer samples are drawn.
pub fn gap_k(n: usize) -> usize {
    n.min(4)
}

/// The model the gap to the oracle is measured from, among those evaluated: the warm-up model,
/// or the base of a run that did no warm-up of its own (an RL run started from another run's
/// warm-up model has that model as its base). `sft_steps` is the run's. `None` when it was not
/// evaluated.
pub fn gap_reference(sft_steps: u64, evaluated: &[RunModel]) -> Option<RunModel> {
    if evaluated.contains(&RunModel::Warmup) {
        Some(RunModel::Warmup)
    } else if sft_steps == 0 && evaluated.contains(&RunModel::Base) {
        Some(RunModel::Base)
    } else {
        None
    }
}

/// Fills in [`ModelReport::gap_closed`] of every report but `reference`'s, from the mean menu
/// oracle of the same prompts; does nothing when `reference` is not among `reports` or the
/// reports have no true acceptance (logged grader).
pub fn fill_gap_closed(reports: &mut [ModelReport], reference: RunModel, menu_oracle: f64) {
    let Some(base) = reports.iter().find(|r| r.model == reference) else {
        return;
    };
    let best_of = |report: &ModelReport, k: usize| {
        report
            .best_of
            .as_deref()
            .and_then(|values| values.get(k.checked_sub(1)?).copied())
    };
    let figures: Vec<(Option<f64>, Option<f64>)> = reports
        .iter()
        .map(|r| {
            let k = gap_k(r.pass_at.len());
            (best_of(r, k), r.greedy.acceptance_probability)
        })
        .collect();
    let k = gap_k(base.pass_at.len());
    let (base_best, base_greedy) = (best_of(base, k), base.greedy.acceptance_probability);
    if base_best.is_none() && base_greedy.is_none() {
        return;
    }
    for (report, (best, greedy)) in reports.iter_mut().zip(figures) {
        if report.model == reference {
            continue;
        }
        let gap = |model: Option<f64>, start: Option<f64>| gap_closed(model?, start?, menu_oracle);
        report.gap_closed = Some(GapClosed {
            reference,
            k,
            best_of: gap(best, base_best),
            greedy: gap(greedy, base_greedy),
        });
    }
}

/// How the evaluation samples.
#[derive(Debug, Clone, Copy)]
pub struct EvalSettings<'a> {
    /// Samples per prompt (pass@k and maj@k for k = 1..n).
    pub n: usize,
    pub max_new_tokens: usize,
    pub temperature: f64,
    pub seed: u64,
    /// Prompts per generation batch.
    pub batch_prompts: usize,
    /// Draw every completion under the recommendation grammar.
    pub constrained: bool,
    /// The organizations' model and tool names the grammar allows.
    pub catalogues: &'a crate::rft::dataset::Catalogues,
    /// Keep every graded completion in [`ModelReport::samples`] (`eval --samples-out`).
    pub keep_samples: bool,
    /// A learned grader that ranks each prompt's samples beside the world grader's verdicts
    /// ([`ModelReport::learned_pick_of`]); `None` for no such figure.
    pub reward_model: Option<&'a Grader>,
}

/// One graded completion of an evaluation (`eval --samples-out`): what a grader outside eval
/// (`arc-rec grade serve`, verl's `compute_score`) must answer for the same completion.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EvalSample {
    pub model: RunModel,
    pub prompt_id: String,
    /// The temperature-0 completion, or one of the n samples.
    pub greedy: bool,
    pub completion: String,
    /// The key of the world's acceptance draw (`--seed`).
    pub draw: u64,
    pub reward: f64,
    pub accepted: bool,
    pub format_valid: bool,
}

/// One model's figures on the held-out prompts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelReport {
    pub model: RunModel,
    pub path: PathBuf,
    pub prompts: usize,
    /// Share of the sampled completions that are well-formed recommendations.
    pub format_validity: f64,
    /// The malformed sampled completions by reason (`FormatError::kind`: `no_change`,
    /// `invalid_result`, ...), so a validity below 1 says what is left to fix; greedy ones are
    /// not counted.
    #[serde(default)]
    pub format_errors: BTreeMap<String, u64>,
    /// For each reason of `format_errors`, the first such completion's error message (where the
    /// parser stopped, or the field and the rule it broke).
    #[serde(default)]
    pub format_error_examples: BTreeMap<String, String>,
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
    /// World grader on a learned-grader run: `learned_pick_of[k − 1]` is the expected true
    /// acceptance probability of the sample the run's learned grader ranks first among k — by
    /// its lower bound, the reward RL trains on (unbiased over k-subsets of the n; a malformed
    /// sample ranks last and counts 0). Between the mean (k = 1) and `best_of`: how much of the
    /// truth's best of k the reward model recovers when it chooses.
    #[serde(default)]
    pub learned_pick_of: Option<Vec<f64>>,
    /// Tokens generated.
    pub new_tokens: u64,
    pub seconds: f64,
    /// Each prompt's figures, in the order of the prompts evaluated (the same for every model,
    /// so two models' lists pair up).
    #[serde(default)]
    pub per_prompt: Vec<PromptFigures>,
    /// World grader, with the model RL started from also evaluated: the share of the gap from that
    /// model to the menu oracle this one closes (filled in by the command; `None` for the
    /// reference itself).
    #[serde(default)]
    pub gap_closed: Option<GapClosed>,
    /// The world-free checkpoint criterion (`train --eval-every`) of this model on the
    /// validation split's logged decisions, to read beside the world's truth; `None` when no
    /// validation context has both an accepted and a rejected answer.
    #[serde(default)]
    pub held_out_criterion: Option<CriterionFigures>,
    /// Every graded completion, the n samples then the greedy one per prompt, when
    /// [`EvalSettings::keep_samples`] (`eval --samples-out`; not part of `eval.json`).
    #[serde(skip)]
    pub samples: Vec<EvalSample>,
}

/// One held-out prompt's figures for one model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PromptFigures {
    /// The prompt's id (`RftPrompt::id`).
    pub id: String,
    /// Share of its n samples that are well formed.
    pub format_validity: f64,
    /// `pass_at[k − 1]`: unbiased pass@k of its n samples, k = 1..n.
    pub pass_at: Vec<f64>,
    /// World grader: `best_of[k − 1]`, the expected true acceptance of the best of k of its
    /// samples, k = 1..n.
    pub best_of: Option<Vec<f64>>,
    /// World grader on a learned-grader run: `learned_pick_of[k − 1]`, the expected true
    /// acceptance of the sample the learned grader ranks first among k of its samples.
    #[serde(default)]
    pub learned_pick_of: Option<Vec<f64>>,
    /// Whether its greedy completion is well formed.
    pub greedy_format_valid: bool,
    /// Whether its greedy completion was accepted.
    pub greedy_accepted: bool,
    /// World grader: the greedy completion's true acceptance probability (0 when malformed).
    pub greedy_acceptance_probability: Option<f64>,
    /// The greedy completion's canonical answer (its minimal patch), when well formed: what the
    /// model would recommend here (absent from reports written before it existed).
    #[serde(default)]
    pub greedy_answer: Option<String>,
}

/// How much of the gap from the model RL started from to the menu oracle a model closes:
/// (model − reference) / (oracle − reference), of mean true acceptance over the prompts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GapClosed {
    /// The reference: the warm-up model, or the base of a run without a warm-up of its own
    /// (whose base is the model RL started from).
    pub reference: RunModel,
    /// The k of [`Self::best_of`]: 4, or n when n < 4.
    pub k: usize,
    /// Of the expected true acceptance of the best of k samples; `None` when the reference
    /// already reaches the oracle.
    pub best_of: Option<f64>,
    /// Of the greedy completion's true acceptance probability.
    pub greedy: Option<f64>,
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
    settings: EvalSettings<'_>,
    progress: &mut dyn FnMut(usize),
) -> anyhow::Result<ModelReport> {
    let mut graded_samples = Vec::new();
    let started = Instant::now();
    let n = settings.n;
    let world = grader.kind() == crate::rft::GraderKind::World;
    let reward_model = settings.reward_model.filter(|_| world);
    let grammar =
        super::rollout::recommendation_grammar(policy, settings.constrained, settings.catalogues)?;
    let mut sums = Sums::new(n);
    let mut per_prompt = Vec::with_capacity(prompts.len());
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
                grammar: grammar.as_ref(),
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
                grammar: grammar.as_ref(),
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
            // The reward model's order of the samples: its lower bound, malformed ones below
            // every bound.
            let learned_keys: Option<Vec<f64>> = reward_model.map(|model| {
                group
                    .samples
                    .iter()
                    .map(|s| {
                        let completion = policy.decode(&s.tokens);
                        model
                            .grade(batch[index].prompt, &completion, settings.seed)
                            .learned_lower_bound
                            .unwrap_or(-1.0)
                    })
                    .collect()
            });
            let mut figures = PromptFigures {
                id: batch[index].prompt.id.clone(),
                format_validity: 0.0,
                pass_at: Vec::with_capacity(n),
                best_of: world.then(|| Vec::with_capacity(n)),
                learned_pick_of: learned_keys.as_ref().map(|_| Vec::with_capacity(n)),
                greedy_format_valid: false,
                greedy_accepted: false,
                greedy_acceptance_probability: world.then_some(0.0),
                greedy_answer: None,
            };
            for k in 1..=n {
                let pass = estimate::pass_at_k(n, correct, k)?;
                let best = estimate::expected_best_of_k(&probabilities, k)?;
                sums.pass_at[k - 1] += pass;
                sums.maj_at[k - 1] +=
                    estimate::majority_at_k(&accepted, &group.answers, &priority, k)?;
                sums.best_of[k - 1] += best;
                figures.pass_at.push(pass);
                if let Some(best_of) = &mut figures.best_of {
                    best_of.push(best);
                }
                if let (Some(keys), Some(picks)) = (&learned_keys, &mut figures.learned_pick_of) {
                    let pick = estimate::expected_pick_of_k(keys, &probabilities, k)?;
                    sums.learned_pick_of[k - 1] += pick;
                    picks.push(pick);
                }
            }
            let mut valid = 0.0;
            for sample in &group.samples {
                valid += f64::from(u8::from(sample.verdict.format_valid));
                if let Some(reason) = sample.verdict.format_error {
                    *sums.format_errors.entry(reason.to_owned()).or_insert(0) += 1;
                    if let Some(message) = &sample.verdict.format_error_message {
                        sums.format_error_examples
                            .entry(reason.to_owned())
                            .or_insert_with(|| message.clone());
                    }
                }
                sums.reliability_gain += sample.verdict.reliability_gain.unwrap_or(0.0);
            }
            sums.valid += valid;
            figures.format_validity = valid / group.samples.len().max(1) as f64;
            if let Some(top) = top.samples.first() {
                let verdict = &top.verdict;
                let probability = verdict.acceptance_probability.unwrap_or(0.0);
                sums.greedy_valid += f64::from(u8::from(verdict.format_valid));
                sums.greedy_accepted += f64::from(u8::from(verdict.accepted));
                sums.greedy_probability += probability;
                sums.greedy_gain += verdict.reliability_gain.unwrap_or(0.0);
                figures.greedy_format_valid = verdict.format_valid;
                figures.greedy_accepted = verdict.accepted;
                figures.greedy_acceptance_probability = world.then_some(probability);
                figures.greedy_answer.clone_from(&verdict.answer);
            }
            if settings.keep_samples {
                let graded = group.samples.iter().map(|s| (false, s));
                for (greedy, sample) in graded.chain(top.samples.iter().map(|s| (true, s))) {
                    graded_samples.push(EvalSample {
                        model: which,
                        prompt_id: batch[index].prompt.id.clone(),
                        greedy,
                        completion: policy.decode(&sample.tokens),
                        draw: settings.seed,
                        reward: sample.verdict.reward,
                        accepted: sample.verdict.accepted,
                        format_valid: sample.verdict.format_valid,
                    });
                }
            }
            per_prompt.push(figures);
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
        format_errors: sums.format_errors,
        format_error_examples: sums.format_error_examples,
        pass_at: mean(sums.pass_at),
        maj_at: mean(sums.maj_at),
        greedy: GreedyFigures {
            format_validity: sums.greedy_valid / count,
            accepted: sums.greedy_accepted / count,
            acceptance_probability: world.then(|| sums.greedy_probability / count),
            reliability_gain: world.then(|| sums.greedy_gain / count),
        },
        best_of: world.then(|| mean(sums.best_of)),
        learned_pick_of: reward_model.map(|_| mean(sums.learned_pick_of)),
        reliability_gain: world.then(|| sums.reliability_gain / samples),
        new_tokens: sums.new_tokens,
        seconds: started.elapsed().as_secs_f64(),
        per_prompt,
        gap_closed: None,
        held_out_criterion: None,
        samples: graded_samples,
    })
}

/// A model's figures by the checkpoint criterion (`training::selection`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CriterionFigures {
    pub menu_acceptance: f64,
    pub pair_accuracy: f64,
    /// The log-probability margin over the warm-up model (when the warm-up was evaluated too;
    /// 0 for the warm-up itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprob_margin: Option<f64>,
    /// Validation contexts with both an accepted and a rejected logged answer.
    pub contexts: usize,
    /// Every held-out answer's log-probability (what the margin is computed from).
    #[serde(skip)]
    pub scored: super::selection::Scored,
}

/// Running sums over prompts.
struct Sums {
    pass_at: Vec<f64>,
    maj_at: Vec<f64>,
    best_of: Vec<f64>,
    learned_pick_of: Vec<f64>,
    valid: f64,
    format_errors: BTreeMap<String, u64>,
    format_error_examples: BTreeMap<String, String>,
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
            learned_pick_of: vec![0.0; n],
            valid: 0.0,
            format_errors: BTreeMap::new(),
            format_error_examples: BTreeMap::new(),
            reliability_gain: 0.0,
            greedy_valid: 0.0,
            greedy_accepted: 0.0,
            greedy_probability: 0.0,
            greedy_gain: 0.0,
            new_tokens: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(model: RunModel, best_of: Option<Vec<f64>>, greedy: Option<f64>) -> ModelReport {
        let n = best_of.as_ref().map_or(2, Vec::len);
        ModelReport {
            model,
            path: PathBuf::from("m"),
            prompts: 1,
            format_validity: 1.0,
            format_errors: BTreeMap::new(),
            format_error_examples: BTreeMap::new(),
            pass_at: vec![0.5; n],
            maj_at: vec![0.5; n],
            greedy: GreedyFigures {
                format_validity: 1.0,
                accepted: 1.0,
                acceptance_probability: greedy,
                reliability_gain: greedy.map(|_| 0.0),
            },
            reliability_gain: greedy.map(|_| 0.0),
            best_of,
            learned_pick_of: None,
            new_tokens: 0,
            seconds: 0.0,
            per_prompt: Vec::new(),
            gap_closed: None,
            held_out_criterion: None,
            samples: Vec::new(),
        }
    }

    #[test]
    fn the_gap_is_measured_from_the_model_rl_started_from() {
        use RunModel::{Base, Rl, Warmup};
        assert_eq!(gap_reference(300, &[Base, Warmup, Rl]), Some(Warmup));
        assert_eq!(gap_reference(300, &[Warmup, Rl]), Some(Warmup));
        assert_eq!(gap_reference(0, &[Base, Rl]), Some(Base));
        assert_eq!(gap_reference(300, &[Base, Rl]), None);
        assert_eq!(gap_reference(0, &[Rl]), None);
    }

    #[test]
    fn gap_closed_uses_best_of_four_and_the_greedy_answer() {
        let mut reports = vec![
            report(
                RunModel::Base,
                Some(vec![0.1, 0.1, 0.1, 0.2, 0.2]),
                Some(0.1),
            ),
            report(
                RunModel::Warmup,
                Some(vec![0.3, 0.35, 0.38, 0.4, 0.41]),
                Some(0.3),
            ),
            report(
                RunModel::Rl,
                Some(vec![0.5, 0.55, 0.58, 0.6, 0.61]),
                Some(0.45),
            ),
        ];
        fill_gap_closed(&mut reports, RunModel::Warmup, 0.8);
        assert_eq!(
            reports[1].gap_closed, None,
            "the reference has no gap figure"
        );
        let rl = reports[2].gap_closed.clone().unwrap();
        assert_eq!((rl.reference, rl.k), (RunModel::Warmup, 4));
        // Best of 4: (0.6 − 0.4) / (0.8 − 0.4); greedy: (0.45 − 0.3) / (0.8 − 0.3).
        assert!((rl.best_of.unwrap() - 0.5).abs() < 1e-12);
        assert!((rl.greedy.unwrap() - 0.3).abs() < 1e-12);
        let base = reports[0].gap_closed.clone().unwrap();
        assert!(
            (base.best_of.unwrap() + 0.5).abs() < 1e-12,
            "worse than warm-up"
        );

        // n < 4: the best of n.
        let mut small = vec![
            report(RunModel::Warmup, Some(vec![0.3, 0.4]), Some(0.3)),
            report(RunModel::Rl, Some(vec![0.5, 0.6]), Some(0.3)),
        ];
        fill_gap_closed(&mut small, RunModel::Warmup, 0.8);
        let rl = small[1].gap_closed.clone().unwrap();
        assert_eq!(rl.k, 2);
        assert!((rl.best_of.unwrap() - 0.5).abs() < 1e-12);
        assert_eq!(rl.greedy, Some(0.0));

        // No true acceptance (logged grader), or no reference evaluated: nothing filled in.
        let mut logged = vec![
            report(RunModel::Warmup, None, None),
            report(RunModel::Rl, None, None),
        ];
        fill_gap_closed(&mut logged, RunModel::Warmup, 0.8);
        assert!(logged.iter().all(|r| r.gap_closed.is_none()));
        let mut alone = vec![report(RunModel::Rl, Some(vec![0.5; 4]), Some(0.5))];
        fill_gap_closed(&mut alone, RunModel::Warmup, 0.8);
        assert_eq!(alone[0].gap_closed, None);
    }
}
