//! The heuristics: candidate changes for one failure context, in the platform's vocabulary, with
//! expected reliability and cost deltas from the organization's statistics shrunk toward priors
//! when evidence is thin. Pure and allocation-light: this runs on the HTTP request path.
//!
//! Each heuristic proposes a few drafts; [`super::constraints::finalize`] then drops no-ops,
//! invalid diffs and candidates over the cost cap, deduplicates, and assigns ids.

use serde_json::{Map, Value};

use super::config::{ConfigView, number, round1};
use super::constraints::finalize;
use super::describe::{pct, relative_change, secs, temp, usd_per_run};
use super::index::{CandidateIndex, DiffAgg, Lever, ModelEntry, shrink};
use super::request::{CandidateRequest, SignalProfile};
use super::signals::{CATEGORY_SLOTS, FailureSignal};
use crate::domain::{Candidate, CandidateSource, RecommendationType};

/// Most candidates one request returns (a bandit ranks at most about this many).
pub const MAX_CANDIDATES: usize = 50;
/// The platform's retention rule: a cheaper model must keep 95% of the current reliability.
pub const CHEAPEST_RETENTION: f64 = 0.95;
/// The platform's cost rule for "cheapest": at least 30% cheaper.
pub const CHEAPEST_MAX_PRICE_RATIO: f64 = 0.7;
/// Prior strength, in applied past diffs, of the lever priors.
const LEVER_PRIOR_DIFFS: f64 = 8.0;
/// Reliability a "balanced" model gives up per e-fold of price.
const BALANCE_LAMBDA: f64 = 0.04;
/// Longest timeout arc-rec proposes (seconds).
const MAX_TIMEOUT_S: f64 = 600.0;
/// Most retry attempts arc-rec proposes.
const MAX_ATTEMPTS: u64 = 10;

use FailureSignal as S;

const TRANSIENT: [FailureSignal; 3] = [S::ToolTimeout, S::RateLimit, S::ProviderError];
const HOT_SIGNALS: [FailureSignal; 3] = [S::MalformedArgs, S::HallucinatedTool, S::OutputFormat];

/// Candidates for the request: the heuristics' and the caller's model candidates (those naming
/// only models and tools the organization has run), every one a
/// valid diff that changes the configuration, within the cost cap, no two alike, at most
/// [`MAX_CANDIDATES`], most promising (expected reliability delta) first.
pub fn generate(index: &CandidateIndex, request: &CandidateRequest) -> Vec<Candidate> {
    let ctx = Ctx::new(index, request);
    let mut drafts: Vec<Candidate> = Vec::with_capacity(40 + request.model_candidates.len());
    cheapest(&ctx, &mut drafts);
    highest_perf(&ctx, &mut drafts);
    balanced(&ctx, &mut drafts);
    model_switch(&ctx, &mut drafts);
    retry_policy(&ctx, &mut drafts);
    timeout_adjustment(&ctx, &mut drafts);
    temperature(&ctx, &mut drafts);
    tool_configuration(&ctx, &mut drafts);
    // A model candidate bringing in a model or tool the organization has never run has nothing
    // to price it (`arc-rec candidates` drops them; this also covers rows it stored before it
    // did, and configurations it never saw).
    drafts.extend(
        request
            .model_candidates
            .iter()
            .filter(|c| {
                index
                    .unknown_name(&request.current_config, &c.diff)
                    .is_none()
            })
            .cloned(),
    );
    finalize(
        &request.current_config,
        drafts,
        request.max_cost_increase_usd_per_run,
        MAX_CANDIDATES,
    )
}

/// What every heuristic reads.
struct Ctx<'a> {
    index: &'a CandidateIndex,
    request: &'a CandidateRequest,
    view: ConfigView<'a>,
    signals: SignalProfile,
    current: Option<&'a ModelEntry>,
    /// Reliability of the current model across the organization (model comparisons use it).
    model_reliability: f64,
    /// Reliability of this configuration (measured if the caller knows, else the model's).
    reliability: f64,
    /// Cost per run of this configuration.
    cost: f64,
}

