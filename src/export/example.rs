//! One training example: prompt context, recommendation, reward, split; and its JSON formats.

use std::fmt::Write as _;

use serde::Serialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::rewards::{Decision, Reward, RewardInputs, reward};
use crate::candidates::FailureObservation;
use crate::domain::agent_config::{canonical_json, validate_diff};
use crate::domain::{FieldErrors, RecommendationType, apply_merge_patch};
use crate::storage::export_rows::ExportRow;

/// Output line formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ExportFormat {
    /// arc-rec's full record: context, recommendation, outcome, reward breakdown, split, origin.
    #[default]
    Arc,
    /// `{"prompt", "completion", "label", "origin"}`: Hugging Face TRL's prompt-completion
    /// shape; `label` (accepted or not) makes it TRL's unpaired-preference format (KTO).
    PromptCompletion,
    /// `{"messages": [system, user, assistant], "origin"}` as TRL's conversational format and
    /// OpenAI fine-tuning accept; accepted recommendations only (supervised warm-up).
    Chat,
}

/// Train, validation or test, decided by a hash of the example's id so it never changes between
/// runs. Training learns on train, choices between checkpoints or settings look at validation, and
/// reported figures come from test, which nothing was chosen on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Split {
    Train,
    Validation,
    Test,
}

/// How many examples in a hundred each held-out split takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holdout {
    pub validation_percent: u8,
    pub test_percent: u8,
}

impl Holdout {
    /// `arc-rec export`'s default: 10 % validation, 10 % test.
    pub const DEFAULT: Holdout = Holdout {
        validation_percent: 10,
        test_percent: 10,
    };

    /// Everything in train.
    pub const NONE: Holdout = Holdout {
        validation_percent: 0,
        test_percent: 0,
    };
}

impl Split {
    /// The split of example `org/id`: its hash's bucket (0–99) below `validation_percent` is
    /// validation, the next `test_percent` buckets test, the rest train. So validation is the same
    /// examples whatever the test share, and an export made before the test split existed (test
    /// share 0) assigned every example as this does with its validation share.
    pub fn of(org: &str, id: &str, holdout: Holdout) -> Split {
        let digest = Sha256::new()
            .chain_update(org)
            .chain_update(b"/")
            .chain_update(id)
            .finalize();
        let bucket = u64::from_be_bytes(digest[..8].try_into().expect("sha256 has 32 bytes")) % 100;
        let validation = u64::from(holdout.validation_percent);
        if bucket < validation {
            Split::Validation
        } else if bucket < validation + u64::from(holdout.test_percent) {
            Split::Test
        } else {
            Split::Train
        }
    }

    /// The split's name in files and messages.
    pub fn name(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Validation => "validation",
            Split::Test => "test",
        }
    }
}

/// The system prompt of the recommender.
pub const SYSTEM_PROMPT: &str = "You are arc-rec, an assistant that recommends one configuration change for an LLM agent \
whose evaluation runs are failing. Answer with a single JSON object: \
{\"type\": one of cheapest|highest_perf|balanced|model_switch|retry_policy|timeout_adjustment|temperature|tool_configuration, \
\"diff\": a JSON merge patch over the current configuration, \"rationale\": one sentence}.";

/// A failure group of the configuration before the change.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct FailureGroup {
    pub failure_category: String,
    pub failure_type: String,
    pub count: i64,
    pub example: String,
}

/// Failures of one export failure group read into a context, at most: the signal weights are
/// shares, so a group's size only matters relative to the others'.
const MAX_FAILURES_PER_GROUP: i64 = 100;

impl FailureGroup {
    /// How many of the group's failures a context reads: its count, at most
    /// [`MAX_FAILURES_PER_GROUP`].
    pub fn failures_read(&self) -> usize {
        self.count.clamp(0, MAX_FAILURES_PER_GROUP) as usize
    }

