//! Agent configurations as the world reasons about them: the typed reading of a
//! `parsed_config` JSON object, and the random initial configurations people start from.

use rand::Rng;
use serde_json::{Map, Value, json};

use crate::domain::agent_config::validate_config;
use crate::domain::validation::FieldErrors;

use super::catalogue::{MODELS, ModelSpec, TOOLS, model_spec};
use super::sampling::{chance, int_between, pick, weighted_index};

/// Default per-call timeout when a configuration sets none (the platform's default).
pub(crate) const DEFAULT_TIMEOUT_S: f64 = 30.0;
/// Default retry backoff when a configuration sets retries without one.
pub(crate) const DEFAULT_BACKOFF_S: f64 = 1.0;

/// A configuration the world can run: valid, on a model the catalogue knows.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct AgentSpec<'a> {
    pub model: &'static ModelSpec,
    pub temperature: f64,
    pub tools: Vec<ToolSetting<'a>>,
    pub max_attempts: u32,
    pub backoff_s: f64,
    pub timeout_s: f64,
    /// Rough token count of the system prompt (characters / 4).
    pub system_prompt_tokens: f64,
    /// Whether the system prompt asks for a strict output format (halves nothing, but helps).
    pub format_instructions: bool,
}

/// One configured tool.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ToolSetting<'a> {
    pub name: &'a str,
    pub timeout_s: Option<f64>,
}

/// Why a configuration cannot be run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SpecError {
    /// It fails `validate_config`.
    Invalid(String),
    /// It names a model the catalogue does not have.
    UnknownModel(String),
}

