//! `arc-rec candidates`: the trained recommender's ideas, made ready for serving. A run's RL
//! model (warm-up model + adapter; or its warm-up or base model, `--model`) writes k
//! recommendations for the typical configuration of every (organization, failure cluster) of the
//! run's data; those that pass the graders' format check, name only models and tools the
//! organization has run, and pass serving's hard constraints go to
//! `candidate_recommendations` tagged with the model version, where `serve` ranks them beside the heuristic candidates, each from the
//! learned grader's prior (`--prior`) until feedback prices it. The database is opened only
//! around the checks and the grader's fit before the model work and the write after it.

use std::collections::{BTreeMap, BTreeSet};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Args;

use super::DatabaseArgs;
use crate::candidates::CandidateIndex;
use crate::rft::model_candidates::{
    Gathered, OrgSummary, ServingContext, candidate_lines, gather, price,
};
use crate::storage::candidate_stats::{SavedCandidates, save_model_candidates_by_cluster};
use crate::storage::clusters::active_cluster_ids;
use crate::storage::model_versions::{self, VersionStatus};
use crate::storage::training_runs;
use crate::training::candidates::{
    CandidateRun, Generated, GenerationOptions, generate, harvest_all,
};
use crate::training::evaluation::RunModel;
use crate::training::learned_grader_fit::FitOn;
use crate::training::rollout::Sampling;
use crate::training::{Constrained, DeviceChoice};
/// Most recommendations per context.
pub const MAX_K: usize = 64;

/// Arguments of `arc-rec candidates`.
#[derive(Debug, Args)]
pub struct CandidatesArgs {
    /// The run directory `arc-rec train` wrote: its RL model generates, its data (config.json's
    /// `data`) gives the contexts, its `run_id` is the model version the candidates are tagged
    /// with.
    #[arg(long, value_name = "RUN_DIR")]
    pub run: PathBuf,
    /// Which of the run's models writes the candidates: `rl` (the warm-up model with RL's
    /// adapter; model version = the run id), `warmup` (version `<run id>-warmup`) or `base`
    /// (version `<run id>-base`), e.g. to compare what RL adds in `arc-rec bench pipeline`.
    #[arg(long, value_enum, default_value_t = RunModel::Rl)]
    pub model: RunModel,
    /// Recommendations sampled per (organization, failure cluster) context (1–64).
    #[arg(long, default_value_t = 8)]
    pub k: usize,
    /// Sampling temperature (the run's RL sampling temperature by default).
    #[arg(long)]
    pub temperature: Option<f64>,
    /// Most tokens per recommendation (the run's --max-new-tokens by default).
    #[arg(long)]
    pub max_new_tokens: Option<usize>,
    /// Seeds the samples (with each context's prompt): the same run, data and seed give the
    /// same candidates.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Contexts per generation batch (memory against speed).
    #[arg(long, default_value_t = 8)]
    pub batch_prompts: usize,
    /// Where to run: CUDA (bf16) when available, or the CPU (f32).
    #[arg(long, value_enum, default_value_t = DeviceChoice::Auto)]
    pub device: DeviceChoice,
    /// Draw the recommendations under their JSON grammar (every one well-formed), as RL's
    /// samples were by default.
    #[arg(long, value_enum, default_value_t = Constrained::On)]
    pub constrained: Constrained,
    /// How the candidates enter serving: `learned` stores with each the learned grader's
    /// posterior P(accept) for the contexts it was written for (mean and sd; the grader is fitted
    /// on every logged decision of the run's data), which serving ranks it from until feedback
    /// prices it; `none` stores none (ranked from zero, as a heuristic candidate without
    /// feedback).
    #[arg(long, value_enum, default_value_t = PriorChoice::Learned)]
    pub prior: PriorChoice,
    /// Write the candidates to this JSON-lines file instead of the database (one line per
    /// organization's candidate: `org`, `cluster`, `candidate`), e.g. one file per model for
    /// `arc-rec bench pipeline --arm NAME=FILE`.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Write the RL model's ideas even when the run's checkpoint selection found no checkpoint
    /// that beats the warm-up on the held-out criterion (`train --eval-every`); the run then kept
    /// its warm-up model as its RL adapter, so they are the warm-up's, under the RL version.
    #[arg(long)]
    pub force: bool,
}

/// Where a model candidate's serving prior comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PriorChoice {
    Learned,
    None,
}

