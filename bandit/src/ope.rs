//! Off-policy evaluation: IPS, SNIPS, effective sample size and percentile-bootstrap intervals.
//!
//! Each record is one logged action (for rankings: one (decision, position) pair) with its
//! reward r, the logging policy's propensity p of that action, and the target policy's
//! probability π of the same action. With importance weights wᵢ = πᵢ/pᵢ:
//!
//! - IPS: V̂ = (1/n) Σ wᵢ rᵢ — unbiased when p > 0 wherever π > 0, high variance.
//! - SNIPS: V̂ = Σ wᵢ rᵢ / Σ wᵢ — slightly biased, far lower variance, stays within the
//!   reward range.
//! - ESS = (Σ wᵢ)² / Σ wᵢ² — how many on-policy samples the weighted log is worth; a small
//!   ESS means the estimate leans on a few records.
//! - Percentile bootstrap: resample n records with replacement B times (seeded ChaCha8),
//!   recompute the estimator, and report the (α/2, 1−α/2) quantiles.
//!
//! Per-position records of one decision are correlated; resampling them independently gives
//! somewhat narrow intervals. For per-position IIPS of a k-slot ranking, pass one record per
//! shown position: IPS over them is the per-slot average (multiply by k for the list total).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::error::{BanditError, Result};

/// One logged action.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LoggedRecord {
    /// The observed reward (e.g. 1 accepted, 0 rejected).
    pub reward: f64,
    /// The logging policy's probability of the logged action, in (0, 1].
    pub logging_propensity: f64,
    /// The target policy's probability of the same action, in [0, 1].
    pub target_probability: f64,
}

/// Which estimator a bootstrap interval is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Estimator {
    /// Inverse propensity scoring.
    Ips,
    /// Self-normalized IPS.
    Snips,
}

/// Bootstrap settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BootstrapConfig {
    /// B, the number of resamples (at least 1).
    pub resamples: usize,
    /// Coverage of the interval, in (0, 1); 0.95 by default.
    pub level: f64,
    /// Seed of the resampling generator, so an interval is reproducible.
    pub seed: u64,
}

impl Default for BootstrapConfig {
    fn default() -> Self {
        Self {
            resamples: 1000,
            level: 0.95,
            seed: 0,
        }
    }
}

/// A point estimate with its percentile-bootstrap interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ConfidenceInterval {
    /// The estimator on the full log.
    pub estimate: f64,
    /// Lower percentile bound.
    pub lower: f64,
    /// Upper percentile bound.
    pub upper: f64,
    /// Coverage requested.
    pub level: f64,
    /// Resamples that produced a value (SNIPS is undefined on a resample whose weights are all
    /// zero; such resamples are skipped).
    pub resamples_used: usize,
}

/// All estimates for one target policy.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OpeReport {
    /// Number of records.
    pub n: usize,
    /// IPS with its interval.
    pub ips: ConfidenceInterval,
    /// SNIPS with its interval.
    pub snips: ConfidenceInterval,
    /// Effective sample size (Σw)²/Σw².
    pub effective_sample_size: f64,
}

/// wᵢ = πᵢ/pᵢ, after checking every record (the error names the record and field).
pub fn importance_weights(log: &[LoggedRecord]) -> Result<Vec<f64>> {
    if log.is_empty() {
        return Err(BanditError::EmptyLog);
    }
    log.iter()
        .enumerate()
        .map(|(index, r)| {
            let bad = |field, reason: &str| BanditError::InvalidRecord {
                index,
                field,
                reason: reason.to_owned(),
            };
            if !r.reward.is_finite() {
                return Err(bad("reward", "is not finite"));
            }
            if !(r.logging_propensity > 0.0 && r.logging_propensity <= 1.0) {
                return Err(bad("logging_propensity", "must lie in (0, 1]"));
            }
            if !(0.0..=1.0).contains(&r.target_probability) {
                return Err(bad("target_probability", "must lie in [0, 1]"));
            }
            Ok(r.target_probability / r.logging_propensity)
        })
        .collect()
}

