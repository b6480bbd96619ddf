//! The hard constraints every candidate set meets, whoever proposed the candidates (heuristics
//! or the recommender model): the diff is a valid merge patch, the patched configuration is
//! valid, it differs from the current one, the expected cost increase respects the cap, and no
//! two candidates lead to the same configuration.
//!
//! This runs on the request path for every candidate, so it works on the keys a diff touches
//! instead of cloning the configuration: when the current configuration is valid, a valid diff
//! always yields a valid configuration (the validators check each field on its own, and a diff
//! cannot remove `model` or `temperature`), and two results are equal when they agree on every
//! key either diff touches. An invalid current configuration takes the plain path through
//! [`usable`], which is the reference the fast path is tested against.

use std::borrow::Cow;
use std::hash::{DefaultHasher, Hash, Hasher};

use serde_json::{Map, Value};

use super::config::same_json;
use crate::domain::Candidate;
use crate::domain::agent_config::{apply_merge_patch, validate_config, validate_diff};
use crate::domain::validation::FieldErrors;

/// Applies the constraints to `candidates` for `current`, in order (the first of equal ones is
/// kept, so put preferred sources first), assigns every survivor its [`Candidate::id_for`] id,
/// and returns at most `max` of them, highest expected reliability delta first (ties by id, so
/// the order is deterministic).
///
/// Dropped: invalid diffs or results, no-ops (numbers compare by value, so `30.0` over `30` is a
/// no-op), non-finite expectations, expected cost increases over `max_cost_increase_usd` (when
/// finite), and diffs whose patched configuration equals an earlier candidate's.
pub fn finalize(
    current: &Value,
    candidates: Vec<Candidate>,
    max_cost_increase_usd: Option<f64>,
    max: usize,
) -> Vec<Candidate> {
    let cap = max_cost_increase_usd.filter(|c| c.is_finite());
    let base = Base::of(current);
    let mut kept: Vec<(usize, Outcome<'_>)> = Vec::with_capacity(candidates.len());
    for (i, candidate) in candidates.iter().enumerate() {
        if !candidate.expected_reliability_delta.is_finite()
            || !candidate.expected_cost_delta_usd.is_finite()
            || cap.is_some_and(|cap| candidate.expected_cost_delta_usd > cap)
        {
            continue;
        }
        let outcome = match &base {
            Some(base) => base.apply(&candidate.diff),
            None => usable(current, &candidate.diff).map(|patched| Outcome {
                hash: json_hash(&patched),
                result: Result::Full(patched),
            }),
        };
        let Some(outcome) = outcome else {
            continue;
        };
        let duplicate = kept.iter().any(|(_, other)| {
            other.hash == outcome.hash && same_result(base.as_ref(), other, &outcome)
        });
        if !duplicate {
            kept.push((i, outcome));
        }
    }
    let keep: Vec<usize> = kept.into_iter().map(|(i, _)| i).collect();
    let mut out: Vec<Candidate> = candidates
        .into_iter()
        .enumerate()
        .filter(|(i, _)| keep.binary_search(i).is_ok())
        .map(|(_, mut c)| {
            c.candidate_id = Candidate::id_for(c.recommendation_type, &c.diff);
            c
        })
        .collect();
    out.sort_by(|a, b| {
        b.expected_reliability_delta
            .total_cmp(&a.expected_reliability_delta)
            .then_with(|| a.candidate_id.cmp(&b.candidate_id))
    });
    out.truncate(max);
    out
}

/// The patched configuration when `diff` is a valid merge patch whose result is a valid
/// configuration different from `current`.
pub fn usable(current: &Value, diff: &Value) -> Option<Value> {
    let mut errors = FieldErrors::default();
    validate_diff(diff, &mut errors);
    if !errors.is_empty() {
        return None;
    }
    let mut patched = current.clone();
    apply_merge_patch(&mut patched, diff);
    validate_config(&patched, &mut errors);
    (errors.is_empty() && !same_json(&patched, current)).then_some(patched)
}

/// A valid current configuration, with the hash of each of its entries.
struct Base<'a> {
    config: &'a Map<String, Value>,
    /// Order-independent hash of the whole configuration: the sum of its entry hashes.
    hash: u64,
}

