//! A lenient typed reading of the current agent configuration: the fields heuristics change,
//! with the platform's defaults for absent ones (one attempt, 1 s backoff, 30 s timeout). It never
//! fails: an odd field reads as its default, and the constraint checks catch the rest.

use serde_json::{Map, Value};

/// Per-call timeout when a configuration sets none (the platform's default).
pub const DEFAULT_TIMEOUT_S: f64 = 30.0;
/// Retry backoff when a configuration sets retries without one.
pub const DEFAULT_BACKOFF_S: f64 = 1.0;

/// The fields of a configuration that candidates change.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigView<'a> {
    pub model: &'a str,
    pub temperature: f64,
    /// The `tools` array as given (each element kept whole when a patch rewrites the array).
    pub tools: &'a [Value],
    pub max_attempts: u64,
    pub backoff_s: f64,
    pub timeout_s: f64,
    pub system_prompt_chars: usize,
}

static NO_TOOLS: [Value; 0] = [];

impl<'a> ConfigView<'a> {
    /// Reads `config`; missing or malformed fields take their defaults.
    pub fn of(config: &'a Value) -> Self {
        Self::read(|key| config.get(key), |key| config.get("retry")?.get(key))
    }

    /// Reads `config` as it would be after applying the merge patch `diff`, without building the
    /// patched configuration (the request path reads many candidates).
    pub fn patched(config: &'a Value, diff: &'a Value) -> Self {
        let Some(patch) = diff.as_object() else {
            return Self::of(diff);
        };
        let field = move |key: &str| match patch.get(key) {
            Some(Value::Null) => None,
            Some(value) => Some(value),
            None => config.get(key),
        };
        let retry_field = move |key: &str| match patch.get("retry") {
            None => config.get("retry")?.get(key),
            Some(Value::Object(retry)) => match retry.get(key) {
                Some(Value::Null) => None,
                Some(value) => Some(value),
                None => config.get("retry")?.get(key),
            },
            // Null removes the retry policy; anything else replaces it wholesale.
            Some(other) => other.get(key),
        };
        Self::read(field, retry_field)
    }

    fn read(
        field: impl Fn(&str) -> Option<&'a Value>,
        retry_field: impl Fn(&str) -> Option<&'a Value>,
    ) -> Self {
        let positive = |v: Option<&Value>| v.and_then(Value::as_f64).filter(|x| *x > 0.0);
        Self {
            model: field("model").and_then(Value::as_str).unwrap_or_default(),
            temperature: field("temperature")
                .and_then(Value::as_f64)
                .filter(|t| t.is_finite())
                .unwrap_or(0.7),
            tools: field("tools")
                .and_then(Value::as_array)
                .map_or(&NO_TOOLS[..], Vec::as_slice),
            max_attempts: retry_field("max_attempts")
                .and_then(Value::as_u64)
                .filter(|a| *a >= 1)
                .unwrap_or(1),
            backoff_s: positive(retry_field("backoff_s")).unwrap_or(DEFAULT_BACKOFF_S),
            timeout_s: positive(field("timeout_s")).unwrap_or(DEFAULT_TIMEOUT_S),
            system_prompt_chars: field("system_prompt")
                .and_then(Value::as_str)
                .map_or(0, str::len),
        }
    }