/// Runs `arc-rec candidates`.
pub async fn run(args: &CandidatesArgs, database: &DatabaseArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    args.validate()?;
    // Everything that can be checked before minutes of generation is.
    let run = CandidateRun::open(&args.run, args.model, args.force)?;
    let contexts = run.contexts()?;
    let orgs: Vec<String> = contexts
        .iter()
        .map(|c| c.org.to_owned())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let (stored_clusters, indexes) = read_organizations(database, &orgs).await?;
    let grader = match args.prior {
        PriorChoice::Learned => Some(
            super::fit_learned_grader(database, &run.settings, &run.dataset, FitOn::Everything)
                .await
                .context("--prior learned: cannot fit the learned grader that prices the candidates (--prior none stores them without priors)")?
                .grader,
        ),
        PriorChoice::None => None,
    };
    let runtime = trainer::device::Runtime::select(args.device.request())?;
    println!(
        "generating {} recommendations for each of {} contexts (organization × failure cluster, its typical configuration) of {} in {} organization(s) with model version {} on {}",
        args.k,
        contexts.len(),
        run.settings.data.display(),
        orgs.len(),
        run.model_version,
        runtime.describe()
    );
    let generation = Instant::now();
    let generated =
        tokio::task::block_in_place(|| generate_with_progress(args, &run, runtime, &contexts))?;
    let generation_seconds = generation.elapsed().as_secs_f64();
    let harvests = harvest_all(&contexts, &generated, &run.model_version, &indexes);
    let mut gathered = gather(&contexts, &harvests, &stored_clusters);
    if let Some(grader) = &grader {
        let means = price(grader, &contexts, &harvests, &mut gathered)?;
        print_priors(&means, gathered.total().floored);
    }
    refuse_nothing_usable(&gathered)?;
    let notes = notes(&gathered);
    let written = gathered.row_count();
    if let Some(out) = &args.out {
        let text = candidate_lines(&gathered.rows)?;
        crate::training::run_dir::write_atomically(out, text.as_bytes())
            .with_context(|| format!("--out {}", out.display()))?;
        print_summary(&gathered);
        notes.iter().for_each(|note| println!("{note}"));
        println!(
            "wrote {written} candidates of model version {} to {} in {:.1} s ({:.1} s generating)",
            run.model_version,
            out.display(),
            started.elapsed().as_secs_f64(),
            generation_seconds
        );
        return Ok(());
    }
    save(database, &run, &mut gathered).await?;
    print_summary(&gathered);
    notes.iter().for_each(|note| println!("{note}"));
    if gathered.unmatched > 0 {
        println!(
            "{} of {} contexts' failure clusters are not active clusters in the database (the data was exported before `arc-rec cluster`, or re-clustered since): their candidates are for any cluster",
            gathered.unmatched,
            contexts.len()
        );
    }
    println!(
        "wrote {written} candidates of model version {} in {:.1} s ({:.1} s generating); running `arc-rec serve` replicas pick them up within {} s",
        run.model_version,
        started.elapsed().as_secs_f64(),
        generation_seconds,
        crate::recommend::service::MODEL_CANDIDATES_RELOAD_BOUND.as_secs()
    );
    Ok(())
}

impl CandidatesArgs {
    fn validate(&self) -> anyhow::Result<()> {
        if !(1..=MAX_K).contains(&self.k) {
            bail!("--k must be between 1 and {MAX_K}, got {}", self.k);
        }
        if let Some(temperature) = self.temperature
            && !(temperature.is_finite() && temperature > 0.0)
        {
            bail!("--temperature must be positive, got {temperature}");
        }
        if self.max_new_tokens == Some(0) {
            bail!("--max-new-tokens must be at least 1");
        }
        if self.batch_prompts == 0 {
            bail!("--batch-prompts must be at least 1");
        }
        Ok(())
    }
}

/// Per organization, its active stored clusters and its models and tools; an error when the
/// run's data names an organization the database does not hold.
async fn read_organizations(
    database: &DatabaseArgs,
    orgs: &[String],
) -> anyhow::Result<(
    BTreeMap<String, BTreeSet<String>>,
    BTreeMap<String, CandidateIndex>,
)> {
    let orgs = orgs.to_vec();
    super::with_database(database, |pool| async move {
        let unknown = training_runs::unknown_orgs(&pool, &orgs).await?;
        if !unknown.is_empty() {
            bail!(
                "organization(s) {} of the run's data are not in the database",
                unknown.join(", ")
            );
        }
        let (mut stored, mut indexes) = (BTreeMap::new(), BTreeMap::new());
        for org in orgs {
            let ids = active_cluster_ids(&pool, &org).await?;
            stored.insert(org.clone(), ids.into_iter().collect());
            let index = CandidateIndex::load(&pool, &org)
                .await
                .with_context(|| format!("loading {org}'s models and tools"))?;
            indexes.insert(org, index);
        }
        Ok((stored, indexes))
    })
    .await
}

