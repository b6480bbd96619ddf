//! Confidence intervals for acceptance rates.

/// The Wilson score interval for `successes` out of `trials` at normal quantile `z` (1.96 for
/// 95%). Unlike the normal approximation it stays inside [0, 1] and is sensible for rates near 0
/// or 1 and for small counts. `None` when there are no trials or `successes > trials`.
pub fn wilson(successes: u64, trials: u64, z: f64) -> Option<(f64, f64)> {
    if trials == 0 || successes > trials || !z.is_finite() || z < 0.0 {
        return None;
    }
    let n = trials as f64;
    let p = successes as f64 / n;
    let z2 = z * z;
    let denominator = 1.0 + z2 / n;
    let center = (p + z2 / (2.0 * n)) / denominator;
    let half = z * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt() / denominator;
    Some(((center - half).max(0.0), (center + half).min(1.0)))
}

/// The standard normal CDF, via the Abramowitz–Stegun 7.1.26 approximation of erf (error below
/// 1.5e-7, far under the noise of anything it feeds).
pub fn normal_cdf(x: f64) -> f64 {
    if x.is_nan() {
        return 0.5;
    }
    let z = x.abs() / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.327_591_1 * z);
    let poly = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    let erf = 1.0 - poly * (-z * z).exp();
    if x >= 0.0 {
        0.5 * (1.0 + erf)
    } else {
        0.5 * (1.0 - erf)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn matches_a_worked_example() {
        // 540 of 1200 at 95%: the textbook value is [0.4219, 0.4783].
        let (lo, hi) = wilson(540, 1200, 1.96).unwrap();
        assert!((lo - 0.4219).abs() < 5e-4, "{lo}");
        assert!((hi - 0.4783).abs() < 5e-4, "{hi}");
    }

    #[test]
    fn edge_counts() {
        assert_eq!(wilson(0, 0, 1.96), None);
        assert_eq!(wilson(3, 2, 1.96), None);
        let (lo, hi) = wilson(0, 10, 1.96).unwrap();
        assert_eq!(lo, 0.0);
        assert!(hi > 0.2 && hi < 0.35, "{hi}");
    }

    proptest! {
        #[test]
        fn interval_contains_the_rate_and_stays_in_unit_range(trials in 1u64..100_000, frac in 0.0f64..=1.0) {
            let successes = (frac * trials as f64).round() as u64;
            let (lo, hi) = wilson(successes, trials, 1.96).unwrap();
            let p = successes as f64 / trials as f64;
            prop_assert!(0.0 <= lo && lo <= p + 1e-12 && p <= hi + 1e-12 && hi <= 1.0);
        }

        #[test]
        fn more_trials_narrow_the_interval(successes in 0u64..50, extra in 1u64..50) {
            let trials = successes + extra;
            let (lo1, hi1) = wilson(successes, trials, 1.96).unwrap();
            let (lo2, hi2) = wilson(successes * 10, trials * 10, 1.96).unwrap();
            prop_assert!(hi2 - lo2 < hi1 - lo1);
        }
    }

    #[test]
    fn normal_cdf_matches_known_values() {
        assert!((normal_cdf(0.0) - 0.5).abs() < 1e-7);
        assert!((normal_cdf(1.0) - 0.841_344_7).abs() < 1e-6);
        assert!((normal_cdf(-1.96) - 0.024_997_9).abs() < 1e-6);
    }
}
