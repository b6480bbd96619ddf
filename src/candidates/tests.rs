//! Unit tests of candidate generation: each heuristic on a hand-made index, each hard constraint,
//! the features, and (ignored) the generation speed.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use super::*;
use crate::domain::agent_config::{apply_merge_patch, validate_config, validate_diff};
use crate::domain::validation::FieldErrors;
use crate::domain::{Candidate, CandidateSource, RecommendationType as T};
use crate::storage::candidate_stats::{
    DiffGroupRow, ModelCategoryRow, ModelFailureRow, ModelRow, StatsRows, ToolRow,
};

fn model(name: &str, runs: i64, sims: i64, rel: f64, price: f64) -> ModelRow {
    ModelRow {
        model: name.to_owned(),
        runs,
        simulations: sims,
        mean_reliability: Some(rel),
        // Every model runs the same ~6k tokens per run here.
        mean_cost_usd: Some(price * 6.0),
        usd_per_1k_tokens: Some(price),
        success_reliability: Some(0.88),
        failure_reliability: Some(0.15),
    }
}

fn failures(name: &str, category: &str, code: &str, n: i64) -> ModelFailureRow {
    ModelFailureRow {
        model: name.to_owned(),
        error_category: Some(category.to_owned()),
        error_code: Some(code.to_owned()),
        failures: n,
    }
}

#[allow(clippy::too_many_arguments)]
fn diff_group(
    kind: &str,
    lever: &str,
    category: &str,
    applied: i64,
    improved: i64,
    delta: f64,
    cost: f64,
    value: Option<f64>,
    backoff: Option<f64>,
) -> DiffGroupRow {
    DiffGroupRow {
        recommendation_type: Some(kind.to_owned()),
        lever: lever.to_owned(),
        category: Some(category.to_owned()),
        proposed: applied * 3,
        approved: applied + 2,
        rejected: applied,
        applied,
        improved,
        mean_reliability_delta: Some(delta),
        mean_cost_delta_usd: Some(cost),
        effective: improved,
        median_value: value,
        median_backoff_s: backoff,
    }
}

fn tool(name: &str, calls: i64, ok: i64, p90_ms: Option<f64>, conf: i64, called: i64) -> ToolRow {
    ToolRow {
        tool: name.to_owned(),
        calls,
        ok_calls: ok,
        p50_ok_ms: p90_ms.map(|p| p / 3.0),
        p90_ok_ms: p90_ms,
        versions_configured: conf,
        versions_called: called,
    }
}

const GPT: &str = "openai/gpt-4.1";
const HAIKU: &str = "anthropic/claude-3-haiku";
const SONNET: &str = "anthropic/claude-3.5-sonnet";
const GEMINI: &str = "google/gemini-1.5-pro";
const LLAMA: &str = "meta/llama-3-8b";
const RARE: &str = "tiny/rare-model";
const MISTRAL: &str = "mistral/mistral-large";

/// An organization with six models, past retry/timeout/temperature diffs and a few tools.
fn rows() -> StatsRows {
    StatsRows {
        models: vec![
            model(GPT, 200, 40, 0.80, 0.005),
            model(HAIKU, 150, 30, 0.79, 0.0005),
            model(LLAMA, 100, 20, 0.55, 0.0002),
            model(SONNET, 120, 25, 0.90, 0.008),
            model(GEMINI, 80, 15, 0.86, 0.003),
            model(MISTRAL, 90, 18, 0.82, 0.004),
            // Excellent and cheap, but only two simulations: never proposed.
            model(RARE, 5, 2, 0.99, 0.0001),
        ],
        failures: vec![
            failures(GPT, "model_error", "429", 20),
            failures(HAIKU, "model_error", "429", 30),
            failures(LLAMA, "model_error", "429", 40),
            failures(SONNET, "model_error", "429", 15),
            failures(GEMINI, "model_error", "429", 12),
            failures(MISTRAL, "model_error", "429", 1),
            failures(GPT, "timeout", "TOOL_TIMEOUT", 25),
            failures(LLAMA, "tool_error", "INVALID_TOOL_ARGUMENTS", 30),
        ],
        categories: vec![ModelCategoryRow {
            model: MISTRAL.to_owned(),
            category: "model_error".to_owned(),
            runs: 60,
            simulations: 12,
            mean_reliability: Some(0.84),
        }],
        diffs: vec![
            diff_group(
                "retry_policy",
                "retry",
                "timeout",
                10,
                7,
                0.06,
                0.002,
                Some(4.0),
                Some(3.0),
            ),
            diff_group(
                "retry_policy",
                "retry",
                "model_error",
                8,
                6,
                0.09,
                0.001,
                Some(4.0),
                Some(3.0),
            ),
            diff_group(
                "timeout_adjustment",
                "tool_timeout",
                "timeout",
                6,
                5,
                0.14,
                0.001,
                Some(4.0),
                None,
            ),
            diff_group(
                "temperature",
                "temperature_down",
                "tool_error",
                5,
                4,
                0.08,
                0.0,
                Some(0.2),
                None,
            ),
        ],
        tools: vec![
            tool("web_search", 500, 450, Some(2500.0), 40, 38),
            tool("calculator", 300, 299, Some(100.0), 30, 28),
            tool("calendar_lookup", 0, 0, None, 10, 0),
            tool("crm_lookup", 120, 100, Some(900.0), 12, 11),
            tool("dead_tool", 50, 1, None, 8, 8),
            // Invented by models, never works.
            tool("web_browser", 30, 0, None, 0, 0),
        ],
    }
}