    /// The group as the failures a request reports: its example message, once per failure
    /// counted (at most [`MAX_FAILURES_PER_GROUP`]), with no tool or error code (the export
    /// keeps neither per failure).
    pub fn observations(&self) -> impl Iterator<Item = FailureObservation> + '_ {
        let observation = FailureObservation {
            failure_category: Some(self.failure_category.clone()),
            error_message: Some(self.example.clone()),
            tool_name: None,
            error_code: None,
        };
        std::iter::repeat_n(observation, self.failures_read())
    }
}

/// Where an example's decision was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    /// A config diff the platform recorded with its approval (its own recommender's or a
    /// person's).
    Platform,
    /// An answer to a recommendation arc-rec served.
    Served,
}

impl Origin {
    /// As files and reports name it.
    pub fn name(self) -> &'static str {
        match self {
            Origin::Platform => "platform",
            Origin::Served => "served",
        }
    }
}

/// How a served recommendation was shown: what the policy that logged it did, for weighting
/// the answer by that policy (the logged propensity is exact for the ranking it came from).
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct ServedDecision {
    pub event_id: String,
    pub recommendation_id: String,
    /// `heuristic` or `model`.
    pub source: String,
    /// The model version that generated it (`model` only).
    pub model_version_id: Option<String>,
    /// 0-based rank in the answer.
    pub position: i64,
    /// The logged probability of showing it at that position.
    pub propensity: f64,
}

/// One exported example.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrainingExample {
    pub id: String,
    pub org: String,
    pub diff_id: String,
    pub config_id: String,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub split: Split,
    pub cluster: Option<String>,
    pub origin: Origin,
    /// How it was served (origin `served` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub served: Option<ServedDecision>,
    pub context: PromptContext,
    pub recommendation: Recommendation,
    pub outcome: ObservedOutcome,
    pub reward: Reward,
}

/// What the recommender sees.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct PromptContext {
    pub failure_summary: String,
    pub failures: Vec<FailureGroup>,
    pub failing_tools: Value,
    pub current_config: Value,
    pub user_context: Value,
}

/// What it recommended.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct Recommendation {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub diff: Value,
    pub rationale: String,
    pub llm_generated: bool,
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ObservedOutcome {
    pub approval_status: String,
    pub runs_before: i64,
    pub failed_runs_before: i64,
    pub reliability_before: Option<f64>,
    pub cost_per_run_before: Option<f64>,
    pub runs_after: i64,
    pub reliability_after: Option<f64>,
    pub cost_per_run_after: Option<f64>,
}

impl Recommendation {
    /// The recommendation as the model should write it: one compact JSON object, its keys in
    /// the order the generation grammar fixes (`type`, `diff`, `rationale`; the diff's keys
    /// sorted), written out explicitly so the text does not depend on where the diff came from
    /// (JSONB's key order, or a builder's) or on serde_json's `preserve_order` feature (which
    /// llguidance turns on in builds with the model).
    pub fn completion_text(&self) -> String {
        format!(
            "{{\"type\":{},\"diff\":{},\"rationale\":{}}}",
            canonical_json(&json!(self.kind)),
            canonical_json(&self.diff),
            canonical_json(&Value::from(self.rationale.as_str())),
        )
    }
}

impl PromptContext {
    /// The user turn the recommender is asked: failure summary, current configuration, user.
    pub fn user_turn(&self) -> String {
        let mut text = String::with_capacity(1024);
        text.push_str(&self.failure_summary);
        // Sorted keys: the same prompt whatever order the configuration's keys came in.
        let _ = write!(
            text,
            "\nCurrent configuration: {}",
            canonical_json(&self.current_config)
        );
        if let Some(object) = self.user_context.as_object().filter(|o| !o.is_empty()) {
            let role = object
                .get("user_role")
                .and_then(Value::as_str)
                .unwrap_or("unknown role");
            let domain = object
                .get("domain")
                .and_then(Value::as_str)
                .unwrap_or("unknown domain");
            let _ = write!(text, "\nUser: {role}, domain {domain}.");
        }
        text.push_str("\nRecommend one configuration change as a JSON object.");
        text
    }
}

