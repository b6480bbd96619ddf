//! The agent configuration (`config_versions.parsed_config`) and the recommendation diffs over it.
//!
//! The platform's `AgentConfig` allows extra fields, so a configuration stays a JSON object; this
//! module validates the fields arc-rec reasons about (`model`, `temperature`, `tools`, `retry`,
//! `timeout_s`) and applies diffs. A diff is a JSON Merge Patch (RFC 7396): objects merge key by
//! key, `null` deletes, anything else (arrays included) replaces.

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::validation::{FieldErrors, is_blank};

/// Keys of a configuration that arc-rec understands and may recommend changing.
pub const KNOWN_CONFIG_KEYS: &[&str] = &[
    "model",
    "temperature",
    "tools",
    "retry",
    "timeout_s",
    "system_prompt",
    "max_tokens",
];

/// Validates a full agent configuration, as the platform's CHECK constraint does
/// (`parsed_config ? 'model' AND ? 'temperature'`, temperature between 0 and 2) plus the
/// shapes of the optional fields arc-rec reads.
pub fn validate_config(config: &Value, errors: &mut FieldErrors) {
    let Some(object) = config.as_object() else {
        errors.push("", "must be a JSON object");
        return;
    };
    match object.get("model") {
        Some(Value::String(model)) if !is_blank(model) => {}
        Some(_) => errors.push("model", "must be a non-empty string"),
        None => errors.push("model", "is required"),
    }
    match object.get("temperature") {
        Some(value) => check_temperature(value, errors),
        None => errors.push("temperature", "is required"),
    }
    validate_optional_fields(object, errors);
}

/// The JSON Schema of exactly what [`validate_config`] accepts (the OpenAPI document's
/// `AgentConfig`): keys it does not read are free, nulls stand for an absent optional field,
/// blank means what JSON Schema's `\\s` means ([`super::validation::is_blank`]).
pub fn config_json_schema() -> Value {
    let seconds = || serde_json::json!({"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": MAX_SECONDS});
    serde_json::json!({
        "type": "object",
        "description": "An agent configuration: `model` and `temperature` required; `tools`, `retry`, `timeout_s` and `system_prompt` checked when present; other keys are kept as they are.",
        "required": ["model", "temperature"],
        "properties": {
            "model": {"type": "string", "pattern": "\\S"},
            "temperature": {"type": "number", "minimum": 0, "maximum": 2},
            "tools": {
                "type": ["array", "null"],
                "items": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {
                        "name": {"type": "string", "pattern": "\\S"},
                        "timeout_s": seconds()
                    }
                }
            },
            "retry": {
                "type": ["object", "null"],
                "properties": {
                    "max_attempts": {"type": ["integer", "null"], "minimum": 1, "maximum": 100},
                    "backoff_s": seconds()
                }
            },
            "timeout_s": seconds(),
            "system_prompt": {"type": ["string", "null"]}
        }
    })
}

/// Largest number of seconds a timeout or backoff may be (`validate_config`, `validate_diff`).
pub const MAX_SECONDS: f64 = 86_400.0;

/// Validates a diff (merge patch) over a configuration: the same field rules, nothing required,
/// and at least one change.
pub fn validate_diff(diff: &Value, errors: &mut FieldErrors) {
    let Some(object) = diff.as_object() else {
        errors.push(
            "",
            "must be a JSON object (a merge patch over the configuration)",
        );
        return;
    };
    if object.is_empty() {
        errors.push("", "must change at least one field");
    }
    for key in ["model", "temperature"] {
        if object.get(key).is_some_and(Value::is_null) {
            errors.push(key, "cannot be removed; a configuration always has one");
        }
    }
    if let Some(model) = object.get("model").filter(|v| !v.is_null())
        && model.as_str().is_none_or(is_blank)
    {
        errors.push("model", "must be a non-empty string");
    }
    if let Some(value) = object.get("temperature").filter(|v| !v.is_null()) {
        check_temperature(value, errors);
    }
    validate_optional_fields(object, errors);
}

fn check_temperature(value: &Value, errors: &mut FieldErrors) {
    match value.as_f64() {
        Some(t) => errors.check_range("temperature", t, 0.0, 2.0),
        None => errors.push("temperature", "must be a number between 0 and 2"),
    }
}

