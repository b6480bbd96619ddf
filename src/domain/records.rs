//! Ingest records: one JSON line `{"kind": ..., "org": ..., "data": {...}}` per platform row, in the
//! platform's own field names (see `CONTRACTS.md`). `arc-rec ingest`, `POST /v1/trajectories` and
//! the synthetic world all produce and consume these types, so every source enters through one door.
//!
//! Unknown fields are rejected with an error naming them: a typo must not pass silently.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize, de::DeserializeOwned};
use serde_json::Value;
use serde_json::value::RawValue;

use super::agent_config::{validate_config, validate_diff};
use super::validation::{FieldError, FieldErrors};

/// An organization's id as the platform names it (`"acme"`). Every row arc-rec stores carries one
/// and nothing reads across organizations.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct OrgId(String);

/// [`OrgId::parse`]'s rule as a JSON Schema (ECMAScript) pattern.
pub const ORG_ID_PATTERN: &str = "^[A-Za-z0-9._-]{1,128}$";

impl OrgId {
    /// Parses an organization id: 1–128 characters of letters, digits, `-`, `_` or `.`.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
        if raw.is_empty() || raw.len() > 128 || !raw.chars().all(ok_char) {
            return Err(format!(
                "must be 1-128 characters of letters, digits, '-', '_' or '.', got {raw:?}"
            ));
        }
        Ok(Self(raw.to_owned()))
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for OrgId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The record kinds an ingest line may carry, in dependency order: a record may reference only
/// kinds listed before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordKind {
    /// A platform user with the role and domain the acceptance model segments by.
    User,
    /// An agent configuration (`configurations`).
    Configuration,
    /// One version of a configuration (`config_versions`).
    ConfigVersion,
    /// An evaluation scenario (`scenarios`).
    Scenario,
    /// A run of a configuration version over scenarios (`simulations`).
    Simulation,
    /// One scenario's result inside a simulation, with its trajectory (`outcomes`).
    Outcome,
    /// A failure extracted from an outcome (`failure_patterns`).
    FailurePattern,
    /// A proposed change to a configuration and whether people approved it (`config_diffs`).
    ConfigDiff,
}

impl RecordKind {
    /// Every kind, in dependency order.
    pub const ALL: [RecordKind; 8] = [
        RecordKind::User,
        RecordKind::Configuration,
        RecordKind::ConfigVersion,
        RecordKind::Scenario,
        RecordKind::Simulation,
        RecordKind::Outcome,
        RecordKind::FailurePattern,
        RecordKind::ConfigDiff,
    ];

    /// The field of `data` that holds the record's id.
    pub fn id_field(self) -> &'static str {
        match self {
            RecordKind::User => "user_id",
            RecordKind::Configuration => "config_id",
            RecordKind::ConfigVersion => "version_id",
            RecordKind::Scenario => "scenario_id",
            RecordKind::Simulation => "simulation_id",
            RecordKind::Outcome => "outcome_id",
            RecordKind::FailurePattern => "pattern_id",
            RecordKind::ConfigDiff => "diff_id",
        }
    }

    /// The name used in the `kind` field.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordKind::User => "user",
            RecordKind::Configuration => "configuration",
            RecordKind::ConfigVersion => "config_version",
            RecordKind::Scenario => "scenario",
            RecordKind::Simulation => "simulation",
            RecordKind::Outcome => "outcome",
            RecordKind::FailurePattern => "failure_pattern",
            RecordKind::ConfigDiff => "config_diff",
        }
    }
}

/// A platform user (`users` is not in the platform dump; arc-rec accepts it to learn segments).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct User {
    pub user_id: String,
    /// e.g. `senior_ml_engineer`, `product_manager`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_role: Option<String>,
    /// e.g. `fintech`, `healthcare`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
}

/// `configurations`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Configuration {
    pub config_id: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    #[serde(default = "default_true")]
    pub is_active: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_version_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modal_app_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_config: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<DateTime<Utc>>,
}

