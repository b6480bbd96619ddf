//! What candidate generation is asked: the failure context and the current configuration, and
//! what it reads from them (failure signals, failing and requested tools, category weights).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::config::ConfigView;
use super::signals::{CATEGORY_SLOTS, FailureSignal, category_of, category_slot};
use crate::domain::Candidate;

/// One failure of the context, as the platform reports it (`failure_context.failures[]`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailureObservation {
    /// `timeout`, `tool_error`, `model_error`, `validation_error`, `system_error`, `sandbox_error`.
    #[serde(default)]
    pub failure_category: Option<String>,
    #[serde(default)]
    pub error_message: Option<String>,
    /// The tool involved, when there is one (for unknown-tool errors: the name the model called).
    #[serde(default)]
    pub tool_name: Option<String>,
    /// `outcomes.error_code` (`429`, `TOOL_TIMEOUT`, ...), when known.
    #[serde(default)]
    pub error_code: Option<String>,
}

/// A request for candidates. The index passed beside it is the organization's; nothing here
/// crosses organizations.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CandidateRequest {
    /// The configuration that failed (`parsed_config`).
    pub current_config: Value,
    /// Its recent failures.
    pub failures: Vec<FailureObservation>,
    /// The failure cluster's key, e.g. `tool_timeout-web_search` (a signal label, then the tool)
    /// or a bare category; read like one more failure.
    pub cluster_key: Option<String>,
    /// Candidates must not raise the expected cost per run by more than this (USD).
    pub max_cost_increase_usd_per_run: Option<f64>,
    /// The configuration's measured reliability, when the caller knows it (else the model's).
    pub current_reliability: Option<f64>,
    /// The configuration's measured cost per run, when the caller knows it (else the model's).
    pub current_cost_usd_per_run: Option<f64>,
    /// Tools the configuration's recent runs called, when the caller looked
    /// (`storage::candidate_stats::tools_called`); configured tools missing here are unused.
    pub called_tools: Option<Vec<String>>,
    /// Candidates from the recommender model, held to the same constraints and deduplicated with
    /// the heuristic ones.
    pub model_candidates: Vec<Candidate>,
}

impl CandidateRequest {
    /// A request with only the current configuration.
    pub fn new(current_config: Value) -> Self {
        Self {
            current_config,
            ..Self::default()
        }
    }
}

/// The failure context as heuristics read it.
#[derive(Debug, Clone, PartialEq)]
pub struct SignalProfile {
    /// Share of the context's failures showing each signal (sums to 1).
    pub weights: [f64; FailureSignal::COUNT],
    /// Share of failures per category slot.
    pub categories: [f64; CATEGORY_SLOTS],
    /// Each failure's signal and category slot (the cluster key counts as one failure).
    pub observations: Vec<(FailureSignal, usize)>,
    /// Configured tools that failed, most often first, with the signal they failed with.
    pub failing_tools: Vec<(String, FailureSignal)>,
    /// Tools the model called that the configuration lacks (unknown-tool errors).
    pub requested_tools: Vec<String>,
}

impl SignalProfile {
    /// Reads the request's failures and cluster key against the current configuration.
    pub fn of(request: &CandidateRequest, view: &ConfigView<'_>) -> Self {
        let mut weights = [0.0; FailureSignal::COUNT];
        let mut categories = [0.0; CATEGORY_SLOTS];
        let mut tool_counts: Vec<(String, FailureSignal, u32)> = Vec::new();
        let mut requested_tools: Vec<String> = Vec::new();
        let mut observations: Vec<(FailureSignal, usize)> = Vec::new();
        let mut note = |signal: FailureSignal, category: Option<&str>, tool: Option<&str>| {
            weights[signal.index()] += 1.0;
            let slot = category_slot(category.or_else(|| category_of(signal)));
            categories[slot] += 1.0;
            if !observations.contains(&(signal, slot)) {
                observations.push((signal, slot));
            }
            let Some(tool) = tool.map(str::trim).filter(|t| !t.is_empty()) else {
                return;
            };
            if view.has_tool(tool) {
                match tool_counts
                    .iter_mut()
                    .find(|(t, s, _)| t == tool && *s == signal)
                {
                    Some(entry) => entry.2 += 1,
                    None => tool_counts.push((tool.to_owned(), signal, 1)),
                }
            } else if signal == FailureSignal::HallucinatedTool
                && !requested_tools.iter().any(|t| t == tool)
            {
                requested_tools.push(tool.to_owned());
            }
        };
        for failure in &request.failures {
            let signal = FailureSignal::classify(
                failure.failure_category.as_deref(),
                failure.error_code.as_deref(),
                failure.error_message.as_deref(),
            );
            note(
                signal,
                failure.failure_category.as_deref(),
                failure.tool_name.as_deref(),
            );
        }
        if let Some(key) = request.cluster_key.as_deref() {
            let (label, tool) = key
                .split_once('-')
                .map_or((key, None), |(l, t)| (l, Some(t)));
            let signal = FailureSignal::from_label(label)
                .unwrap_or_else(|| FailureSignal::classify(Some(label), None, Some(label)));
            note(signal, None, tool);
        }
        let total: f64 = weights.iter().sum();
        if total > 0.0 {
            for w in &mut weights {
                *w /= total;
            }
        } else {
            weights[FailureSignal::Other.index()] = 1.0;
        }
        let total: f64 = categories.iter().sum();
        if total > 0.0 {
            for w in &mut categories {
                *w /= total;
            }
        } else {
            categories[CATEGORY_SLOTS - 1] = 1.0;
        }
        tool_counts.sort_by_key(|t| std::cmp::Reverse(t.2));
        Self {
            weights,
            categories,
            observations,
            failing_tools: tool_counts.into_iter().map(|(t, s, _)| (t, s)).collect(),
            requested_tools,
        }
    }

    /// Weight of one signal.
    pub fn weight(&self, signal: FailureSignal) -> f64 {
        self.weights[signal.index()]
    }

    /// Summed weight of several signals.
    pub fn weight_of(&self, signals: &[FailureSignal]) -> f64 {
        signals.iter().map(|s| self.weight(*s)).sum()
    }

    /// The heaviest signal (first in signal order on ties).
    pub fn dominant(&self) -> FailureSignal {
        let mut best = FailureSignal::Other;
        let mut top = 0.0;
        for signal in FailureSignal::ALL {
            if self.weight(signal) > top {
                top = self.weight(signal);
                best = signal;
            }
        }
        best
    }

    /// The heaviest of the given signals, if any has weight.
    pub fn dominant_of(&self, signals: &[FailureSignal]) -> Option<FailureSignal> {
        signals
            .iter()
            .copied()
            .filter(|s| self.weight(*s) > 0.0)
            .max_by(|a, b| self.weight(*a).total_cmp(&self.weight(*b)))
    }

    /// The configured tool failing most often with one of these signals.
    pub fn failing_tool(&self, signals: &[FailureSignal]) -> Option<&str> {
        self.failing_tools
            .iter()
            .find(|(_, s)| signals.contains(s))
            .map(|(t, _)| t.as_str())
    }
}

impl From<&crate::world::ObservedFailure> for FailureObservation {
    fn from(failure: &crate::world::ObservedFailure) -> Self {
        Self {
            failure_category: Some(failure.failure_category.clone()),
            error_message: Some(failure.error_message.clone()),
            tool_name: failure.tool_name.clone(),
            error_code: None,
        }
    }
}
