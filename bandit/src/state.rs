//! Versioned, serializable snapshots of a policy, checked on load.
//!
//! A snapshot holds the sufficient statistics (Λ, η = Λμ), the Cholesky factor and μ exactly as
//! the live policy had them, so a restored policy is bit-identical: same bank from the same
//! seed, same rankings from the same request seeds. Restoring from Λ alone would refactor and
//! drift by rounding, enough to flip near-ties. Loading never trusts the bytes: every length,
//! value and the identities Λ = LLᵀ and Λμ = η are checked, and any mismatch is an error.

use serde::{Deserialize, Serialize};

use crate::error::{BanditError, Result};
use crate::features::FeatureLayout;
use crate::linalg::Cholesky;
use crate::model::Posterior;
use crate::policy::{PolicyConfig, ThompsonPolicy};

/// The snapshot format this crate writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// Relative tolerance for the consistency checks on load. Rank-1 updates and refactoring
/// agree with Λ to ~1e-13 relative in practice; 1e-7 leaves room for long update histories and
/// still catches any edit that matters.
const CONSISTENCY_TOLERANCE: f64 = 1e-7;

/// Everything needed to restore a [`ThompsonPolicy`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyState {
    /// [`FORMAT_VERSION`] at the time of writing.
    pub format_version: u32,
    /// Block sizes of z and c.
    pub layout: FeatureLayout,
    /// Model, exploration and discounting settings.
    pub config: PolicyConfig,
    /// Λ, row-major d×d.
    pub precision: Vec<f64>,
    /// U = Lᵀ, upper triangle row by row from the diagonal: d(d+1)/2 values.
    pub cholesky_upper: Vec<f64>,
    /// η = Λμ; for the linear model the classic b = Σ w·r·x.
    pub natural_mean: Vec<f64>,
    /// μ.
    pub mean: Vec<f64>,
    /// Observations applied since the prior.
    pub observations: u64,
    /// The decay clock, in the observations' time unit (seconds).
    pub last_decay_s: Option<f64>,
    /// Seed of the bank of posterior draws; the bank is redrawn from it on load.
    pub bank_seed: u64,
}

impl PolicyState {
    /// The snapshot as JSON. Floats are written in shortest round-trip form and parsed back
    /// exactly by [`PolicyState::from_json`].
    pub fn to_json(&self) -> String {
        // Serializing plain numbers, strings and vectors cannot fail; the fallback keeps this
        // function total without a panic path.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parses a snapshot written by [`PolicyState::to_json`]. Only the syntax is checked here;
    /// [`ThompsonPolicy::from_state`] checks the contents.
    pub fn from_json(json: &str) -> Result<Self> {
        serde_json::from_str(json).map_err(|e| BanditError::CorruptState(e.to_string()))
    }
}

impl ThompsonPolicy {
    /// A snapshot of the policy. The bank is not stored: it is redrawn from `bank_seed`, so
    /// snapshot right after a refresh if rankings must be reproducible from it.
    pub fn to_state(&self) -> PolicyState {
        PolicyState {
            format_version: FORMAT_VERSION,
            layout: self.layout,
            config: self.config,
            precision: self.posterior.precision.clone(),
            cholesky_upper: self.posterior.chol.to_packed_upper(),
            natural_mean: self.posterior.eta.clone(),
            mean: self.posterior.mean.clone(),
            observations: self.observations,
            last_decay_s: self.clock_s,
            bank_seed: self.bank_seed,
        }
    }

    /// Restores a policy, checking the snapshot thoroughly; a corrupt or mismatched snapshot is
    /// a [`BanditError::CorruptState`] (or the layout/config error), never a panic.
    pub fn from_state(state: &PolicyState) -> Result<Self> {
        let corrupt = |msg: String| Err(BanditError::CorruptState(msg));
        if state.format_version != FORMAT_VERSION {
            return corrupt(format!(
                "format_version {} is not the supported {FORMAT_VERSION}",
                state.format_version
            ));
        }
        state.layout.validate()?;
        state.config.validate()?;
        let d = state.layout.dim();
        for (name, len, expected) in [
            ("precision", state.precision.len(), d * d),
            (
                "cholesky_upper",
                state.cholesky_upper.len(),
                d * (d + 1) / 2,
            ),
            ("natural_mean", state.natural_mean.len(), d),
            ("mean", state.mean.len(), d),
        ] {
            if len != expected {
                return corrupt(format!("{name} has {len} values, expected {expected}"));
            }
        }
        for (name, values) in [
            ("precision", &state.precision),
            ("cholesky_upper", &state.cholesky_upper),
            ("natural_mean", &state.natural_mean),
            ("mean", &state.mean),
        ] {
            if let Some(i) = values.iter().position(|v| !v.is_finite()) {
                return corrupt(format!("{name}[{i}] is not finite"));
            }
        }
        if let Some(t) = state.last_decay_s
            && !t.is_finite()
        {
            return corrupt("last_decay_s is not finite".into());
        }
        let p = &state.precision;
        for i in 0..d {
            if p[i * d + i] <= 0.0 {
                return corrupt(format!("precision diagonal {i} is not positive"));
            }
            for j in i + 1..d {
                if p[i * d + j] != p[j * d + i] {
                    return corrupt(format!("precision is not symmetric at ({i}, {j})"));
                }
            }
        }
        let chol = Cholesky::from_packed_upper(&state.cholesky_upper, d).ok_or_else(|| {
            BanditError::CorruptState("cholesky_upper has a non-positive diagonal".into())
        })?;
        // Λ = LLᵀ, probed with a fixed vector whose entries are distinct so no edit cancels.
        let probe: Vec<f64> = (0..d).map(|i| 1.0 + (i % 7) as f64 / 7.0).collect();
        check_identity(
            "cholesky_upper does not factor precision",
            &chol.reconstruct_times(&probe),
            p,
            &probe,
            &vec![0.0; d],
        )?;
        check_identity(
            "mean does not solve precision · mean = natural_mean",
            &state.natural_mean,
            p,
            &state.mean,
            &state.natural_mean,
        )?;
        let posterior = Posterior {
            kind: state.config.model,
            d,
            prior_precision: state.config.prior_precision,
            precision: state.precision.clone(),
            chol,
            eta: state.natural_mean.clone(),
            mean: state.mean.clone(),
        };
        Ok(Self::assemble(
            state.layout,
            state.config,
            posterior,
            state.observations,
            state.last_decay_s,
            state.bank_seed,
        ))
    }
}

/// Checks `lhs ≈ A·v` row by row, relative to Σⱼ|Aᵢⱼvⱼ| + |extraᵢ| (the size of the terms).
fn check_identity(what: &str, lhs: &[f64], a: &[f64], v: &[f64], extra: &[f64]) -> Result<()> {
    let d = v.len();
    for i in 0..d {
        let row = &a[i * d..(i + 1) * d];
        let av: f64 = row.iter().zip(v).map(|(x, y)| x * y).sum();
        let scale: f64 = row.iter().zip(v).map(|(x, y)| (x * y).abs()).sum::<f64>()
            + extra[i].abs()
            + f64::MIN_POSITIVE;
        if (lhs[i] - av).abs() > CONSISTENCY_TOLERANCE * scale {
            return Err(BanditError::CorruptState(format!("{what} (row {i})")));
        }
    }
    Ok(())
}
