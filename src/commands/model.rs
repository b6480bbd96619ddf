//! `arc-rec model init --preset tiny --out DIR`: write a small random-initialised Qwen2 checkpoint
//! whose tokenizer is trained on the synthetic world's recommendation text. Needs no database.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use serde_json::{Value, json};

use crate::domain::records::{OutcomeStatus, RecordData};
use crate::export::TrainingExample;
use crate::export::example::SYSTEM_PROMPT;
use crate::storage::export_rows::ExportRow;
use crate::world::{World, WorldParams};

/// `arc-rec model ...`.
#[derive(Debug, Subcommand)]
pub enum ModelCommand {
    /// Write a preset checkpoint (config, safetensors weights, tokenizer, chat template).
    Init(InitArgs),
}

/// Checkpoints `model init` can write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Preset {
    /// Qwen2 architecture, ~1M parameters, byte-level BPE of ~1k tokens: CPU tests and demos.
    Tiny,
}

/// Arguments of `arc-rec model init`.
#[derive(Debug, Args)]
pub struct InitArgs {
    /// Which checkpoint to write.
    #[arg(long, value_enum, default_value_t = Preset::Tiny)]
    pub preset: Preset,
    /// Directory to write into (created if missing; must be empty unless --force).
    #[arg(long)]
    pub out: PathBuf,
    /// Seed of the weights and of the synthetic world the tokenizer corpus comes from: the same
    /// seed writes byte-identical files.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Outcomes of the synthetic world whose recommendations make up the tokenizer corpus.
    #[arg(long, default_value_t = 3_000)]
    pub corpus_outcomes: usize,
    /// Write into a non-empty directory, replacing files of the same names.
    #[arg(long)]
    pub force: bool,
}

/// Runs `arc-rec model ...`.
pub fn run(command: &ModelCommand) -> anyhow::Result<()> {
    match command {
        ModelCommand::Init(args) => init(args),
    }
}

fn init(args: &InitArgs) -> anyhow::Result<()> {
    refuse_non_empty(&args.out, args.force)?;
    let corpus = tokenizer_corpus(args.seed, args.corpus_outcomes)?;
    let corpus_bytes: usize = corpus.iter().map(String::len).sum();
    let written = match args.preset {
        Preset::Tiny => trainer::preset::write_tiny_checkpoint(&args.out, args.seed, &corpus),
    }
    .with_context(|| format!("cannot write the checkpoint to {}", args.out.display()))?;
    println!(
        "wrote the {} preset (seed {}) to {}",
        args.preset
            .to_possible_value()
            .map_or_else(String::new, |v| v.get_name().to_owned()),
        args.seed,
        written.dir.display()
    );
    for file in &written.files {
        println!("  {:<24} {:>10} bytes", file.name, file.bytes);
    }
    println!(
        "parameters: {}; vocabulary: {} tokens, trained in {:.2} s on {} lines ({} bytes) of synthetic recommendation text",
        written.parameter_count,
        written.vocab_size,
        written.tokenizer_training.as_secs_f64(),
        written.corpus_lines,
        corpus_bytes
    );
    Ok(())
}

/// Fails when `out` exists and is a file, or a directory with entries, unless `force`.
fn refuse_non_empty(out: &Path, force: bool) -> anyhow::Result<()> {
    if out.is_file() {
        anyhow::bail!("{} is a file, not a directory", out.display());
    }
    if force || !out.exists() {
        return Ok(());
    }
    let mut entries =
        std::fs::read_dir(out).with_context(|| format!("cannot read {}", out.display()))?;
    if entries.next().is_some() {
        anyhow::bail!(
            "{} is not empty; pass --force to write into it anyway",
            out.display()
        );
    }
    Ok(())
}

