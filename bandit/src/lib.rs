//! The contextual bandit that ranks recommendations: Thompson sampling over a shared Bayesian
//! model of (context, candidate) features, Monte-Carlo propensities and off-policy estimators.
//!
//! Pure by design: no IO, no async, no SQL. Callers hand in features and a random number
//! generator and get numbers back, so everything here is testable against simple oracles.
//! So far it holds the feature layout, the Gaussian posterior (linear and logistic) and the
//! Wilson interval the acceptance analytics report with.

pub mod error;
pub mod features;
pub mod interval;
mod linalg;
pub mod model;

pub use error::{BanditError, MAX_ABS_VALUE, Result};
pub use features::{FeatureLayout, GROUP_NAMES, MAX_DIM};
pub use model::{ModelKind, Observation};