fn index() -> CandidateIndex {
    CandidateIndex::from_rows("acme", &rows())
}

fn config() -> Value {
    json!({"model": GPT, "temperature": 0.7,
           "tools": [{"name": "web_search", "description": "search"}, {"name": "calculator"}],
           "retry": {"max_attempts": 1}, "timeout_s": 5, "system_prompt": "You are..."})
}

fn failure(category: &str, message: &str, tool: Option<&str>) -> FailureObservation {
    FailureObservation {
        failure_category: Some(category.to_owned()),
        error_message: Some(message.to_owned()),
        tool_name: tool.map(str::to_owned),
        error_code: None,
    }
}

fn timeouts() -> Vec<FailureObservation> {
    vec![
        failure(
            "timeout",
            "web_search timed out after 5000 ms",
            Some("web_search"),
        ),
        failure(
            "timeout",
            "Timeout: tool 'web_search' exceeded 5s deadline",
            Some("web_search"),
        ),
    ]
}

fn rate_limits() -> Vec<FailureObservation> {
    vec![
        failure(
            "model_error",
            "HTTP 429 Too Many Requests from provider openai (retry-after 12s)",
            None,
        ),
        failure(
            "model_error",
            "openai API error 429: rate_limit_exceeded, please retry after 3000 ms",
            None,
        ),
    ]
}

fn request(config: Value, failures: Vec<FailureObservation>) -> CandidateRequest {
    CandidateRequest {
        failures,
        ..CandidateRequest::new(config)
    }
}

fn of_type(candidates: &[Candidate], kind: T) -> Vec<&Candidate> {
    candidates
        .iter()
        .filter(|c| c.recommendation_type == kind)
        .collect()
}

fn patched(current: &Value, diff: &Value) -> Value {
    let mut config = current.clone();
    apply_merge_patch(&mut config, diff);
    config
}

/// Every hard constraint, checked on any output.
fn assert_constraints(current: &Value, candidates: &[Candidate], cap: Option<f64>) {
    let mut configs: Vec<Value> = Vec::new();
    let mut ids = BTreeSet::new();
    for c in candidates {
        let mut errors = FieldErrors::default();
        validate_diff(&c.diff, &mut errors);
        let after = patched(current, &c.diff);
        validate_config(&after, &mut errors);
        assert!(errors.is_empty(), "{c:?}: {:?}", errors.into_vec());
        assert!(!same_json(&after, current), "no-op {c:?}");
        assert!(
            !configs.iter().any(|other| same_json(other, &after)),
            "duplicate {c:?}"
        );
        configs.push(after);
        assert_eq!(
            c.candidate_id,
            Candidate::id_for(c.recommendation_type, &c.diff)
        );
        assert!(ids.insert(c.candidate_id.clone()));
        assert!(c.expected_reliability_delta.is_finite() && c.expected_cost_delta_usd.is_finite());
        if let Some(cap) = cap {
            assert!(c.expected_cost_delta_usd <= cap, "{c:?} over cap {cap}");
        }
        assert!(!c.description.is_empty());
    }
    assert!(candidates.len() <= MAX_CANDIDATES);
}

