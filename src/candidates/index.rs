//! The precomputed statistics candidate generation reads: per model, per past diff pattern
//! (lever × failure category, and recommendation type × failure category) and per tool, with
//! shrinkage applied once at build time so the request path only looks numbers up.
//!
//! Built by [`CandidateIndex::from_rows`] from the aggregates `storage::candidate_stats` loads
//! (`CandidateIndex::load` in `load.rs`); the service refreshes it periodically, never per request.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::config::{ConfigView, provider_of};
use super::signals::{CATEGORY_SLOTS, FailureSignal, category_slot};
use crate::domain::RecommendationType;
use crate::storage::candidate_stats::{DiffGroupRow, StatsRows};

/// Fewest distinct simulations a model needs before arc-rec proposes it (the platform's
/// `HAVING COUNT(DISTINCT simulation_id) >= 3`).
pub const MIN_SIMULATIONS: u64 = 3;
/// Prior strength, in runs, pulling a model's mean reliability toward the organization's.
const MODEL_PRIOR_RUNS: f64 = 20.0;
/// Prior strength, in runs, pulling a model's per-signal failure rate toward the organization's.
const SIGNAL_PRIOR_RUNS: f64 = 30.0;
/// Reliability of an organization with no data at all (the platform's typical failing agent).
const EMPTY_RELIABILITY: f64 = 0.6;
/// Score a fixed failure gains when nothing is known (success ≈ 0.85, failure ≈ 0.15).
const EMPTY_GAP: f64 = 0.7;

/// Which knob a diff turns; past diffs are grouped by it (`lever` of the storage query).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Lever {
    Model,
    Retry,
    TemperatureDown,
    TemperatureUp,
    Timeout,
    ToolTimeout,
    ToolsAdd,
    ToolsRemove,
    ToolsOther,
    Other,
}

impl Lever {
    /// Every lever, in index order.
    pub const ALL: [Lever; 10] = [
        Lever::Model,
        Lever::Retry,
        Lever::TemperatureDown,
        Lever::TemperatureUp,
        Lever::Timeout,
        Lever::ToolTimeout,
        Lever::ToolsAdd,
        Lever::ToolsRemove,
        Lever::ToolsOther,
        Lever::Other,
    ];