impl TrainingExample {
    /// Builds the example from a query row.
    pub fn from_row(row: ExportRow, holdout: Holdout) -> Self {
        let failures: Vec<FailureGroup> = row
            .failures
            .clone()
            .and_then(|f| serde_json::from_value(f).ok())
            .unwrap_or_default();
        let failing_tools = row.failing_tools.clone().unwrap_or_else(|| json!({}));
        let kind = row
            .recommendation_type
            .clone()
            .or_else(|| RecommendationType::infer(&row.diff).map(|t| t.as_str().to_owned()));
        let format_valid = is_well_formed(kind.as_deref(), &row.config_before, &row.diff);
        let decision = if row.approval_status == "approved" {
            Decision::Accepted
        } else {
            Decision::Rejected
        };
        let reward = reward(&RewardInputs {
            decision,
            reliability_before: row.before_reliability,
            reliability_after: row.after_reliability,
            format_valid,
            after_runs: row.after_runs,
            after_tool_timeouts: row.after_tool_timeouts.unwrap_or(0),
            after_successful_tool_calls: row.after_tool_calls_ok.unwrap_or(0),
        });
        let mut user_context = serde_json::Map::new();
        if let Some(role) = &row.user_role {
            user_context.insert("user_role".into(), json!(role));
        }
        if let Some(domain) = &row.domain {
            user_context.insert("domain".into(), json!(domain));
        }
        let failure_summary = summarize_failures(&row, &failures, &failing_tools);
        let served: Option<ServedDecision> = row
            .served
            .clone()
            .and_then(|s| serde_json::from_value(s).ok());
        let origin = if row.served.is_some() {
            Origin::Served
        } else {
            Origin::Platform
        };
        Self {
            id: format!("{}/{}", row.org_id, row.diff_id),
            split: Split::of(&row.org_id, &row.diff_id, holdout),
            org: row.org_id,
            diff_id: row.diff_id,
            config_id: row.config_id,
            created_at: row.created_at,
            cluster: row.cluster,
            origin,
            served,
            context: PromptContext {
                failure_summary,
                failures,
                failing_tools,
                current_config: row.config_before,
                user_context: Value::Object(user_context),
            },
            recommendation: Recommendation {
                kind,
                diff: row.diff,
                rationale: row.change_summary,
                llm_generated: row.llm_generated,
            },
            outcome: ObservedOutcome {
                approval_status: row.approval_status,
                runs_before: row.before_runs,
                failed_runs_before: row.before_failed,
                reliability_before: row.before_reliability,
                cost_per_run_before: row.before_cost,
                runs_after: row.after_runs,
                reliability_after: row.after_reliability,
                cost_per_run_after: row.after_cost,
            },
            reward,
        }
    }

    /// Whether people accepted the recommendation.
    pub fn accepted(&self) -> bool {
        self.reward.binary > 0.0
    }

    /// The user turn: failure summary, current configuration, user.
    pub fn prompt_text(&self) -> String {
        self.context.user_turn()
    }

    /// The assistant turn: the recommendation as the model should write it.
    pub fn completion_text(&self) -> String {
        self.recommendation.completion_text()
    }

    /// Appends the example as one JSON object (no newline) in `format`.
    pub fn write_json(&self, format: ExportFormat, out: &mut Vec<u8>) {
        let value = match format {
            ExportFormat::Arc => {
                serde_json::to_writer(&mut *out, self).expect("examples serialize to JSON");
                return;
            }
            ExportFormat::PromptCompletion => json!({
                "prompt": format!("{SYSTEM_PROMPT}\n\n{}", self.prompt_text()),
                "completion": self.completion_text(),
                "label": self.accepted(),
                "origin": self.origin,
            }),
            ExportFormat::Chat => json!({"messages": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": self.prompt_text()},
                {"role": "assistant", "content": self.completion_text()},
            ], "origin": self.origin}),
        };
        serde_json::to_writer(&mut *out, &value).expect("examples serialize to JSON");
    }
}