/// IPS: (1/n) Σ wᵢ rᵢ.
pub fn ips(log: &[LoggedRecord]) -> Result<f64> {
    let w = importance_weights(log)?;
    Ok(ips_of(log, &w, (0..log.len()).map(|i| (i, 1))).unwrap_or(f64::NAN))
}

/// SNIPS: Σ wᵢ rᵢ / Σ wᵢ; [`BanditError::ZeroWeight`] when Σ wᵢ = 0.
pub fn snips(log: &[LoggedRecord]) -> Result<f64> {
    let w = importance_weights(log)?;
    snips_of(log, &w, (0..log.len()).map(|i| (i, 1))).ok_or(BanditError::ZeroWeight)
}

/// Effective sample size (Σ wᵢ)² / Σ wᵢ²; 0 when every weight is 0.
pub fn effective_sample_size(log: &[LoggedRecord]) -> Result<f64> {
    let w = importance_weights(log)?;
    let sum: f64 = w.iter().sum();
    let sum_sq: f64 = w.iter().map(|w| w * w).sum();
    Ok(if sum_sq > 0.0 {
        sum * sum / sum_sq
    } else {
        0.0
    })
}

/// The estimator on the full log with a percentile-bootstrap interval.
pub fn bootstrap(
    log: &[LoggedRecord],
    estimator: Estimator,
    config: &BootstrapConfig,
) -> Result<ConfidenceInterval> {
    let [interval] = bootstrap_all(log, [estimator], config)?;
    Ok(interval)
}