#[test]
fn index_shrinks_and_prices_models() {
    let index = index();
    assert_eq!(index.org_stats.runs, 745);
    let rare = index.model(RARE).unwrap();
    assert!(!rare.proposable());
    // Five runs at 0.99 are pulled most of the way to the organization's mean.
    assert!(rare.reliability < 0.85, "{}", rare.reliability);
    let gpt = index.model(GPT).unwrap();
    assert!((gpt.reliability - 0.80).abs() < 0.01);
    assert_eq!(gpt.confidence(), Confidence::High);
    assert_eq!(Confidence::of_runs(7), Confidence::Medium);
    assert_eq!(Confidence::of_runs(4), Confidence::Low);
    assert!((index.price_ratio(Some(gpt), index.model(HAIKU).unwrap()) - 0.1).abs() < 1e-9);
    let rl = FailureSignal::RateLimit.index();
    assert!(
        index.model(MISTRAL).unwrap().signal_failure_rate[rl]
            < index.model(LLAMA).unwrap().signal_failure_rate[rl]
    );
    assert_eq!(index.typical.retry_attempts, Some(4.0));
    assert_eq!(index.typical.retry_backoff_s, Some(3.0));
    assert_eq!(
        index.tool("calendar_lookup").unwrap().usage_rate(),
        Some(0.0)
    );
    assert!(index.approval_rate(T::RetryPolicy) > 0.0);
    // Serializable for snapshots and logs.
    let text = serde_json::to_string(&index).unwrap();
    let back: CandidateIndex = serde_json::from_str(&text).unwrap();
    assert_eq!(back.models.len(), index.models.len());
}

#[test]
fn cheapest_keeps_95_percent_of_reliability_and_needs_three_simulations() {
    let current = config();
    let out = generate(&index(), &request(current.clone(), timeouts()));
    assert_constraints(&current, &out, None);
    let cheapest = of_type(&out, T::Cheapest);
    assert!(!cheapest.is_empty(), "{out:#?}");
    for c in &cheapest {
        let m = c.diff["model"].as_str().unwrap();
        assert_ne!(m, LLAMA, "keeps < 95% of reliability");
        assert_ne!(m, RARE, "fewer than 3 simulations");
        assert!(c.expected_cost_delta_usd < 0.0);
    }
    let haiku = cheapest
        .iter()
        .find(|c| c.diff == json!({"model": HAIKU}))
        .unwrap();
    assert!(
        haiku
            .description
            .starts_with("Switch to anthropic/claude-3-haiku (90% lower cost, 9"),
        "{}",
        haiku.description
    );
    assert_eq!(haiku.evidence_count, 150);
    // Nothing cheaper keeps 95% when the current model is the cheapest good one.
    let on_haiku = json!({"model": HAIKU, "temperature": 0.7});
    let out = generate(&index(), &request(on_haiku, timeouts()));
    assert!(of_type(&out, T::Cheapest).is_empty(), "{out:#?}");
}

#[test]
fn highest_perf_upgrades_and_adds_retries_for_transient_failures() {
    let out = generate(&index(), &request(config(), timeouts()));
    let best = of_type(&out, T::HighestPerf);
    assert_eq!(best.len(), 1, "{out:#?}");
    assert_eq!(best[0].diff["model"], json!(SONNET));
    assert_eq!(
        best[0].diff["retry"],
        json!({"max_attempts": 4, "backoff_s": 3})
    );
    assert!(best[0].description.contains("+ retry logic"));
    assert!(best[0].expected_reliability_delta > 0.05);
    let format = vec![failure(
        "validation_error",
        "OutputParserException: Could not parse LLM output",
        None,
    )];
    let out = generate(&index(), &request(config(), format));
    let best = of_type(&out, T::HighestPerf);
    assert_eq!(best[0].diff, json!({"model": SONNET}));
}

#[test]
fn balanced_picks_reliability_per_dollar_with_a_moderate_temperature() {
    let hot = json!({"model": GPT, "temperature": 0.9});
    let out = generate(&index(), &request(hot, timeouts()));
    let balanced = of_type(&out, T::Balanced);
    assert_eq!(balanced.len(), 1, "{out:#?}");
    let diff = &balanced[0].diff;
    // The typical cooler temperature that worked here (0.2), kept within 0.2–0.5.
    assert_eq!(diff["temperature"], json!(0.2));
    let chosen = diff["model"].as_str().unwrap();
    assert_ne!(chosen, GPT);
    assert_ne!(chosen, RARE);
    // On the model with the best reliability per dollar already, only temperature would change:
    // that is the temperature heuristic's candidate, not a balanced one.
    let on_haiku = json!({"model": HAIKU, "temperature": 0.9});
    let out = generate(&index(), &request(on_haiku, timeouts()));
    assert!(of_type(&out, T::Balanced).is_empty(), "{out:#?}");
    assert!(balanced[0].description.starts_with("Use "));
}