fn default_true() -> bool {
    true
}

/// How a configuration version came to be (`config_versions.generated_by`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GeneratedBy {
    Manual,
    LlmRecommendation,
    DiffEngine,
    Api,
}

impl GeneratedBy {
    /// The database enum label.
    pub fn as_str(self) -> &'static str {
        match self {
            GeneratedBy::Manual => "manual",
            GeneratedBy::LlmRecommendation => "llm_recommendation",
            GeneratedBy::DiffEngine => "diff_engine",
            GeneratedBy::Api => "api",
        }
    }
}

/// `config_versions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigVersion {
    pub version_id: String,
    pub config_id: String,
    pub version_number: i32,
    /// The agent configuration; see [`crate::domain::agent_config`].
    pub parsed_config: Value,
    #[serde(default = "default_generated_by")]
    pub generated_by: GeneratedBy,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_yaml: Option<String>,
    /// SHA-256 of the canonical config; computed when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<DateTime<Utc>>,
}

fn default_generated_by() -> GeneratedBy {
    GeneratedBy::Manual
}

/// `scenarios`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub scenario_id: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default)]
    pub expected_tools: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub difficulty_level: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scenario_embedding: Option<Vec<f32>>,
}

/// `simulations`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Simulation {
    pub simulation_id: String,
    pub config_version_id: String,
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overall_score: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_time_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_cost_usd: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scenario_set: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<DateTime<Utc>>,
}

/// `outcomes.status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeStatus {
    Success,
    Error,
    Timeout,
    Cancelled,
}

impl OutcomeStatus {
    /// The database enum label.
    pub fn as_str(self) -> &'static str {
        match self {
            OutcomeStatus::Success => "success",
            OutcomeStatus::Error => "error",
            OutcomeStatus::Timeout => "timeout",
            OutcomeStatus::Cancelled => "cancelled",
        }
    }
}

/// `outcomes.error_category`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCategory {
    Timeout,
    ToolError,
    ModelError,
    ValidationError,
    SystemError,
    SandboxError,
}

impl ErrorCategory {
    /// The database enum label.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCategory::Timeout => "timeout",
            ErrorCategory::ToolError => "tool_error",
            ErrorCategory::ModelError => "model_error",
            ErrorCategory::ValidationError => "validation_error",
            ErrorCategory::SystemError => "system_error",
            ErrorCategory::SandboxError => "sandbox_error",
        }
    }
}

/// `outcomes`, with the platform's `TrajectoryData` in `trajectory`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Outcome {
    pub outcome_id: String,
    pub simulation_id: String,
    pub scenario_id: String,
    pub execution_time: DateTime<Utc>,
    pub status: OutcomeStatus,
    pub reliability_score: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_time_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_used: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
    #[serde(default)]
    pub retry_count: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_category: Option<ErrorCategory>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trajectory_embedding: Option<Vec<f32>>,
    pub trajectory: Trajectory,
}

/// The platform's `TrajectoryData` (`arc/sandbox/engine/trajectory_capture.py`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Trajectory {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scenario_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scenario_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_prompt: Option<String>,
    pub start_time: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_time: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<f64>,
    pub status: String,
    #[serde(default)]
    pub tool_calls: Vec<ToolCall>,
    #[serde(default)]
    pub llm_interactions: Vec<LlmInteraction>,
    #[serde(default)]
    pub decision_points: Vec<DecisionPoint>,
    #[serde(default)]
    pub error_events: Vec<ErrorEvent>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_usage: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_breakdown: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spans: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_tree: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_selection_rationale: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameter_choices: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_recovery_attempts: Option<Value>,
}

/// `TrajectoryData.tool_calls[]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCall {
    pub tool_name: String,
    #[serde(default)]
    pub tool_input: Value,
    #[serde(default)]
    pub tool_output: Value,
    pub duration_ms: f64,
    pub success: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_context: Option<Value>,
}