impl<'a> AgentSpec<'a> {
    /// Reads a configuration; defaults follow the platform (one attempt, 30 s timeout).
    pub fn parse(config: &'a Value) -> Result<Self, SpecError> {
        let mut errors = FieldErrors::default();
        validate_config(config, &mut errors);
        if let Some(first) = errors.into_vec().into_iter().next() {
            return Err(SpecError::Invalid(first.to_string()));
        }
        let model_name = config
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let model =
            model_spec(model_name).ok_or_else(|| SpecError::UnknownModel(model_name.to_owned()))?;
        let temperature = config
            .get("temperature")
            .and_then(Value::as_f64)
            .unwrap_or(0.0);
        let tools = config
            .get("tools")
            .and_then(Value::as_array)
            .map(|tools| {
                tools
                    .iter()
                    .filter_map(|t| {
                        let name = t.get("name")?.as_str()?;
                        Some(ToolSetting {
                            name,
                            timeout_s: t.get("timeout_s").and_then(Value::as_f64),
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        let retry = config.get("retry");
        let max_attempts = retry
            .and_then(|r| r.get("max_attempts"))
            .and_then(Value::as_u64)
            .map_or(1, |a| a.clamp(1, 100) as u32);
        let backoff_s = retry
            .and_then(|r| r.get("backoff_s"))
            .and_then(Value::as_f64)
            .unwrap_or(DEFAULT_BACKOFF_S);
        let timeout_s = config
            .get("timeout_s")
            .and_then(Value::as_f64)
            .unwrap_or(DEFAULT_TIMEOUT_S);
        let prompt = config
            .get("system_prompt")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let lowered = prompt.to_ascii_lowercase();
        Ok(Self {
            model,
            temperature,
            tools,
            max_attempts,
            backoff_s,
            timeout_s,
            system_prompt_tokens: prompt.len() as f64 / 4.0,
            format_instructions: lowered.contains("json") || lowered.contains("schema"),
        })
    }

    /// Whether a tool of this name is configured.
    pub fn has_tool(&self, name: &str) -> bool {
        self.tools.iter().any(|t| t.name == name)
    }

    /// The timeout that applies to a tool: its own, else the configuration's.
    pub fn tool_timeout_s(&self, name: &str) -> f64 {
        self.tools
            .iter()
            .find(|t| t.name == name)
            .and_then(|t| t.timeout_s)
            .unwrap_or(self.timeout_s)
    }

    /// Names of the configured tools.
    pub fn tool_names(&self) -> Vec<String> {
        self.tools.iter().map(|t| t.name.to_owned()).collect()
    }
}

/// Draws the configuration a person writes first for a workload that calls `needed_tools`.
///
/// People start from defaults that are often wrong in a way the world can punish: short
/// timeouts, no retries, temperature at an extreme, a cheap model, a tool forgotten or many
/// unused tools pasted in from another agent.
pub(crate) fn draw_initial_config<R: Rng + ?Sized>(
    rng: &mut R,
    needed_tools: &[&'static str],
    domain: &str,
) -> Value {
    // Cheap models are popular first choices; this is what makes rate limits, format errors and
    // context overflows common in real histories.
    let weights: Vec<f64> = MODELS
        .iter()
        .map(|m| {
            if m.blended_price() < 0.002 {
                1.6
            } else if m.blended_price() < 0.01 {
                1.0
            } else {
                0.7
            }
        })
        .collect();
    let model = weighted_index(rng, &weights).map_or(MODELS[0].name, |i| MODELS[i].name);
    let temperature = *pick(
        rng,
        &[
            0.0, 0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.7, 0.9, 1.0, 1.2, 1.4,
        ],
    )
    .unwrap_or(&0.7);
    let mut tool_names: Vec<&str> = needed_tools.to_vec();
    if tool_names.len() > 1 && chance(rng, 0.25) {
        // A tool the tasks need was forgotten.
        let drop = int_between(rng, 0, tool_names.len() as u64 - 1) as usize;
        tool_names.remove(drop);
    }
    let extra = if chance(rng, 0.4) {
        int_between(rng, 1, 6)
    } else {
        0
    };
    for _ in 0..extra {
        if let Some(t) = pick(rng, TOOLS)
            && !tool_names.contains(&t.name)
        {
            tool_names.push(t.name);
        }
    }
    let timeout_s = *pick(
        rng,
        &[2.0, 3.0, 5.0, 5.0, 10.0, 15.0, 30.0, 30.0, 60.0, 60.0],
    )
    .unwrap_or(&30.0);
    let tools: Vec<Value> = tool_names
        .iter()
        .map(|name| {
            if chance(rng, 0.1) {
                json!({"name": name, "timeout_s": *pick(rng, &[2.0, 5.0, 20.0]).unwrap_or(&5.0)})
            } else {
                json!({"name": name})
            }
        })
        .collect();
    let mut config = Map::new();
    config.insert("model".into(), json!(model));
    config.insert("temperature".into(), json!(temperature));
    config.insert("tools".into(), Value::Array(tools));
    if chance(rng, 0.45) {
        let attempts = *pick(rng, &[2u64, 2, 3]).unwrap_or(&2);
        let backoff = *pick(rng, &[0.5, 1.0, 2.0]).unwrap_or(&1.0);
        config.insert(
            "retry".into(),
            json!({"max_attempts": attempts, "backoff_s": backoff}),
        );
    } else {
        config.insert("retry".into(), json!({"max_attempts": 1}));
    }
    config.insert("timeout_s".into(), json!(timeout_s));
    let prompt = pick(rng, SYSTEM_PROMPTS)
        .copied()
        .unwrap_or("You are a helpful agent.");
    config.insert(
        "system_prompt".into(),
        json!(prompt.replace("{domain}", domain)),
    );
    Value::Object(config)
}

const SYSTEM_PROMPTS: &[&str] = &[
    "You are a careful {domain} operations agent. Use the tools provided; never guess ids.",
    "You are a {domain} support assistant. Be concise and cite the records you used.",
    "You are an analyst for a {domain} company. \
     Answer with a JSON object matching the output schema.",
    "You are a helpful agent. Think step by step, call tools when needed, \
     and finish with a short summary for a {domain} audience.",
    "You help {domain} teams. Reply in JSON with fields answer, confidence and sources.",
];
