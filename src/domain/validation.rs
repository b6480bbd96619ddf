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
        if value.trim().is_empty() {
            self.push(field, "must not be empty");
        } else if value.len() > 256 {
            self.push(
                field,
                format!("must be at most 256 bytes, got {}", value.len()),
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
