//! A model completion read as a recommendation: one JSON object `{"type", "diff", "rationale"}`,
//! checked the way the platform would (known type, valid merge patch, a valid configuration after
//! it, an actual change), and its canonical answer for matching and majority voting.

use serde_json::{Map, Number, Value};

use crate::domain::agent_config::{canonical_json, validate_config, validate_diff};
use crate::domain::{FieldErrors, RecommendationType, apply_merge_patch};

/// A well-formed recommendation.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedRecommendation {
    pub kind: RecommendationType,
    /// The diff as written.
    pub diff: Value,
    pub rationale: String,
    /// The minimal merge patch from the current configuration to the patched one: what the diff
    /// actually changes (keys restating the current value dropped). Graders judge this, so two
    /// diffs with the same effect get the same judgement.
    pub patch: Value,
    /// [`Self::patch`] as compact JSON with sorted keys and integral numbers written as integers:
    /// the canonical answer for matching and majority voting.
    pub canonical: String,
}

/// Why a completion is not a well-formed recommendation (one name per reason, for metrics).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("not one JSON object: {0}")]
    NotJson(String),
    #[error("field `{0}` is missing")]
    MissingField(&'static str),
    #[error("field `{0}` is not part of a recommendation (type, diff, rationale)")]
    UnknownField(String),
    #[error("field `type`: {0:?} is not a recommendation type")]
    UnknownType(String),
    #[error("field `rationale`: must be one non-empty line")]
    Rationale,
    #[error("field `diff`: {0}")]
    InvalidDiff(String),
    #[error("the configuration after the diff is invalid: {0}")]
    InvalidResult(String),
    #[error("field `diff`: changes nothing in the current configuration")]
    NoChange,
}

impl FormatError {
    /// A short stable name (metrics keys).
    pub fn kind(&self) -> &'static str {
        match self {
            FormatError::NotJson(_) => "not_json",
            FormatError::MissingField(_) => "missing_field",
            FormatError::UnknownField(_) => "unknown_field",
            FormatError::UnknownType(_) => "unknown_type",
            FormatError::Rationale => "rationale",
            FormatError::InvalidDiff(_) => "invalid_diff",
            FormatError::InvalidResult(_) => "invalid_result",
            FormatError::NoChange => "no_change",
        }
    }
}

/// Reads `completion` as a recommendation over `current` (the configuration it changes).
pub fn parse_recommendation(
    completion: &str,
    current: &Value,
) -> Result<ParsedRecommendation, FormatError> {
    let value: Value =
        serde_json::from_str(completion.trim()).map_err(|e| FormatError::NotJson(e.to_string()))?;
    let Value::Object(mut object) = value else {
        return Err(FormatError::NotJson("not an object".to_owned()));
    };
    let kind = object
        .remove("type")
        .ok_or(FormatError::MissingField("type"))?;
    let diff = object
        .remove("diff")
        .ok_or(FormatError::MissingField("diff"))?;
    let rationale = object
        .remove("rationale")
        .ok_or(FormatError::MissingField("rationale"))?;
    if let Some(extra) = object.keys().next() {
        return Err(FormatError::UnknownField(extra.clone()));
    }
    let kind = match &kind {
        Value::String(name) => {
            RecommendationType::parse(name).ok_or_else(|| FormatError::UnknownType(name.clone()))
        }
        other => Err(FormatError::UnknownType(other.to_string())),
    }?;
    let rationale = match rationale {
        Value::String(text) if !text.trim().is_empty() && !text.contains('\n') => text,
        _ => return Err(FormatError::Rationale),
    };
    let mut errors = FieldErrors::default();
    validate_diff(&diff, &mut errors);
    if !errors.is_empty() {
        return Err(FormatError::InvalidDiff(describe(errors)));
    }
    let mut after = current.clone();
    apply_merge_patch(&mut after, &diff);
    let mut errors = FieldErrors::default();
    validate_config(&after, &mut errors);
    if !errors.is_empty() {
        return Err(FormatError::InvalidResult(describe(errors)));
    }
    let minimal = merge_patch_between(&normalize(current), &normalize(&after));
    if minimal.as_object().is_some_and(Map::is_empty) {
        return Err(FormatError::NoChange);
    }
    Ok(ParsedRecommendation {
        kind,
        diff,
        rationale,
        canonical: canonical_json(&minimal),
        patch: minimal,
    })
}

/// The canonical answer of `diff` over `current`, as [`ParsedRecommendation::canonical`], for
/// logged diffs that were never completions.
pub fn canonical_answer(current: &Value, diff: &Value) -> String {
    canonical_json(&minimal_patch(current, diff))
}

/// The minimal merge patch of `diff` over `current`, as [`ParsedRecommendation::patch`], for
/// logged diffs that were never completions.
pub fn minimal_patch(current: &Value, diff: &Value) -> Value {
    let mut after = current.clone();
    apply_merge_patch(&mut after, diff);
    merge_patch_between(&normalize(current), &normalize(&after))
}

