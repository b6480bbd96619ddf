//! `arc-rec candidates`' model side: a finished run's identity and data, and its model's sampled
//! recommendations for each serving context, harvested into candidates (what is stored, priced
//! and counted is [`crate::rft::model_candidates`]'s).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::bail;

use super::evaluation::{RunModel, load_run_model};
use super::rollout::{PromptTokens, Sampling, recommendation_grammar, rollout, tokenize_prompts};
use super::run_dir::{FINAL_ADAPTER_DIR, read_run_data, read_run_id, read_settings};
use super::selection::read_choice;
use super::settings::TrainSettings;
use crate::candidates::CandidateIndex;
use crate::rft::model_candidates::{Harvest, ServingContext, harvest, serving_contexts};
use crate::rft::{Grader, RftDataset, RftPrompt};

/// A finished run as `candidates` reads it: settings, the model version its candidates are
/// tagged with, and its data.
#[derive(Debug)]
pub struct CandidateRun {
    pub dir: PathBuf,
    pub model: RunModel,
    pub settings: TrainSettings,
    /// `run_id` for the RL model, `<run id>-warmup` or `<run id>-base` for the others.
    pub model_version: String,
    pub dataset: RftDataset,
}

impl CandidateRun {
    /// Reads the run directory `arc-rec train` wrote; errors name `--run` and say what to do.
    /// The RL model of a run whose checkpoint selection found nothing better than the warm-up
    /// is refused unless `force` (`--force`).
    pub fn open(dir: &Path, model: RunModel, force: bool) -> anyhow::Result<Self> {
        let settings = read_settings(dir, "--run")?;
        let run_id = read_run_id(dir, "--run")?;
        let model_version = match model {
            RunModel::Rl => run_id,
            RunModel::Warmup => format!("{run_id}-warmup"),
            RunModel::Base => format!("{run_id}-base"),
        };
        if model == RunModel::Rl && !dir.join(FINAL_ADAPTER_DIR).is_dir() {
            bail!(
                "--run {}: no {FINAL_ADAPTER_DIR}/, the run has not finished its RL steps (finish it with `arc-rec train --resume {}`)",
                dir.display(),
                dir.display()
            );
        }
        if model == RunModel::Rl
            && !force
            && let Some(choice) = read_choice(dir)?
            && !choice.beats_warmup
        {
            bail!(
                "--run {}: RL did not beat its warm-up on the held-out {} (best {:.3} at RL step {} against the warm-up's {:.3}: gain {:+.3}, standard error {:.3}, where the best of {} RL points must beat it by {:.2} standard errors, on {} validation contexts), so the run kept its warm-up model and its RL ideas are not written; `--model warmup` writes the warm-up's ideas under its own version, --force writes them under the RL version anyway",
                dir.display(),
                choice.criterion.as_str(),
                choice.best_value,
                choice.best_rl_step,
                choice.warmup_value,
                choice.gain,
                choice.gain_se,
                choice.points.saturating_sub(1),
                choice.noise_z,
                choice.contexts
            );
        }
        let dataset = read_run_data(dir, &settings)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            model,
            settings,
            model_version,
            dataset,
        })
    }

    /// The contexts the model is asked about; an error when the data has none.
    pub fn contexts(&self) -> anyhow::Result<Vec<ServingContext<'_>>> {
        let contexts = serving_contexts(&self.dataset);
        if contexts.is_empty() {
            bail!(
                "{}: no context with a recorded failure to generate candidates for",
                self.settings.data.display()
            );
        }
        Ok(contexts)
    }

    /// The base model's path as stored with the candidates.
    pub fn base_model(&self) -> String {
        super::run_dir::absolute(&self.settings.model)
            .display()
            .to_string()
    }
}

/// One context's completions.
#[derive(Debug)]
pub struct Generated {
    pub completions: Vec<String>,
    /// How many passed the graders' format check (what `harvest` counts as valid).
    pub format_valid: usize,
}

/// How the run's model samples.
#[derive(Debug, Clone, Copy)]
pub struct GenerationOptions<'a> {
    pub sampling: Sampling<'a>,
    /// Under the recommendation grammar.
    pub constrained: bool,
    /// Contexts per generation batch.
    pub batch_prompts: usize,
}

/// Samples every context's completions with the run's model, calling `progress` with (contexts
/// done, contexts in all, well-formed completions so far) after each batch.
pub fn generate(
    run: &CandidateRun,
    runtime: trainer::device::Runtime,
    contexts: &[ServingContext<'_>],
    options: GenerationOptions<'_>,
    progress: &mut dyn FnMut(usize, usize, usize),
) -> anyhow::Result<Vec<Generated>> {
    let policy = load_run_model(run.model, &run.settings, &run.dir, runtime)?;
    let grammar = recommendation_grammar(&policy, options.constrained, &run.dataset.catalogues())?;
    let sampling = Sampling {
        grammar: grammar.as_ref(),
        ..options.sampling
    };
    let prompts: Vec<&RftPrompt> = contexts.iter().map(|c| c.prompt).collect();
    let tokens = tokenize_prompts(&policy, &run.dataset, &prompts)?;
    // The format check is the graders' (`Grader::grade` reads a completion with
    // `parse_recommendation`, as `harvest` does); verdicts need no world here.
    let grader = Grader::logged(false);
    let mut generated: Vec<Generated> = Vec::with_capacity(tokens.len());
    let mut well_formed = 0;
    for batch in tokens.chunks(options.batch_prompts) {
        let picks: Vec<&PromptTokens<'_>> = batch.iter().collect();
        let rollout = rollout(&policy, &picks, sampling, &grader, sampling.seed)?;
        for group in rollout.groups {
            let format_valid = group
                .samples
                .iter()
                .filter(|s| s.verdict.format_valid)
                .count();
            well_formed += format_valid;
            generated.push(Generated {
                completions: group
                    .samples
                    .iter()
                    .map(|sample| policy.decode(&sample.tokens))
                    .collect(),
                format_valid,
            });
        }
        progress(generated.len(), tokens.len(), well_formed);
    }
    Ok(generated)
}

/// Each context's completions harvested into candidates, checked against its organization's
/// models and tools (`indexes`; an organization missing there knows none).
pub fn harvest_all(
    contexts: &[ServingContext<'_>],
    generated: &[Generated],
    model_version: &str,
    indexes: &BTreeMap<String, CandidateIndex>,
) -> Vec<Harvest> {
    contexts
        .iter()
        .zip(generated)
        .map(|(context, generated)| {
            let empty;
            let index = match indexes.get(context.org) {
                Some(index) => index,
                None => {
                    empty = CandidateIndex::empty(context.org);
                    &empty
                }
            };
            let harvest = harvest(context.prompt, &generated.completions, model_version, index);
            debug_assert_eq!(harvest.valid, generated.format_valid);
            harvest
        })
        .collect()
}