/// An expected effect from past diffs of one lever, shrunk toward a prior.
#[derive(Debug, Clone, Copy)]
struct Estimate {
    rel: f64,
    cost: f64,
    evidence: u32,
    applied: u64,
    fix_rate: Option<f64>,
}

impl<'a> Ctx<'a> {
    fn new(index: &'a CandidateIndex, request: &'a CandidateRequest) -> Self {
        let view = ConfigView::of(&request.current_config);
        let signals = SignalProfile::of(request, &view);
        let current = index.model(view.model);
        let model_reliability = current.map_or(index.org_stats.mean_reliability, |m| m.reliability);
        let reliability = request
            .current_reliability
            .filter(|r| r.is_finite())
            .map_or(model_reliability, |r| r.clamp(0.0, 1.0));
        let cost = request
            .current_cost_usd_per_run
            .filter(|c| c.is_finite() && *c >= 0.0)
            .unwrap_or_else(|| current.map_or(index.org_stats.mean_cost_usd, |m| m.cost_usd));
        Self {
            index,
            request,
            view,
            signals,
            current,
            model_reliability,
            reliability,
            cost,
        }
    }

    fn w(&self, signal: FailureSignal) -> f64 {
        self.signals.weight(signal)
    }

    /// Past diffs of `lever` pooled over the failure categories of the context's failures that
    /// this lever plausibly fixes, shrunk toward the priors (reliability and cost delta per run).
    /// Categories are coarse — `timeout` holds slow tools and loops alike — so a loop's category
    /// must not borrow the record of longer timeouts on slow tools.
    fn estimate(&self, lever: Lever, prior_rel: f64, prior_cost: f64) -> Estimate {
        let mut slots = [false; CATEGORY_SLOTS];
        for (signal, slot) in &self.signals.observations {
            if lever_prior(lever, *signal) > 0.0 {
                slots[*slot] = true;
            }
        }
        let mut pooled = DiffAgg::default();
        for (slot, used) in slots.iter().enumerate() {
            if *used {
                pooled.add(self.index.lever_stats(lever, slot));
            }
        }
        let n = pooled.applied as f64;
        Estimate {
            rel: shrink(
                pooled.mean_reliability_delta().unwrap_or(prior_rel),
                n,
                prior_rel,
                LEVER_PRIOR_DIFFS,
            ),
            cost: shrink(
                pooled.mean_cost_delta_usd().unwrap_or(prior_cost),
                n,
                prior_cost,
                LEVER_PRIOR_DIFFS,
            ),
            evidence: u32::try_from(pooled.decided()).unwrap_or(u32::MAX),
            applied: pooled.applied,
            fix_rate: pooled.fix_rate(),
        }
    }

    /// Prior reliability gain of pulling `lever`, given the context's failure signals.
    fn prior(&self, lever: Lever) -> f64 {
        FailureSignal::ALL
            .iter()
            .map(|s| self.w(*s) * lever_prior(lever, *s))
            .sum()
    }

    /// "fixes 71% of similar timeouts" when enough past diffs were re-run, else the expectation.
    fn evidence_phrase(&self, est: &Estimate, noun: &str) -> String {
        match est.fix_rate {
            Some(rate) if est.applied >= 3 => format!("fixes {} of similar {noun}", pct(rate)),
            _ if est.rel.abs() < 0.001 => "little reliability change expected".to_owned(),
            _ => format!(
                "{} reliability expected",
                relative_change(est.rel, self.reliability)
            ),
        }
    }

    /// Proposable models other than the current one.
    fn other_models(&self) -> impl Iterator<Item = &'a ModelEntry> + '_ {
        self.index
            .models
            .iter()
            .filter(move |m| m.proposable() && m.model != self.view.model)
    }

    fn price_ratio(&self, to: &ModelEntry) -> f64 {
        self.index.price_ratio(self.current, to)
    }

    /// Expected cost change of running `to` instead of the current model.
    fn model_cost_delta(&self, to: &ModelEntry) -> f64 {
        self.index
            .model_switch_cost_delta(self.current, self.cost, to)
    }

