//! Fixed-length numeric features for the bandit: the candidate block `c` (what a candidate
//! changes and what arc-rec expects of it) and the configuration part of the context block.
//! Layouts are documented by the `*_FEATURE_NAMES` arrays, index by index; a new feature goes at
//! the end so saved bandit states keep their meaning.

use serde_json::Value;

use super::config::{ConfigView, provider_of};
use super::index::CandidateIndex;
use crate::domain::{Candidate, CandidateSource, RecommendationType};

/// Names of [`candidate_features`], in order.
pub const CANDIDATE_FEATURE_NAMES: [&str; 20] = [
    // 0–7: recommendation type one-hot, in `RecommendationType::ALL` order.
    "type_cheapest",
    "type_highest_perf",
    "type_balanced",
    "type_model_switch",
    "type_retry_policy",
    "type_timeout_adjustment",
    "type_temperature",
    "type_tool_configuration",
    // 8: expected reliability delta, clamped to [-1, 1].
    "expected_reliability_delta",
    // 9: expected cost delta per run as sign(x)·ln(1 + |x in cents|).
    "expected_cost_delta_slog_cents",
    // 10: ln(1 + evidence_count).
    "log_evidence",
    // 11: the model changes; 12: the provider changes.
    "model_change",
    "provider_change",
    // 13: 1 for a recommender-model candidate, 0 for a heuristic one.
    "source_model",
    // 14: ln(new max_attempts / old).
    "log_retry_ratio",
    // 15: ln(new timeout_s / old) (defaults 30 s).
    "log_timeout_ratio",
    // 16: largest ln(new / old) of a tool's effective timeout, over the tools after the change (a
    // tool it adds had the configuration's timeout before).
    "log_tool_timeout_ratio",
    // 17: new temperature − old.
    "temperature_delta",
    // 18: tools after − tools before.
    "tool_count_delta",
    // 19: number of top-level fields the diff touches.
    "fields_touched",
];

/// Length of [`candidate_features`].
pub const CANDIDATE_FEATURES: usize = CANDIDATE_FEATURE_NAMES.len();

/// Names of [`config_features`], in order.
pub const CONFIG_FEATURE_NAMES: [&str; 11] = [
    // 0: temperature.
    "temperature",
    // 1: ln(max_attempts); 2: ln(backoff_s); 3: ln(timeout_s).
    "log_max_attempts",
    "log_backoff_s",
    "log_timeout_s",
    // 4: number of tools; 5: share of them with their own timeout.
    "tool_count",
    "tool_timeout_share",
    // 6: ln(1 + system prompt characters / 1000).
    "log_system_prompt_kchars",
    // 7: ln(model price per token / the organization's median), clamped to [-5, 5]; 0 unknown.
    "model_price_tier",
    // 8: the model's shrunk mean reliability − the organization's; 0 unknown.
    "model_reliability_vs_org",
    // 9: the organization has run the model (1) or not (0).
    "model_known",
    // 10: ln(1 + the model's distinct simulations).
    "log_model_simulations",
];

/// Length of [`config_features`].
pub const CONFIG_FEATURES: usize = CONFIG_FEATURE_NAMES.len();

/// The candidate block: [`CANDIDATE_FEATURES`] finite numbers laid out as
/// [`CANDIDATE_FEATURE_NAMES`] says.
pub fn candidate_features(candidate: &Candidate, current_config: &Value) -> Vec<f64> {
    let mut f = vec![0.0; CANDIDATE_FEATURES];
    let kind = candidate.recommendation_type;
    if let Some(i) = RecommendationType::ALL.iter().position(|k| *k == kind) {
        f[i] = 1.0;
    }
    f[8] = finite(candidate.expected_reliability_delta).clamp(-1.0, 1.0);
    f[9] = signed_log1p(finite(candidate.expected_cost_delta_usd) * 100.0);
    f[10] = f64::from(candidate.evidence_count).ln_1p();

    let before = ConfigView::of(current_config);
    let after = ConfigView::patched(current_config, &candidate.diff);
    f[11] = flag(before.model != after.model);
    f[12] = flag(provider_of(before.model) != provider_of(after.model));
    f[13] = flag(matches!(candidate.source, CandidateSource::Model { .. }));
    f[14] = (after.max_attempts as f64 / before.max_attempts as f64).ln();
    f[15] = (after.timeout_s / before.timeout_s).ln();
    // Over the tools after the change, so that a diff replacing every tool by new ones with
    // huge timeouts is seen (a recommender model wrote one with 38,933 s).
    f[16] = after
        .tool_names()
        .filter(|name| !name.is_empty())
        .map(|name| (after.tool_timeout_s(name) / before.tool_timeout_s(name)).ln())
        .fold(
            0.0,
            |best: f64, x| if x.abs() > best.abs() { x } else { best },
        );
    f[17] = after.temperature - before.temperature;
    f[18] = after.tools.len() as f64 - before.tools.len() as f64;
    f[19] = candidate.diff.as_object().map_or(0, |o| o.len()) as f64;
    for x in &mut f {
        *x = finite(*x);
    }
    f
}

/// The configuration part of the context block: [`CONFIG_FEATURES`] finite numbers laid out as
/// [`CONFIG_FEATURE_NAMES`] says. The model's price tier and reliability come from the
/// organization's statistics.
pub fn config_features(current_config: &Value, index: &CandidateIndex) -> Vec<f64> {
    let view = ConfigView::of(current_config);
    let mut f = vec![0.0; CONFIG_FEATURES];
    f[0] = view.temperature;
    f[1] = (view.max_attempts as f64).ln();
    f[2] = view.backoff_s.ln();
    f[3] = view.timeout_s.ln();
    f[4] = view.tools.len() as f64;
    if !view.tools.is_empty() {
        let own = view
            .tools
            .iter()
            .filter(|t| t.get("timeout_s").and_then(Value::as_f64).is_some())
            .count();
        f[5] = own as f64 / view.tools.len() as f64;
    }
    f[6] = (view.system_prompt_chars as f64 / 1000.0).ln_1p();
    if let Some(model) = index.model(view.model) {
        if let (Some(price), Some(median)) = (
            model.usd_per_1k_tokens,
            index.org_stats.median_usd_per_1k_tokens,
        ) {
            f[7] = (price / median).ln().clamp(-5.0, 5.0);
        }
        f[8] = model.reliability - index.org_stats.mean_reliability;
        f[9] = 1.0;
        f[10] = (model.simulations as f64).ln_1p();
    }
    for x in &mut f {
        *x = finite(*x);
    }
    f
}

fn flag(b: bool) -> f64 {
    if b { 1.0 } else { 0.0 }
}

fn finite(x: f64) -> f64 {
    if x.is_finite() { x } else { 0.0 }
}

/// sign(x)·ln(1 + |x|): keeps sign and order, tames the range.
fn signed_log1p(x: f64) -> f64 {
    x.signum() * x.abs().ln_1p()
}