/// What a diff makes of the configuration.
struct Outcome<'a> {
    hash: u64,
    result: Result<'a>,
}

enum Result<'a> {
    /// The new value of every key the diff touches (`None`: removed).
    Changes(Vec<(&'a str, Option<Cow<'a, Value>>)>),
    /// The whole patched configuration (when the current one is invalid).
    Full(Value),
}

impl<'a> Base<'a> {
    fn of(current: &'a Value) -> Option<Self> {
        let config = current.as_object()?;
        let mut errors = FieldErrors::default();
        validate_config(current, &mut errors);
        if !errors.is_empty() {
            return None;
        }
        let hash = config
            .iter()
            .fold(0u64, |sum, (k, v)| sum.wrapping_add(entry_hash(k, v)));
        Some(Self { config, hash })
    }

    /// The outcome of a valid, effective diff; `None` for an invalid diff or a no-op.
    fn apply(&self, diff: &'a Value) -> Option<Outcome<'a>> {
        let mut errors = FieldErrors::default();
        validate_diff(diff, &mut errors);
        if !errors.is_empty() {
            return None;
        }
        let patch = diff.as_object()?;
        let mut changes = Vec::with_capacity(patch.len());
        let mut hash = self.hash;
        let mut changed = false;
        for (key, value) in patch {
            let old = self.config.get(key);
            let new: Option<Cow<'a, Value>> = match value {
                Value::Null => None,
                Value::Object(_) => {
                    // Objects merge: only this (small) entry is rebuilt.
                    let mut merged = old
                        .filter(|o| o.is_object())
                        .cloned()
                        .unwrap_or(Value::Null);
                    apply_merge_patch(&mut merged, value);
                    Some(Cow::Owned(merged))
                }
                other => Some(Cow::Borrowed(other)),
            };
            if !same_option(old, new.as_deref()) {
                changed = true;
            }
            if let Some(old) = old {
                hash = hash.wrapping_sub(entry_hash(key, old));
            }
            if let Some(new) = &new {
                hash = hash.wrapping_add(entry_hash(key, new));
            }
            changes.push((key.as_str(), new));
        }
        changed.then_some(Outcome {
            hash,
            result: Result::Changes(changes),
        })
    }

    /// The value `key` has after the changes.
    fn resolved<'b>(
        &'b self,
        changes: &'b [(&str, Option<Cow<'_, Value>>)],
        key: &str,
    ) -> Option<&'b Value> {
        match changes.iter().find(|(k, _)| *k == key) {
            Some((_, new)) => new.as_deref(),
            None => self.config.get(key),
        }
    }
}

fn same_result(base: Option<&Base<'_>>, a: &Outcome<'_>, b: &Outcome<'_>) -> bool {
    match (&a.result, &b.result, base) {
        (Result::Full(x), Result::Full(y), _) => same_json(x, y),
        (Result::Changes(x), Result::Changes(y), Some(base)) => x
            .iter()
            .chain(y.iter())
            .all(|(key, _)| same_option(base.resolved(x, key), base.resolved(y, key))),
        _ => false,
    }
}

fn same_option(a: Option<&Value>, b: Option<&Value>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => same_json(a, b),
        (None, None) => true,
        _ => false,
    }
}

fn entry_hash(key: &str, value: &Value) -> u64 {
    let mut hasher = DefaultHasher::new();
    key.hash(&mut hasher);
    hash_into(value, &mut hasher);
    hasher.finish()
}

/// A hash consistent with [`same_json`]: numbers by value, objects independent of key order.
fn json_hash(value: &Value) -> u64 {
    let mut hasher = DefaultHasher::new();
    hash_into(value, &mut hasher);
    hasher.finish()
}