#[test]
fn model_switch_prefers_models_that_rarely_fail_this_way() {
    let current = config();
    let out = generate(&index(), &request(current.clone(), rate_limits()));
    assert_constraints(&current, &out, None);
    // model_switch candidates that were not deduplicated into an earlier type.
    let all_switches: Vec<&str> = out
        .iter()
        .filter(|c| c.diff.as_object().unwrap().len() == 1)
        .filter_map(|c| c.diff["model"].as_str())
        .collect();
    assert!(all_switches.contains(&MISTRAL), "{out:#?}");
    let switch = of_type(&out, T::ModelSwitch);
    assert!(!switch.is_empty() && switch.len() <= 3);
    let mistral = out
        .iter()
        .find(|c| c.diff == json!({"model": MISTRAL}))
        .unwrap();
    let llama = out.iter().find(|c| c.diff == json!({"model": LLAMA}));
    if let Some(llama) = llama {
        assert!(mistral.expected_reliability_delta > llama.expected_reliability_delta);
    }
    assert!(
        switch
            .iter()
            .all(|c| c.description.contains("for this failure pattern"))
    );
}

#[test]
fn retry_policy_targets_transient_failures_with_the_typical_values() {
    let out = generate(&index(), &request(config(), rate_limits()));
    let retries = of_type(&out, T::RetryPolicy);
    // The typical policy, a more patient one for rate limits, and a single retry.
    assert_eq!(retries.len(), 3, "{out:#?}");
    let first = retries
        .iter()
        .find(|c| c.diff["retry"]["max_attempts"] == json!(4))
        .unwrap();
    // Rate limits want waiting: backoff at least 4 s.
    assert_eq!(first.diff["retry"]["backoff_s"], json!(4));
    assert!(
        first
            .description
            .starts_with("Retry rate-limited calls up to 4 times with 4s backoff (fixes 75% of similar rate limits, +$"),
        "{}",
        first.description
    );
    assert!(first.expected_reliability_delta > 0.05);
    // Decided past retry diffs for model errors: 10 approved, 8 rejected.
    assert_eq!(first.evidence_count, 18);

    let out = generate(&index(), &request(config(), timeouts()));
    let retry = &of_type(&out, T::RetryPolicy)[0];
    assert!(
        retry.description.starts_with(
            "Retry web_search up to 4 times with 3s backoff (fixes 70% of similar timeouts"
        ),
        "{}",
        retry.description
    );
    // Already retrying enough: nothing to propose without transient failures.
    let patient =
        json!({"model": GPT, "temperature": 0.7, "retry": {"max_attempts": 6, "backoff_s": 5}});
    let format = vec![failure(
        "validation_error",
        "Final answer failed schema validation: missing required field 'answer'",
        None,
    )];
    let out = generate(&index(), &request(patient, format));
    assert!(of_type(&out, T::RetryPolicy).is_empty(), "{out:#?}");
}

#[test]
fn timeout_adjustment_raises_the_failing_tools_timeout_and_keeps_other_tools() {
    let current = config();
    let out = generate(&index(), &request(current.clone(), timeouts()));
    let timeouts = of_type(&out, T::TimeoutAdjustment);
    let per_tool: Vec<&&Candidate> = timeouts
        .iter()
        .filter(|c| c.diff.get("tools").is_some())
        .collect();
    assert_eq!(per_tool.len(), 2, "moderate and generous: {out:#?}");
    for c in &per_tool {
        let tools = c.diff["tools"].as_array().unwrap();
        assert_eq!(tools.len(), 2);
        assert_eq!(tools[0]["name"], "web_search");
        assert_eq!(tools[0]["description"], "search", "other fields kept");
        assert_eq!(
            tools[1],
            json!({"name": "calculator"}),
            "other tools intact"
        );
        // Typical ratio 4 × 5 s = 20 s, and at least 3 × p90 (2.5 s).
        assert!(tools[0]["timeout_s"].as_f64().unwrap() >= 20.0);
    }
    assert!(
        per_tool[0]
            .description
            .starts_with("Raise web_search's timeout from 5s to ")
    );
    assert!(
        per_tool[0]
            .description
            .contains("fixes 83% of similar timeouts")
    );
    let global = timeouts
        .iter()
        .find(|c| c.diff.get("timeout_s").is_some())
        .unwrap();
    assert!(global.diff["timeout_s"].as_f64().unwrap() > 5.0);
    assert!(global.expected_reliability_delta > 0.05);
}