/// `TrajectoryData.llm_interactions[]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlmInteraction {
    pub model: String,
    #[serde(default)]
    pub prompt: String,
    #[serde(default)]
    pub response: String,
    pub tokens_in: i64,
    pub tokens_out: i64,
    pub duration_ms: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_context: Option<Value>,
}

/// `TrajectoryData.decision_points[]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecisionPoint {
    pub decision_type: String,
    #[serde(default)]
    pub options: Vec<Value>,
    #[serde(default)]
    pub selected: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rationale: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_context: Option<Value>,
}

/// `TrajectoryData.error_events[]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorEvent {
    pub error_type: String,
    pub error_message: String,
    #[serde(default)]
    pub recovery_attempted: bool,
    #[serde(default)]
    pub recovery_successful: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_context: Option<Value>,
}

/// `failure_patterns`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailurePattern {
    pub pattern_id: String,
    pub outcome_id: String,
    pub failure_type: String,
    pub failure_category: String,
    pub error_message: String,
    /// Any fixed dimension per organization (the platform uses 1536).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_embedding: Option<Vec<f32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_time: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern_cluster_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_confidence: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub similar_failures_count: Option<i32>,
    #[serde(default)]
    pub recovery_attempted: bool,
    #[serde(default)]
    pub recovery_successful: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolution_steps: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llm_analysis: Option<Value>,
}

/// `config_diffs.approval_status`: the accept/reject signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalStatus {
    Pending,
    Approved,
    Rejected,
}

impl ApprovalStatus {
    /// The database enum label.
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalStatus::Pending => "pending",
            ApprovalStatus::Approved => "approved",
            ApprovalStatus::Rejected => "rejected",
        }
    }
}

/// `config_diffs`: a past recommendation as a merge patch over `version_before`'s config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigDiff {
    pub diff_id: String,
    pub config_id: String,
    pub version_before: String,
    /// The version the diff produces; may not exist yet (pending or rejected diffs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version_after: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diff_yaml: Option<String>,
    pub change_summary: String,
    /// JSON Merge Patch over `version_before`'s `parsed_config`.
    pub diff: Value,
    /// arc-rec's vocabulary (`retry_policy`, `model_switch`, `cheapest`, ...); inferred when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recommendation_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub impact_prediction: Option<Value>,
    #[serde(default)]
    pub llm_generated: bool,
    pub approval_status: ApprovalStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved_by: Option<String>,
    pub created_at: DateTime<Utc>,
}

/// One parsed, validated ingest line.
#[derive(Debug, Clone, PartialEq)]
pub struct IngestRecord {
    /// The organization the record belongs to.
    pub org: OrgId,
    /// The record itself.
    pub data: RecordData,
}

/// The payload of an ingest line, by kind.
#[derive(Debug, Clone, PartialEq)]
pub enum RecordData {
    User(User),
    Configuration(Configuration),
    ConfigVersion(ConfigVersion),
    Scenario(Scenario),
    Simulation(Simulation),
    Outcome(Box<Outcome>),
    FailurePattern(FailurePattern),
    ConfigDiff(ConfigDiff),
}

/// A reference from one record to another, checked before anything is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference<'a> {
    /// Path of the referring field (`data.simulation_id`).
    pub field: &'static str,
    /// Kind of the record referred to.
    pub target: RecordKind,
    /// Id of the record referred to.
    pub id: &'a str,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLine<'a> {
    kind: RecordKind,
    org: String,
    #[serde(borrow)]
    data: &'a RawValue,
}

#[derive(Serialize)]
struct LineOut<'a, T> {
    kind: RecordKind,
    org: &'a OrgId,
    data: &'a T,
}