/// The run's model's completions for every context, with a progress bar on a terminal and a
/// line per batch otherwise.
fn generate_with_progress(
    args: &CandidatesArgs,
    run: &CandidateRun,
    runtime: trainer::device::Runtime,
    contexts: &[ServingContext<'_>],
) -> anyhow::Result<Vec<Generated>> {
    let options = GenerationOptions {
        sampling: Sampling {
            n: args.k,
            max_new_tokens: args.max_new_tokens.unwrap_or(run.settings.max_new_tokens),
            temperature: args.temperature.unwrap_or(run.settings.temperature),
            seed: args.seed,
            grammar: None,
        },
        constrained: args.constrained.is_on(),
        batch_prompts: args.batch_prompts,
    };
    let bar = std::io::stderr()
        .is_terminal()
        .then(|| crate::progress::bar(contexts.len() as u64, "contexts", false));
    let generated = generate(
        run,
        runtime,
        contexts,
        options,
        &mut |done, total, well_formed| match &bar {
            Some(bar) => bar.set_position(done as u64),
            None => println!(
                "generated for {done}/{total} contexts ({well_formed} well-formed recommendations so far)"
            ),
        },
    );
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    generated
}

fn print_priors(means: &[f64], floored: usize) {
    if let (Some(min), Some(max)) = (means.first(), means.last()) {
        println!(
            "priced {} candidates with the learned grader: prior P(accept) {min:.3} (min) / {:.3} (median) / {max:.3} (max)",
            means.len(),
            means[means.len() / 2],
        );
    }
    if floored > 0 {
        println!(
            "{floored} more priced at the learned grader's floor (P(accept) 0: outside the data's support wherever proposed) are not written"
        );
    }
}

/// Fails, writing nothing, when no row is left to write: none passed, or every one that did was
/// priced at the learned grader's floor.
fn refuse_nothing_usable(gathered: &Gathered) -> anyhow::Result<()> {
    let total = gathered.total();
    if total.rows > 0 {
        return Ok(());
    }
    if total.passed > 0 {
        bail!(
            "the model produced no usable candidate: all {} candidates that passed the format check and the hard constraints were priced at the learned grader's floor (P(accept) 0: outside the data's support); nothing was written (--prior none writes them without priors)",
            total.floored
        );
    }
    let errors = gathered.format_errors_text();
    bail!(
        "the model produced no usable candidate: {} recommendations generated, {} passed the format check{}, {} of them named a model or tool the organization has never run, none passed the hard constraints; nothing was written (train the run longer, e.g. more --sft-steps, or sample more with --k)",
        total.generated,
        total.valid,
        if errors.is_empty() {
            String::new()
        } else {
            format!(" (format errors: {errors})")
        },
        total.unknown
    )
}

/// Printed under the summary table, whichever way the candidates are written.
fn notes(gathered: &Gathered) -> Vec<String> {
    let mut notes = Vec::new();
    let errors = gathered.format_errors_text();
    if !errors.is_empty() {
        notes.push(format!("format errors: {errors}"));
    }
    if let Some(example) = &gathered.first_unknown {
        notes.push(format!(
            "{} valid recommendations named a model or tool the organization has never run and were dropped (e.g. {example})",
            gathered.total().unknown
        ));
    }
    notes
}

/// Stores every organization's rows, counting what was new and what was updated.
async fn save(
    database: &DatabaseArgs,
    run: &CandidateRun,
    gathered: &mut Gathered,
) -> anyhow::Result<()> {
    let (rows, model_version, base_model) = (
        gathered.rows.clone(),
        run.model_version.clone(),
        run.base_model(),
    );
    let saved: BTreeMap<String, SavedCandidates> =
        super::with_database(database, |pool| async move {
            let mut saved = BTreeMap::new();
            for (org, rows) in rows.iter().filter(|(_, rows)| !rows.is_empty()) {
                let written =
                    save_model_candidates_by_cluster(&pool, org, &model_version, &base_model, rows)
                        .await
                        .with_context(|| format!("writing {org}'s candidates"))?;
                saved.insert(org.clone(), written);
                // Written again for a version someone retired: stored, not served.
                if model_versions::status(&pool, org, &model_version).await?
                    == Some(VersionStatus::Retired)
                {
                    println!(
                        "note: {org}'s model version {model_version} is retired: its candidates are stored but not served (`arc-rec models promote --org {org} {model_version}` serves them)"
                    );
                }
            }
            Ok(saved)
        })
        .await?;
    for (org, saved) in saved {
        if let Some(summary) = gathered.summaries.get_mut(&org) {
            summary.saved = saved;
        }
    }
    Ok(())
}

fn print_summary(gathered: &Gathered) {
    println!(
        "{:<16} {:>8} {:>9} {:>6} {:>7} {:>6} {:>5} {:>7} {:>5} {:>8} {:>11}",
        "organization",
        "contexts",
        "generated",
        "valid",
        "unknown",
        "passed",
        "floor",
        "written",
        "new",
        "updated",
        "for cluster"
    );
    let line = |org: &str, s: &OrgSummary| {
        println!(
            "{org:<16} {:>8} {:>9} {:>6} {:>7} {:>6} {:>5} {:>7} {:>5} {:>8} {:>11}",
            s.contexts,
            s.generated,
            s.valid,
            s.unknown,
            s.passed,
            s.floored,
            s.rows,
            s.saved.inserted,
            s.saved.updated,
            s.for_cluster
        );
    };
    for (org, summary) in &gathered.summaries {
        line(org, summary);
    }
    line("total", &gathered.total());
    println!(
        "valid: passed the graders' format check; unknown: valid, but bringing in a model or tool \
         the organization has never run (dropped); passed: valid, no unknown name, and serving's \
         hard constraints (a valid configuration after the diff, a real change, no two alike in a context); floor: \
         priced at the learned grader's floor, P(accept) 0 (not written); written: rows of \
         candidate_recommendations (a candidate proposed in several clusters is one row, for any \
         cluster); for cluster: rows tied to one failure cluster, the others serve every cluster"
    );
}