fn validate_optional_fields(object: &Map<String, Value>, errors: &mut FieldErrors) {
    if let Some(tools) = object.get("tools").filter(|v| !v.is_null()) {
        match tools.as_array() {
            Some(tools) => {
                for (i, tool) in tools.iter().enumerate() {
                    match tool.get("name") {
                        Some(Value::String(name)) if !is_blank(name) => {}
                        _ => errors.push(&format!("tools[{i}].name"), "must be a non-empty string"),
                    }
                    if let Some(t) = tool.get("timeout_s").filter(|v| !v.is_null()) {
                        check_positive(t, &format!("tools[{i}].timeout_s"), errors);
                    }
                }
            }
            None => errors.push("tools", "must be an array of {\"name\": ...} objects"),
        }
    }
    if let Some(retry) = object.get("retry").filter(|v| !v.is_null()) {
        match retry.as_object() {
            Some(retry) => {
                if let Some(attempts) = retry.get("max_attempts").filter(|v| !v.is_null()) {
                    match attempts.as_u64() {
                        Some(1..=100) => {}
                        _ => errors
                            .push("retry.max_attempts", "must be an integer between 1 and 100"),
                    }
                }
                if let Some(backoff) = retry.get("backoff_s").filter(|v| !v.is_null()) {
                    check_positive(backoff, "retry.backoff_s", errors);
                }
            }
            None => errors.push("retry", "must be an object like {\"max_attempts\": 3}"),
        }
    }
    if let Some(timeout) = object.get("timeout_s").filter(|v| !v.is_null()) {
        check_positive(timeout, "timeout_s", errors);
    }
    if let Some(prompt) = object.get("system_prompt").filter(|v| !v.is_null())
        && !prompt.is_string()
    {
        errors.push("system_prompt", "must be a string");
    }
}

fn check_positive(value: &Value, field: &str, errors: &mut FieldErrors) {
    match value.as_f64() {
        Some(v) if v.is_finite() && v > 0.0 && v <= MAX_SECONDS => {}
        _ => errors.push(
            field,
            "must be a positive number of seconds (at most 86400)",
        ),
    }
}

