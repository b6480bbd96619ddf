//! The hidden ground truth: how likely each failure mode is for a configuration in a given
//! situation, what a configuration change does to reliability and cost, and whether a person
//! accepts it.
//!
//! Everything here is closed-form and deterministic, so the yardstick is exact: a run's failure
//! probability per mode is `p × (1 − r)^(attempts − 1)` (first-attempt probability `p`, each retry
//! recovering with probability `r`), a scenario succeeds when no mode fails, and the expected
//! reliability of a configuration is the mean over its workload of
//! `P(success) × E[score | success] + P(failure) × E[score | failure]`. The history's sampled
//! outcomes use the same numbers, so what the data shows agrees with what the truth says.

use serde_json::Value;

use crate::domain::agent_config::{apply_merge_patch, validate_diff};
use crate::domain::validation::FieldErrors;

use super::agent::AgentSpec;
use super::candidates::{RecommendationType, classify_diff};
use super::catalogue::{UserProfile, tool_spec};
use super::failure::FailureMode;
use super::sampling::sigmoid;
use bandit::interval::normal_cdf;

/// Mean reliability score of a failed run (failed runs score 0.05–0.25).
pub(crate) const FAILED_SCORE_MEAN: f64 = 0.15;
/// Half-width of the uniform noise around a run's score.
pub(crate) const SCORE_NOISE: f64 = 0.05;
/// Spread (log-normal sigma) of tool latencies around their median.
pub(crate) const LATENCY_SIGMA: f64 = 0.6;
/// Spread (log-normal sigma) of a run's context size around its median.
pub(crate) const CONTEXT_SIGMA: f64 = 0.35;
/// Tokens a tool the catalogue does not know adds to the prompt.
const UNKNOWN_TOOL_SCHEMA_TOKENS: f64 = 600.0;
/// Tokens of agent scaffolding (instructions, few-shot examples) in every prompt.
const SCAFFOLD_TOKENS: f64 = 400.0;

/// What one scenario of a workload needs, as the truth sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ScenarioProfile {
    pub(crate) expected_tools: &'static [&'static str],
    pub(crate) difficulty: f64,
}

/// The hidden circumstances of a configuration: properties of its environment no configuration
/// field shows, but that decide which failure modes bite.
#[derive(Debug, Clone, PartialEq)]
pub struct Latent {
    /// Multiplies every tool's latency (slow backends, cold caches).
    pub(crate) tool_slowness: f64,
    /// Request volume relative to nominal; drives rate limits and provider errors.
    pub(crate) load: f64,
    /// Median tokens of task context (documents, history) before tool schemas.
    pub(crate) prompt_tokens: f64,
    /// Probability that the sandbox fails a run that needs it; nothing in the config changes it.
    pub(crate) sandbox_flakiness: f64,
    /// A tool whose credentials are broken; scenarios needing it fail whatever the config says.
    pub(crate) broken_credential: Option<&'static str>,
}

/// Ground truth about one failure context: the configuration's hidden circumstances, the workload
/// it is evaluated on, and the per-mode failure rates of the configuration it was drawn for.
///
/// Policies under evaluation must not read this; benchmarks and graders use it to score them.
#[derive(Debug, Clone, PartialEq)]
pub struct HiddenState {
    pub(crate) latent: Latent,
    pub(crate) workload: Vec<ScenarioProfile>,
    pub(crate) failure_rates: Vec<(FailureMode, f64)>,
}

impl HiddenState {
    /// Per-mode failure rates (fraction of runs that die of each mode) of the configuration this
    /// state was drawn for, largest first.
    pub fn failure_rates(&self) -> &[(FailureMode, f64)] {
        &self.failure_rates
    }

    /// The mode that fails most runs, if any fails at all.
    pub fn dominant_mode(&self) -> Option<FailureMode> {
        self.failure_rates
            .first()
            .filter(|(_, rate)| *rate > 0.0)
            .map(|(mode, _)| *mode)
    }
}

/// What a configuration change does, in expectation, over the context's workload.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Effect {
    /// Change of expected reliability score per run (positive is better).
    pub reliability_delta: f64,
    /// Change of expected cost per run in USD (positive is more expensive).
    pub cost_delta_usd_per_run: f64,
    /// False when the diff is invalid or names a model the world does not have; such a diff
    /// breaks the configuration (its reliability delta is minus the current reliability).
    pub applicable: bool,
}

