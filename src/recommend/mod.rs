//! Serving recommendations: placing a failure context, generating candidates, ranking them with
//! the bandit, logging the decision durably, and learning from feedback. HTTP-free.

pub mod bench_data;
pub mod benchmark;
pub mod candidate_log;
pub mod decision_writer;
pub mod engine;
pub mod exposure;
pub mod features;
pub mod loop_bench;
pub mod ope;
pub mod pipeline_bench;
pub mod placement;
pub mod serve_bench;
pub mod service;
pub mod snapshot;
pub mod warm_start;