    /// The target retry policy: the organization's typical attempts and backoff, more patient
    /// when rate limits dominate (a 429 wants waiting, not hammering).
    fn retry_target(&self) -> (u64, f64) {
        let typical = self.index.typical;
        let attempts = typical
            .retry_attempts
            .map_or(3.0, |a| a.round().clamp(2.0, 6.0)) as u64;
        let mut backoff = typical
            .retry_backoff_s
            .map_or(2.0, |b| round1(b.clamp(0.5, 30.0)));
        if self.w(S::RateLimit) >= 0.2 {
            backoff = backoff.max(4.0);
        }
        let attempts = attempts
            .max(self.view.max_attempts + u64::from(self.signals.weight_of(&TRANSIENT) > 0.0))
            .min(MAX_ATTEMPTS);
        (attempts, backoff)
    }

    /// The moderate temperature "balanced" settles on.
    fn moderate_temperature(&self) -> f64 {
        self.index
            .typical
            .temperature_down
            .map_or(0.3, |t| round1(t.clamp(0.2, 0.5)))
    }
}

/// Prior reliability gain of pulling `lever` against failures of one signal: what each lever is
/// known to fix (retries recover transient faults, longer timeouts slow tools, cooler sampling
/// malformed calls, warmer sampling loops, a missing tool invented calls, fewer tool schemas
/// context overflows) and what it makes worse.
fn lever_prior(lever: Lever, signal: FailureSignal) -> f64 {
    match (lever, signal) {
        (Lever::Retry, S::RateLimit) => 0.12,
        (Lever::Retry, S::ProviderError) => 0.08,
        (Lever::Retry, S::ToolTimeout) => 0.05,
        (Lever::Retry, S::Sandbox | S::Auth) => 0.0,
        (Lever::Retry, _) => 0.003,
        (Lever::Timeout | Lever::ToolTimeout, S::ToolTimeout) => 0.15,
        (Lever::Timeout | Lever::ToolTimeout, S::Looping) => -0.01,
        (Lever::TemperatureDown, S::MalformedArgs) => 0.10,
        (Lever::TemperatureDown, S::HallucinatedTool) => 0.05,
        (Lever::TemperatureDown, S::OutputFormat) => 0.03,
        (Lever::TemperatureDown, S::Looping) => -0.03,
        (Lever::TemperatureUp, S::Looping) => 0.15,
        (Lever::TemperatureUp, S::MalformedArgs) => -0.03,
        (Lever::TemperatureUp, S::HallucinatedTool | S::OutputFormat) => -0.01,
        (Lever::ToolsAdd, S::HallucinatedTool) => 0.15,
        (Lever::ToolsRemove, S::ContextOverflow) => 0.10,
        (Lever::ToolsRemove, S::Sandbox | S::Auth) => 0.0,
        (Lever::ToolsRemove, _) => 0.005,
        _ => 0.0,
    }
}

fn draft(
    kind: RecommendationType,
    diff: Value,
    description: String,
    rel: f64,
    cost: f64,
    evidence: u32,
) -> Candidate {
    Candidate {
        candidate_id: String::new(),
        recommendation_type: kind,
        diff,
        description,
        expected_reliability_delta: rel,
        expected_cost_delta_usd: cost,
        evidence_count: evidence,
        source: CandidateSource::Heuristic,
    }
}