/// First-attempt probabilities and per-retry recovery probabilities of every mode for one
/// configuration on one scenario.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ModeOdds {
    pub first: [f64; FailureMode::COUNT],
    pub recover: [f64; FailureMode::COUNT],
}

impl ModeOdds {
    /// Probability that `mode` fails the run after all allowed attempts.
    pub fn fail(&self, mode: FailureMode, max_attempts: u32) -> f64 {
        let i = mode.index();
        let retries = max_attempts.saturating_sub(1).min(100) as i32;
        self.first[i] * (1.0 - self.recover[i]).powi(retries)
    }

    /// Probability that the run succeeds: no mode fails (modes are independent).
    pub fn success(&self, max_attempts: u32) -> f64 {
        FailureMode::ALL
            .iter()
            .map(|m| 1.0 - self.fail(*m, max_attempts))
            .product()
    }
}

/// Probability that one call of `tool` exceeds its timeout.
pub(crate) fn tool_timeout_probability(
    spec: &AgentSpec<'_>,
    latent: &Latent,
    scenario: &ScenarioProfile,
    tool: &str,
) -> f64 {
    let median = median_latency_s(latent, scenario, tool);
    let timeout = spec.tool_timeout_s(tool).max(1e-3);
    1.0 - normal_cdf((timeout / median).ln() / LATENCY_SIGMA)
}

/// Median latency of one call of `tool` in this situation (harder tasks make heavier calls).
pub(crate) fn median_latency_s(latent: &Latent, scenario: &ScenarioProfile, tool: &str) -> f64 {
    let base = tool_spec(tool).map_or(1.5, |t| t.median_latency_s);
    (base * latent.tool_slowness * (1.0 + 0.6 * scenario.difficulty)).max(1e-3)
}

/// Median tokens the agent's context reaches on this scenario.
pub(crate) fn context_need_tokens(
    spec: &AgentSpec<'_>,
    latent: &Latent,
    scenario: &ScenarioProfile,
) -> f64 {
    let schemas: f64 = spec
        .tools
        .iter()
        .map(|t| {
            tool_spec(t.name).map_or(UNKNOWN_TOOL_SCHEMA_TOKENS, |s| f64::from(s.schema_tokens))
        })
        .sum();
    latent.prompt_tokens * (1.0 + 0.5 * scenario.difficulty)
        + schemas
        + spec.system_prompt_tokens
        + SCAFFOLD_TOKENS
}