impl IngestRecord {
    /// Parses and validates one JSON line; every error names the offending field.
    pub fn parse_line(line: &str) -> Result<Self, Vec<FieldError>> {
        if let Some(error) = super::validation::find_nul(line) {
            return Err(vec![error]);
        }
        let raw: RawLine<'_> = parse_json(line, "")?;
        let org = OrgId::parse(&raw.org).map_err(|m| vec![FieldError::new("org", m)])?;
        let text = raw.data.get();
        let data = match raw.kind {
            RecordKind::User => RecordData::User(parse_json(text, "data")?),
            RecordKind::Configuration => RecordData::Configuration(parse_json(text, "data")?),
            RecordKind::ConfigVersion => RecordData::ConfigVersion(parse_json(text, "data")?),
            RecordKind::Scenario => RecordData::Scenario(parse_json(text, "data")?),
            RecordKind::Simulation => RecordData::Simulation(parse_json(text, "data")?),
            RecordKind::Outcome => RecordData::Outcome(Box::new(parse_json(text, "data")?)),
            RecordKind::FailurePattern => RecordData::FailurePattern(parse_json(text, "data")?),
            RecordKind::ConfigDiff => RecordData::ConfigDiff(parse_json(text, "data")?),
        };
        let record = IngestRecord { org, data };
        record.validate()?;
        Ok(record)
    }

    /// Best-effort `(kind, org, id)` of a line that failed to parse, so records that reference
    /// it can be told it was rejected rather than missing.
    pub fn identify_bad_line(line: &str) -> Option<(RecordKind, String, String)> {
        let value: Value = serde_json::from_str(line).ok()?;
        let kind: RecordKind = serde_json::from_value(value.get("kind")?.clone()).ok()?;
        let org = value.get("org")?.as_str()?.to_owned();
        let id = value
            .get("data")?
            .get(kind.id_field())?
            .as_str()?
            .to_owned();
        Some((kind, org, id))
    }

    /// Writes the record as one JSON line (no trailing newline), the inverse of [`Self::parse_line`].
    pub fn to_line(&self) -> String {
        fn line<T: Serialize>(kind: RecordKind, org: &OrgId, data: &T) -> String {
            serde_json::to_string(&LineOut { kind, org, data })
                .expect("ingest records contain only JSON-representable values")
        }
        let kind = self.kind();
        match &self.data {
            RecordData::User(d) => line(kind, &self.org, d),
            RecordData::Configuration(d) => line(kind, &self.org, d),
            RecordData::ConfigVersion(d) => line(kind, &self.org, d),
            RecordData::Scenario(d) => line(kind, &self.org, d),
            RecordData::Simulation(d) => line(kind, &self.org, d),
            RecordData::Outcome(d) => line(kind, &self.org, d.as_ref()),
            RecordData::FailurePattern(d) => line(kind, &self.org, d),
            RecordData::ConfigDiff(d) => line(kind, &self.org, d),
        }
    }

    /// The record's kind.
    pub fn kind(&self) -> RecordKind {
        match &self.data {
            RecordData::User(_) => RecordKind::User,
            RecordData::Configuration(_) => RecordKind::Configuration,
            RecordData::ConfigVersion(_) => RecordKind::ConfigVersion,
            RecordData::Scenario(_) => RecordKind::Scenario,
            RecordData::Simulation(_) => RecordKind::Simulation,
            RecordData::Outcome(_) => RecordKind::Outcome,
            RecordData::FailurePattern(_) => RecordKind::FailurePattern,
            RecordData::ConfigDiff(_) => RecordKind::ConfigDiff,
        }
    }

    /// The record's own id (unique per organization and kind).
    pub fn id(&self) -> &str {
        match &self.data {
            RecordData::User(d) => &d.user_id,
            RecordData::Configuration(d) => &d.config_id,
            RecordData::ConfigVersion(d) => &d.version_id,
            RecordData::Scenario(d) => &d.scenario_id,
            RecordData::Simulation(d) => &d.simulation_id,
            RecordData::Outcome(d) => &d.outcome_id,
            RecordData::FailurePattern(d) => &d.pattern_id,
            RecordData::ConfigDiff(d) => &d.diff_id,
        }
    }

