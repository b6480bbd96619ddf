//! The platform's logged decisions matched to the candidates arc-rec generates, so a policy can
//! learn the log before it serves: each logged context goes through the candidate generator as
//! a request would, and the logged diff is matched to a generated candidate leading to the same
//! configuration, or pulling the same lever by another amount. Serving's warm start of a new
//! organization ([`observations`]) and `bench bandit`'s (`benchmark::warm_start`) are built on
//! it; pure, no IO.

use bandit::Observation;
use chrono::{DateTime, Utc};
use serde_json::Value;

use super::engine::{Prepared, RecommendInput, candidate_vector_for, prepare, timestamp_s};
use super::placement::place;
use crate::candidates::CandidateIndex;
use crate::clustering::ClusterModel;
use crate::domain::apply_merge_patch;
use crate::export::example::FailureGroup;
use crate::storage::export_rows::ExportRow;

/// A decision from the platform's log: what was known when it was made, the diff people were
/// shown and their answer.
#[derive(Debug, Clone)]
pub struct LoggedDecision {
    pub org: String,
    /// The logged diff's id (unique in its organization).
    pub id: String,
    /// When the diff was proposed.
    pub created_at: DateTime<Utc>,
    /// The failures, configuration and user segment, as a request would send them.
    pub input: RecommendInput,
    pub diff: Value,
    pub approved: bool,
}

impl LoggedDecision {
    /// The decision an export row records: the before-version's top failure groups (each as
    /// the failures a request would report, naming the failing tool its example message names),
    /// its configuration and the owner's role and domain; never what happened after
    /// (`impact_prediction`, the after-version's runs).
    pub fn of_export_row(row: ExportRow) -> Self {
        let groups: Vec<FailureGroup> = row
            .failures
            .and_then(|f| serde_json::from_value(f).ok())
            .unwrap_or_default();
        // The export counts failed calls per tool apart from the failure groups; a request
        // names the tool of each failure, and tool-level candidates (a tool's own timeout) are
        // generated only for a named tool.
        let mut failing_tools: Vec<(String, i64)> = row
            .failing_tools
            .as_ref()
            .and_then(Value::as_object)
            .map(|tools| {
                tools
                    .iter()
                    .map(|(name, n)| (name.clone(), n.as_i64().unwrap_or(0)))
                    .collect()
            })
            .unwrap_or_default();
        failing_tools.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let failures = groups
            .iter()
            .flat_map(|group| {
                let tool = failing_tools
                    .iter()
                    .find(|(name, _)| !name.is_empty() && group.example.contains(name.as_str()))
                    .map(|(name, _)| name.clone());
                group.observations().map(move |mut failure| {
                    failure.tool_name.clone_from(&tool);
                    failure
                })
            })
            .collect();
        Self {
            org: row.org_id,
            id: row.diff_id,
            created_at: row.created_at,
            input: RecommendInput {
                failures,
                current_config: row.config_before,
                user_role: row.user_role,
                domain: row.domain,
                k: 1,
                ..RecommendInput::default()
            },
            diff: row.diff,
            approved: row.approval_status == "approved",
        }
    }
}

/// What a warm start learned from.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct WarmStartCounts {
    /// Logged decisions read.
    pub logged: u64,
    /// Of those, matched to a generated candidate (each one observation).
    pub matched: u64,
    /// Of the matched, those matched by lever (another amount of the same change).
    pub lever_matched: u64,
}