/// Per-version aggregates, as the export query computes them for a diff's `version_before`.
#[derive(Debug, Default)]
struct VersionStats {
    runs: i64,
    failed: i64,
    reliability_sum: f64,
    cost_sum: f64,
    cost_count: i64,
    /// (category, type) → (count, smallest message), like the query's `min(error_message)`.
    failures: BTreeMap<(String, String), (i64, String)>,
    failing_tools: BTreeMap<String, i64>,
}

/// The tokenizer's training text: the system prompt and, for every decided recommendation of a
/// synthetic world drawn from `seed`, the user prompt and the assistant completion exactly as
/// `arc-rec export --format chat` renders them. The export query's per-version aggregates are
/// recomputed from the in-memory history, so no database is needed.
pub fn tokenizer_corpus(seed: u64, outcomes: usize) -> anyhow::Result<Vec<String>> {
    let world = World::new(WorldParams {
        seed,
        outcomes,
        ..WorldParams::default()
    })
    .context("invalid synthetic world parameters")?;
    let mut users: HashMap<String, (Option<String>, Option<String>)> = HashMap::new();
    let mut config_users: HashMap<String, String> = HashMap::new();
    let mut version_configs: HashMap<String, Value> = HashMap::new();
    let mut simulation_versions: HashMap<String, String> = HashMap::new();
    let mut outcome_versions: HashMap<String, String> = HashMap::new();
    let mut stats: HashMap<String, VersionStats> = HashMap::new();
    let mut corpus = vec![SYSTEM_PROMPT.to_owned()];
    for record in world.history() {
        let org = record.org.as_str().to_owned();
        match record.data {
            RecordData::User(user) => {
                users.insert(user.user_id, (user.user_role, user.domain));
            }
            RecordData::Configuration(configuration) => {
                if let Some(user) = configuration.user_id {
                    config_users.insert(configuration.config_id, user);
                }
            }
            RecordData::ConfigVersion(version) => {
                version_configs.insert(version.version_id, version.parsed_config);
            }
            RecordData::Simulation(simulation) => {
                simulation_versions.insert(simulation.simulation_id, simulation.config_version_id);
            }
            RecordData::Outcome(outcome) => {
                let Some(version) = simulation_versions.get(&outcome.simulation_id) else {
                    continue;
                };
                let entry = stats.entry(version.clone()).or_default();
                entry.runs += 1;
                entry.failed += i64::from(outcome.status != OutcomeStatus::Success);
                entry.reliability_sum += outcome.reliability_score;
                if let Some(cost) = outcome.cost_usd {
                    entry.cost_sum += cost;
                    entry.cost_count += 1;
                }
                for call in outcome.trajectory.tool_calls.iter().filter(|c| !c.success) {
                    *entry
                        .failing_tools
                        .entry(call.tool_name.clone())
                        .or_default() += 1;
                }
                outcome_versions.insert(outcome.outcome_id, version.clone());
            }
            RecordData::FailurePattern(pattern) => {
                let Some(version) = outcome_versions.get(&pattern.outcome_id) else {
                    continue;
                };
                let group = stats
                    .entry(version.clone())
                    .or_default()
                    .failures
                    .entry((pattern.failure_category, pattern.failure_type))
                    .or_insert((0, pattern.error_message.clone()));
                group.0 += 1;
                if pattern.error_message < group.1 {
                    group.1 = pattern.error_message;
                }
            }
            RecordData::ConfigDiff(diff) => {
                if diff.approval_status == crate::domain::records::ApprovalStatus::Pending {
                    continue;
                }
                let Some(config_before) = version_configs.get(&diff.version_before) else {
                    continue;
                };
                let (user_role, domain) = config_users
                    .get(&diff.config_id)
                    .and_then(|user| users.get(user))
                    .cloned()
                    .unwrap_or_default();
                let before = stats.get(&diff.version_before);
                let row = ExportRow {
                    org_id: org,
                    diff_id: diff.diff_id,
                    config_id: diff.config_id,
                    created_at: diff.created_at,
                    approval_status: diff.approval_status.as_str().to_owned(),
                    recommendation_type: diff.recommendation_type,
                    diff: diff.diff,
                    change_summary: diff.change_summary,
                    llm_generated: diff.llm_generated,
                    version_before: diff.version_before,
                    version_after: diff.version_after,
                    config_before: config_before.clone(),
                    user_role,
                    domain,
                    before_runs: before.map_or(0, |s| s.runs),
                    before_failed: before.map_or(0, |s| s.failed),
                    before_reliability: before
                        .filter(|s| s.runs > 0)
                        .map(|s| s.reliability_sum / s.runs as f64),
                    before_cost: before
                        .filter(|s| s.cost_count > 0)
                        .map(|s| s.cost_sum / s.cost_count as f64),
                    after_runs: 0,
                    after_reliability: None,
                    after_cost: None,
                    after_tool_timeouts: None,
                    after_tool_calls_ok: None,
                    failures: before.map(top_failures),
                    failing_tools: before.map(top_failing_tools),
                    cluster: None,
                };
                let example = TrainingExample::from_row(row, 0);
                corpus.push(example.prompt_text());
                corpus.push(example.completion_text());
            }
            RecordData::Scenario(_) => {}
        }
    }
    Ok(corpus)
}