/// Expected-tool names this configuration has, in the scenario's order.
pub(crate) fn used_tools(spec: &AgentSpec<'_>, scenario: &ScenarioProfile) -> Vec<&'static str> {
    scenario
        .expected_tools
        .iter()
        .copied()
        .filter(|t| spec.has_tool(t))
        .collect()
}

/// Expected-tool names this configuration lacks.
pub(crate) fn missing_tools(spec: &AgentSpec<'_>, scenario: &ScenarioProfile) -> Vec<&'static str> {
    scenario
        .expected_tools
        .iter()
        .copied()
        .filter(|t| !spec.has_tool(t))
        .collect()
}

/// The heart of the world: how each mode's likelihood depends on the configuration.
pub(crate) fn mode_odds(
    spec: &AgentSpec<'_>,
    latent: &Latent,
    scenario: &ScenarioProfile,
) -> ModeOdds {
    let q = spec.model.quality;
    let t = spec.temperature;
    let d = scenario.difficulty;
    let used = used_tools(spec, scenario);
    let missing = missing_tools(spec, scenario).len() as i32;
    let mut first = [0.0; FailureMode::COUNT];
    let mut recover = [0.0; FailureMode::COUNT];
    let mut set = |mode: FailureMode, p: f64, r: f64| {
        first[mode.index()] = p.clamp(0.0, 0.97);
        recover[mode.index()] = r.clamp(0.0, 1.0);
    };

    // Short timeouts against slow tools. A retry meets the same slow backend, so it recovers
    // only half as often as a fresh call would succeed: raising the timeout is the real fix.
    let timeout = 1.0
        - used
            .iter()
            .map(|tool| 1.0 - 0.9 * tool_timeout_probability(spec, latent, scenario, tool))
            .product::<f64>();
    set(FailureMode::ToolTimeout, timeout, 0.5 * (1.0 - timeout));

    // 429s: provider proneness × load. Retries recover when they back off long enough.
    let rate_limit = 0.015 + 0.22 * spec.model.rate_limit_proneness * latent.load;
    let backoff_recovery = 0.45 + 0.5 * (1.0 - (-spec.backoff_s.max(0.0) / 2.0).exp());
    set(FailureMode::RateLimit, rate_limit, backoff_recovery);

    // 5xx and overloads: per model, worse under load; almost always transient.
    set(
        FailureMode::ProviderError,
        spec.model.provider_error_rate * (0.7 + 0.3 * latent.load),
        0.8,
    );

    // Content errors (malformed arguments, invented tools, bad output, overflow, loops) are not
    // what a retry policy is for: it re-sends the same request, so it seldom helps.

    // Malformed arguments: weak models at high temperature, on harder tasks.
    let malformed = if used.is_empty() {
        0.0
    } else {
        0.5 * (1.0 - q) * (0.25 + 2.2 * (t - 0.5).max(0.0)) * (0.6 + 0.8 * d)
    };
    set(FailureMode::MalformedToolArgs, malformed, 0.1);

    // Hallucinated tools: sampling noise at high temperature, and tasks that need a tool the
    // configuration lacks (the model calls it anyway).
    let invented = 0.3 * (1.0 - q) * (0.2 + 1.6 * (t - 0.6).max(0.0));
    let lacking = 1.0 - (1.0 - (0.55 + 0.3 * (1.0 - q))).powi(missing);
    set(
        FailureMode::HallucinatedTool,
        1.0 - (1.0 - invented) * (1.0 - lacking),
        0.05,
    );

    // Context overflow: the context's log-normal size against the window.
    let need = context_need_tokens(spec, latent, scenario);
    let window = f64::from(spec.model.context_window);
    let overflow = 1.0 - normal_cdf((window / need).ln() / CONTEXT_SIGMA);
    set(FailureMode::ContextOverflow, overflow, 0.02);

    // Looping: near-greedy decoding repeats itself; weak models and hard tasks more so.
    let cold = ((0.15 - t) / 0.15).clamp(0.0, 1.0);
    set(
        FailureMode::Looping,
        (0.02 + 0.5 * cold) * (1.7 - q) * (0.4 + 0.8 * d),
        0.03,
    );

    // Output validation: weak models, a little worse when hot; a format instruction helps.
    let instructed = if spec.format_instructions { 0.6 } else { 1.0 };
    let format = 0.8 * (1.0 - q).powf(1.5) * (0.7 + 0.5 * t) * (0.5 + d) * instructed;
    set(FailureMode::OutputFormat, format, 0.12);

    // The environment's own faults: the scenario's needs, not the configuration, decide them,
    // and retries do not help (the sandbox stays broken, the secret stays expired).
    let needs_sandbox = scenario
        .expected_tools
        .iter()
        .any(|t| matches!(*t, "code_exec" | "file_read" | "pdf_extract"));
    let sandbox = latent.sandbox_flakiness * if needs_sandbox { 1.0 } else { 0.25 };
    set(FailureMode::SandboxFailure, sandbox, 0.0);
    let auth = match latent.broken_credential {
        Some(tool) if scenario.expected_tools.contains(&tool) => 0.45,
        _ => 0.0,
    };
    set(FailureMode::ToolAuth, auth, 0.0);

    ModeOdds { first, recover }
}

/// Mean reliability score of a successful run.
pub(crate) fn success_score_mean(spec: &AgentSpec<'_>, scenario: &ScenarioProfile) -> f64 {
    0.5 + 0.45 * spec.model.quality - 0.12 * scenario.difficulty
}

/// Expected token use of one run, for costs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct RunShape {
    /// LLM calls of a clean run: plan, one after each tool result, answer.
    pub calls: f64,
    pub tokens_in_per_call: f64,
    pub tokens_out_per_call: f64,
    /// LLM calls a looping run burns before the step budget or timeout stops it.
    pub loop_calls: f64,
}

impl RunShape {
    pub fn of(spec: &AgentSpec<'_>, latent: &Latent, scenario: &ScenarioProfile) -> Self {
        Self {
            calls: 2.0 + used_tools(spec, scenario).len() as f64,
            tokens_in_per_call: 0.55 * context_need_tokens(spec, latent, scenario),
            tokens_out_per_call: 200.0 * (1.0 + 0.5 * scenario.difficulty),
            loop_calls: (spec.timeout_s / 3.0).clamp(3.0, 25.0).round(),
        }
    }

    pub fn call_usd(&self, spec: &AgentSpec<'_>) -> f64 {
        (self.tokens_in_per_call * spec.model.price_in_per_1k
            + self.tokens_out_per_call * spec.model.price_out_per_1k)
            / 1000.0
    }
}

/// Expected reliability, cost and per-mode failure rates of a configuration over a workload.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Evaluation {
    pub reliability: f64,
    pub cost_usd: f64,
    pub failure_rates: [f64; FailureMode::COUNT],
}

