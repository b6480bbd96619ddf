//! Candidate recommendations for a failure context, from the Configuration→Outcome graph.
//!
//! **Statistics** ([`CandidateIndex`]): per model, per past diff pattern and per tool, loaded by
//! `storage::candidate_stats::CandidateStats::load` with a handful of SQL aggregates at start-up
//! and on a refresh timer — never per request.

mod config;
mod describe;
mod index;
mod signals;

pub use config::{ConfigView, provider_of, same_json};
pub use index::{
    CandidateIndex, Confidence, DiffAgg, Lever, MIN_SIMULATIONS, ModelEntry, OrgStats, ToolEntry,
    TypicalValues, shrink,
};
pub use signals::{CATEGORIES, FailureSignal};