/// The five largest failure groups, largest first (ties by category), as the export query.
fn top_failures(stats: &VersionStats) -> Value {
    let mut groups: Vec<_> = stats.failures.iter().collect();
    groups.sort_by(|a, b| b.1.0.cmp(&a.1.0).then_with(|| a.0.0.cmp(&b.0.0)));
    Value::Array(
        groups
            .into_iter()
            .take(5)
            .map(|((category, kind), (count, example))| {
                json!({"failure_category": category, "failure_type": kind,
                       "count": count, "example": example})
            })
            .collect(),
    )
}

/// The five tools with the most failed calls.
fn top_failing_tools(stats: &VersionStats) -> Value {
    let mut tools: Vec<_> = stats.failing_tools.iter().collect();
    tools.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
    Value::Object(
        tools
            .into_iter()
            .take(5)
            .map(|(tool, count)| (tool.clone(), json!(count)))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corpus_is_export_shaped_recommendation_text_and_deterministic() {
        let corpus = tokenizer_corpus(5, 400).unwrap();
        assert_eq!(corpus, tokenizer_corpus(5, 400).unwrap());
        assert_ne!(corpus, tokenizer_corpus(6, 400).unwrap());
        assert_eq!(corpus[0], SYSTEM_PROMPT);
        // Prompt/completion pairs follow the system prompt.
        assert!(
            corpus.len() > 10 && corpus.len() % 2 == 1,
            "{}",
            corpus.len()
        );
        assert!(
            corpus[1].contains("Current configuration: {"),
            "{}",
            corpus[1]
        );
        assert!(corpus[1].ends_with("Recommend one configuration change as a JSON object."));
        let completion: Value = serde_json::from_str(&corpus[2]).unwrap();
        assert!(
            completion["rationale"]
                .as_str()
                .is_some_and(|r| !r.is_empty())
        );
        assert!(
            corpus
                .iter()
                .any(|text| text.contains("runs failed (mean reliability")),
            "no failure summaries"
        );
    }

    #[test]
    fn refuses_a_non_empty_directory_without_force() {
        let dir = tempfile::tempdir().unwrap();
        refuse_non_empty(dir.path(), false).unwrap();
        refuse_non_empty(&dir.path().join("missing"), false).unwrap();
        std::fs::write(dir.path().join("x"), "x").unwrap();
        let message = refuse_non_empty(dir.path(), false).unwrap_err().to_string();
        assert!(message.contains("--force"), "{message}");
        refuse_non_empty(dir.path(), true).unwrap();
        assert!(refuse_non_empty(&dir.path().join("x"), true).is_err());
    }
}