    /// The label the storage query writes.
    pub fn as_str(self) -> &'static str {
        match self {
            Lever::Model => "model",
            Lever::Retry => "retry",
            Lever::TemperatureDown => "temperature_down",
            Lever::TemperatureUp => "temperature_up",
            Lever::Timeout => "timeout",
            Lever::ToolTimeout => "tool_timeout",
            Lever::ToolsAdd => "tools_add",
            Lever::ToolsRemove => "tools_remove",
            Lever::ToolsOther => "tools_other",
            Lever::Other => "other",
        }
    }

    /// Parses a label; unknown ones are [`Lever::Other`].
    pub fn parse(label: &str) -> Self {
        Self::ALL
            .into_iter()
            .find(|l| l.as_str() == label)
            .unwrap_or(Lever::Other)
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Past diffs of one group: how often they were approved and what applying them did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct DiffAgg {
    pub proposed: u64,
    pub approved: u64,
    pub rejected: u64,
    /// Approved and re-run (before and after outcomes known).
    pub applied: u64,
    /// Applied and reliability rose.
    pub improved: u64,
    /// Sums over applied diffs, for pooling groups exactly.
    pub sum_reliability_delta: f64,
    pub sum_cost_delta_usd: f64,
    /// Approved and not harmful; their typical values are worth copying.
    pub effective: u64,
    /// Weighted sums of the groups' medians (weight = effective count), for typical values.
    pub value_sum: f64,
    pub value_weight: f64,
    pub backoff_sum: f64,
    pub backoff_weight: f64,
}

impl DiffAgg {
    /// Approved plus rejected: decisions people made.
    pub fn decided(&self) -> u64 {
        self.approved + self.rejected
    }

    /// Approved share of decided diffs, if any were decided.
    pub fn approval_rate(&self) -> Option<f64> {
        (self.decided() > 0).then(|| self.approved as f64 / self.decided() as f64)
    }

    /// Mean reliability change over applied diffs.
    pub fn mean_reliability_delta(&self) -> Option<f64> {
        (self.applied > 0).then(|| self.sum_reliability_delta / self.applied as f64)
    }

    /// Mean cost change per run over applied diffs.
    pub fn mean_cost_delta_usd(&self) -> Option<f64> {
        (self.applied > 0).then(|| self.sum_cost_delta_usd / self.applied as f64)
    }

    /// Share of applied diffs that raised reliability ("fixes 71% of similar timeouts").
    pub fn fix_rate(&self) -> Option<f64> {
        (self.applied > 0).then(|| self.improved as f64 / self.applied as f64)
    }

    /// Pools another group into this one.
    pub fn add(&mut self, other: &DiffAgg) {
        self.proposed += other.proposed;
        self.approved += other.approved;
        self.rejected += other.rejected;
        self.applied += other.applied;
        self.improved += other.improved;
        self.sum_reliability_delta += other.sum_reliability_delta;
        self.sum_cost_delta_usd += other.sum_cost_delta_usd;
        self.effective += other.effective;
        self.value_sum += other.value_sum;
        self.value_weight += other.value_weight;
        self.backoff_sum += other.backoff_sum;
        self.backoff_weight += other.backoff_weight;
    }

    fn from_row(row: &DiffGroupRow) -> Self {
        let count = |n: i64| u64::try_from(n).unwrap_or(0);
        let finite = |x: Option<f64>| x.filter(|v| v.is_finite());
        let applied = count(row.applied);
        let effective = count(row.effective) as f64;
        let (value_sum, value_weight) = match finite(row.median_value) {
            Some(v) if effective > 0.0 => (v * effective, effective),
            _ => (0.0, 0.0),
        };
        let (backoff_sum, backoff_weight) = match finite(row.median_backoff_s) {
            Some(v) if effective > 0.0 => (v * effective, effective),
            _ => (0.0, 0.0),
        };
        Self {
            proposed: count(row.proposed),
            approved: count(row.approved),
            rejected: count(row.rejected),
            applied,
            improved: count(row.improved).min(applied),
            sum_reliability_delta: finite(row.mean_reliability_delta).unwrap_or(0.0)
                * applied as f64,
            sum_cost_delta_usd: finite(row.mean_cost_delta_usd).unwrap_or(0.0) * applied as f64,
            effective: count(row.effective),
            value_sum,
            value_weight,
            backoff_sum,
            backoff_weight,
        }
    }
}

/// What the organization's data says about one model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelEntry {
    pub model: String,
    pub provider: String,
    pub runs: u64,
    pub simulations: u64,
    /// Raw mean reliability of its runs.
    pub raw_reliability: f64,
    /// Mean reliability shrunk toward the organization's mean by [`MODEL_PRIOR_RUNS`].
    pub reliability: f64,
    /// Mean cost per run (USD).
    pub cost_usd: f64,
    /// Blended price per 1k tokens, when runs report tokens and cost.
    pub usd_per_1k_tokens: Option<f64>,
    /// Share of its runs failing with each signal (shrunk toward the organization's rate).
    pub signal_failure_rate: [f64; FailureSignal::COUNT],
    /// Its runs within versions that showed each failure category: (runs, shrunk reliability).
    pub category_reliability: [Option<(u64, f64)>; CATEGORY_SLOTS],
}

impl ModelEntry {
    /// Enough distinct simulations to be proposed.
    pub fn proposable(&self) -> bool {
        self.simulations >= MIN_SIMULATIONS && !self.model.trim().is_empty()
    }

    /// The platform's confidence label for this model's evidence.
    pub fn confidence(&self) -> Confidence {
        Confidence::of_runs(self.runs)
    }
}

/// The platform's confidence labels (`recommend.py`): high at 10 runs or more, medium at 5.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Confidence {
    High,
    Medium,
    Low,
}

impl Confidence {
    /// The label for `runs` runs of evidence.
    pub fn of_runs(runs: u64) -> Self {
        match runs {
            10.. => Confidence::High,
            5..=9 => Confidence::Medium,
            _ => Confidence::Low,
        }
    }

