//! The crate's one error type: every rejected input becomes a variant that names what was wrong.

use thiserror::Error;

/// Largest magnitude accepted for a feature or a linear reward. Bounding inputs keeps every
/// sufficient statistic finite (a feature product is at most 1e24, far from overflow even after
/// billions of updates), so a hostile value is rejected up front instead of poisoning the state.
pub const MAX_ABS_VALUE: f64 = 1e6;

/// Everything that can go wrong in this crate. Inputs are checked before any state changes, so an
/// error leaves a policy exactly as it was.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum BanditError {
    /// A block of features has the wrong length for the layout.
    #[error("{block}: expected {expected} values, got {actual}")]
    Dimension {
        block: String,
        expected: usize,
        actual: usize,
    },
    /// A feature (or reward) is NaN, infinite or larger than [`MAX_ABS_VALUE`] in magnitude.
    #[error("{block}[{index}] = {value} is not a finite number within ±1e6")]
    BadValue {
        block: String,
        index: usize,
        value: f64,
    },
    /// The context vector must start with the constant 1 that carries the candidate main effects.
    #[error("context[0] must be the constant 1, got {0}")]
    ContextConstant(f64),
    /// A configuration or layout field is out of range.
    #[error("invalid {field}: {reason}")]
    Invalid { field: &'static str, reason: String },
    /// An observation lies so far after the decay clock that its weight 2^(Δt/half-life) would
    /// dwarf everything else; the caller should advance the clock with `decay_to` first.
    #[error(
        "observation at {timestamp_s} s is {half_lives:.1} half-lives after the decay clock ({clock_s} s); call decay_to first"
    )]
    ClockBehind {
        timestamp_s: f64,
        clock_s: f64,
        half_lives: f64,
    },
    /// Refactoring the posterior precision failed; cannot happen for valid inputs because the
    /// precision is always at least λI, so this signals numerical breakdown.
    #[error("the posterior precision is not positive definite")]
    NotPositiveDefinite,
    /// A serialized policy state is inconsistent; the text says which part.
    #[error("corrupt policy state: {0}")]
    CorruptState(String),
    /// An off-policy estimator was given no records.
    #[error("the off-policy log is empty")]
    EmptyLog,
    /// An off-policy record has an unusable field.
    #[error("off-policy record {index}: {field} {reason}")]
    InvalidRecord {
        index: usize,
        field: &'static str,
        reason: String,
    },
    /// Every importance weight is zero: the target policy never takes a logged action, so the
    /// self-normalized estimate is undefined.
    #[error("all importance weights are zero: the target policy never takes a logged action")]
    ZeroWeight,
}

/// Shorthand for results in this crate.
pub type Result<T> = std::result::Result<T, BanditError>;

/// Checks that every value is finite and within [`MAX_ABS_VALUE`]; the error names the block and
/// the index within it.
pub(crate) fn check_values(block: &str, values: &[f64]) -> Result<()> {
    match values
        .iter()
        .position(|v| !(v.is_finite() && v.abs() <= MAX_ABS_VALUE))
    {
        Some(index) => Err(BanditError::BadValue {
            block: block.to_owned(),
            index,
            value: values[index],
        }),
        None => Ok(()),
    }
}
