//! Field-level validation errors: every complaint names the JSON path of the offending field.

use std::fmt;

/// One problem with one field, named by its JSON path (`data.trajectory.tool_calls[0].success`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct FieldError {
    /// Dotted JSON path of the field, as a client would write it.
    pub field: String,
    /// What is wrong with it, lowercase, no trailing period.
    pub message: String,
}

impl FieldError {
    /// A problem with the field at `field`.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "field `{}`: {}", self.field, self.message)
    }
}

impl std::error::Error for FieldError {}

/// The first field of a JSON text whose string (or key) holds the NUL character U+0000, by
/// JSON path (`data.user_id`, `failures[2].tool_name`; `(body)` for a bare string): Postgres
/// text and jsonb cannot store it, so input carrying one is refused at the edge, naming the
/// field, instead of failing in the database. `None` when there is none, or when the text is
/// not JSON (its parser says so).
pub fn find_nul(text: &str) -> Option<FieldError> {
    // JSON can carry a NUL only as the escape `\u0000`: texts without it (nearly all) cost a scan.
    if !text.contains("\\u0000") {
        return None;
    }
    let value: serde_json::Value = serde_json::from_str(text).ok()?;
    let path = nul_path(&value, String::new())?;
    let field = if path.is_empty() {
        "(body)".to_owned()
    } else {
        path
    };
    Some(FieldError::new(
        field,
        "must not contain the NUL character (\\u0000)",
    ))
}

fn nul_path(value: &serde_json::Value, path: String) -> Option<String> {
    match value {
        serde_json::Value::String(s) => s.contains('\0').then_some(path),
        serde_json::Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, item)| nul_path(item, format!("{path}[{i}]"))),
        serde_json::Value::Object(map) => map.iter().find_map(|(key, item)| {
            let field = if path.is_empty() {
                key.clone()
            } else {
                format!("{path}.{key}")
            };
            if key.contains('\0') {
                Some(field)
            } else {
                nul_path(item, field)
            }
        }),
        _ => None,
    }
}

/// Whether `text` is empty or all whitespace, whitespace as JSON Schema's `\\s` (ECMAScript)
/// reads it: the OpenAPI document says "not blank" with the pattern `\\S`, so the handlers must
/// mean the same characters (Rust's `trim` also strips U+0085 and keeps U+FEFF).
pub fn is_blank(text: &str) -> bool {
    text.chars().all(|c| {
        matches!(
            c,
            '\t' | '\n' | '\u{b}' | '\u{c}' | '\r' | ' ' | '\u{a0}' | '\u{1680}' | '\u{2000}'
                ..='\u{200a}'
                    | '\u{2028}'
                    | '\u{2029}'
                    | '\u{202f}'
                    | '\u{205f}'
                    | '\u{3000}'
                    | '\u{feff}'
        )
    })
}

/// Longest id accepted (characters, as JSON Schema's `maxLength` counts them).
pub const MAX_ID_CHARS: usize = 256;

/// Collects the field errors of one record; validators push into it and the caller checks once.
#[derive(Debug, Default)]
pub struct FieldErrors {
    prefix: String,
    errors: Vec<FieldError>,
}

impl FieldErrors {
    /// An empty collector whose paths start with `prefix` (e.g. `data`).
    pub fn with_prefix(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_owned(),
            errors: Vec::new(),
        }
    }

    /// Full path of `field` under this collector's prefix.
    pub fn path(&self, field: &str) -> String {
        match (self.prefix.is_empty(), field.is_empty()) {
            (true, _) => field.to_owned(),
            (false, true) => self.prefix.clone(),
            (false, false) if field.starts_with('[') => format!("{}{field}", self.prefix),
            (false, false) => format!("{}.{field}", self.prefix),
        }
    }

    /// Records a problem with `field` (relative to the prefix).
    pub fn push(&mut self, field: &str, message: impl Into<String>) {
        let path = self.path(field);
        self.errors.push(FieldError::new(path, message));
    }

    /// Requires `value` to lie in `[lo, hi]` and be finite.
    pub fn check_range(&mut self, field: &str, value: f64, lo: f64, hi: f64) {
        if !value.is_finite() || value < lo || value > hi {
            self.push(field, format!("must be between {lo} and {hi}, got {value}"));
        }
    }

    /// Requires `value` to be finite and not negative.
    pub fn check_non_negative(&mut self, field: &str, value: f64) {
        if !value.is_finite() || value < 0.0 {
            self.push(field, format!("must be a non-negative number, got {value}"));
        }
    }

    /// Requires an identifier to be non-empty and reasonably short.
    pub fn check_id(&mut self, field: &str, value: &str) {
        if is_blank(value) {
            self.push(field, "must not be empty");
        } else if value.chars().count() > MAX_ID_CHARS {
            self.push(
                field,
                format!(
                    "must be at most {MAX_ID_CHARS} characters, got {}",
                    value.chars().count()
                ),
            );
        }
    }

    /// True when nothing was pushed.
    pub fn is_empty(&self) -> bool {
        self.errors.is_empty()
    }

    /// The collected errors, in the order they were found.
    pub fn into_vec(self) -> Vec<FieldError> {
        self.errors
    }

    /// `Ok(())` when empty, else all errors.
    pub fn finish(self) -> Result<(), Vec<FieldError>> {
        if self.errors.is_empty() {
            Ok(())
        } else {
            Err(self.errors)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blank_is_what_ecmascript_calls_whitespace() {
        assert!(is_blank(""));
        assert!(is_blank(" \t\u{a0}\u{feff}\u{3000}"));
        assert!(!is_blank("\u{85}"), "NEL is not \\s in ECMAScript");
        assert!(!is_blank(" x "));
    }

    #[test]
    fn a_nul_character_is_found_by_its_json_path_and_an_escaped_backslash_is_not_one() {
        let found = |text: &str| find_nul(text).map(|e| e.field);
        assert_eq!(
            found(r#"{"data":{"user_id":"u\u0000"}}"#).as_deref(),
            Some("data.user_id")
        );
        assert_eq!(
            found(r#"{"failures":[{},{"tool_name":"a\u0000b"}]}"#).as_deref(),
            Some("failures[1].tool_name")
        );
        assert_eq!(found(r#"{"k\u0000":1}"#).as_deref(), Some("k\0"));
        assert_eq!(found(r#""\u0000""#).as_deref(), Some("(body)"));
        assert_eq!(
            found(r#"{"path":"C:\\u0000"}"#),
            None,
            "a backslash, then u0000"
        );
        assert_eq!(found(r#"{"a":"plain"}"#), None);
        assert_eq!(found("not json \\u0000"), None);
    }
}