    /// The name of the i-th tool ("" when it has none).
    pub fn tool_name(&self, i: usize) -> &'a str {
        self.tools
            .get(i)
            .and_then(|t| t.get("name"))
            .and_then(Value::as_str)
            .unwrap_or_default()
    }

    /// Configured tool names, in order.
    pub fn tool_names(&self) -> impl Iterator<Item = &'a str> + '_ {
        (0..self.tools.len()).map(|i| self.tool_name(i))
    }

    /// Whether a tool of this name is configured.
    pub fn has_tool(&self, name: &str) -> bool {
        self.tool_names().any(|t| t == name)
    }

    /// The timeout a call of `tool` runs under: its own, else the configuration's.
    pub fn tool_timeout_s(&self, tool: &str) -> f64 {
        self.tools
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some(tool))
            .and_then(|t| t.get("timeout_s"))
            .and_then(Value::as_f64)
            .filter(|x| *x > 0.0)
            .unwrap_or(self.timeout_s)
    }

    /// The provider part of the model name (`openai` of `openai/gpt-4.1`).
    pub fn provider(&self) -> &'a str {
        provider_of(self.model)
    }

    /// A `tools` array equal to the current one except that `tool` gets `timeout_s` (merge patch
    /// replaces arrays wholesale, so every other tool must be carried over unchanged).
    pub fn tools_with_timeout(&self, tool: &str, timeout_s: f64) -> Value {
        Value::Array(
            self.tools
                .iter()
                .map(|t| {
                    if t.get("name").and_then(Value::as_str) == Some(tool) {
                        let mut object = t.as_object().cloned().unwrap_or_else(Map::new);
                        object.insert("timeout_s".to_owned(), number(timeout_s));
                        Value::Object(object)
                    } else {
                        t.clone()
                    }
                })
                .collect(),
        )
    }

    /// A `tools` array without the named tools.
    pub fn tools_without(&self, removed: &[&str]) -> Value {
        Value::Array(
            self.tools
                .iter()
                .filter(|t| {
                    !t.get("name")
                        .and_then(Value::as_str)
                        .is_some_and(|n| removed.contains(&n))
                })
                .cloned()
                .collect(),
        )
    }

    /// A `tools` array with one more tool at the end.
    pub fn tools_with(&self, added: &str) -> Value {
        let mut tools = self.tools.to_vec();
        let mut object = Map::new();
        object.insert("name".to_owned(), Value::String(added.to_owned()));
        tools.push(Value::Object(object));
        Value::Array(tools)
    }
}

/// The provider part of a model name: before the first `/`, or the whole name.
pub fn provider_of(model: &str) -> &str {
    model.split_once('/').map_or(model, |(p, _)| p)
}

/// A JSON number, written as an integer when it is one, so `3` and `3.0` patch alike and a diff
/// reads the way a person would write it.
pub fn number(x: f64) -> Value {
    if x.is_finite() && x.fract() == 0.0 && x.abs() < 1e15 {
        Value::from(x as i64)
    } else {
        serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number)
    }
}

/// Rounds to one decimal (temperatures, seconds people type).
pub fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// Equality of JSON values that compares numbers by value (`30` equals `30.0`), so a diff that
/// rewrites a number in another notation still counts as a no-op.
pub fn same_json(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_f64(), y.as_f64()) {
            (Some(x), Some(y)) => x == y,
            _ => x == y,
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same_json(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
        }
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn defaults_and_tool_patches() {
        let config = json!({"model": "openai/gpt-4.1", "temperature": 0.7,
            "tools": [{"name": "web_search", "description": "d"}, {"name": "calculator", "timeout_s": 5}]});
        let view = ConfigView::of(&config);
        assert_eq!(view.max_attempts, 1);
        assert_eq!(view.timeout_s, 30.0);
        assert_eq!(view.tool_timeout_s("calculator"), 5.0);
        assert_eq!(view.tool_timeout_s("web_search"), 30.0);
        assert_eq!(view.provider(), "openai");
        assert_eq!(
            view.tools_with_timeout("web_search", 60.0),
            json!([{"name": "web_search", "description": "d", "timeout_s": 60},
                   {"name": "calculator", "timeout_s": 5}])
        );
        assert_eq!(
            view.tools_without(&["web_search"]),
            json!([{"name": "calculator", "timeout_s": 5}])
        );
        let odd = json!({"model": 3, "temperature": "hot", "tools": "x", "retry": 2});
        let view = ConfigView::of(&odd);
        assert_eq!(
            (view.model, view.temperature, view.tools.len()),
            ("", 0.7, 0)
        );
    }

    #[test]
    fn numbers_compare_by_value() {
        assert!(same_json(
            &json!({"a": [1, {"b": 30}]}),
            &json!({"a": [1.0, {"b": 30.0}]})
        ));
        assert!(!same_json(&json!({"a": 1}), &json!({"a": 1, "b": 2})));
        assert_eq!(number(3.0), json!(3));
        assert_eq!(number(0.3), json!(0.3));
    }
}