    /// snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Confidence::High => "high",
            Confidence::Medium => "medium",
            Confidence::Low => "low",
        }
    }
}

/// One tool across the organization's runs and configurations.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolEntry {
    pub tool: String,
    pub calls: u64,
    pub ok_calls: u64,
    /// Latency of successful calls, seconds.
    pub p50_ok_s: Option<f64>,
    pub p90_ok_s: Option<f64>,
    pub versions_configured: u64,
    pub versions_called: u64,
}

impl ToolEntry {
    /// Share of the configurations carrying this tool whose runs called it.
    pub fn usage_rate(&self) -> Option<f64> {
        (self.versions_configured > 0)
            .then(|| self.versions_called as f64 / self.versions_configured as f64)
    }

    /// Whether the tool exists here: a configuration of the organization carries it, or a call
    /// of it worked. Not a name that only agents asked for (an entry with neither: calls of a
    /// tool no configuration has, all failing).
    pub fn exists(&self) -> bool {
        self.versions_configured > 0 || self.ok_calls > 0
    }

    /// Whether calls of this tool ever work here (it is a real, reachable tool).
    pub fn known_good(&self) -> bool {
        self.ok_calls >= 3
    }
}

/// A model or tool a diff brings into a configuration that the organization has never run
/// ([`CandidateIndex::unknown_name`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnknownName {
    Model(String),
    Tool(String),
}

impl std::fmt::Display for UnknownName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UnknownName::Model(name) => write!(f, "model {name:?}"),
            UnknownName::Tool(name) => write!(f, "tool {name:?}"),
        }
    }
}

/// Organization-wide figures: the priors everything else shrinks toward.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OrgStats {
    pub runs: u64,
    pub simulations: u64,
    pub mean_reliability: f64,
    pub mean_cost_usd: f64,
    /// Median blended price per 1k tokens over models (the "tier 0" price).
    pub median_usd_per_1k_tokens: Option<f64>,
    /// Mean reliability of successful runs minus that of failed ones: what a fixed failure gains.
    pub success_gap: f64,
    /// Share of all runs failing with each signal.
    pub signal_failure_rate: [f64; FailureSignal::COUNT],
}

/// Typical values of changes that worked here (medians over effective past diffs).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TypicalValues {
    pub retry_attempts: Option<f64>,
    pub retry_backoff_s: Option<f64>,
    /// New timeout over old.
    pub timeout_ratio: Option<f64>,
    pub tool_timeout_ratio: Option<f64>,
    pub temperature_down: Option<f64>,
    pub temperature_up: Option<f64>,
}

/// Everything candidate generation knows about one organization.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CandidateIndex {
    pub org: String,
    pub org_stats: OrgStats,
    /// Sorted by name.
    pub models: Vec<ModelEntry>,
    /// Past diffs by lever and failure-category slot.
    pub levers: [[DiffAgg; CATEGORY_SLOTS]; Lever::ALL.len()],
    /// Past diffs by recommendation type and failure-category slot.
    pub types: [[DiffAgg; CATEGORY_SLOTS]; RecommendationType::ALL.len()],
    pub typical: TypicalValues,
    /// Sorted by name.
    pub tools: Vec<ToolEntry>,
}

impl CandidateIndex {
    /// An index with no data: heuristics fall back to their priors.
    pub fn empty(org: &str) -> Self {
        Self::from_rows(org, &StatsRows::default())
    }

