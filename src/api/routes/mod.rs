//! HTTP handlers: extract → call library code → map. No SQL here.

pub mod analytics;
pub mod dashboard;
pub mod feedback;
pub mod health;
pub mod recommendations;
pub mod trajectories;
