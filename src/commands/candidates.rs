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
use super::learned_grader_fit::{FitOn, fit_learned_grader};
use crate::candidates::CandidateIndex;
use crate::domain::CandidateSource;
use crate::rft::model_candidates::{
    ClusterCandidates, Harvest, ServingContext, StoredCandidate, candidate_lines, harvest,
    merge_clusters, serving_contexts,
};
use crate::rft::{Grader, LearnedGrader, RftDataset, RftPrompt};
use crate::storage::candidate_stats::{SavedCandidates, save_model_candidates_by_cluster};
use crate::storage::clusters::active_cluster_ids;
use crate::storage::training_runs;
use crate::training::evaluation::{RunModel, load_run_model};
use crate::training::rollout::{
    PromptTokens, Sampling, recommendation_grammar, rollout, tokenize_prompts,
};
use crate::training::run_dir::{FINAL_ADAPTER_DIR, read_run_data, read_settings};
use crate::training::{Constrained, DeviceChoice, TrainSettings};

/// The file of a run directory holding its id (`arc-rec train` writes it): the model version.
const RUN_ID_FILE: &str = "run_id";
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
}

/// Where a model candidate's serving prior comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PriorChoice {
    Learned,
    None,
}

/// One organization's figures.
#[derive(Debug, Default)]
struct OrgSummary {
    contexts: usize,
    generated: usize,
    valid: usize,
    unknown: usize,
    passed: usize,
    rows: usize,
    for_cluster: usize,
    saved: SavedCandidates,
}