/// Serving's warm start of an organization: the observations its policy learns from the
/// platform's `logged` decisions before its own first answer, each placed in the organization's
/// failure clusters (`clusters`) as a request's failures would be and matched to a candidate of
/// `index` ([`match_decision`]). All are stamped at the newest decision's `created_at`: the log
/// counts alike within itself (weighing each by its own age cost `bench bandit`'s cold start
/// 0.01–0.03 on both tuning worlds, `--warm-start-by-age`) and, as a whole, as old as its end,
/// so the policy's decay discounts it as time passes like any answer. Ids are
/// `log:{diff id}`; a decision that cannot be placed is matched unplaced, as a request without
/// failures would be.
pub fn observations(
    index: &CandidateIndex,
    clusters: Option<&ClusterModel>,
    logged: &[LoggedDecision],
) -> (Vec<Observation>, WarmStartCounts) {
    let mut counts = WarmStartCounts {
        logged: logged.len() as u64,
        ..WarmStartCounts::default()
    };
    let Some(newest) = logged.iter().map(|d| d.created_at).max() else {
        return (Vec::new(), counts);
    };
    let mut out = Vec::new();
    for decision in logged {
        let mut decision = decision.clone();
        let placement = clusters
            .and_then(|model| place(model, None, &decision.input.failures).ok())
            .flatten();
        if let Some(placement) = placement {
            decision.input.cluster_key = Some(placement.label);
            decision.input.reduced_embedding = Some(placement.reduced);
        }
        let Some(matched) = match_decision(index, &decision) else {
            continue;
        };
        counts.matched += 1;
        counts.lever_matched += u64::from(matched.by_lever);
        let (context, candidates) = (matched.prepared.context, matched.prepared.candidates);
        let Some((_, features)) = candidates.into_iter().nth(matched.position) else {
            continue;
        };
        out.push(Observation::binary(
            format!("log:{}", decision.id),
            timestamp_s(newest),
            context,
            features,
            decision.approved,
        ));
    }
    (out, counts)
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

    #[test]
    fn serving_s_warm_start_counts_the_log_alike_as_of_its_newest_decision() {
        let index = CandidateIndex::empty("acme");
        let input = RecommendInput {
            current_config: json!({"model": "openai/gpt-4.1", "temperature": 0.7,
                "retry": {"max_attempts": 1}, "timeout_s": 30}),
            failures: vec![crate::candidates::FailureObservation {
                failure_category: Some("timeout".into()),
                error_message: Some("the model call timed out after 30 s".into()),
                tool_name: None,
                error_code: None,
            }],
            k: 1,
            ..RecommendInput::default()
        };
        let generated = prepare(&index, &input).candidates;
        assert!(generated.len() >= 2);
        let at = |hours| DateTime::UNIX_EPOCH + chrono::TimeDelta::hours(hours);
        let decision = |id: &str, hours, diff: &Value, approved| LoggedDecision {
            org: "acme".into(),
            id: id.into(),
            created_at: at(hours),
            input: input.clone(),
            diff: diff.clone(),
            approved,
        };
        let logged = [
            decision("d1", 1, &generated[0].0.diff, true),
            decision("d2", 900, &generated[1].0.diff, false),
            // No candidate pulls this lever: read, not learned.
            decision("d3", 5, &json!({"system_prompt": "Be brief."}), true),
        ];
        let (learned, counts) = observations(&index, None, &logged);
        assert_eq!(
            counts,
            WarmStartCounts {
                logged: 3,
                matched: 2,
                lever_matched: 0
            }
        );
        let stamps: Vec<(&str, f64, f64)> = learned
            .iter()
            .map(|o| (o.id.as_str(), o.timestamp_s, o.reward))
            .collect();
        let newest = timestamp_s(at(900));
        assert_eq!(stamps, [("log:d1", newest, 1.0), ("log:d2", newest, 0.0)]);
        assert_eq!(learned[0].candidate, generated[0].1);
        assert_eq!(observations(&index, None, &[]).1.logged, 0);
    }

    #[test]
    fn an_export_row_is_the_context_a_request_would_have_sent() {
        let row = ExportRow {
            org_id: "acme".into(),
            diff_id: "d9".into(),
            config_id: "c1".into(),
            created_at: DateTime::UNIX_EPOCH,
            approval_status: "rejected".into(),
            recommendation_type: None,
            diff: json!({"timeout_s": 60}),
            change_summary: String::new(),
            llm_generated: false,
            version_before: "v1".into(),
            version_after: None,
            config_before: json!({"timeout_s": 30}),
            user_role: Some("product_manager".into()),
            domain: None,
            before_runs: 3,
            before_failed: 3,
            before_reliability: None,
            before_cost: None,
            after_runs: 0,
            after_reliability: None,
            after_cost: None,
            after_tool_timeouts: None,
            after_tool_calls_ok: None,
            failures: Some(json!([
                {"failure_category": "timeout", "failure_type": "tool_error", "count": 2,
                 "example": "web_search timed out after 5000 ms"},
                {"failure_category": "format", "failure_type": "output", "count": 1,
                 "example": "expected JSON"}
            ])),
            failing_tools: Some(json!({"calculator": 1, "web_search": 2})),
            cluster: None,
            served: None,
        };
        let decision = LoggedDecision::of_export_row(row);
        assert_eq!((decision.id.as_str(), decision.approved), ("d9", false));
        let tools: Vec<Option<&str>> = decision
            .input
            .failures
            .iter()
            .map(|f| f.tool_name.as_deref())
            .collect();
        // The tool its message names; none for a message naming no failing tool.
        assert_eq!(tools, [Some("web_search"), Some("web_search"), None]);
        assert_eq!(decision.input.user_role.as_deref(), Some("product_manager"));
        assert_eq!(decision.input.current_config, json!({"timeout_s": 30}));
    }
}