/// The smallest merge patch p with apply(from, p) = to (RFC 7396 §2 in reverse): removed keys
/// become null, changed objects recurse, anything else changed is replaced whole.
fn merge_patch_between(from: &Value, to: &Value) -> Value {
    match (from, to) {
        (Value::Object(a), Value::Object(b)) => {
            let mut patch = Map::new();
            for key in a.keys() {
                if !b.contains_key(key) {
                    patch.insert(key.clone(), Value::Null);
                }
            }
            for (key, new) in b {
                match a.get(key) {
                    Some(old) if old == new => {}
                    Some(old @ Value::Object(_)) if new.is_object() => {
                        patch.insert(key.clone(), merge_patch_between(old, new));
                    }
                    _ => {
                        patch.insert(key.clone(), new.clone());
                    }
                }
            }
            Value::Object(patch)
        }
        _ => to.clone(),
    }
}

/// Integral floats become integers (3.0 and 3 are the same timeout), recursively.
fn normalize(value: &Value) -> Value {
    match value {
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 9.0e15 => {
                Value::Number(Number::from(f as i64))
            }
            _ => value.clone(),
        },
        Value::Array(items) => Value::Array(items.iter().map(normalize).collect()),
        Value::Object(map) => {
            Value::Object(map.iter().map(|(k, v)| (k.clone(), normalize(v))).collect())
        }
        other => other.clone(),
    }
}

/// Every field error, `field: message; ...`.
fn describe(errors: FieldErrors) -> String {
    errors
        .into_vec()
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn current() -> Value {
        json!({"model": "openai/gpt-4o-mini", "temperature": 0.9, "timeout_s": 10,
               "retry": {"max_attempts": 1}, "tools": [{"name": "web_search"}]})
    }

    #[test]
    fn a_good_completion_parses_with_its_canonical_answer() {
        let text = r#" {"type":"retry_policy","diff":{"retry":{"max_attempts":3,"backoff_s":2.0}},"rationale":"Rate limits recover on retry."} "#;
        let parsed = parse_recommendation(text, &current()).unwrap();
        assert_eq!(parsed.kind, RecommendationType::RetryPolicy);
        assert_eq!(
            parsed.canonical,
            r#"{"retry":{"backoff_s":2,"max_attempts":3}}"#
        );
    }

    #[test]
    fn equal_effects_give_equal_answers() {
        // Restating an unchanged field, another key order and 20.0 for 20: the same change.
        let a =
            r#"{"type":"timeout_adjustment","diff":{"timeout_s":20},"rationale":"Slow tools."}"#;
        let b = r#"{"rationale":"Tools are slow.","diff":{"temperature":0.9,"timeout_s":20.0},"type":"timeout_adjustment"}"#;
        let (a, b) = (
            parse_recommendation(a, &current()).unwrap(),
            parse_recommendation(b, &current()).unwrap(),
        );
        assert_eq!(a.canonical, b.canonical);
        assert_eq!(
            a.canonical,
            canonical_answer(&current(), &json!({"timeout_s": 20}))
        );
    }

    #[test]
    fn bad_completions_are_named() {
        let cases = [
            ("the model rambles", "not_json"),
            (
                r#"{"type":"retry_policy","diff":{"retry":{"max_attempts":3}}} trailing"#,
                "not_json",
            ),
            (r#"["type"]"#, "not_json"),
            (
                r#"{"diff":{"timeout_s":20},"rationale":"x"}"#,
                "missing_field",
            ),
            (
                r#"{"type":"temperature","diff":{"temperature":0.2},"rationale":"x","score":1}"#,
                "unknown_field",
            ),
            (
                r#"{"type":"magic","diff":{"temperature":0.2},"rationale":"x"}"#,
                "unknown_type",
            ),
            (
                r#"{"type":null,"diff":{"temperature":0.2},"rationale":"x"}"#,
                "unknown_type",
            ),
            (
                r#"{"type":"temperature","diff":{"temperature":0.2},"rationale":""}"#,
                "rationale",
            ),
            (
                r#"{"type":"temperature","diff":{"temperature":0.2},"rationale":"a\nb"}"#,
                "rationale",
            ),
            (
                r#"{"type":"temperature","diff":{"temperature":7},"rationale":"x"}"#,
                "invalid_diff",
            ),
            (
                r#"{"type":"temperature","diff":{"model":null},"rationale":"x"}"#,
                "invalid_diff",
            ),
            (
                r#"{"type":"temperature","diff":[],"rationale":"x"}"#,
                "invalid_diff",
            ),
            (
                r#"{"type":"temperature","diff":{"temperature":0.9},"rationale":"x"}"#,
                "no_change",
            ),
        ];
        for (text, kind) in cases {
            let err = parse_recommendation(text, &current()).unwrap_err();
            assert_eq!(err.kind(), kind, "{text}: {err}");
        }
    }

    #[test]
    fn a_diff_that_breaks_the_configuration_is_invalid() {
        // Valid as a patch, but the current configuration has no model to keep.
        let broken = json!({"temperature": 0.5});
        let err = parse_recommendation(
            r#"{"type":"temperature","diff":{"temperature":0.2},"rationale":"x"}"#,
            &broken,
        )
        .unwrap_err();
        assert_eq!(err.kind(), "invalid_result", "{err}");
    }

    #[test]
    fn removing_a_key_is_a_null_in_the_answer() {
        let answer = canonical_answer(&current(), &json!({"retry": null}));
        assert_eq!(answer, r#"{"retry":null}"#);
    }
}