fn object(entries: impl IntoIterator<Item = (&'static str, Value)>) -> Value {
    let mut map = Map::new();
    for (k, v) in entries {
        map.insert(k.to_owned(), v);
    }
    Value::Object(map)
}

fn retry_object(attempts: u64, backoff_s: f64) -> Value {
    object([
        ("max_attempts", Value::from(attempts)),
        ("backoff_s", number(backoff_s)),
    ])
}

fn runs(m: &ModelEntry) -> u32 {
    u32::try_from(m.runs).unwrap_or(u32::MAX)
}

/// `cheapest`: the platform's rule — a model at least 30% cheaper that keeps ≥ 95% of the
/// current model's reliability, with ≥ 3 distinct simulations. Proposes the cheapest such model
/// and the most reliable one. Statistics: per-model shrunk reliability, price per token, runs.
fn cheapest(ctx: &Ctx<'_>, out: &mut Vec<Candidate>) {
    let floor = CHEAPEST_RETENTION * ctx.model_reliability;
    let mut options: Vec<(&ModelEntry, f64)> = ctx
        .other_models()
        .map(|m| (m, ctx.price_ratio(m)))
        .filter(|(m, ratio)| *ratio <= CHEAPEST_MAX_PRICE_RATIO && m.reliability >= floor)
        .collect();
    options.sort_by(|a, b| a.1.total_cmp(&b.1).then_with(|| a.0.model.cmp(&b.0.model)));
    let most_reliable = options
        .iter()
        .max_by(|a, b| a.0.reliability.total_cmp(&b.0.reliability))
        .copied();
    let picks = options.first().copied().into_iter().chain(most_reliable);
    for (m, ratio) in picks {
        let retention = m.reliability / ctx.model_reliability.max(1e-6);
        // The platform states retention ("96% reliability"); a gain reads better as one.
        let reliability = if retention > 1.0 {
            format!("+{} reliability", pct(retention - 1.0))
        } else {
            format!("{} reliability", pct(retention))
        };
        out.push(draft(
            RecommendationType::Cheapest,
            object([("model", Value::String(m.model.clone()))]),
            format!(
                "Switch to {} ({} lower cost, {reliability})",
                m.model,
                pct(1.0 - ratio),
            ),
            m.reliability - ctx.model_reliability,
            ctx.cost * (ratio - 1.0),
            runs(m),
        ));
    }
}

/// `highest_perf`: the most reliable proposable model, plus retry logic when the failures are
/// transient (timeouts, rate limits, provider errors). Statistics: per-model shrunk reliability
/// and price; retry diffs' outcomes for the retry part.
fn highest_perf(ctx: &Ctx<'_>, out: &mut Vec<Candidate>) {
    let Some(best) = ctx
        .other_models()
        .max_by(|a, b| a.reliability.total_cmp(&b.reliability))
    else {
        return;
    };
    if best.reliability <= ctx.model_reliability {
        return;
    }
    let ratio = ctx.price_ratio(best);
    let mut rel = best.reliability - ctx.model_reliability;
    let mut cost = ctx.model_cost_delta(best);
    let mut diff = object([("model", Value::String(best.model.clone()))]);
    let (attempts, backoff) = ctx.retry_target();
    let with_retry = ctx.signals.weight_of(&TRANSIENT) > 0.0 && attempts > ctx.view.max_attempts;
    if with_retry {
        let est = ctx.estimate(Lever::Retry, ctx.prior(Lever::Retry), 0.05 * ctx.cost);
        // A better model already fixes part of what retries would: count the retry part at 70%.
        rel += 0.7 * est.rel;
        cost += est.cost * ratio;
        if let Value::Object(map) = &mut diff {
            map.insert("retry".to_owned(), retry_object(attempts, backoff));
        }
    }
    let description = format!(
        "Upgrade to {}{} ({} reliability gain, {})",
        best.model,
        if with_retry { " + retry logic" } else { "" },
        relative_change(rel, ctx.reliability),
        usd_per_run(cost)
    );
    out.push(draft(
        RecommendationType::HighestPerf,
        diff,
        description,
        rel,
        cost,
        runs(best),
    ));
}

/// `balanced`: the best reliability per dollar — the model maximising shrunk reliability minus
/// [`BALANCE_LAMBDA`] per e-fold of price, among those keeping 95% of the current reliability —
/// with a moderate temperature. Statistics: per-model reliability and price, typical
/// temperatures of past diffs.
fn balanced(ctx: &Ctx<'_>, out: &mut Vec<Candidate>) {
    let floor = CHEAPEST_RETENTION * ctx.model_reliability;
    let score = |m: &ModelEntry| m.reliability - BALANCE_LAMBDA * ctx.price_ratio(m).ln();
    let Some(best) = ctx
        .other_models()
        .filter(|m| m.reliability >= floor)
        .max_by(|a, b| score(a).total_cmp(&score(b)))
    else {
        return;
    };
    if score(best) <= ctx.model_reliability {
        return;
    }
    let target = ctx.moderate_temperature();
    let mut rel = best.reliability - ctx.model_reliability;
    let mut entries = vec![("model", Value::String(best.model.clone()))];
    let t = ctx.view.temperature;
    if !(0.2..=0.5).contains(&t) {
        let lever = if target < t {
            Lever::TemperatureDown
        } else {
            Lever::TemperatureUp
        };
        rel += ctx.estimate(lever, ctx.prior(lever), 0.0).rel;
        entries.push(("temperature", number(target)));
    }
    let shown_t = if entries.len() > 1 { target } else { t };
    out.push(draft(
        RecommendationType::Balanced,
        object(entries),
        format!(
            "Use {} + temperature={} (optimal cost/performance, {})",
            best.model,
            temp(shown_t),
            usd_per_run(ctx.model_cost_delta(best))
        ),
        rel,
        ctx.model_cost_delta(best),
        runs(best),
    ));
}

/// `model_switch`: the models that do best on this failure pattern — reliability within the
/// versions showing the context's failure categories, plus the reliability a lower failure rate
/// of the context's signals is worth. Top three. Statistics: per-model reliability per failure
/// category and per-signal failure rates, the organization's success gap.
fn model_switch(ctx: &Ctx<'_>, out: &mut Vec<Candidate>) {
    let cats = &ctx.signals.categories;
    let category_rel = |m: Option<&ModelEntry>| -> f64 {
        let base = m.map_or(ctx.index.org_stats.mean_reliability, |m| m.reliability);
        (0..CATEGORY_SLOTS)
            .map(|slot| {
                let r = m
                    .and_then(|m| m.category_reliability[slot])
                    .map_or(base, |(_, r)| r);
                cats[slot] * r
            })
            .sum()
    };
    let rate = |m: Option<&ModelEntry>, s: FailureSignal| {
        m.map_or(ctx.index.org_stats.signal_failure_rate[s.index()], |m| {
            m.signal_failure_rate[s.index()]
        })
    };
    let current_rel = category_rel(ctx.current);
    let gap = ctx.index.org_stats.success_gap;
    let gain = |m: &ModelEntry| -> f64 {
        let fewer: f64 = FailureSignal::ALL
            .iter()
            .map(|s| ctx.w(*s) * (rate(ctx.current, *s) - rate(Some(m), *s)))
            .sum();
        // Half weight: the category reliabilities already reflect part of the failure rates.
        category_rel(Some(m)) - current_rel + 0.5 * gap * fewer
    };
    // Models an earlier heuristic already proposed on their own would only be deduplicated away.
    let proposed = |m: &ModelEntry| {
        out.iter().any(|c| {
            c.diff.as_object().is_some_and(|o| o.len() == 1)
                && c.diff.get("model").and_then(Value::as_str) == Some(m.model.as_str())
        })
    };
    let mut ranked: Vec<(&ModelEntry, f64)> = ctx
        .other_models()
        .filter(|m| !proposed(m))
        .map(|m| (m, gain(m)))
        .collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.model.cmp(&b.0.model)));
    let noun = ctx.signals.dominant().plural_noun();
    // A switch expected to lose more than a few points is not worth a person's time.
    for (m, rel) in ranked.into_iter().filter(|(_, rel)| *rel >= -0.03).take(3) {
        let cost = ctx.model_cost_delta(m);
        out.push(draft(
            RecommendationType::ModelSwitch,
            object([("model", Value::String(m.model.clone()))]),
            format!(
                "Switch to {} for this failure pattern ({} success on similar {noun}, {})",
                m.model,
                relative_change(rel, ctx.reliability),
                usd_per_run(cost)
            ),
            rel,
            cost,
            runs(m),
        ));
    }
}

