//! Property tests of the bandit against simple oracles: one test binary, one module per topic.

mod discount;
mod floor;
mod helpers;
mod learning;
mod off_policy;
mod offsets;
mod ranking;
mod state;
