//! The synthetic Arc-Eval world: a deterministic generator of a realistic platform history, and
//! the hidden ground truth that later benchmarks score recommenders against.
//!
//! A [`World`] is drawn from [`WorldParams`] (seed, target number of outcomes, organizations,
//! embedding dimension, start date). [`World::history`] streams it as ingest records in reference
//! order; [`Environment`] draws failure contexts and answers for diffs; [`GroundTruth`] says what a
//! diff really does and whether a person accepts it. Pure and deterministic: no IO, no clock, and
//! the same parameters give a byte-identical history. See `docs/WORLD.md`.

mod catalogue;
mod failure;
mod sampling;

pub use catalogue::{
    DOMAINS, MODELS, ModelSpec, OrgProfile, ROLES, ScenarioSpec, TOOLS, ToolSpec, UserProfile,
    model_spec, providers, tool_spec,
};
pub use failure::FailureMode;