/// Runs `arc-rec candidates`.
pub async fn run(args: &CandidatesArgs, database: &DatabaseArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    if !(1..=MAX_K).contains(&args.k) {
        bail!("--k must be between 1 and {MAX_K}, got {}", args.k);
    }
    if let Some(temperature) = args.temperature
        && !(temperature.is_finite() && temperature > 0.0)
    {
        bail!("--temperature must be positive, got {temperature}");
    }
    if args.max_new_tokens == Some(0) {
        bail!("--max-new-tokens must be at least 1");
    }
    if args.batch_prompts == 0 {
        bail!("--batch-prompts must be at least 1");
    }
    // Everything that can be checked before minutes of generation is.
    let settings = read_settings(&args.run, "--run")?;
    let run_id = std::fs::read_to_string(args.run.join(RUN_ID_FILE))
        .with_context(|| {
            format!(
                "--run {}: no {RUN_ID_FILE} file; not a run directory of `arc-rec train`",
                args.run.display()
            )
        })?
        .trim()
        .to_owned();
    if run_id.is_empty() {
        bail!(
            "--run {}: its {RUN_ID_FILE} file is empty",
            args.run.display()
        );
    }
    let run_id = match args.model {
        RunModel::Rl => run_id,
        RunModel::Warmup => format!("{run_id}-warmup"),
        RunModel::Base => format!("{run_id}-base"),
    };
    if args.model == RunModel::Rl && !args.run.join(FINAL_ADAPTER_DIR).is_dir() {
        bail!(
            "--run {}: no {FINAL_ADAPTER_DIR}/, the run has not finished its RL steps (finish it with `arc-rec train --resume {}`)",
            args.run.display(),
            args.run.display()
        );
    }
    let dataset = read_run_data(&args.run, &settings)?;
    let contexts = serving_contexts(&dataset);
    if contexts.is_empty() {
        bail!(
            "{}: no context with a recorded failure to generate candidates for",
            settings.data.display()
        );
    }
    let orgs: Vec<String> = contexts
        .iter()
        .map(|c| c.org.to_owned())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let (stored_clusters, indexes): (
        BTreeMap<String, BTreeSet<String>>,
        BTreeMap<String, CandidateIndex>,
    ) = {
        let orgs = orgs.clone();
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
        .await?
    };

    let grader = match args.prior {
        PriorChoice::Learned => Some(
            fit_learned_grader(&settings, &dataset, FitOn::Everything, database)
                .await
                .context("--prior learned: cannot fit the learned grader that prices the candidates (--prior none stores them without priors)")?,
        ),
        PriorChoice::None => None,
    };

    let runtime = trainer::device::Runtime::select(args.device.request())?;
    let sampling = Sampling {
        n: args.k,
        max_new_tokens: args.max_new_tokens.unwrap_or(settings.max_new_tokens),
        temperature: args.temperature.unwrap_or(settings.temperature),
        seed: args.seed,
        grammar: None,
    };
    println!(
        "generating {} recommendations for each of {} contexts (organization × failure cluster, its typical configuration) of {} in {} organization(s) with model version {} on {}",
        args.k,
        contexts.len(),
        settings.data.display(),
        orgs.len(),
        run_id,
        runtime.describe()
    );
    let generation = Instant::now();
    let generated = tokio::task::block_in_place(|| {
        generate(args, &settings, runtime, &dataset, &contexts, sampling)
    })?;
    let generation_seconds = generation.elapsed().as_secs_f64();
    let harvests: Vec<Harvest> = contexts
        .iter()
        .zip(&generated)
        .map(|(context, generated)| {
            // `indexes` has every context's organization: it was loaded for each.
            let empty;
            let index = match indexes.get(context.org) {
                Some(index) => index,
                None => {
                    empty = CandidateIndex::empty(context.org);
                    &empty
                }
            };
            let harvest = harvest(context.prompt, &generated.completions, &run_id, index);
            debug_assert_eq!(harvest.valid, generated.format_valid);
            harvest
        })
        .collect();

    // Candidates of a context whose cluster is not an active stored cluster (an export made
    // before `arc-rec cluster`, whose clusters are failure categories, or clusters renamed since)
    // are stored for any cluster.
    let mut summaries: BTreeMap<&str, OrgSummary> = BTreeMap::new();
    let mut per_org: BTreeMap<&str, Vec<ClusterCandidates>> = BTreeMap::new();
    let mut unmatched = 0;
    let mut format_errors: BTreeMap<&str, usize> = BTreeMap::new();
    let mut first_unknown = None;
    for (context, harvest) in contexts.iter().zip(&harvests) {
        let stored = stored_clusters
            .get(context.org)
            .is_some_and(|ids| ids.contains(context.cluster));
        if !stored {
            unmatched += 1;
        }
        let summary = summaries.entry(context.org).or_default();
        summary.contexts += 1;
        summary.generated += harvest.generated;
        summary.valid += harvest.valid;
        summary.unknown += harvest.unknown_names;
        summary.passed += harvest.candidates.len();
        if first_unknown.is_none() {
            first_unknown = harvest
                .first_unknown
                .as_ref()
                .map(|name| format!("{name} in {}", context.org));
        }
        for (kind, count) in &harvest.format_errors {
            *format_errors.entry(kind).or_insert(0) += count;
        }
        per_org.entry(context.org).or_default().push((
            stored.then(|| context.cluster.to_owned()),
            harvest.candidates.clone(),
        ));
    }
    let mut rows: BTreeMap<String, Vec<StoredCandidate>> = per_org
        .into_iter()
        .map(|(org, per_context)| (org.to_owned(), merge_clusters(per_context)))
        .collect();
    if let Some(grader) = &grader {
        price(grader, &contexts, &harvests, &mut rows)?;
    }
    let generated: usize = summaries.values().map(|s| s.generated).sum();
    let valid: usize = summaries.values().map(|s| s.valid).sum();
    let unknown: usize = summaries.values().map(|s| s.unknown).sum();
    let passed: usize = summaries.values().map(|s| s.passed).sum();
    let errors = format_errors
        .iter()
        .map(|(kind, count)| format!("{kind} {count}"))
        .collect::<Vec<_>>()
        .join(", ");
    if passed == 0 {
        bail!(
            "the model produced no usable candidate: {generated} recommendations generated, {valid} passed the format check{}, {unknown} of them named a model or tool the organization has never run, none passed the hard constraints; nothing was written (train the run longer, e.g. more --sft-steps, or sample more with --k)",
            if errors.is_empty() {
                String::new()
            } else {
                format!(" (format errors: {errors})")
            }
        );
    }

    let base_model = std::path::absolute(&settings.model)
        .unwrap_or_else(|_| settings.model.clone())
        .display()
        .to_string();
    for (org, rows) in &rows {
        let summary = summaries.entry(org.as_str()).or_default();
        summary.rows = rows.len();
        summary.for_cluster = rows.iter().filter(|(c, _)| c.is_some()).count();
    }
    // Printed under the summary table, whichever way the candidates are written.
    let mut notes = Vec::new();
    if !errors.is_empty() {
        notes.push(format!("format errors: {errors}"));
    }
    if let Some(example) = &first_unknown {
        notes.push(format!(
            "{unknown} valid recommendations named a model or tool the organization has never run and were dropped (e.g. {example})"
        ));
    }
    if let Some(out) = &args.out {
        let text = candidate_lines(&rows)?;
        crate::training::run_dir::write_atomically(out, text.as_bytes())
            .with_context(|| format!("--out {}", out.display()))?;
        print_summary(&summaries);
        for note in &notes {
            println!("{note}");
        }
        println!(
            "wrote {} candidates of model version {run_id} to {} in {:.1} s ({:.1} s generating)",
            rows.values().map(Vec::len).sum::<usize>(),
            out.display(),
            started.elapsed().as_secs_f64(),
            generation_seconds
        );
        return Ok(());
    }
    let saved: BTreeMap<String, SavedCandidates> = {
        let (rows, run_id) = (rows.clone(), run_id.clone());
        super::with_database(database, |pool| async move {
            let mut saved = BTreeMap::new();
            for (org, rows) in rows.iter().filter(|(_, rows)| !rows.is_empty()) {
                let written =
                    save_model_candidates_by_cluster(&pool, org, &run_id, &base_model, rows)
                        .await
                        .with_context(|| format!("writing {org}'s candidates"))?;
                saved.insert(org.clone(), written);
            }
            Ok(saved)
        })
        .await?
    };
    for (org, saved) in saved {
        if let Some(summary) = summaries.get_mut(org.as_str()) {
            summary.saved = saved;
        }
    }
    print_summary(&summaries);
    for note in &notes {
        println!("{note}");
    }
    if unmatched > 0 {
        println!(
            "{unmatched} of {} contexts' failure clusters are not active clusters in the database (the data was exported before `arc-rec cluster`, or re-clustered since): their candidates are for any cluster",
            contexts.len()
        );
    }
    println!(
        "wrote {} candidates of model version {} in {:.1} s ({:.1} s generating); running `arc-rec serve` replicas pick them up within {} s",
        rows.values().map(Vec::len).sum::<usize>(),
        run_id,
        started.elapsed().as_secs_f64(),
        generation_seconds,
        crate::recommend::service::MODEL_CANDIDATES_RELOAD_BOUND.as_secs()
    );
    Ok(())
}

