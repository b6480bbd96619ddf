//! Recommendation types in the platform's vocabulary, and a simple generator of plausible
//! candidate diffs for a failure context — good ones, useless ones and harmful ones, as a real
//! heuristic generator produces — so benchmarks can run end to end without arc-rec's own
//! candidate generation.

use rand::Rng;
use rand::seq::SliceRandom;
use serde_json::{Map, Value, json};

use crate::domain::agent_config::{apply_merge_patch, config_hash, validate_config, validate_diff};
use crate::domain::validation::FieldErrors;

use super::catalogue::{MODELS, ModelSpec, TOOLS, model_spec};
use super::failure::ObservedFailure;
use super::sampling::stream_rng;

pub use crate::domain::RecommendationType;

/// Names what kind of change `diff` makes to `current`, from its content alone (people react to
/// what a change does, not to its label). `None` for something that is not a non-empty object.
pub fn classify_diff(current: &Value, diff: &Value) -> Option<RecommendationType> {
    let patch = diff.as_object().filter(|p| !p.is_empty())?;
    let current_model = current.get("model").and_then(Value::as_str);
    let new_model = patch
        .get("model")
        .and_then(Value::as_str)
        .filter(|m| Some(*m) != current_model);
    let others: Vec<&String> = patch.keys().filter(|k| k.as_str() != "model").collect();
    if let Some(new_model) = new_model {
        let new_spec = model_spec(new_model);
        if !others.is_empty() {
            let best = MODELS.iter().map(|m| m.quality).fold(0.0, f64::max);
            return Some(if new_spec.is_some_and(|m| m.quality >= best - 0.03) {
                RecommendationType::HighestPerf
            } else {
                RecommendationType::Balanced
            });
        }
        let much_cheaper = match (new_spec, current_model.and_then(model_spec)) {
            (Some(new), Some(old)) => new.blended_price() < 0.5 * old.blended_price(),
            _ => false,
        };
        return Some(if much_cheaper {
            RecommendationType::Cheapest
        } else {
            RecommendationType::ModelSwitch
        });
    }
    let only = |key: &str| others.len() == 1 && others[0] == key;
    if only("retry") {
        return Some(RecommendationType::RetryPolicy);
    }
    if only("temperature") {
        return Some(RecommendationType::Temperature);
    }
    let tool_names = |config: Option<&Value>| -> Vec<String> {
        config
            .and_then(Value::as_array)
            .map(|tools| {
                tools
                    .iter()
                    .filter_map(|t| t.get("name")?.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let tools_renamed = patch.contains_key("tools")
        && tool_names(patch.get("tools")) != tool_names(current.get("tools"));
    let timeout_only = others
        .iter()
        .all(|k| k.as_str() == "timeout_s" || k.as_str() == "tools");
    if timeout_only && !tools_renamed && !others.is_empty() {
        return Some(RecommendationType::TimeoutAdjustment);
    }
    if only("tools") {
        return Some(RecommendationType::ToolConfiguration);
    }
    Some(RecommendationType::Balanced)
}

/// One candidate recommendation.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// Its type, from [`classify_diff`].
    pub recommendation_type: RecommendationType,
    /// A JSON Merge Patch over the current configuration.
    pub diff: Value,
    /// A one-line description, as a person would read it.
    pub description: String,
}

/// Plausible candidates for a configuration with these observed failures: usually 15–25, every
/// one valid, none a no-op, no two equal. Deterministic in its inputs.
///
/// Like a real heuristic generator it proposes the usual suspects for every failure — retries,
/// timeouts, temperatures, model switches, tool changes — so some help, many do nothing and a
/// few make things worse; picking well among them is the recommender's job.
pub fn candidate_diffs(current: &Value, failures: &[ObservedFailure]) -> Vec<Candidate> {
    let mut seed_text = config_hash(current);
    for f in failures {
        seed_text.push_str(&f.error_message);
    }
    let seed = u64::from_str_radix(&config_hash(&Value::String(seed_text))[..16], 16).unwrap_or(0);
    let mut rng = stream_rng(seed, 0);

    let model = current
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let current_spec = model_spec(model);
    let temperature = current
        .get("temperature")
        .and_then(Value::as_f64)
        .unwrap_or(0.7);
    let attempts = current
        .pointer("/retry/max_attempts")
        .and_then(Value::as_u64)
        .unwrap_or(1);
    let timeout = current
        .get("timeout_s")
        .and_then(Value::as_f64)
        .filter(|t| *t > 0.0)
        .unwrap_or(30.0);
    let tools: Vec<Value> = current
        .get("tools")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let tool_name = |t: &Value| {
        t.get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let configured: Vec<String> = tools.iter().map(tool_name).collect();
    let failing_tool = failures
        .iter()
        .filter_map(|f| f.tool_name.as_deref())
        .find(|t| configured.iter().any(|c| c == t));

    let mut out = Vec::new();
    let mut push = |diff: Value, description: String| {
        let Some(kind) = classify_diff(current, &diff) else {
            return;
        };
        if is_usable(current, &diff) && !out.iter().any(|c: &Candidate| c.diff == diff) {
            out.push(Candidate {
                recommendation_type: kind,
                diff,
                description,
            });
        }
    };

    // Retry policies.
    if attempts < 3 {
        push(
            json!({"retry": {"max_attempts": 3, "backoff_s": 2}}),
            "Retry failed calls up to 3 times with 2 s backoff".into(),
        );
    }
    if attempts < 2 {
        push(
            json!({"retry": {"max_attempts": 2, "backoff_s": 1}}),
            "Retry failed calls once after 1 s".into(),
        );
    }
    let many = (attempts + 2).clamp(5, 100);
    push(
        json!({"retry": {"max_attempts": many, "backoff_s": 5}}),
        format!("Retry up to {many} times with 5 s exponential backoff"),
    );

    // Timeouts.
    let doubled = (timeout * 2.0).min(600.0);
    push(
        json!({"timeout_s": doubled}),
        format!(
            "Raise the call timeout from {}s to {}s",
            fmt_s(timeout),
            fmt_s(doubled)
        ),
    );
    let generous = (timeout * 4.0).clamp(30.0, 600.0);
    push(
        json!({"timeout_s": generous}),
        format!(
            "Raise the call timeout from {}s to {}s",
            fmt_s(timeout),
            fmt_s(generous)
        ),
    );
    if let Some(tool) = failing_tool {
        let own = (timeout * 3.0).clamp(15.0, 600.0);
        let patched: Vec<Value> = tools
            .iter()
            .map(|t| {
                if tool_name(t) == tool {
                    with_field(t, "timeout_s", json!(own))
                } else {
                    t.clone()
                }
            })
            .collect();
        push(
            json!({"tools": patched}),
            format!("Give {tool} its own {}s timeout", fmt_s(own)),
        );
    }

    // Temperatures.
    let mut targets = vec![0.0, 0.2, 0.3, 0.5, 0.7, 1.0];
    targets.shuffle(&mut rng);
    for target in targets
        .into_iter()
        .filter(|t| (t - temperature).abs() >= 0.05)
        .take(4)
    {
        let verb = if target < temperature {
            "Lower"
        } else {
            "Raise"
        };
        push(
            json!({"temperature": target}),
            format!("{verb} temperature from {temperature} to {target}"),
        );
    }

    // Model switches, including the platform's named strategies.
    let others: Vec<&ModelSpec> = MODELS.iter().filter(|m| m.name != model).collect();
    let mut shuffled = others.clone();
    shuffled.shuffle(&mut rng);
    for m in shuffled.iter().take(3) {
        push(
            json!({"model": m.name}),
            switch_description(current_spec, m),
        );
    }
    if let Some(cheap) = others
        .iter()
        .filter(|m| m.quality >= 0.7)
        .min_by(|a, b| a.blended_price().total_cmp(&b.blended_price()))
    {
        push(
            json!({"model": cheap.name}),
            switch_description(current_spec, cheap),
        );
    }
    if let Some(best) = others.iter().max_by(|a, b| a.quality.total_cmp(&b.quality)) {
        push(
            json!({"model": best.name, "retry": {"max_attempts": attempts.max(3), "backoff_s": 2}}),
            format!("Upgrade to {} with retry logic", best.name),
        );
    }
    let value = |m: &&&ModelSpec| m.quality / m.blended_price().max(1e-6);
    if let Some(balanced) = others
        .iter()
        .filter(|m| m.quality >= 0.8)
        .max_by(|a, b| value(a).total_cmp(&value(b)))
    {
        push(
            json!({"model": balanced.name, "temperature": 0.3}),
            format!(
                "Use {} with temperature 0.3 (cost/performance balance)",
                balanced.name
            ),
        );
    }

    // Tool changes: drop one, trim to half, add one a hallucination asked for, add a random one.
    let mut removable: Vec<&String> = configured
        .iter()
        .filter(|t| Some(t.as_str()) != failing_tool)
        .collect();
    removable.shuffle(&mut rng);
    if let Some(drop) = removable.first() {
        let kept: Vec<Value> = tools
            .iter()
            .filter(|t| &&tool_name(t) != drop)
            .cloned()
            .collect();
        push(
            json!({"tools": kept}),
            format!("Remove tool {drop} (rarely useful in recent runs)"),
        );
    }
    if tools.len() >= 4 {
        let kept: Vec<Value> = tools.iter().take(tools.len() / 2).cloned().collect();
        push(
            json!({"tools": kept}),
            format!(
                "Trim the tool list to the {} most used tools",
                tools.len() / 2
            ),
        );
    }
    let requested = failures
        .iter()
        .filter_map(|f| f.tool_name.as_deref())
        .find(|t| !configured.iter().any(|c| c == t) && TOOLS.iter().any(|spec| spec.name == *t));
    if let Some(tool) = requested {
        let mut added = tools.clone();
        added.push(json!({"name": tool}));
        push(
            json!({"tools": added}),
            format!("Add the {tool} tool the agent keeps asking for"),
        );
    }
    let unused: Vec<&str> = TOOLS
        .iter()
        .map(|t| t.name)
        .filter(|t| !configured.iter().any(|c| c == t))
        .collect();
    if let Some(tool) = unused.get(rng.random_range(0..unused.len().max(1))) {
        let mut added = tools.clone();
        added.push(json!({"name": tool}));
        push(json!({"tools": added}), format!("Add the {tool} tool"));
    }
    out
}

/// A diff is usable when it is valid, its result is a valid configuration, and it changes
/// something.
fn is_usable(current: &Value, diff: &Value) -> bool {
    let mut errors = FieldErrors::default();
    validate_diff(diff, &mut errors);
    let mut patched = current.clone();
    apply_merge_patch(&mut patched, diff);
    validate_config(&patched, &mut errors);
    errors.is_empty() && patched != *current
}

fn with_field(tool: &Value, key: &str, value: Value) -> Value {
    let mut object = tool.as_object().cloned().unwrap_or_else(Map::new);
    object.insert(key.to_owned(), value);
    Value::Object(object)
}

fn switch_description(current: Option<&ModelSpec>, to: &ModelSpec) -> String {
    match current {
        Some(from) if from.blended_price() > 0.0 => {
            let change = to.blended_price() / from.blended_price() - 1.0;
            let direction = if change < 0.0 { "lower" } else { "higher" };
            format!(
                "Switch to {} ({:.0}% {direction} cost)",
                to.name,
                change.abs() * 100.0
            )
        }
        _ => format!("Switch to {}", to.name),
    }
}

fn fmt_s(seconds: f64) -> String {
    if (seconds - seconds.round()).abs() < 1e-9 {
        format!("{}", seconds.round() as i64)
    } else {
        format!("{seconds:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_follows_the_platform_vocabulary() {
        let current = json!({"model": "openai/gpt-4.1", "temperature": 0.7, "tools": [{"name": "web_search"}]});
        let kind = |diff: Value| classify_diff(&current, &diff).map(RecommendationType::as_str);
        assert_eq!(
            kind(json!({"retry": {"max_attempts": 3}})),
            Some("retry_policy")
        );
        assert_eq!(kind(json!({"timeout_s": 60})), Some("timeout_adjustment"));
        assert_eq!(
            kind(json!({"tools": [{"name": "web_search", "timeout_s": 20}]})),
            Some("timeout_adjustment")
        );
        assert_eq!(
            kind(json!({"tools": [{"name": "calculator"}]})),
            Some("tool_configuration")
        );
        assert_eq!(kind(json!({"temperature": 0.2})), Some("temperature"));
        assert_eq!(
            kind(json!({"model": "anthropic/claude-3-haiku"})),
            Some("cheapest")
        );
        assert_eq!(
            kind(json!({"model": "google/gemini-1.5-pro"})),
            Some("model_switch")
        );
        assert_eq!(
            kind(json!({"model": "anthropic/claude-3.5-sonnet", "retry": {"max_attempts": 3}})),
            Some("highest_perf")
        );
        assert_eq!(
            kind(json!({"model": "deepseek/deepseek-v3", "temperature": 0.3})),
            Some("balanced")
        );
        assert_eq!(kind(json!({})), None);
    }

    #[test]
    fn candidates_are_many_valid_and_distinct() {
        let current = json!({"model": "openai/gpt-4o-mini", "temperature": 0.0,
            "tools": [{"name": "web_search"}, {"name": "calculator"}, {"name": "sql_query"}, {"name": "email_send"}],
            "retry": {"max_attempts": 1}, "timeout_s": 5});
        let failures = [ObservedFailure {
            failure_category: "timeout".into(),
            error_message: "web_search timed out after 5000 ms".into(),
            tool_name: Some("web_search".into()),
        }];
        let candidates = candidate_diffs(&current, &failures);
        assert!(
            (10..=30).contains(&candidates.len()),
            "{}",
            candidates.len()
        );
        assert_eq!(
            candidates,
            candidate_diffs(&current, &failures),
            "deterministic"
        );
        let kinds: std::collections::BTreeSet<_> =
            candidates.iter().map(|c| c.recommendation_type).collect();
        assert!(kinds.len() >= 6, "{kinds:?}");
    }
}
