//! The contextual bandit that ranks recommendations: Thompson sampling over a shared Bayesian
//! model of (context, candidate) features, Monte-Carlo propensities and off-policy estimators.
//!
//! Pure by design: no IO, no async, no SQL. Callers hand in features and a random number
//! generator and get numbers back, so everything here is testable against simple oracles.

pub mod error;
pub mod features;
pub mod interval;
mod linalg;
pub mod model;
pub mod policy;
pub mod state;

pub use error::{BanditError, MAX_ABS_VALUE, Result};
pub use features::{FeatureLayout, GROUP_NAMES, MAX_DIM};
pub use model::{ModelKind, Observation};
pub use policy::{Explanation, PolicyConfig, RankedItem, Ranking, ThompsonPolicy};
pub use state::{FORMAT_VERSION, PolicyState};