/// `retry_policy`: retries with backoff for transient failures (timeouts, rate limits, provider
/// errors); a second, more patient policy when rate limits or provider errors are frequent.
/// Statistics: past retry diffs in these failure categories (fix rate, reliability and cost
/// deltas), typical attempts and backoff of retries that worked.
fn retry_policy(ctx: &Ctx<'_>, out: &mut Vec<Candidate>) {
    let (attempts, backoff) = ctx.retry_target();
    let view = &ctx.view;
    let transient = ctx.signals.weight_of(&TRANSIENT);
    let noun = ctx
        .signals
        .dominant_of(&TRANSIENT)
        .map_or("failures", FailureSignal::plural_noun);
    let subject = match ctx.signals.failing_tool(&TRANSIENT) {
        Some(tool) if ctx.signals.dominant_of(&TRANSIENT) == Some(S::ToolTimeout) => {
            tool.to_owned()
        }
        _ if ctx.signals.dominant_of(&TRANSIENT) == Some(S::RateLimit) => {
            "rate-limited calls".to_owned()
        }
        _ => "failed calls".to_owned(),
    };
    let base_cost = (0.02 + 0.1 * transient) * ctx.cost;
    let mut policies: Vec<(u64, f64, f64)> = vec![(attempts, backoff, 1.0)];
    if ctx.signals.weight_of(&[S::RateLimit, S::ProviderError]) >= 0.25 {
        policies.push((
            (attempts + 2).min(MAX_ATTEMPTS),
            round1((backoff * 2.5).min(60.0)),
            1.5,
        ));
    }
    // A single retry is the cheapest policy to try and the easiest to approve.
    if view.max_attempts == 1 && attempts > 2 {
        policies.push((2, backoff, 0.6));
    }
    for (attempts, backoff, scale) in policies {
        if attempts <= view.max_attempts && backoff <= view.backoff_s {
            continue;
        }
        let mut est = ctx.estimate(Lever::Retry, ctx.prior(Lever::Retry), base_cost);
        // Past retry diffs are pooled whatever their attempts; scale to this policy's.
        est.rel *= scale.min(1.2);
        est.cost *= scale;
        out.push(draft(
            RecommendationType::RetryPolicy,
            object([("retry", retry_object(attempts, backoff))]),
            format!(
                "Retry {subject} up to {attempts} times with {}s backoff ({}, {})",
                secs(backoff),
                ctx.evidence_phrase(&est, noun),
                usd_per_run(est.cost)
            ),
            est.rel,
            est.cost,
            est.evidence,
        ));
    }
}