    /// Builds the index from the storage aggregates. Odd values (negative counts, NaN means) are
    /// read as absent, never trusted.
    pub fn from_rows(org: &str, rows: &StatsRows) -> Self {
        let count = |n: i64| u64::try_from(n).unwrap_or(0);
        let finite = |x: Option<f64>| x.filter(|v| v.is_finite());

        // Organization totals, run-weighted over models.
        let mut runs = 0u64;
        let mut simulations = 0u64;
        let (mut rel_sum, mut cost_sum, mut cost_runs) = (0.0, 0.0, 0u64);
        let (mut ok_sum, mut ok_w, mut fail_sum, mut fail_w) = (0.0, 0.0, 0.0, 0.0);
        for row in &rows.models {
            let n = count(row.runs);
            runs += n;
            simulations += count(row.simulations);
            if let Some(r) = finite(row.mean_reliability) {
                rel_sum += r * n as f64;
            }
            if let Some(c) = finite(row.mean_cost_usd) {
                cost_sum += c * n as f64;
                cost_runs += n;
            }
            if let Some(r) = finite(row.success_reliability) {
                ok_sum += r * n as f64;
                ok_w += n as f64;
            }
            if let Some(r) = finite(row.failure_reliability) {
                fail_sum += r * n as f64;
                fail_w += n as f64;
            }
        }
        let mean_reliability = if runs > 0 {
            (rel_sum / runs as f64).clamp(0.0, 1.0)
        } else {
            EMPTY_RELIABILITY
        };
        let mean_cost_usd = if cost_runs > 0 {
            (cost_sum / cost_runs as f64).max(0.0)
        } else {
            0.0
        };
        let success_gap = if ok_w > 0.0 && fail_w > 0.0 {
            (ok_sum / ok_w - fail_sum / fail_w).clamp(0.05, 1.0)
        } else {
            EMPTY_GAP
        };

        // Failures per model and signal.
        let mut model_signal: Vec<(&str, [u64; FailureSignal::COUNT])> = Vec::new();
        let mut org_signal = [0u64; FailureSignal::COUNT];
        for row in &rows.failures {
            let signal = FailureSignal::classify(
                row.error_category.as_deref(),
                row.error_code.as_deref(),
                None,
            );
            let n = count(row.failures);
            org_signal[signal.index()] += n;
            match model_signal.iter_mut().find(|(m, _)| *m == row.model) {
                Some((_, counts)) => counts[signal.index()] += n,
                None => {
                    let mut counts = [0u64; FailureSignal::COUNT];
                    counts[signal.index()] = n;
                    model_signal.push((&row.model, counts));
                }
            }
        }
        let org_rate = org_signal.map(|n| {
            if runs > 0 {
                n as f64 / runs as f64
            } else {
                0.0
            }
        });

        let mut prices: Vec<f64> = Vec::new();
        let mut models: Vec<ModelEntry> = rows
            .models
            .iter()
            .filter(|row| count(row.runs) > 0)
            .map(|row| {
                let n = count(row.runs);
                let raw = finite(row.mean_reliability)
                    .unwrap_or(mean_reliability)
                    .clamp(0.0, 1.0);
                let reliability = shrink(raw, n as f64, mean_reliability, MODEL_PRIOR_RUNS);
                let price = finite(row.usd_per_1k_tokens).filter(|p| *p > 0.0);
                if let Some(p) = price {
                    prices.push(p);
                }
                let signals = model_signal
                    .iter()
                    .find(|(m, _)| *m == row.model)
                    .map(|(_, c)| *c)
                    .unwrap_or_default();
                let mut signal_failure_rate = [0.0; FailureSignal::COUNT];
                for (i, rate) in signal_failure_rate.iter_mut().enumerate() {
                    let raw = (signals[i] as f64 / n as f64).min(1.0);
                    *rate = shrink(raw, n as f64, org_rate[i], SIGNAL_PRIOR_RUNS);
                }
                let mut category_reliability = [None; CATEGORY_SLOTS];
                for c in rows.categories.iter().filter(|c| c.model == row.model) {
                    let k = count(c.runs);
                    if let (true, Some(r)) = (k > 0, finite(c.mean_reliability)) {
                        let slot = category_slot(Some(&c.category));
                        category_reliability[slot] = Some((
                            k,
                            shrink(r.clamp(0.0, 1.0), k as f64, reliability, MODEL_PRIOR_RUNS),
                        ));
                    }
                }
                ModelEntry {
                    model: row.model.clone(),
                    provider: provider_of(&row.model).to_owned(),
                    runs: n,
                    simulations: count(row.simulations),
                    raw_reliability: raw,
                    reliability,
                    cost_usd: finite(row.mean_cost_usd).unwrap_or(mean_cost_usd).max(0.0),
                    usd_per_1k_tokens: price,
                    signal_failure_rate,
                    category_reliability,
                }
            })
            .collect();
        models.sort_by(|a, b| a.model.cmp(&b.model));
        models.dedup_by(|a, b| a.model == b.model);
        prices.sort_by(f64::total_cmp);
        let median_usd_per_1k_tokens = prices.get(prices.len() / 2).copied();

        let mut levers = [[DiffAgg::default(); CATEGORY_SLOTS]; Lever::ALL.len()];
        let mut types = [[DiffAgg::default(); CATEGORY_SLOTS]; RecommendationType::ALL.len()];
        for row in &rows.diffs {
            let agg = DiffAgg::from_row(row);
            let slot = category_slot(row.category.as_deref());
            levers[Lever::parse(&row.lever).index()][slot].add(&agg);
            if let Some(kind) = row
                .recommendation_type
                .as_deref()
                .and_then(RecommendationType::parse)
            {
                types[kind as usize][slot].add(&agg);
            }
        }
        let all = |lever: Lever| {
            let mut total = DiffAgg::default();
            for agg in &levers[lever.index()] {
                total.add(agg);
            }
            total
        };
        let value = |lever: Lever| {
            let t = all(lever);
            (t.value_weight > 0.0).then(|| t.value_sum / t.value_weight)
        };
        let retry = all(Lever::Retry);
        let typical = TypicalValues {
            retry_attempts: value(Lever::Retry),
            retry_backoff_s: (retry.backoff_weight > 0.0)
                .then(|| retry.backoff_sum / retry.backoff_weight),
            timeout_ratio: value(Lever::Timeout),
            tool_timeout_ratio: value(Lever::ToolTimeout),
            temperature_down: value(Lever::TemperatureDown),
            temperature_up: value(Lever::TemperatureUp),
        };

        let mut tools: Vec<ToolEntry> = rows
            .tools
            .iter()
            .filter(|t| !t.tool.trim().is_empty())
            .map(|t| {
                let seconds = |ms: Option<f64>| finite(ms).filter(|v| *v >= 0.0).map(|v| v / 1e3);
                ToolEntry {
                    tool: t.tool.clone(),
                    calls: count(t.calls),
                    ok_calls: count(t.ok_calls),
                    p50_ok_s: seconds(t.p50_ok_ms),
                    p90_ok_s: seconds(t.p90_ok_ms),
                    versions_configured: count(t.versions_configured),
                    versions_called: count(t.versions_called).min(count(t.versions_configured)),
                }
            })
            .collect();
        tools.sort_by(|a, b| a.tool.cmp(&b.tool));
        tools.dedup_by(|a, b| a.tool == b.tool);

        Self {
            org: org.to_owned(),
            org_stats: OrgStats {
                runs,
                simulations,
                mean_reliability,
                mean_cost_usd,
                median_usd_per_1k_tokens,
                success_gap,
                signal_failure_rate: org_rate,
            },
            models,
            levers,
            types,
            typical,
            tools,
        }
    }

