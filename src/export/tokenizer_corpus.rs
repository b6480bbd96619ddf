//! The tiny tokenizer's training text: the prompts and completions `arc-rec export --format chat`
//! would render for a synthetic world's decided recommendations, recomputed from the world's
//! in-memory history so that `arc-rec model init` needs no database.

use std::collections::{BTreeMap, HashMap};

use serde_json::{Value, json};

use crate::domain::records::{
    ApprovalStatus, ConfigDiff, FailurePattern, Outcome, OutcomeStatus, RecordData,
};
use crate::export::example::SYSTEM_PROMPT;
use crate::export::{Holdout, TrainingExample};
use crate::storage::export_rows::ExportRow;
use crate::world::{World, WorldError, WorldParams};

/// The tokenizer's training text: the system prompt and, for every decided recommendation of a
/// synthetic world drawn from `seed`, the user prompt and the assistant completion exactly as
/// `arc-rec export --format chat` renders them. The export query's per-version aggregates are
/// recomputed from the in-memory history, so no database is needed.
pub fn tokenizer_corpus(seed: u64, outcomes: usize) -> Result<Vec<String>, WorldError> {
    let world = World::new(WorldParams {
        seed,
        outcomes,
        ..WorldParams::default()
    })?;
    let mut history = HistoryIndex::default();
    let mut corpus = vec![SYSTEM_PROMPT.to_owned()];
    for record in world.history() {
        let org = record.org.as_str().to_owned();
        match record.data {
            RecordData::User(user) => {
                history
                    .users
                    .insert(user.user_id, (user.user_role, user.domain));
            }
            RecordData::Configuration(configuration) => {
                if let Some(user) = configuration.user_id {
                    history.config_users.insert(configuration.config_id, user);
                }
            }
            RecordData::ConfigVersion(version) => {
                history
                    .version_configs
                    .insert(version.version_id, version.parsed_config);
            }
            RecordData::Simulation(simulation) => {
                history
                    .simulation_versions
                    .insert(simulation.simulation_id, simulation.config_version_id);
            }
            RecordData::Outcome(outcome) => history.add_outcome(*outcome),
            RecordData::FailurePattern(pattern) => history.add_failure_pattern(pattern),
            RecordData::ConfigDiff(diff) => {
                if let Some(example) = history.example_of(org, diff) {
                    corpus.push(example.prompt_text());
                    corpus.push(example.completion_text());
                }
            }
            RecordData::Scenario(_) => {}
        }
    }
    Ok(corpus)
}

/// What the export query joins, indexed by id as the history streams past.
#[derive(Debug, Default)]
struct HistoryIndex {
    /// user id → (role, domain).
    users: HashMap<String, (Option<String>, Option<String>)>,
    /// config id → user id.
    config_users: HashMap<String, String>,
    /// version id → parsed config.
    version_configs: HashMap<String, Value>,
    /// simulation id → config version id.
    simulation_versions: HashMap<String, String>,
    /// outcome id → config version id.
    outcome_versions: HashMap<String, String>,
    stats: HashMap<String, VersionStats>,
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

impl HistoryIndex {
    fn add_outcome(&mut self, outcome: Outcome) {
        let Some(version) = self.simulation_versions.get(&outcome.simulation_id) else {
            return;
        };
        let entry = self.stats.entry(version.clone()).or_default();
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
        self.outcome_versions
            .insert(outcome.outcome_id, version.clone());
    }

    fn add_failure_pattern(&mut self, pattern: FailurePattern) {
        let Some(version) = self.outcome_versions.get(&pattern.outcome_id) else {
            return;
        };
        let group = self
            .stats
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

    /// The training example of a decided diff, as export renders it (no outcome after the
    /// change: the corpus needs only the prompt and the completion); `None` for a pending diff
    /// or one whose config before is unknown.
    fn example_of(&self, org: String, diff: ConfigDiff) -> Option<TrainingExample> {
        if diff.approval_status == ApprovalStatus::Pending {
            return None;
        }
        let config_before = self.version_configs.get(&diff.version_before)?;
        let (user_role, domain) = self
            .config_users
            .get(&diff.config_id)
            .and_then(|user| self.users.get(user))
            .cloned()
            .unwrap_or_default();
        let before = self.stats.get(&diff.version_before);
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
            served: None,
        };
        Some(TrainingExample::from_row(row, Holdout::NONE))
    }
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
}