#[test]
fn temperature_goes_down_for_malformed_calls_and_up_for_loops() {
    let hot = json!({"model": GPT, "temperature": 1.2});
    let malformed = vec![failure(
        "tool_error",
        "Invalid arguments for tool 'web_search': expected object, got string",
        Some("web_search"),
    )];
    let out = generate(&index(), &request(hot, malformed));
    let temps: Vec<f64> = of_type(&out, T::Temperature)
        .iter()
        .map(|c| c.diff["temperature"].as_f64().unwrap())
        .collect();
    assert!(temps.contains(&0.2), "typical target: {temps:?}");
    assert!(temps.contains(&0.7), "half step: {temps:?}");
    let lower = of_type(&out, T::Temperature)
        .into_iter()
        .find(|c| c.diff["temperature"] == json!(0.2))
        .unwrap();
    assert!(
        lower.description.starts_with(
            "Lower temperature from 1.2 to 0.2 (fixes 80% of similar malformed tool calls"
        ),
        "{}",
        lower.description
    );

    let cold = json!({"model": GPT, "temperature": 0.0});
    let looping = vec![failure(
        "timeout",
        "Max iterations (20) reached without final answer",
        None,
    )];
    let out = generate(&index(), &request(cold, looping));
    let raise = of_type(&out, T::Temperature);
    assert_eq!(raise.len(), 1, "{out:#?}");
    assert_eq!(raise[0].diff, json!({"temperature": 0.3}));
    assert!(raise[0].expected_reliability_delta > 0.05);
    assert!(
        raise[0]
            .description
            .starts_with("Raise temperature from 0 to 0.3")
    );
}

#[test]
fn tool_configuration_adds_requested_and_removes_unused_and_dead_tools() {
    let current = json!({"model": GPT, "temperature": 0.5, "timeout_s": 5,
        "tools": [{"name": "web_search"}, {"name": "calendar_lookup"}, {"name": "dead_tool"}]});
    let failures = vec![
        failure(
            "tool_error",
            "Unknown tool 'crm_lookup' requested by model; available tools: web_search",
            Some("crm_lookup"),
        ),
        failure(
            "tool_error",
            "Model attempted to call undefined function web_browser()",
            Some("web_browser"),
        ),
    ];
    let out = generate(&index(), &request(current.clone(), failures));
    assert_constraints(&current, &out, None);
    let tools: Vec<&Candidate> = of_type(&out, T::ToolConfiguration);
    let add = tools
        .iter()
        .find(|c| c.description.starts_with("Add the crm_lookup tool"))
        .expect("adds the requested real tool");
    assert_eq!(
        add.diff["tools"],
        json!([{"name": "web_search"}, {"name": "calendar_lookup"}, {"name": "dead_tool"}, {"name": "crm_lookup"}])
    );
    assert!(add.expected_reliability_delta > 0.05);
    assert!(
        !tools.iter().any(|c| c.description.contains("web_browser")),
        "an invented tool is never added"
    );
    let remove = tools
        .iter()
        .find(|c| {
            c.description
                .starts_with("Remove unused tool calendar_lookup")
        })
        .expect("removes the never-called tool");
    assert_eq!(
        remove.diff["tools"],
        json!([{"name": "web_search"}, {"name": "dead_tool"}])
    );
    assert!(remove.expected_cost_delta_usd < 0.0);
    assert!(
        tools
            .iter()
            .any(|c| c.description.starts_with("Remove dead_tool"))
    );
    let matched = tools
        .iter()
        .find(|c| c.description.starts_with("Match tool timeouts"))
        .unwrap();
    assert_eq!(matched.diff["tools"][0]["timeout_s"], json!(8));

    // The caller's list of called tools wins over the organization's usage rates.
    let mut req = request(current.clone(), vec![]);
    req.called_tools = Some(vec!["calendar_lookup".to_owned()]);
    let out = generate(&index(), &req);
    let remove = out
        .iter()
        .find(|c| c.description.starts_with("Remove unused tools"))
        .unwrap();
    assert_eq!(remove.diff["tools"], json!([{"name": "calendar_lookup"}]));
}