pub(crate) fn evaluate(
    spec: &AgentSpec<'_>,
    latent: &Latent,
    workload: &[ScenarioProfile],
) -> Evaluation {
    let mut reliability = 0.0;
    let mut cost = 0.0;
    let mut rates = [0.0; FailureMode::COUNT];
    let attempts = spec.max_attempts;
    for scenario in workload {
        let odds = mode_odds(spec, latent, scenario);
        let success = odds.success(attempts);
        reliability +=
            success * success_score_mean(spec, scenario) + (1.0 - success) * FAILED_SCORE_MEAN;
        for mode in FailureMode::ALL {
            rates[mode.index()] += odds.fail(mode, attempts);
        }
        let shape = RunShape::of(spec, latent, scenario);
        let call = shape.call_usd(spec);
        let mut calls = shape.calls;
        for mode in FailureMode::ALL {
            let i = mode.index();
            // Expected retries once a mode triggers: 1 + (1 − r) + (1 − r)² + ... (attempts − 1 terms).
            let miss = 1.0 - odds.recover[i];
            let retries: f64 = (0..attempts.saturating_sub(1).min(100))
                .map(|k| miss.powi(k as i32))
                .sum();
            let per_retry = if mode == FailureMode::Looping {
                shape.loop_calls
            } else {
                1.0
            };
            calls += odds.first[i] * retries * per_retry;
        }
        calls += odds.first[FailureMode::Looping.index()] * shape.loop_calls;
        cost += calls * call;
    }
    let n = workload.len().max(1) as f64;
    for rate in &mut rates {
        *rate /= n;
    }
    Evaluation {
        reliability: reliability / n,
        cost_usd: cost / n,
        failure_rates: rates,
    }
}

/// Per-mode failure rates sorted largest first (ties in mode order).
pub(crate) fn sorted_rates(rates: &[f64; FailureMode::COUNT]) -> Vec<(FailureMode, f64)> {
    let mut sorted: Vec<(FailureMode, f64)> = FailureMode::ALL
        .iter()
        .map(|m| (*m, rates[m.index()]))
        .collect();
    sorted.sort_by(|a, b| b.1.total_cmp(&a.1));
    sorted
}

/// The ground truth's questions, answered. Stateless: all it needs is in the hidden state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroundTruth;

impl GroundTruth {
    /// Expected reliability score per run of `config` in this situation; `None` when the config
    /// is invalid or names an unknown model.
    pub fn expected_reliability(&self, hidden: &HiddenState, config: &Value) -> Option<f64> {
        let spec = AgentSpec::parse(config).ok()?;
        Some(evaluate(&spec, &hidden.latent, &hidden.workload).reliability)
    }

    /// Expected cost per run in USD of `config` in this situation.
    pub fn expected_cost_usd(&self, hidden: &HiddenState, config: &Value) -> Option<f64> {
        let spec = AgentSpec::parse(config).ok()?;
        Some(evaluate(&spec, &hidden.latent, &hidden.workload).cost_usd)
    }