    /// The statistics of a model, if the organization ran it.
    pub fn model(&self, name: &str) -> Option<&ModelEntry> {
        self.models
            .binary_search_by(|m| m.model.as_str().cmp(name))
            .ok()
            .map(|i| &self.models[i])
    }

    /// The statistics of a tool, if the organization's runs or configurations have it.
    pub fn tool(&self, name: &str) -> Option<&ToolEntry> {
        self.tools
            .binary_search_by(|t| t.tool.as_str().cmp(name))
            .ok()
            .map(|i| &self.tools[i])
    }

    /// The first model or tool that applying `diff` to `current_config` brings in and this
    /// organization has never run (a model without an entry here, a tool that does not
    /// [`ToolEntry::exists`]), models first; `None` when every name it brings
    /// in is known. Heuristics only propose models and tools from the organization's history; a
    /// recommender model may write any name, and an invented one ("}},", a model name as a tool)
    /// has no statistics to price it and nothing to show it exists.
    pub fn unknown_name(&self, current_config: &Value, diff: &Value) -> Option<UnknownName> {
        let before = ConfigView::of(current_config);
        let after = ConfigView::patched(current_config, diff);
        if before.model != after.model && self.model(after.model).is_none() {
            return Some(UnknownName::Model(after.model.to_owned()));
        }
        after
            .tool_names()
            .find(|name| {
                !name.is_empty()
                    && !before.has_tool(name)
                    && !self.tool(name).is_some_and(ToolEntry::exists)
            })
            .map(|name| UnknownName::Tool(name.to_owned()))
    }