/// A recommendation is well formed when its type is known, its diff is a valid merge patch, and
/// applying it actually changes the configuration.
pub fn is_well_formed(kind: Option<&str>, config: &Value, diff: &Value) -> bool {
    if kind.is_none_or(|k| RecommendationType::parse(k).is_none()) {
        return false;
    }
    let mut errors = FieldErrors::default();
    validate_diff(diff, &mut errors);
    if !errors.is_empty() {
        return false;
    }
    let mut after = config.clone();
    apply_merge_patch(&mut after, diff);
    after != *config
}

fn summarize_failures(row: &ExportRow, failures: &[FailureGroup], failing_tools: &Value) -> String {
    let mut text = String::with_capacity(512);
    match row.before_reliability {
        Some(reliability) => {
            let _ = write!(
                text,
                "{} of {} runs failed (mean reliability {:.2}",
                row.before_failed, row.before_runs, reliability
            );
            if let Some(cost) = row.before_cost {
                let _ = write!(text, ", ${cost:.4}/run");
            }
            text.push_str(").");
        }
        None => text.push_str("No runs recorded for this configuration."),
    }
    if !failures.is_empty() {
        text.push_str("\nTop failures:");
        for group in failures {
            let _ = write!(
                text,
                "\n- {} ({}) x{}: \"{}\"",
                group.failure_category, group.failure_type, group.count, group.example
            );
        }
    }
    if let Some(tools) = failing_tools.as_object().filter(|t| !t.is_empty()) {
        text.push_str("\nFailing tool calls:");
        for (tool, count) in tools {
            let _ = write!(text, " {tool} x{count};");
        }
        text.pop();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_is_deterministic_and_near_the_requested_share() {
        let holdout = |validation_percent, test_percent| Holdout {
            validation_percent,
            test_percent,
        };
        let splits: Vec<Split> = (0..10_000)
            .map(|i| Split::of("acme", &format!("d{i}"), holdout(10, 15)))
            .collect();
        let count = |split| splits.iter().filter(|&&s| s == split).count();
        assert!(
            (800..1200).contains(&count(Split::Validation)),
            "{splits:?}"
        );
        assert!((1250..1750).contains(&count(Split::Test)));
        assert_eq!(
            Split::of("acme", "d1", holdout(10, 10)),
            Split::of("acme", "d1", holdout(10, 10))
        );
        assert_eq!(Split::of("acme", "d1", Holdout::NONE), Split::Train);
        assert_eq!(Split::of("acme", "d1", holdout(100, 0)), Split::Validation);
        assert_eq!(Split::of("acme", "d1", holdout(0, 100)), Split::Test);
        // The test share takes from train only: validation is what it was without it, as in an
        // export made before the test split existed.
        for i in 0..2_000 {
            let id = format!("d{i}");
            let old = Split::of("acme", &id, holdout(10, 0));
            let new = Split::of("acme", &id, holdout(10, 10));
            assert_eq!(old == Split::Validation, new == Split::Validation, "{id}");
        }
    }

    #[test]
    fn well_formed_requires_known_type_valid_and_effective_diff() {
        let config = json!({"model": "m", "temperature": 0.7, "retry": {"max_attempts": 1}});
        assert!(is_well_formed(
            Some("retry_policy"),
            &config,
            &json!({"retry": {"max_attempts": 3}})
        ));
        assert!(
            !is_well_formed(
                Some("retry_policy"),
                &config,
                &json!({"retry": {"max_attempts": 1}})
            ),
            "no-op"
        );
        assert!(
            !is_well_formed(Some("magic"), &config, &json!({"temperature": 0.2})),
            "unknown type"
        );
        assert!(
            !is_well_formed(Some("temperature"), &config, &json!({"temperature": 9})),
            "invalid"
        );
        assert!(!is_well_formed(None, &config, &json!({"temperature": 0.2})));
    }
}