    /// Fraction of runs of `config` that die of each mode, largest first.
    pub fn failure_rates(
        &self,
        hidden: &HiddenState,
        config: &Value,
    ) -> Option<Vec<(FailureMode, f64)>> {
        let spec = AgentSpec::parse(config).ok()?;
        Some(sorted_rates(
            &evaluate(&spec, &hidden.latent, &hidden.workload).failure_rates,
        ))
    }

    /// What applying `diff` (a JSON Merge Patch) to `current` does in this situation.
    pub fn effect(&self, hidden: &HiddenState, current: &Value, diff: &Value) -> Effect {
        self.assess(hidden, current, diff).effect
    }

    /// Probability that `user` accepts `diff` for `current` in this situation.
    ///
    /// People accept changes that work and dislike paying more; engineers weigh reliability,
    /// product managers cost; regulated domains are wary of model switches; retries and timeouts
    /// are easy to say yes to. Bounded to [0.01, 0.82]: nobody accepts everything.
    pub fn acceptance_probability(
        &self,
        user: &UserProfile,
        hidden: &HiddenState,
        current: &Value,
        diff: &Value,
    ) -> f64 {
        let assessment = self.assess(hidden, current, diff);
        acceptance_from(user, &assessment)
    }

    pub(crate) fn assess(&self, hidden: &HiddenState, current: &Value, diff: &Value) -> Assessment {
        let broken = |reliability: f64| Assessment {
            effect: Effect {
                reliability_delta: -reliability,
                cost_delta_usd_per_run: 0.0,
                applicable: false,
            },
            current_cost: 0.0,
            kind: None,
            changes_model: false,
            no_op: false,
        };
        let Ok(current_spec) = AgentSpec::parse(current) else {
            return broken(0.0);
        };
        let before = evaluate(&current_spec, &hidden.latent, &hidden.workload);
        let mut diff_errors = FieldErrors::default();
        validate_diff(diff, &mut diff_errors);
        if !diff_errors.is_empty() {
            return broken(before.reliability);
        }
        let mut patched = current.clone();
        apply_merge_patch(&mut patched, diff);
        let Ok(patched_spec) = AgentSpec::parse(&patched) else {
            return broken(before.reliability);
        };
        let after = evaluate(&patched_spec, &hidden.latent, &hidden.workload);
        Assessment {
            effect: Effect {
                reliability_delta: after.reliability - before.reliability,
                cost_delta_usd_per_run: after.cost_usd - before.cost_usd,
                applicable: true,
            },
            current_cost: before.cost_usd,
            kind: classify_diff(current, diff),
            changes_model: patched_spec.model.name != current_spec.model.name,
            no_op: patched == *current,
        }
    }
}

/// An effect plus what a person notices about the change.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Assessment {
    pub effect: Effect,
    pub current_cost: f64,
    pub kind: Option<RecommendationType>,
    pub changes_model: bool,
    pub no_op: bool,
}

/// How much a role weighs reliability and relative cost.
fn role_weights(role: &str) -> (f64, f64) {
    match role {
        "senior_ml_engineer" => (1.4, 0.35),
        "ml_engineer" => (1.25, 0.5),
        "data_scientist" => (1.1, 0.5),
        "platform_engineer" => (1.2, 0.6),
        "product_manager" => (0.85, 1.2),
        "engineering_manager" => (0.95, 0.9),
        _ => (1.0, 0.7),
    }
}

/// Per-type prior: cheap, reversible changes are easy to approve.
fn type_bias(kind: RecommendationType) -> f64 {
    match kind {
        RecommendationType::RetryPolicy => 0.2,
        RecommendationType::TimeoutAdjustment => 0.25,
        RecommendationType::Temperature => 0.1,
        RecommendationType::ToolConfiguration => -0.1,
        RecommendationType::ModelSwitch => -0.15,
        RecommendationType::Cheapest => 0.0,
        RecommendationType::HighestPerf => -0.2,
        RecommendationType::Balanced => 0.05,
    }
}

fn role_type_bias(role: &str, kind: RecommendationType) -> f64 {
    use RecommendationType as T;
    match (role, kind) {
        ("platform_engineer", T::RetryPolicy | T::TimeoutAdjustment) => 0.3,
        ("product_manager", T::Cheapest) => 0.4,
        ("data_scientist", T::Temperature) => 0.2,
        ("senior_ml_engineer", T::ModelSwitch) => 0.2,
        _ => 0.0,
    }
}