/// Several estimators from one pass of resampling: each gets exactly the interval
/// [`bootstrap`] would give it alone (the resamples are drawn from the same seed), at the cost
/// of one.
pub fn bootstrap_all<const N: usize>(
    log: &[LoggedRecord],
    estimators: [Estimator; N],
    config: &BootstrapConfig,
) -> Result<[ConfidenceInterval; N]> {
    if config.resamples == 0 {
        return Err(BanditError::Invalid {
            field: "resamples",
            reason: "must be at least 1".into(),
        });
    }
    if !(config.level > 0.0 && config.level < 1.0) {
        return Err(BanditError::Invalid {
            field: "level",
            reason: "must lie in (0, 1)".into(),
        });
    }
    let w = importance_weights(log)?;
    let n = log.len();
    let of = |estimator: Estimator, records: &mut dyn Iterator<Item = (usize, u32)>| match estimator
    {
        Estimator::Ips => ips_of(log, &w, records),
        Estimator::Snips => snips_of(log, &w, records),
    };
    let mut estimates = [0.0; N];
    for (slot, &estimator) in estimates.iter_mut().zip(&estimators) {
        *slot = of(estimator, &mut (0..n).map(|i| (i, 1))).ok_or(BanditError::ZeroWeight)?;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(config.seed);
    let mut counts = vec![0u32; n];
    let mut values: [Vec<f64>; N] = std::array::from_fn(|_| Vec::with_capacity(config.resamples));
    for _ in 0..config.resamples {
        // Multiplicities instead of an index list: the estimators are sums, so this is the same
        // resample with one pass over the log.
        counts.fill(0);
        for _ in 0..n {
            counts[rng.random_range(0..n)] += 1;
        }
        for (sample, &estimator) in values.iter_mut().zip(&estimators) {
            let mut resample = counts
                .iter()
                .enumerate()
                .filter(|(_, c)| **c > 0)
                .map(|(i, &c)| (i, c));
            sample.extend(of(estimator, &mut resample));
        }
    }
    let alpha = 1.0 - config.level;
    let mut intervals = Vec::with_capacity(N);
    for (mut sample, estimate) in values.into_iter().zip(estimates) {
        if sample.is_empty() {
            return Err(BanditError::ZeroWeight);
        }
        sample.sort_by(f64::total_cmp);
        intervals.push(ConfidenceInterval {
            estimate,
            lower: quantile(&sample, alpha / 2.0),
            upper: quantile(&sample, 1.0 - alpha / 2.0),
            level: config.level,
            resamples_used: sample.len(),
        });
    }
    intervals.try_into().map_err(|_| BanditError::ZeroWeight)
}

/// IPS, SNIPS and ESS with bootstrap intervals.
pub fn evaluate(log: &[LoggedRecord], config: &BootstrapConfig) -> Result<OpeReport> {
    let [ips, snips] = bootstrap_all(log, [Estimator::Ips, Estimator::Snips], config)?;
    Ok(OpeReport {
        n: log.len(),
        ips,
        snips,
        effective_sample_size: effective_sample_size(log)?,
    })
}

/// IPS over a multiset of records given as (index, multiplicity).
fn ips_of(
    log: &[LoggedRecord],
    w: &[f64],
    records: impl Iterator<Item = (usize, u32)>,
) -> Option<f64> {
    let (mut total, mut n) = (0.0, 0u64);
    for (i, c) in records {
        total += f64::from(c) * w[i] * log[i].reward;
        n += u64::from(c);
    }
    (n > 0).then(|| total / n as f64)
}

/// SNIPS over a multiset of records; `None` when the weights sum to zero.
fn snips_of(
    log: &[LoggedRecord],
    w: &[f64],
    records: impl Iterator<Item = (usize, u32)>,
) -> Option<f64> {
    let (mut num, mut den) = (0.0, 0.0);
    for (i, c) in records {
        num += f64::from(c) * w[i] * log[i].reward;
        den += f64::from(c) * w[i];
    }
    (den > 0.0).then(|| num / den)
}

/// The q-quantile of sorted values, interpolating linearly between order statistics.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let pos = q * (sorted.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = (lo + 1).min(sorted.len() - 1);
    let frac = pos - lo as f64;
    sorted[lo] + frac * (sorted[hi] - sorted[lo])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(reward: f64, p: f64, pi: f64) -> LoggedRecord {
        LoggedRecord {
            reward,
            logging_propensity: p,
            target_probability: pi,
        }
    }

    #[test]
    fn hand_computed_values() {
        // w = [2, 0, 1]; rewards [1, 1, 0].
        let log = [rec(1.0, 0.5, 1.0), rec(1.0, 0.5, 0.0), rec(0.0, 1.0, 1.0)];
        assert!((ips(&log).unwrap() - 2.0 / 3.0).abs() < 1e-15);
        assert!((snips(&log).unwrap() - 2.0 / 3.0).abs() < 1e-15);
        assert!((effective_sample_size(&log).unwrap() - 9.0 / 5.0).abs() < 1e-15);
    }

    #[test]
    fn rejects_bad_logs() {
        assert_eq!(ips(&[]), Err(BanditError::EmptyLog));
        let err = ips(&[rec(1.0, 0.5, 0.5), rec(1.0, 0.0, 0.5)]).unwrap_err();
        assert!(
            matches!(
                err,
                BanditError::InvalidRecord {
                    index: 1,
                    field: "logging_propensity",
                    ..
                }
            ),
            "{err}"
        );
        assert!(snips(&[rec(1.0, f64::NAN, 0.5)]).is_err());
        assert!(snips(&[rec(f64::NAN, 0.5, 0.5)]).is_err());
        assert!(snips(&[rec(1.0, 0.5, 1.5)]).is_err());
        assert_eq!(snips(&[rec(1.0, 0.5, 0.0)]), Err(BanditError::ZeroWeight));
        let config = BootstrapConfig {
            resamples: 0,
            ..BootstrapConfig::default()
        };
        assert!(bootstrap(&[rec(1.0, 0.5, 0.5)], Estimator::Ips, &config).is_err());
    }

    #[test]
    fn bootstrap_brackets_the_estimate_and_is_reproducible() {
        let log: Vec<_> = (0..200)
            .map(|i| rec(f64::from(i % 3 == 0), 0.25 + 0.5 * f64::from(i % 2), 0.5))
            .collect();
        let config = BootstrapConfig {
            resamples: 300,
            ..BootstrapConfig::default()
        };
        let a = bootstrap(&log, Estimator::Snips, &config).unwrap();
        assert!(a.lower <= a.estimate && a.estimate <= a.upper, "{a:?}");
        assert!(a.upper - a.lower < 0.3, "{a:?}");
        assert_eq!(a, bootstrap(&log, Estimator::Snips, &config).unwrap());
        assert_eq!(quantile(&[1.0, 2.0, 3.0], 0.25), 1.5);
    }
}