fn hash_into(value: &Value, h: &mut DefaultHasher) {
    match value {
        Value::Null => 0u8.hash(h),
        Value::Bool(b) => (1u8, *b).hash(h),
        Value::Number(n) => {
            2u8.hash(h);
            match n.as_f64() {
                // +0 and -0 are equal values.
                Some(x) => (if x == 0.0 { 0.0f64 } else { x }).to_bits().hash(h),
                None => n.to_string().hash(h),
            }
        }
        Value::String(s) => (3u8, s).hash(h),
        Value::Array(items) => {
            (4u8, items.len()).hash(h);
            for item in items {
                hash_into(item, h);
            }
        }
        Value::Object(map) => {
            // Sum of per-entry hashes: independent of iteration order.
            let sum = map
                .iter()
                .fold(0u64, |sum, (k, v)| sum.wrapping_add(entry_hash(k, v)));
            (5u8, map.len(), sum).hash(h);
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::domain::{CandidateSource, RecommendationType};

    fn candidate(diff: Value) -> Candidate {
        Candidate {
            candidate_id: String::new(),
            recommendation_type: RecommendationType::Balanced,
            diff,
            description: "d".to_owned(),
            expected_reliability_delta: 0.0,
            expected_cost_delta_usd: 0.0,
            evidence_count: 0,
            source: CandidateSource::Heuristic,
        }
    }

    /// The fast path keeps exactly the candidates the plain definition keeps.
    #[test]
    fn fast_path_agrees_with_the_definition() {
        let currents = [
            json!({"model": "a/b", "temperature": 0.7, "retry": {"max_attempts": 3, "backoff_s": 2},
                   "tools": [{"name": "x"}, {"name": "y", "timeout_s": 5}], "timeout_s": 10,
                   "extra": {"k": [1, 2]}}),
            json!({"model": "a/b", "temperature": 0.7}),
            // Invalid current configurations take the plain path.
            json!({"temperature": 0.7}),
            json!({"model": "a/b", "temperature": 9}),
        ];
        let diffs = [
            json!({"temperature": 0.7}),
            json!({"temperature": 0.70}),
            json!({"temperature": 0.3}),
            json!({"retry": {"max_attempts": 3}}),
            json!({"retry": {"max_attempts": 3.0, "backoff_s": 2}}),
            json!({"retry": {"backoff_s": null}}),
            json!({"retry": {"backoff_s": null, "max_attempts": 3}}),
            json!({"retry": null}),
            json!({"retry": {"max_attempts": 0}}),
            json!({"timeout_s": 10.0}),
            json!({"timeout_s": 20}),
            json!({"tools": [{"name": "x"}, {"name": "y", "timeout_s": 5.0}]}),
            json!({"tools": [{"name": "x"}]}),
            json!({"tools": null}),
            json!({"tools": [{"nom": "x"}]}),
            json!({"model": "a/b"}),
            json!({"model": "c/d", "temperature": 0.3}),
            json!({"temperature": 0.3, "model": "c/d"}),
            json!({"model": null}),
            json!({"extra": {"k": [1, 2]}}),
            json!({"extra": {"k": null}}),
            json!({"extra": null}),
            json!({"new": {"a": null}}),
            json!({"new": {"a": 1}}),
            json!({}),
            json!([1]),
            json!({"temperature": 0.3, "retry": {"max_attempts": 3}}),
        ];
        for current in &currents {
            let all: Vec<Candidate> = diffs.iter().cloned().map(candidate).collect();
            let kept = finalize(current, all, None, usize::MAX);
            let mut expected: Vec<Value> = Vec::new();
            let mut expected_diffs: Vec<&Value> = Vec::new();
            for diff in &diffs {
                if let Some(patched) = usable(current, diff)
                    && !expected.iter().any(|e| same_json(e, &patched))
                {
                    expected.push(patched);
                    expected_diffs.push(diff);
                }
            }
            let mut got: Vec<&Value> = kept.iter().map(|c| &c.diff).collect();
            got.sort_by_key(|d| d.to_string());
            expected_diffs.sort_by_key(|d| d.to_string());
            assert_eq!(got, expected_diffs, "current {current}");
        }
    }
}