/// Applies a JSON Merge Patch (RFC 7396) to `target` in place.
pub fn apply_merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(target) = target {
        for (key, value) in patch {
            if value.is_null() {
                target.remove(key);
            } else {
                apply_merge_patch(target.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

/// The platform's `config_hash`: hex SHA-256 of the configuration's canonical JSON (object keys
/// sorted, no whitespace), so equal configurations hash equal whatever their key order.
pub fn config_hash(config: &Value) -> String {
    let mut canonical = Vec::with_capacity(256);
    write_canonical(config, &mut canonical);
    hex::encode(Sha256::digest(&canonical))
}

/// Compact JSON with object keys sorted, whatever order the value holds them in.
pub fn canonical_json(value: &Value) -> String {
    let mut out = Vec::with_capacity(128);
    write_canonical(value, &mut out);
    // serde_json writes valid UTF-8.
    String::from_utf8_lossy(&out).into_owned()
}

/// Compact JSON with object keys sorted. Strings and scalars go through serde_json's own
/// writer, so escaping and number formats are exactly `Value`'s `Display`; writing into one
/// buffer keeps this allocation-free (it runs for every candidate of every request).
fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    // Writing JSON into a Vec<u8> cannot fail: it has no IO error and the values are valid.
    fn write_json<T: serde::Serialize + ?Sized>(value: &T, out: &mut Vec<u8>) {
        let _ = serde_json::to_writer(&mut *out, value);
    }
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort_unstable();
            out.push(b'{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_json(key.as_str(), out);
                out.push(b':');
                write_canonical(&map[key], out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        scalar => write_json(scalar, out),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    /// One of `values`, or the key left out (`None`).
    fn field(values: Vec<Value>) -> impl Strategy<Value = Option<Value>> {
        prop_oneof![Just(None), proptest::sample::select(values).prop_map(Some)]
    }

    proptest! {
        /// `config_json_schema` says exactly what `validate_config` accepts, on configurations
        /// built from each field's edge cases (bounds, blanks, nulls, wrong types).
        #[test]
        fn the_config_schema_accepts_exactly_what_validate_config_does(
            model in field(vec![json!("openai/gpt-4.1"), json!(""), json!(" \t"), json!("\u{85}"), json!("\u{feff}"), json!(3), Value::Null]),
            temperature in field(vec![json!(0), json!(0.7), json!(2), json!(2.0001), json!(-0.1), json!("0.5"), Value::Null]),
            tools in field(vec![json!([]), json!([{"name": "web"}]), json!([{"name": " "}]), json!([{}]), json!(["web"]), json!([{"name": "web", "timeout_s": 0}]), json!([{"name": "web", "timeout_s": 86400}]), json!([{"name": "web", "timeout_s": null}]), json!("web"), Value::Null]),
            retry in field(vec![json!({}), json!({"max_attempts": 0}), json!({"max_attempts": 1}), json!({"max_attempts": 100}), json!({"max_attempts": 101}), json!({"max_attempts": "3"}), json!({"backoff_s": 86400.5}), json!({"backoff_s": 0.001, "max_attempts": null}), json!(5), Value::Null]),
            timeout_s in field(vec![json!(0), json!(1e-9), json!(86400), json!(86400.1), json!("1"), json!(-3), Value::Null]),
            system_prompt in field(vec![json!("be brief"), json!(1), Value::Null]),
            extra in field(vec![json!({"nested": [1, 2]}), Value::Null]),
            not_an_object in proptest::bool::weighted(0.05),
        ) {
            let mut object = Map::new();
            for (key, value) in [("model", model), ("temperature", temperature), ("tools", tools), ("retry", retry), ("timeout_s", timeout_s), ("system_prompt", system_prompt), ("max_tokens_hint", extra)] {
                if let Some(value) = value {
                    object.insert(key.to_owned(), value);
                }
            }
            let config = if not_an_object { json!([object]) } else { Value::Object(object) };
            let mut errors = FieldErrors::default();
            validate_config(&config, &mut errors);
            let by_schema = jsonschema::draft202012::is_valid(&config_json_schema(), &config);
            prop_assert_eq!(errors.is_empty(), by_schema, "{} {:?}", config, errors.into_vec());
        }
    }

    #[test]
    fn merge_patch_follows_rfc_7396() {
        let mut config =
            json!({"model": "a", "retry": {"max_attempts": 1, "backoff_s": 2}, "tools": [1, 2]});
        apply_merge_patch(
            &mut config,
            &json!({"retry": {"max_attempts": 3, "backoff_s": null}, "tools": [3]}),
        );
        assert_eq!(
            config,
            json!({"model": "a", "retry": {"max_attempts": 3}, "tools": [3]})
        );
    }

    #[test]
    fn hash_ignores_key_order() {
        assert_eq!(
            config_hash(&json!({"a": 1, "b": [1, {"c": 2, "d": 3}]})),
            config_hash(&json!({"b": [1, {"d": 3, "c": 2}], "a": 1}))
        );
        assert_ne!(config_hash(&json!({"a": 1})), config_hash(&json!({"a": 2})));
    }

    #[test]
    fn hash_is_sha256_of_compact_sorted_json() {
        // Pinned: stored config hashes and candidate ids depend on this exact text. Expected
        // from Python: sha256(json.dumps(v, separators=(",", ":"), sort_keys=True,
        // ensure_ascii=False)).
        assert_eq!(
            config_hash(&json!({"f": 0.5, "e": "q\"xé", "b": [1, {"d": 3, "c": 2}], "a": 1})),
            "b6e77497114e7442912aef7e8f4c1a6e9d4e4c6447cd90b605ce974eece5516b"
        );
    }

    #[test]
    fn temperature_seven_is_named() {
        let mut errors = FieldErrors::with_prefix("data.parsed_config");
        validate_config(&json!({"model": "m", "temperature": 7}), &mut errors);
        let errors = errors.into_vec();
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].field, "data.parsed_config.temperature");
        assert!(
            errors[0].message.contains("between 0 and 2"),
            "{}",
            errors[0].message
        );
    }

    #[test]
    fn missing_model_and_bad_retry_are_reported() {
        let mut errors = FieldErrors::default();
        validate_config(
            &json!({"temperature": 0.5, "retry": {"max_attempts": 0}}),
            &mut errors,
        );
        let fields: Vec<String> = errors.into_vec().into_iter().map(|e| e.field).collect();
        assert_eq!(fields, ["model", "retry.max_attempts"]);
    }

    #[test]
    fn diff_cannot_remove_model() {
        let mut errors = FieldErrors::default();
        validate_diff(&json!({"model": null}), &mut errors);
        assert_eq!(errors.into_vec()[0].field, "model");
    }
}