/// `timeout_adjustment`: a longer timeout for the tool that timed out (its own `timeout_s`, at
/// least three times its observed p90 latency), a generous variant when timeouts dominate, and
/// a longer overall `timeout_s`. Statistics: past timeout diffs (fix rate, deltas, typical
/// ratio new/old), per-tool latency of successful calls.
fn timeout_adjustment(ctx: &Ctx<'_>, out: &mut Vec<Candidate>) {
    let view = &ctx.view;
    let typical = ctx.index.typical;
    let cost_prior = (0.02 + 0.1 * ctx.w(S::Looping)) * ctx.cost;
    if let Some(tool) = ctx.signals.failing_tool(&[S::ToolTimeout]) {
        let current = view.tool_timeout_s(tool);
        let ratio = typical
            .tool_timeout_ratio
            .or(typical.timeout_ratio)
            .map_or(3.0, |r| r.clamp(1.5, 8.0));
        let p90 = ctx.index.tool(tool).and_then(|t| t.p90_ok_s).unwrap_or(0.0);
        let target = (current * ratio)
            .max(current + 5.0)
            .max(3.0 * p90)
            .ceil()
            .min(MAX_TIMEOUT_S);
        let mut targets = vec![target];
        if ctx.w(S::ToolTimeout) >= 0.3 {
            targets.push((target * 2.0).max(60.0).ceil().min(MAX_TIMEOUT_S));
        }
        let est = ctx.estimate(
            Lever::ToolTimeout,
            ctx.prior(Lever::ToolTimeout),
            cost_prior,
        );
        for (i, target) in targets.into_iter().enumerate() {
            if target <= current {
                continue;
            }
            // The generous variant fixes a little more of the tail.
            let rel = est.rel * if i == 0 { 1.0 } else { 1.1 };
            out.push(draft(
                RecommendationType::TimeoutAdjustment,
                object([("tools", view.tools_with_timeout(tool, target))]),
                format!(
                    "Raise {tool}'s timeout from {}s to {}s ({}, {})",
                    secs(current),
                    secs(target),
                    ctx.evidence_phrase(&est, S::ToolTimeout.plural_noun()),
                    usd_per_run(est.cost)
                ),
                rel,
                est.cost,
                est.evidence,
            ));
        }
    }
    let ratio = typical.timeout_ratio.map_or(2.0, |r| r.clamp(1.5, 8.0));
    let target = (view.timeout_s * ratio)
        .max(view.timeout_s + 5.0)
        .ceil()
        .min(MAX_TIMEOUT_S);
    if target > view.timeout_s {
        let est = ctx.estimate(Lever::Timeout, ctx.prior(Lever::Timeout), cost_prior);
        out.push(draft(
            RecommendationType::TimeoutAdjustment,
            object([("timeout_s", number(target))]),
            format!(
                "Raise the call timeout from {}s to {}s ({}, {})",
                secs(view.timeout_s),
                secs(target),
                ctx.evidence_phrase(&est, S::ToolTimeout.plural_noun()),
                usd_per_run(est.cost)
            ),
            est.rel,
            est.cost,
            est.evidence,
        ));
    }
}