    /// The records this one must find (earlier in the input or already stored). Versions named by
    /// a diff are not required: the platform records diffs before their `version_after` exists.
    pub fn references(&self) -> Vec<Reference<'_>> {
        let r = |field, target, id| Reference { field, target, id };
        match &self.data {
            // Users are optional context: a configuration may name a user arc-rec never saw.
            RecordData::User(_) | RecordData::Scenario(_) | RecordData::Configuration(_) => vec![],
            RecordData::ConfigVersion(d) => {
                vec![r("data.config_id", RecordKind::Configuration, &d.config_id)]
            }
            RecordData::Simulation(d) => {
                vec![r(
                    "data.config_version_id",
                    RecordKind::ConfigVersion,
                    &d.config_version_id,
                )]
            }
            RecordData::Outcome(d) => vec![
                r(
                    "data.simulation_id",
                    RecordKind::Simulation,
                    &d.simulation_id,
                ),
                r("data.scenario_id", RecordKind::Scenario, &d.scenario_id),
            ],
            RecordData::FailurePattern(d) => {
                vec![r("data.outcome_id", RecordKind::Outcome, &d.outcome_id)]
            }
            RecordData::ConfigDiff(d) => {
                vec![r("data.config_id", RecordKind::Configuration, &d.config_id)]
            }
        }
    }

    /// Checks the rules the types cannot express: ranges, enums inside free JSON, non-empty ids.
    pub fn validate(&self) -> Result<(), Vec<FieldError>> {
        let mut e = FieldErrors::with_prefix("data");
        match &self.data {
            RecordData::User(d) => e.check_id("user_id", &d.user_id),
            RecordData::Configuration(d) => {
                e.check_id("config_id", &d.config_id);
                if super::validation::is_blank(&d.name) {
                    e.push("name", "must not be empty");
                }
            }
            RecordData::ConfigVersion(d) => {
                e.check_id("version_id", &d.version_id);
                e.check_id("config_id", &d.config_id);
                if d.version_number < 1 {
                    e.push(
                        "version_number",
                        format!("must be at least 1, got {}", d.version_number),
                    );
                }
                let mut config_errors = FieldErrors::with_prefix("data.parsed_config");
                validate_config(&d.parsed_config, &mut config_errors);
                for err in config_errors.into_vec() {
                    e.push_absolute(err);
                }
                if let Some(hash) = &d.config_hash
                    && (hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()))
                {
                    e.push("config_hash", "must be a 64-character hex SHA-256");
                }
            }
            RecordData::Scenario(d) => {
                e.check_id("scenario_id", &d.scenario_id);
                if let Some(embedding) = &d.scenario_embedding {
                    check_embedding(&mut e, "scenario_embedding", embedding);
                }
            }
            RecordData::Simulation(d) => {
                e.check_id("simulation_id", &d.simulation_id);
                if let Some(score) = d.overall_score {
                    e.check_range("overall_score", score, 0.0, 1.0);
                }
                if let Some(cost) = d.total_cost_usd {
                    e.check_non_negative("total_cost_usd", cost);
                }
                if d.execution_time_ms.is_some_and(|ms| ms < 0) {
                    e.push("execution_time_ms", "must not be negative");
                }
            }
            RecordData::Outcome(d) => validate_outcome(d, &mut e),
            RecordData::FailurePattern(d) => {
                e.check_id("pattern_id", &d.pattern_id);
                if let Some(embedding) = &d.error_embedding {
                    check_embedding(&mut e, "error_embedding", embedding);
                }
                if let Some(confidence) = d.cluster_confidence {
                    e.check_range("cluster_confidence", confidence, 0.0, 1.0);
                }
            }
            RecordData::ConfigDiff(d) => {
                e.check_id("diff_id", &d.diff_id);
                let mut diff_errors = FieldErrors::with_prefix("data.diff");
                validate_diff(&d.diff, &mut diff_errors);
                for err in diff_errors.into_vec() {
                    e.push_absolute(err);
                }
                if d.version_after.as_deref() == Some(d.version_before.as_str()) {
                    e.push("version_after", "must differ from version_before");
                }
            }
        }
        e.finish()
    }
}