/// Stores with every candidate the learned grader's prior over the contexts that proposed it
/// (`LearnedGrader::prior`), and prints how the priors spread.
fn price(
    grader: &LearnedGrader,
    contexts: &[ServingContext<'_>],
    harvests: &[Harvest],
    rows: &mut BTreeMap<String, Vec<StoredCandidate>>,
) -> anyhow::Result<()> {
    let mut proposed: BTreeMap<(&str, &str), Vec<(&RftPrompt, &serde_json::Value)>> =
        BTreeMap::new();
    for (context, harvest) in contexts.iter().zip(harvests) {
        for candidate in &harvest.candidates {
            proposed
                .entry((context.org, candidate.candidate_id.as_str()))
                .or_default()
                .push((context.prompt, &candidate.diff));
        }
    }
    let mut means = Vec::new();
    for (org, org_rows) in rows.iter_mut() {
        for (_, candidate) in org_rows.iter_mut() {
            let contexts = proposed
                .get(&(org.as_str(), candidate.candidate_id.as_str()))
                .cloned()
                .unwrap_or_default();
            let prior = grader
                .prior(contexts)
                .with_context(|| format!("pricing {org}'s candidate {}", candidate.candidate_id))?;
            if let (Some(prior), CandidateSource::Model { prior: slot, .. }) =
                (prior, &mut candidate.source)
            {
                means.push(prior.mean);
                *slot = Some(prior);
            }
        }
    }
    if !means.is_empty() {
        means.sort_by(f64::total_cmp);
        println!(
            "priced {} candidates with the learned grader: prior P(accept) {:.3} (min) / {:.3} (median) / {:.3} (max)",
            means.len(),
            means[0],
            means[means.len() / 2],
            means[means.len() - 1]
        );
    }
    Ok(())
}

/// One context's completions.
struct Generated {
    completions: Vec<String>,
    /// How many passed the graders' format check (what `harvest` counts as valid).
    format_valid: usize,
}

/// Samples every context's completions with the run's RL model.
fn generate(
    args: &CandidatesArgs,
    settings: &TrainSettings,
    runtime: trainer::device::Runtime,
    dataset: &RftDataset,
    contexts: &[ServingContext<'_>],
    sampling: Sampling<'_>,
) -> anyhow::Result<Vec<Generated>> {
    let policy = load_run_model(args.model, settings, &args.run, runtime)?;
    let grammar = recommendation_grammar(&policy, args.constrained.is_on())?;
    let sampling = Sampling {
        grammar: grammar.as_ref(),
        ..sampling
    };
    let prompts: Vec<&RftPrompt> = contexts.iter().map(|c| c.prompt).collect();
    let tokens = tokenize_prompts(&policy, dataset, &prompts)?;
    // The format check is the graders' (`Grader::grade` reads a completion with
    // `parse_recommendation`, as `harvest` does); verdicts need no world here.
    let grader = Grader::logged(false);
    let total = tokens.len();
    let bar = std::io::stderr()
        .is_terminal()
        .then(|| crate::progress::bar(total as u64, "contexts", false));
    let mut generated = Vec::with_capacity(total);
    for batch in tokens.chunks(args.batch_prompts) {
        let picks: Vec<&PromptTokens<'_>> = batch.iter().collect();
        let rollout = rollout(&policy, &picks, sampling, &grader, args.seed)?;
        for group in rollout.groups {
            generated.push(Generated {
                completions: group
                    .samples
                    .iter()
                    .map(|sample| policy.decode(&sample.tokens))
                    .collect(),
                format_valid: group
                    .samples
                    .iter()
                    .filter(|s| s.verdict.format_valid)
                    .count(),
            });
        }
        match &bar {
            Some(bar) => bar.set_position(generated.len() as u64),
            None => println!(
                "generated for {}/{total} contexts ({} well-formed recommendations so far)",
                generated.len(),
                generated.iter().map(|g| g.format_valid).sum::<usize>()
            ),
        }
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    Ok(generated)
}

fn print_summary(summaries: &BTreeMap<&str, OrgSummary>) {
    println!(
        "{:<16} {:>8} {:>9} {:>6} {:>7} {:>6} {:>7} {:>5} {:>8} {:>11}",
        "organization",
        "contexts",
        "generated",
        "valid",
        "unknown",
        "passed",
        "written",
        "new",
        "updated",
        "for cluster"
    );
    let mut total = OrgSummary::default();
    let line = |org: &str, s: &OrgSummary| {
        println!(
            "{org:<16} {:>8} {:>9} {:>6} {:>7} {:>6} {:>7} {:>5} {:>8} {:>11}",
            s.contexts,
            s.generated,
            s.valid,
            s.unknown,
            s.passed,
            s.rows,
            s.saved.inserted,
            s.saved.updated,
            s.for_cluster
        );
    };
    for (org, summary) in summaries {
        line(org, summary);
        total.contexts += summary.contexts;
        total.generated += summary.generated;
        total.valid += summary.valid;
        total.unknown += summary.unknown;
        total.passed += summary.passed;
        total.rows += summary.rows;
        total.for_cluster += summary.for_cluster;
        total.saved.inserted += summary.saved.inserted;
        total.saved.updated += summary.saved.updated;
    }
    line("total", &total);
    println!(
        "valid: passed the graders' format check; unknown: valid, but bringing in a model or tool \
         the organization has never run (dropped); passed: valid, no unknown name, and serving's \
         hard constraints (a valid configuration after the diff, a real change, no two alike in a context); written: rows of \
         candidate_recommendations (a candidate proposed in several clusters is one row, for any \
         cluster); for cluster: rows tied to one failure cluster, the others serve every cluster"
    );
}
