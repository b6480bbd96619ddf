//! arc-rec: configuration recommendations for an LLM-agent evaluation platform.
//!
//! The library holds everything the `arc-rec` binary does, HTTP-free where it can be: domain
//! types parsed at the edge, storage (all SQL), the synthetic Arc-Eval world, ingest and export.
//! See `docs/ARCHITECTURE.md` for the map.

pub mod api;
pub mod atomic_file;
pub mod auth;
pub mod candidates;
pub mod cli;
pub mod clustering;
pub mod commands;
pub mod dashboard;
pub mod domain;
pub mod export;
pub mod http_load;
pub mod ingest;
pub mod plot;
pub mod progress;
pub mod quota;
pub mod rate_limit;
pub mod recommend;
pub mod rft;
pub mod storage;
pub mod traffic;
#[cfg(feature = "rft")]
pub mod training;
pub mod world;