#[test]
fn no_op_invalid_duplicate_and_unknown_model_candidates_are_dropped() {
    let current = config();
    let model_candidate = |kind: T, diff: Value, cost: f64| Candidate {
        candidate_id: "whatever".to_owned(),
        recommendation_type: kind,
        diff,
        description: "from the model".to_owned(),
        expected_reliability_delta: 0.5,
        expected_cost_delta_usd: cost,
        evidence_count: 0,
        source: CandidateSource::Model {
            model_version_id: "mv-1".to_owned(),
            prior: None,
        },
    };
    let mut req = request(current.clone(), timeouts());
    req.model_candidates = vec![
        // No-ops: the same value, the same number in another notation, an empty diff.
        model_candidate(T::Temperature, json!({"temperature": 0.7}), 0.0),
        model_candidate(T::TimeoutAdjustment, json!({"timeout_s": 5.0}), 0.0),
        model_candidate(T::Balanced, json!({}), 0.0),
        // Invalid: out of range, removes the model, not an object, bad tools.
        model_candidate(T::Temperature, json!({"temperature": 5}), 0.0),
        model_candidate(T::ModelSwitch, json!({"model": null}), 0.0),
        model_candidate(T::Balanced, json!([1, 2]), 0.0),
        model_candidate(T::ToolConfiguration, json!({"tools": [{"nom": "x"}]}), 0.0),
        // Non-finite expectations.
        model_candidate(T::Temperature, json!({"temperature": 0.11}), f64::NAN),
        // A new, valid one, twice (another key order, another type): kept once.
        model_candidate(
            T::Balanced,
            json!({"temperature": 0.4, "retry": {"max_attempts": 2}}),
            0.001,
        ),
        model_candidate(
            T::RetryPolicy,
            json!({"retry": {"max_attempts": 2}, "temperature": 0.4}),
            0.001,
        ),
        // Equal to a heuristic candidate's diff: the heuristic one is kept.
        model_candidate(T::Cheapest, json!({"model": HAIKU}), -0.01),
        // Valid, but bringing in a model or tools the organization has never run.
        model_candidate(T::ModelSwitch, json!({"model": "acme/gpt-9"}), 0.0),
        model_candidate(
            T::ToolConfiguration,
            json!({"tools": [{"name": "}},"}, {"name": "retry_policy", "timeout_s": 38933}]}),
            0.0,
        ),
    ];
    let out = generate(&index(), &req);
    assert_constraints(&current, &out, None);
    let from_model: Vec<&Candidate> = out
        .iter()
        .filter(|c| matches!(c.source, CandidateSource::Model { .. }))
        .collect();
    assert_eq!(from_model.len(), 1, "{from_model:#?}");
    assert_eq!(from_model[0].recommendation_type, T::Balanced);
    assert_eq!(
        from_model[0].candidate_id,
        Candidate::id_for(T::Balanced, &from_model[0].diff)
    );
    let haiku: Vec<&Candidate> = out
        .iter()
        .filter(|c| c.diff == json!({"model": HAIKU}))
        .collect();
    assert_eq!(haiku.len(), 1);
    assert_eq!(haiku[0].source, CandidateSource::Heuristic);
}

#[test]
fn cost_cap_is_respected() {
    let current = config();
    let uncapped = generate(&index(), &request(current.clone(), timeouts()));
    assert!(
        uncapped.iter().any(|c| c.expected_cost_delta_usd > 0.0),
        "{uncapped:#?}"
    );
    for cap in [0.0, 0.001, -0.01] {
        let mut req = request(current.clone(), timeouts());
        req.max_cost_increase_usd_per_run = Some(cap);
        let out = generate(&index(), &req);
        assert_constraints(&current, &out, Some(cap));
        assert!(out.len() < uncapped.len());
    }
    let mut req = request(current.clone(), timeouts());
    req.max_cost_increase_usd_per_run = Some(-0.02);
    let out = generate(&index(), &req);
    assert!(
        out.iter().all(|c| c.diff.get("model").is_some()),
        "{out:#?}"
    );
}

#[test]
fn every_context_gives_a_valid_varied_deterministic_set() {
    let contexts = [
        timeouts(),
        rate_limits(),
        vec![failure(
            "sandbox_error",
            "Sandbox container sb-1 was OOM-killed",
            None,
        )],
        vec![],
    ];
    for failures in contexts {
        let current = config();
        let req = request(current.clone(), failures);
        let out = generate(&index(), &req);
        assert_constraints(&current, &out, None);
        assert!((10..=MAX_CANDIDATES).contains(&out.len()), "{}", out.len());
        let kinds: BTreeSet<T> = out.iter().map(|c| c.recommendation_type).collect();
        assert!(kinds.len() >= 6, "{kinds:?}");
        assert_eq!(out, generate(&index(), &req), "deterministic");
        // Most promising first.
        assert!(
            out.windows(2)
                .all(|w| w[0].expected_reliability_delta >= w[1].expected_reliability_delta)
        );
    }
}

