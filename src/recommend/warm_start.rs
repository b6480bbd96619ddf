//! The platform's logged decisions matched to the candidates arc-rec generates, so a policy can
//! learn the log before it serves: each logged context goes through the candidate generator as
//! a request would, and the logged diff is matched to a generated candidate leading to the same
//! configuration, or pulling the same lever by another amount. `bench bandit`'s warm start
//! (`benchmark::warm_start`) is built on it; pure, no IO.

use serde_json::Value;

use super::engine::{Prepared, RecommendInput, candidate_vector_for, prepare};
use crate::candidates::CandidateIndex;
use crate::domain::apply_merge_patch;

/// A decision from the platform's log: what was known when it was made, the diff people were
/// shown and their answer.
#[derive(Debug, Clone)]
pub struct LoggedDecision {
    pub org: String,
    /// The failures, configuration and user segment, as a request would send them.
    pub input: RecommendInput,
    pub diff: Value,
    pub approved: bool,
}

/// A logged decision matched to a generated candidate.
#[derive(Debug, Clone)]
pub struct MatchedDecision {
    /// The context and its generated candidates, the matched one featurized as the logged diff.
    pub prepared: Prepared,
    /// Which candidate.
    pub position: usize,
    /// Matched by lever (another amount of the same change) rather than to the same
    /// configuration.
    pub by_lever: bool,
}

/// Matches `decision` to a candidate the generator proposes for its context from `index`: one
/// that leads to the same configuration, or else the first that pulls the same lever (see
/// `lever_of`), whose place the logged diff then takes — featurized as itself (its own size of
/// change) with the lever's type, expected gain and evidence. `None` when no candidate pulls its
/// lever: its candidate features would be undefined.
pub fn match_decision(
    index: &CandidateIndex,
    decision: &LoggedDecision,
) -> Option<MatchedDecision> {
    let mut prepared = prepare(index, &decision.input);
    let current = &decision.input.current_config;
    let target = patched(current, &decision.diff);
    if let Some(position) = prepared
        .candidates
        .iter()
        .position(|(c, _)| patched(current, &c.diff) == target)
    {
        return Some(MatchedDecision {
            prepared,
            position,
            by_lever: false,
        });
    }
    let lever = lever_of(current, &target);
    let position = prepared
        .candidates
        .iter()
        .position(|(c, _)| lever_of(current, &patched(current, &c.diff)) == lever)?;
    let (candidate, features) = &mut prepared.candidates[position];
    candidate.diff = decision.diff.clone();
    *features = candidate_vector_for(candidate, current);
    Some(MatchedDecision {
        prepared,
        position,
        by_lever: true,
    })
}

/// What a change from `before` to `after` does, value by value: each changed number's path and
/// direction, each other changed value's path (and, for a string such as the model, the new
/// value). Two diffs with the same lever differ only in how far they move their numbers.
fn lever_of(before: &Value, after: &Value) -> std::collections::BTreeSet<String> {
    fn walk(
        path: &str,
        before: Option<&Value>,
        after: &Value,
        out: &mut std::collections::BTreeSet<String>,
    ) {
        match (before, after) {
            (Some(b), a) if b == a => {}
            (Some(Value::Object(b)), Value::Object(a)) => {
                for (key, value) in a {
                    walk(&format!("{path}/{key}"), b.get(key), value, out);
                }
            }
            (Some(b), Value::Number(a)) if b.is_number() => {
                let (b, a) = (b.as_f64().unwrap_or(0.0), a.as_f64().unwrap_or(0.0));
                out.insert(format!("{path}:{}", if a > b { "up" } else { "down" }));
            }
            (_, Value::String(a)) => {
                out.insert(format!("{path}={a}"));
            }
            _ => {
                out.insert(format!("{path}:changed"));
            }
        }
    }
    let mut out = std::collections::BTreeSet::new();
    walk("", Some(before), after, &mut out);
    out
}

/// The configuration `diff` leads to from `current`.
fn patched(current: &Value, diff: &Value) -> Value {
    let mut config = current.clone();
    apply_merge_patch(&mut config, diff);
    config
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_lever_is_what_changes_and_which_way_not_how_far() {
        let current = json!({
            "model": "openai/gpt-4.1",
            "temperature": 0.7,
            "retry": {"max_attempts": 3, "backoff_s": 2},
            "tools": [{"name": "web_search"}]
        });
        let lever = |diff: Value| lever_of(&current, &patched(&current, &diff));
        assert_eq!(
            lever(json!({"temperature": 0.5})),
            lever(json!({"temperature": 0.2}))
        );
        assert_ne!(
            lever(json!({"temperature": 0.5})),
            lever(json!({"temperature": 0.9}))
        );
        assert_eq!(
            lever(json!({"retry": {"max_attempts": 5}})),
            ["/retry/max_attempts:up".to_owned()].into()
        );
        // The model switched to is part of the lever; a list is changed or not.
        assert_ne!(
            lever(json!({"model": "anthropic/claude-3.5-sonnet"})),
            lever(json!({"model": "google/gemini-1.5-pro"}))
        );
        assert_eq!(
            lever(json!({"tools": [{"name": "web_search", "timeout_s": 20}]})),
            ["/tools:changed".to_owned()].into()
        );
        assert!(lever(json!({"temperature": 0.7})).is_empty());
    }
}