fn validate_outcome(d: &Outcome, e: &mut FieldErrors) {
    e.check_id("outcome_id", &d.outcome_id);
    e.check_range("reliability_score", d.reliability_score, 0.0, 1.0);
    if let Some(cost) = d.cost_usd {
        e.check_non_negative("cost_usd", cost);
    }
    if d.execution_time_ms.is_some_and(|ms| ms < 0) {
        e.push("execution_time_ms", "must not be negative");
    }
    if d.tokens_used.is_some_and(|t| t < 0) {
        e.push("tokens_used", "must not be negative");
    }
    if d.retry_count < 0 {
        e.push("retry_count", "must not be negative");
    }
    if let Some(embedding) = &d.trajectory_embedding {
        check_embedding(e, "trajectory_embedding", embedding);
    }
    let t = &d.trajectory;
    if super::validation::is_blank(&t.status) {
        e.push("trajectory.status", "must not be empty");
    }
    if t.duration_ms.is_some_and(|ms| !ms.is_finite() || ms < 0.0) {
        e.push("trajectory.duration_ms", "must be a non-negative number");
    }
    for (i, call) in t.tool_calls.iter().enumerate() {
        e.check_non_negative(
            &format!("trajectory.tool_calls[{i}].duration_ms"),
            call.duration_ms,
        );
    }
    for (i, llm) in t.llm_interactions.iter().enumerate() {
        let field = format!("trajectory.llm_interactions[{i}]");
        e.check_non_negative(&format!("{field}.duration_ms"), llm.duration_ms);
        if llm.tokens_in < 0 || llm.tokens_out < 0 {
            e.push(
                &format!("{field}.tokens_in"),
                "token counts must not be negative",
            );
        }
    }
}

fn check_embedding(e: &mut FieldErrors, field: &str, embedding: &[f32]) {
    if embedding.is_empty() {
        e.push(field, "must not be empty");
    } else if embedding.len() > 16_384 {
        e.push(
            field,
            format!(
                "has {} dimensions; at most 16384 are accepted",
                embedding.len()
            ),
        );
    } else if let Some(i) = embedding.iter().position(|x| !x.is_finite()) {
        e.push(&format!("{field}[{i}]"), "must be a finite number");
    }
}

impl FieldErrors {
    /// Records an error whose path is already absolute.
    fn push_absolute(&mut self, error: FieldError) {
        let prefix_len = "data".len();
        let relative = error
            .field
            .get(prefix_len..)
            .unwrap_or("")
            .trim_start_matches('.');
        self.push(relative, error.message);
    }
}

/// Deserializes `text` and, on failure, names the field by its JSON path under `prefix`.
fn parse_json<'de, T: Deserialize<'de>>(
    text: &'de str,
    prefix: &str,
) -> Result<T, Vec<FieldError>> {
    let mut de = serde_json::Deserializer::from_str(text);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|err| {
        let path = err.path().to_string();
        let field = match (prefix.is_empty(), path.as_str()) {
            (true, ".") => String::new(),
            (true, p) => p.to_owned(),
            (false, ".") => prefix.to_owned(),
            (false, p) if p.starts_with('[') => format!("{prefix}{p}"),
            (false, p) => format!("{prefix}.{p}"),
        };
        let inner = err.into_inner();
        let message = describe_json_error(&inner);
        vec![FieldError::new(
            if field.is_empty() {
                "(line)".to_owned()
            } else {
                field
            },
            message,
        )]
    })?;
    de.end().map_err(|err| {
        vec![FieldError::new(
            prefix_or_line(prefix),
            describe_json_error(&err),
        )]
    })?;
    Ok(value)
}