fn domain_bias(domain: &str, kind: RecommendationType, changes_model: bool) -> f64 {
    // Regulated domains re-validate a model before switching; that friction shows as reluctance.
    let model_friction = match domain {
        "healthcare" => -0.8,
        "fintech" => -0.7,
        "insurance" => -0.5,
        _ => 0.0,
    };
    let thrift = match (domain, kind) {
        ("ecommerce" | "saas", RecommendationType::Cheapest) => 0.3,
        ("analytics", RecommendationType::Temperature) => 0.15,
        _ => 0.0,
    };
    (if changes_model { model_friction } else { 0.0 }) + thrift
}

pub(crate) fn acceptance_from(user: &UserProfile, assessment: &Assessment) -> f64 {
    if !assessment.effect.applicable {
        return 0.01;
    }
    if assessment.no_op {
        return 0.02;
    }
    let (w_rel, w_cost) = role_weights(&user.role);
    let delta = assessment.effect.reliability_delta;
    // Gains saturate (a fix can only fix so much); regressions are noticed and punished fully.
    let perceived = if delta >= 0.0 {
        7.0 * (delta / 0.25).tanh()
    } else {
        15.0 * delta
    };
    let relative_cost = (assessment.effect.cost_delta_usd_per_run
        / assessment.current_cost.max(0.002))
    .clamp(-1.0, 4.0);
    let kind_terms = assessment.kind.map_or(0.0, |kind| {
        type_bias(kind)
            + role_type_bias(&user.role, kind)
            + domain_bias(&user.domain, kind, assessment.changes_model)
    });
    let z = -2.7 - user.strictness + w_rel * perceived - w_cost * relative_cost + kind_terms;
    0.01 + 0.81 * sigmoid(z)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn hidden() -> HiddenState {
        HiddenState {
            latent: Latent {
                tool_slowness: 1.0,
                load: 1.0,
                prompt_tokens: 4000.0,
                sandbox_flakiness: 0.0,
                broken_credential: None,
            },
            workload: vec![ScenarioProfile {
                expected_tools: &["web_search", "calculator"],
                difficulty: 0.5,
            }],
            failure_rates: Vec::new(),
        }
    }

    fn config(timeout_s: f64, temperature: f64) -> Value {
        json!({"model": "openai/gpt-4.1-mini", "temperature": temperature,
               "tools": [{"name": "web_search"}, {"name": "calculator"}],
               "retry": {"max_attempts": 1}, "timeout_s": timeout_s})
    }

    #[test]
    fn longer_timeouts_fix_tool_timeouts_with_diminishing_returns() {
        let truth = GroundTruth;
        let h = hidden();
        let short = config(2.0, 0.5);
        let to_10 = truth.effect(&h, &short, &json!({"timeout_s": 10}));
        let to_60 = truth.effect(&h, &short, &json!({"timeout_s": 60}));
        assert!(to_10.reliability_delta > 0.15, "{to_10:?}");
        assert!(to_60.reliability_delta - to_10.reliability_delta < 0.5 * to_10.reliability_delta);
    }

    #[test]
    fn warming_up_fixes_looping_and_longer_timeouts_do_not() {
        let truth = GroundTruth;
        let h = hidden();
        let cold = config(30.0, 0.0);
        assert!(
            truth
                .effect(&h, &cold, &json!({"temperature": 0.3}))
                .reliability_delta
                > 0.1
        );
        let useless = truth.effect(&h, &cold, &json!({"timeout_s": 120}));
        assert!(useless.reliability_delta.abs() < 0.01, "{useless:?}");
        assert!(
            useless.cost_delta_usd_per_run > 0.0,
            "looping longer costs more: {useless:?}"
        );
    }

    #[test]
    fn unknown_models_break_the_config() {
        let truth = GroundTruth;
        let effect = truth.effect(
            &hidden(),
            &config(30.0, 0.5),
            &json!({"model": "openai/gpt-9"}),
        );
        assert!(!effect.applicable);
        assert!(effect.reliability_delta < 0.0);
    }
}