#[test]
fn empty_index_and_odd_inputs_never_panic() {
    let empty = CandidateIndex::empty("acme");
    let current = config();
    let out = generate(&empty, &request(current.clone(), timeouts()));
    assert_constraints(&current, &out, None);
    assert!(out.iter().all(|c| c.diff.get("model").is_none()));
    assert!(!of_type(&out, T::RetryPolicy).is_empty());
    assert!(!of_type(&out, T::TimeoutAdjustment).is_empty());

    let odd_configs = [
        json!(null),
        json!([1, 2]),
        json!({"model": 7, "temperature": "hot", "tools": {"a": 1}, "retry": "x", "timeout_s": -1}),
        json!({"model": GPT, "temperature": 0.7, "tools": [1, null, {"name": ""}, {"name": "web_search", "timeout_s": "slow"}]}),
    ];
    let odd_failures = vec![
        FailureObservation::default(),
        failure("", "", Some("")),
        failure("model_error", &"x".repeat(10_000), Some("🙂")),
    ];
    for current in odd_configs {
        let mut req = request(current.clone(), odd_failures.clone());
        req.cluster_key = Some("tool_timeout-".to_owned());
        req.current_reliability = Some(f64::NAN);
        req.current_cost_usd_per_run = Some(f64::INFINITY);
        req.max_cost_increase_usd_per_run = Some(f64::NAN);
        for idx in [&empty, &index()] {
            let out = generate(idx, &req);
            assert_constraints(&current, &out, None);
            for c in &out {
                assert_eq!(candidate_features(c, &current).len(), CANDIDATE_FEATURES);
            }
            assert_eq!(config_features(&current, idx).len(), CONFIG_FEATURES);
        }
    }
}

#[test]
fn cluster_key_places_a_context_without_failures() {
    let mut req = request(config(), vec![]);
    req.cluster_key = Some("tool_timeout-web_search".to_owned());
    let out = generate(&index(), &req);
    assert!(
        out.iter()
            .any(|c| c.description.starts_with("Raise web_search's timeout")),
        "{out:#?}"
    );
}

#[test]
fn features_have_fixed_layouts() {
    let current = config();
    let out = generate(&index(), &request(current.clone(), timeouts()));
    let switch = out
        .iter()
        .find(|c| c.diff == json!({"model": HAIKU}))
        .unwrap();
    let f = candidate_features(switch, &current);
    assert_eq!(f.len(), CANDIDATE_FEATURES);
    assert_eq!(f[..8].iter().sum::<f64>(), 1.0);
    assert_eq!(f[T::Cheapest as usize], 1.0);
    assert_eq!((f[11], f[12], f[13]), (1.0, 1.0, 0.0));
    assert!(f[9] < 0.0, "cheaper");
    let retry = of_type(&out, T::RetryPolicy)[0];
    let f = candidate_features(retry, &current);
    assert_eq!((f[11], f[12]), (0.0, 0.0));
    assert!((f[14] - 4f64.ln()).abs() < 1e-9);
    assert_eq!(f[19], 1.0);
    let per_tool = out
        .iter()
        .find(|c| c.recommendation_type == T::TimeoutAdjustment && c.diff.get("tools").is_some())
        .unwrap();
    assert!(candidate_features(per_tool, &current)[16] > 1.0);

    let index = index();
    let f = config_features(&current, &index);
    assert_eq!(f.len(), CONFIG_FEATURES);
    assert_eq!(f[0], 0.7);
    assert_eq!(f[3], 5f64.ln());
    assert_eq!(f[4], 2.0);
    assert_eq!(f[9], 1.0);
    let cheap = config_features(&json!({"model": HAIKU, "temperature": 0.2}), &index);
    assert!(cheap[7] < f[7], "haiku is a lower price tier than gpt-4.1");
    assert!(cheap.iter().all(|x| x.is_finite()));
    assert_eq!(CANDIDATE_FEATURE_NAMES.len(), CANDIDATE_FEATURES);
}