    /// Past diffs pulling `lever` for versions whose dominant failure is in a category slot.
    pub fn lever_stats(&self, lever: Lever, slot: usize) -> &DiffAgg {
        &self.levers[lever.index()][slot.min(CATEGORY_SLOTS - 1)]
    }

    /// Past diffs of a recommendation type for a failure-category slot.
    pub fn type_stats(&self, kind: RecommendationType, slot: usize) -> &DiffAgg {
        &self.types[kind as usize][slot.min(CATEGORY_SLOTS - 1)]
    }

    /// Approval rate of a recommendation type over all categories, shrunk toward the overall
    /// approval rate (a prior for rankers; 0.5 with no data).
    pub fn approval_rate(&self, kind: RecommendationType) -> f64 {
        let mut overall = DiffAgg::default();
        let mut this = DiffAgg::default();
        for (k, row) in self.types.iter().enumerate() {
            for agg in row {
                overall.add(agg);
                if k == kind as usize {
                    this.add(agg);
                }
            }
        }
        let prior = overall.approval_rate().unwrap_or(0.5);
        shrink(
            this.approval_rate().unwrap_or(prior),
            this.decided() as f64,
            prior,
            10.0,
        )
    }

    /// Expected change of the cost per run of running `to` instead of `current` at `cost_usd` per
    /// run: `cost_usd × (price ratio − 1)`.
    pub fn model_switch_cost_delta(
        &self,
        current: Option<&ModelEntry>,
        cost_usd: f64,
        to: &ModelEntry,
    ) -> f64 {
        cost_usd * (self.price_ratio(current, to) - 1.0)
    }

    /// Expected change of the cost per run when `diff` is applied to `current_config`: the
    /// model switch's [`Self::model_switch_cost_delta`] at the current model's mean cost per run
    /// (the organization's when the model is unknown here); 0 when the diff keeps the model or
    /// switches to one the organization has never run (nothing to price it by).
    pub fn expected_cost_delta(&self, current_config: &Value, diff: &Value) -> f64 {
        let before = ConfigView::of(current_config);
        let after = ConfigView::patched(current_config, diff);
        if before.model == after.model {
            return 0.0;
        }
        let Some(to) = self.model(after.model) else {
            return 0.0;
        };
        let current = self.model(before.model);
        let cost = current.map_or(self.org_stats.mean_cost_usd, |m| m.cost_usd);
        self.model_switch_cost_delta(current, cost, to)
    }

    /// Price of `to` relative to `from` (1 when either is unknown): per-token prices when both
    /// models report them, else mean cost per run.
    pub fn price_ratio(&self, from: Option<&ModelEntry>, to: &ModelEntry) -> f64 {
        let Some(from) = from else {
            return match (
                self.org_stats.median_usd_per_1k_tokens,
                to.usd_per_1k_tokens,
            ) {
                (Some(median), Some(p)) => p / median,
                _ => 1.0,
            };
        };
        let ratio = match (from.usd_per_1k_tokens, to.usd_per_1k_tokens) {
            (Some(a), Some(b)) => b / a,
            _ if from.cost_usd > 0.0 => to.cost_usd / from.cost_usd,
            _ => 1.0,
        };
        if ratio.is_finite() && ratio > 0.0 {
            ratio
        } else {
            1.0
        }
    }
}

/// Bayesian-average shrinkage: `n` observations with mean `x` against a prior mean worth `k`
/// observations.
pub fn shrink(x: f64, n: f64, prior: f64, k: f64) -> f64 {
    if n + k <= 0.0 {
        return prior;
    }
    (n * x + k * prior) / (n + k)
}
