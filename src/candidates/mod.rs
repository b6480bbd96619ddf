//! Candidate recommendations for a failure context, from the Configuration→Outcome graph.
//!
//! Two halves with different budgets:
//!
//! * **Statistics** ([`CandidateIndex`]): per model, per past diff pattern and per tool, loaded by
//!   [`CandidateIndex::load`] from `storage::candidate_stats`'s handful of SQL aggregates at start-up
//!   and on a refresh timer — never per request.
//! * **Generation** ([`generate`]): pure heuristics over the index and the request, on the HTTP
//!   request path (tens of microseconds): `cheapest`, `highest_perf`, `balanced`, `model_switch`,
//!   `retry_policy`, `timeout_adjustment`, `temperature`, `tool_configuration`, each candidate a
//!   JSON merge-patch diff with a one-line description, expected reliability and cost deltas
//!   (shrunk toward priors when evidence is thin) and its evidence count. The recommender model's
//!   candidates join the same set under the same constraints ([`finalize`]).
//!
//! [`candidate_features`] and [`config_features`] turn candidates and configurations into the
//! fixed-length vectors the bandit ranks with.

mod config;
mod constraints;
mod describe;
mod features;
mod generate;
mod index;
mod load;
mod request;
mod signals;

#[cfg(test)]
mod tests;

pub use config::{ConfigView, provider_of, same_json};
pub use constraints::{finalize, usable};
pub use features::{
    CANDIDATE_FEATURE_NAMES, CANDIDATE_FEATURES, CONFIG_FEATURE_NAMES, CONFIG_FEATURES,
    candidate_features, config_features,
};
pub use generate::{CHEAPEST_MAX_PRICE_RATIO, CHEAPEST_RETENTION, MAX_CANDIDATES, generate};
pub use index::{
    CandidateIndex, Confidence, DiffAgg, Lever, MIN_SIMULATIONS, ModelEntry, OrgStats, ToolEntry,
    TypicalValues, UnknownName, shrink,
};
pub use request::{CandidateRequest, FailureObservation, SignalProfile};
pub use signals::{CATEGORIES, FailureSignal};
