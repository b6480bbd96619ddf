//! HTTP handlers: extract → call library code → map. No SQL here.

pub mod analytics;
pub mod health;
pub mod trajectories;