fn prefix_or_line(prefix: &str) -> String {
    if prefix.is_empty() {
        "(line)".to_owned()
    } else {
        prefix.to_owned()
    }
}

/// serde's message without its "at line 1 column 57" suffix where the path already says where,
/// and with only the column where it does not (line 1 of a single line would mislead).
fn describe_json_error(err: &serde_json::Error) -> String {
    let text = err.to_string();
    match text.rfind(" at line ") {
        Some(at) if err.is_data() => text[..at].to_owned(),
        Some(at) => format!("{} at column {}", &text[..at], err.column()),
        None => text,
    }
}

/// Parses a whole JSON value of type `T` with field-path errors; shared by the HTTP API.
pub fn parse_with_path<T: DeserializeOwned>(text: &str) -> Result<T, Vec<FieldError>> {
    parse_json(text, "")
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONTRACT_LINES: &str = include_str!("../../tests/fixtures/contracts.jsonl");

    #[test]
    fn contract_examples_parse_and_round_trip() {
        for (i, line) in CONTRACT_LINES.lines().enumerate() {
            let record =
                IngestRecord::parse_line(line).unwrap_or_else(|e| panic!("line {}: {e:?}", i + 1));
            let again = IngestRecord::parse_line(&record.to_line()).expect("round trip");
            assert_eq!(record, again);
        }
    }

    fn first_error(line: &str) -> FieldError {
        IngestRecord::parse_line(line)
            .expect_err("must be rejected")
            .remove(0)
    }

    #[test]
    fn unknown_field_is_named() {
        let err = first_error(
            r#"{"kind":"scenario","org":"acme","data":{"scenario_id":"s1","name":"x","difficulty":"hard"}}"#,
        );
        assert_eq!(err.field, "data.difficulty");
        assert!(
            err.message.contains("unknown field `difficulty`"),
            "{}",
            err.message
        );
    }

    #[test]
    fn wrong_type_deep_in_trajectory_is_named() {
        let line = CONTRACT_LINES
            .lines()
            .nth(4)
            .unwrap()
            .replace(r#""success":false"#, r#""success":"no""#);
        let err = first_error(&line);
        assert_eq!(err.field, "data.trajectory.tool_calls[0].success");
        assert!(
            err.message.contains("expected a boolean"),
            "{}",
            err.message
        );
    }

    #[test]
    fn unknown_enum_value_is_named() {
        let line = CONTRACT_LINES.lines().nth(4).unwrap().replace(
            r#""error_category":"timeout""#,
            r#""error_category":"cosmic_ray""#,
        );
        let err = first_error(&line);
        assert_eq!(err.field, "data.error_category");
        assert!(
            err.message.contains("unknown variant `cosmic_ray`"),
            "{}",
            err.message
        );
    }

    #[test]
    fn unknown_kind_is_named() {
        let err = first_error(r#"{"kind":"widget","org":"acme","data":{}}"#);
        assert_eq!(err.field, "kind");
    }

    #[test]
    fn bad_org_is_named() {
        let err = first_error(r#"{"kind":"user","org":"a b","data":{"user_id":"u"}}"#);
        assert_eq!(err.field, "org");
    }

    #[test]
    fn malformed_json_is_reported() {
        let err = first_error(r#"{"kind":"user","org":"acme","data":{"user_id":"#);
        assert!(err.message.contains("EOF"), "{}", err.message);
    }

    #[test]
    fn out_of_range_reliability_is_named() {
        let line = CONTRACT_LINES
            .lines()
            .nth(4)
            .unwrap()
            .replace(r#""reliability_score":0.4"#, r#""reliability_score":1.4"#);
        assert_eq!(first_error(&line).field, "data.reliability_score");
    }
}