/// `temperature`: cooler sampling for malformed arguments, invented tools and format errors (to
/// the typical temperature that worked, and a half step when the gap is large), warmer for
/// loops, and a moderate setting as a default when the current one is extreme. Statistics: past
/// temperature diffs by direction (fix rate, deltas, typical targets).
fn temperature(ctx: &Ctx<'_>, out: &mut Vec<Candidate>) {
    let t = ctx.view.temperature;
    let typical = ctx.index.typical;
    let hot = ctx.signals.weight_of(&HOT_SIGNALS);
    let looping = ctx.w(S::Looping);
    let mut targets: Vec<f64> = Vec::new();
    let down = typical
        .temperature_down
        .map_or(0.3, |x| round1(x.clamp(0.1, 0.5)));
    if t >= down + 0.1 && (hot > 0.0 || t > 1.0) {
        targets.push(down);
        if t - down >= 0.5 {
            targets.push(round1((t + down) / 2.0));
        }
    }
    let up = typical
        .temperature_up
        .map_or(0.3, |x| round1(x.clamp(0.2, 0.7)));
    if t <= up - 0.1 && (looping > 0.0 || t < 0.1) {
        targets.push(up);
    }
    if targets.is_empty() && (t - 0.3).abs() >= 0.15 {
        targets.push(0.3);
    }
    for target in targets {
        let lever = if target < t {
            Lever::TemperatureDown
        } else {
            Lever::TemperatureUp
        };
        // A half step fixes about half as much.
        let step = ((t - target).abs() / (t - down).abs().max(0.1)).min(1.0);
        let prior = ctx.prior(lever)
            * if lever == Lever::TemperatureDown {
                step
            } else {
                1.0
            };
        let est = ctx.estimate(lever, prior, 0.0);
        let (verb, noun) = if lever == Lever::TemperatureDown {
            (
                "Lower",
                ctx.signals
                    .dominant_of(&HOT_SIGNALS)
                    .map_or("erratic outputs", FailureSignal::plural_noun),
            )
        } else {
            ("Raise", S::Looping.plural_noun())
        };
        out.push(draft(
            RecommendationType::Temperature,
            object([("temperature", number(target))]),
            format!(
                "{verb} temperature from {} to {} ({})",
                temp(t),
                temp(target),
                ctx.evidence_phrase(&est, noun)
            ),
            est.rel,
            est.cost,
            est.evidence,
        ));
    }
}