/// A recommender model wrote this (ranked first in the quick start's sample answer): every tool
/// replaced by invented names, one with a timeout of 38,933 s. Its features must see the timeout,
/// and its names are not the organization's.
#[test]
fn a_diff_s_new_tools_count_in_its_features_and_invented_names_are_unknown() {
    let current = config();
    let junk = json!({"tools": [{"name": "anthropic/claude-3.5-sonnet"}, {"name": "}},"},
                                {"name": "retry_policy", "timeout_s": 38933}]});
    let candidate = |diff: Value| Candidate {
        candidate_id: String::new(),
        recommendation_type: T::ToolConfiguration,
        diff,
        description: String::new(),
        expected_reliability_delta: 0.0,
        expected_cost_delta_usd: 0.0,
        evidence_count: 0,
        source: CandidateSource::Model {
            model_version_id: "m".into(),
            prior: None,
        },
    };
    let f = candidate_features(&candidate(junk.clone()), &current);
    // A new tool had the configuration's 5 s before.
    assert!((f[16] - (38933f64 / 5.0).ln()).abs() < 1e-9, "{}", f[16]);
    assert_eq!(f[18], 1.0);
    // Adding a tool without a timeout of its own changes no tool's timeout.
    let added =
        json!({"tools": [{"name": "web_search"}, {"name": "calculator"}, {"name": "crm_lookup"}]});
    assert_eq!(
        candidate_features(&candidate(added.clone()), &current)[16],
        0.0
    );

    let index = index();
    assert_eq!(
        index.unknown_name(&current, &junk),
        Some(UnknownName::Tool("anthropic/claude-3.5-sonnet".into()))
    );
    assert_eq!(index.unknown_name(&current, &added), None);
    // Known tools and models, removals and plain changes bring in nothing unknown; a tool only
    // agents asked for (no configuration has it, no call of it worked) is unknown.
    for known in [
        json!({"model": HAIKU}),
        json!({"tools": [{"name": "calculator"}]}),
        json!({"tools": [{"name": "web_search"}, {"name": "calculator"}, {"name": "calendar_lookup"}]}),
        json!({"temperature": 0.2}),
    ] {
        assert_eq!(index.unknown_name(&current, &known), None, "{known}");
    }
    assert_eq!(
        index.unknown_name(&current, &json!({"model": "acme/gpt-9"})),
        Some(UnknownName::Model("acme/gpt-9".into()))
    );
    assert_eq!(
        index.unknown_name(&current, &json!({"tools": [{"name": "web_browser"}]})),
        Some(UnknownName::Tool("web_browser".into()))
    );
    // A configuration's own tools stay known whatever the index says.
    let own = json!({"model": GPT, "temperature": 0.7, "tools": [{"name": "}},"}]});
    assert_eq!(
        index.unknown_name(&own, &json!({"tools": [{"name": "}},", "timeout_s": 9}]})),
        None
    );
}

/// `cargo test --release --no-default-features --lib candidates::tests::generate_speed -- --ignored --nocapture`
#[test]
#[ignore = "timing, run by hand in release"]
fn generate_speed() {
    use std::time::Instant;
    let mut rows = rows();
    for i in 0..6 {
        rows.models.push(model(
            &format!("extra/model-{i}"),
            100,
            20,
            0.7,
            0.001 * (i + 1) as f64,
        ));
    }
    let index = CandidateIndex::from_rows("acme", &rows);
    let mut failures = timeouts();
    failures.extend(rate_limits());
    failures.push(failure(
        "tool_error",
        "Unknown tool 'crm_lookup' requested by model; available tools: web_search",
        Some("crm_lookup"),
    ));
    let current = json!({"model": GPT, "temperature": 1.2,
        "tools": [{"name": "web_search"}, {"name": "calculator"}, {"name": "calendar_lookup"}, {"name": "dead_tool"}],
        "retry": {"max_attempts": 1}, "timeout_s": 5, "system_prompt": "You are a support agent..."});
    let mut req = request(current, failures);
    // The recommender model's k samples: temperatures and retry policies.
    req.model_candidates = (0..24)
        .map(|i| Candidate {
            candidate_id: String::new(),
            recommendation_type: T::Temperature,
            diff: if i % 2 == 0 {
                json!({"temperature": 0.05 * f64::from(i)})
            } else {
                json!({"retry": {"max_attempts": 2 + i / 2, "backoff_s": 1}})
            },
            description: "model".to_owned(),
            expected_reliability_delta: 0.01,
            expected_cost_delta_usd: 0.0,
            evidence_count: 0,
            source: CandidateSource::Model {
                model_version_id: "mv".to_owned(),
                prior: None,
            },
        })
        .collect();
    let n = generate(&index, &req).len();
    // Median of batches: the machine is shared, single batches are noisy.
    let batch = 2_000;
    let mut per_call: Vec<f64> = (0..9)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..batch {
                std::hint::black_box(generate(&index, std::hint::black_box(&req)));
            }
            start.elapsed().as_secs_f64() / f64::from(batch)
        })
        .collect();
    per_call.sort_by(f64::total_cmp);
    let out = generate(&index, &req);
    let mut features: Vec<f64> = (0..9)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..batch {
                for c in &out {
                    std::hint::black_box(candidate_features(c, &req.current_config));
                }
            }
            start.elapsed().as_secs_f64() / f64::from(batch)
        })
        .collect();
    features.sort_by(f64::total_cmp);
    println!(
        "generate: {n} candidates ({} model candidates offered) in {:.1} µs per call \
         (median of 9 batches; min {:.1}); candidate_features for all {n}: {:.1} µs",
        req.model_candidates.len(),
        per_call[4] * 1e6,
        per_call[0] * 1e6,
        features[4] * 1e6
    );
}
