//! The hard constraints every candidate set meets, whoever proposed the candidates (heuristics
//! or the recommender model): the diff is a valid merge patch, the patched configuration is
//! valid, it differs from the current one, the expected cost increase respects the cap, and no
//! two candidates lead to the same configuration.

use std::hash::{DefaultHasher, Hash, Hasher};

use serde_json::Value;

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
    let mut kept: Vec<(u64, Value, Candidate)> = Vec::with_capacity(candidates.len());
    for mut candidate in candidates {
        if !candidate.expected_reliability_delta.is_finite()
            || !candidate.expected_cost_delta_usd.is_finite()
            || cap.is_some_and(|cap| candidate.expected_cost_delta_usd > cap)
        {
            continue;
        }
        let Some(patched) = usable(current, &candidate.diff) else {
            continue;
        };
        let key = json_hash(&patched);
        if kept
            .iter()
            .any(|(k, other, _)| *k == key && same_json(other, &patched))
        {
            continue;
        }
        candidate.candidate_id = Candidate::id_for(candidate.recommendation_type, &candidate.diff);
        kept.push((key, patched, candidate));
    }
    let mut out: Vec<Candidate> = kept.into_iter().map(|(_, _, c)| c).collect();
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
            let mut sum = 0u64;
            for (k, v) in map {
                let mut entry = DefaultHasher::new();
                k.hash(&mut entry);
                hash_into(v, &mut entry);
                sum = sum.wrapping_add(entry.finish());
            }
            (5u8, map.len(), sum).hash(h);
        }
    }
}