/// `tool_configuration`: add a tool the model keeps calling that works elsewhere in the
/// organization; remove configured tools the configuration never calls (or that never work
/// here); match every tool's own timeout to its observed latency. The tools array is replaced
/// wholesale (merge patch), so every other tool is carried over intact. Statistics: per-tool
/// calls, success and latency, how often configured tools are called, past tool diffs.
fn tool_configuration(ctx: &Ctx<'_>, out: &mut Vec<Candidate>) {
    let view = &ctx.view;
    let index = ctx.index;
    for tool in ctx.signals.requested_tools.iter().take(2) {
        let Some(entry) = index.tool(tool).filter(|t| t.known_good()) else {
            continue;
        };
        let est = ctx.estimate(Lever::ToolsAdd, ctx.prior(Lever::ToolsAdd), 0.05 * ctx.cost);
        out.push(draft(
            RecommendationType::ToolConfiguration,
            object([("tools", view.tools_with(tool))]),
            format!(
                "Add the {tool} tool the agent keeps calling ({} of its calls succeed here, {})",
                pct(entry.ok_calls as f64 / entry.calls.max(1) as f64),
                usd_per_run(est.cost)
            ),
            est.rel,
            est.cost,
            est.evidence,
        ));
    }

    let failing: Vec<&str> = ctx
        .signals
        .failing_tools
        .iter()
        .map(|(t, _)| t.as_str())
        .collect();
    let unused: Vec<&str> = view
        .tool_names()
        .filter(|name| !name.is_empty() && !failing.contains(name))
        .filter(|name| match &ctx.request.called_tools {
            Some(called) => !called.iter().any(|c| c == name),
            None => index.tool(name).is_some_and(|t| {
                t.versions_configured >= 3 && t.usage_rate().is_some_and(|u| u < 0.15)
            }),
        })
        .collect();
    if !unused.is_empty() && unused.len() < view.tools.len() {
        let n = unused.len() as f64;
        let est = ctx.estimate(
            Lever::ToolsRemove,
            ctx.prior(Lever::ToolsRemove),
            -0.04 * n * ctx.cost,
        );
        out.push(draft(
            RecommendationType::ToolConfiguration,
            object([("tools", view.tools_without(&unused))]),
            format!(
                "Remove unused tool{} {} ({}, {})",
                if unused.len() > 1 { "s" } else { "" },
                unused.join(", "),
                relative_change(est.rel, ctx.reliability) + " reliability expected",
                usd_per_run(est.cost)
            ),
            est.rel,
            est.cost,
            est.evidence,
        ));
    }
    // A tool whose calls essentially never work in this organization only costs prompt tokens.
    for name in view.tool_names().filter(|n| !unused.contains(n)) {
        let Some(entry) = index.tool(name) else {
            continue;
        };
        if entry.calls < 20 || entry.ok_calls as f64 >= 0.1 * entry.calls as f64 {
            continue;
        }
        let est = ctx.estimate(
            Lever::ToolsRemove,
            ctx.prior(Lever::ToolsRemove),
            -0.04 * ctx.cost,
        );
        out.push(draft(
            RecommendationType::ToolConfiguration,
            object([("tools", view.tools_without(&[name]))]),
            format!(
                "Remove {name}: {} of its {} calls here succeeded ({})",
                pct(entry.ok_calls as f64 / entry.calls as f64),
                entry.calls,
                usd_per_run(est.cost)
            ),
            est.rel,
            est.cost,
            est.evidence,
        ));
    }

    // Per-tool timeouts at three times each tool's observed p90 latency, where that is longer.
    let mut tools = view.tools.to_vec();
    let mut changed: Vec<String> = Vec::new();
    for (i, tool) in tools.iter_mut().enumerate() {
        let name = view.tool_name(i);
        let Some(p90) = index.tool(name).and_then(|t| t.p90_ok_s) else {
            continue;
        };
        let current = tool
            .get("timeout_s")
            .and_then(Value::as_f64)
            .filter(|t| *t > 0.0)
            .unwrap_or(view.timeout_s);
        let want = (3.0 * p90).ceil().clamp(1.0, MAX_TIMEOUT_S);
        if want > current
            && let Value::Object(map) = tool
        {
            map.insert("timeout_s".to_owned(), number(want));
            changed.push(format!("{name} {}s", secs(want)));
        }
    }
    if !changed.is_empty() {
        let est = ctx.estimate(
            Lever::ToolTimeout,
            ctx.prior(Lever::ToolTimeout) * 0.8,
            0.02 * ctx.cost,
        );
        out.push(draft(
            RecommendationType::ToolConfiguration,
            object([("tools", Value::Array(tools))]),
            format!(
                "Match tool timeouts to observed latency ({}; {})",
                changed.join(", "),
                ctx.evidence_phrase(&est, S::ToolTimeout.plural_noun())
            ),
            est.rel,
            est.cost,
            est.evidence,
        ));
    }
}
