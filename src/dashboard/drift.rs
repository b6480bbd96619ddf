//! Drift alarms: is a failure cluster's acceptance dropping? Pure arithmetic over daily counts.
//!
//! The test, as reports state it: the *recent* window is the last [`RECENT_DAYS`] days of the
//! period that end on its last day with data, the *baseline* every earlier day of the period.
//! A cluster is tested when both windows showed at least [`MIN_SHOWN`] recommendations; the
//! one-sided two-proportion z-test (pooled variance) asks whether the recent rate is below the
//! baseline's, and an alarm is raised when its p-value is below [`ALPHA`] divided by the number
//! of clusters tested (Bonferroni: over all clusters, a false alarm at most 5 % of the time).

use std::collections::BTreeMap;

use chrono::{Days, NaiveDate};

use crate::storage::analytics::{AcceptanceCount, DailyCount};

/// Days in the recent window.
pub const RECENT_DAYS: u64 = 7;
/// Fewest shown recommendations in each window for a cluster to be tested.
pub const MIN_SHOWN: i64 = 30;
/// Family-wise false-alarm rate.
pub const ALPHA: f64 = 0.05;

/// One tested cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterDrift {
    pub cluster: String,
    pub baseline: AcceptanceCount,
    pub recent: AcceptanceCount,
    /// z of (recent − baseline) under the pooled null.
    pub z: f64,
    /// One-sided p-value of a drop.
    pub p_value: f64,
    /// p below ALPHA / clusters tested.
    pub alarm: bool,
}

/// The drift test's answer for a period.
#[derive(Debug, Clone, PartialEq)]
pub struct DriftReport {
    /// First day of the recent window (`None`: no data).
    pub recent_from: Option<NaiveDate>,
    /// Clusters tested, most significant drop first.
    pub tested: Vec<ClusterDrift>,
    /// Clusters with data but too few shown in a window to test.
    pub untested: Vec<String>,
}

/// Tests every cluster of `by_day_and_cluster` (series = cluster id).
pub fn drift(by_day_and_cluster: &[DailyCount]) -> DriftReport {
    let Some(last) = by_day_and_cluster.iter().map(|c| c.day).max() else {
        return DriftReport {
            recent_from: None,
            tested: Vec::new(),
            untested: Vec::new(),
        };
    };
    let recent_from = last
        .checked_sub_days(Days::new(RECENT_DAYS - 1))
        .unwrap_or(NaiveDate::MIN);
    let mut windows: BTreeMap<&str, [(i64, i64); 2]> = BTreeMap::new();
    for c in by_day_and_cluster {
        let window = usize::from(c.day >= recent_from);
        let slot = &mut windows.entry(c.series.as_str()).or_default()[window];
        slot.0 += c.shown;
        slot.1 += c.accepted;
    }
    let count = |key: &str, (shown, accepted): (i64, i64)| AcceptanceCount {
        key: key.to_owned(),
        shown,
        accepted,
    };
    let (testable, untested): (Vec<_>, Vec<_>) = windows
        .into_iter()
        .partition(|(_, [base, recent])| base.0 >= MIN_SHOWN && recent.0 >= MIN_SHOWN);
    let threshold = ALPHA / testable.len().max(1) as f64;
    let mut tested: Vec<ClusterDrift> = testable
        .into_iter()
        .map(|(cluster, [base, recent])| {
            let z = two_proportion_z(base, recent);
            let p_value = bandit::interval::normal_cdf(z);
            ClusterDrift {
                cluster: cluster.to_owned(),
                baseline: count("baseline", base),
                recent: count("recent", recent),
                z,
                p_value,
                alarm: p_value < threshold,
            }
        })
        .collect();
    tested.sort_by(|a, b| {
        a.p_value
            .total_cmp(&b.p_value)
            .then(a.cluster.cmp(&b.cluster))
    });
    DriftReport {
        recent_from: Some(recent_from),
        tested,
        untested: untested.into_iter().map(|(c, _)| c.to_owned()).collect(),
    }
}

/// (p̂_recent − p̂_base) / sqrt(p̂(1 − p̂)(1/n_base + 1/n_recent)) with the pooled p̂; 0 when
/// the pooled rate is 0 or 1 (no variance: nothing can have dropped).
fn two_proportion_z((n1, k1): (i64, i64), (n2, k2): (i64, i64)) -> f64 {
    let (n1, k1, n2, k2) = (n1 as f64, k1 as f64, n2 as f64, k2 as f64);
    let pooled = (k1 + k2) / (n1 + n2);
    let variance = pooled * (1.0 - pooled) * (1.0 / n1 + 1.0 / n2);
    if variance <= 0.0 {
        return 0.0;
    }
    (k2 / n2 - k1 / n1) / variance.sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn day(d: u32) -> NaiveDate {
        NaiveDate::from_ymd_opt(2026, 6, d).unwrap()
    }

    fn counts(
        cluster: &str,
        days: std::ops::RangeInclusive<u32>,
        shown: i64,
        accepted: i64,
    ) -> Vec<DailyCount> {
        days.map(|d| DailyCount {
            day: day(d),
            series: cluster.to_owned(),
            shown,
            accepted,
        })
        .collect()
    }

    #[test]
    fn a_cluster_whose_acceptance_halves_raises_an_alarm_and_a_steady_one_does_not() {
        let mut log = counts("falling", 1..=14, 50, 25);
        log.extend(counts("falling", 15..=21, 50, 10));
        log.extend(counts("steady", 1..=21, 50, 25));
        log.extend(counts("rare", 1..=21, 1, 1));
        let report = drift(&log);
        assert_eq!(report.recent_from, Some(day(15)));
        assert_eq!(report.untested, vec!["rare".to_owned()]);
        let falling = &report.tested[0];
        assert_eq!(falling.cluster, "falling");
        assert_eq!(
            (falling.baseline.shown, falling.baseline.accepted),
            (700, 350)
        );
        assert_eq!((falling.recent.shown, falling.recent.accepted), (350, 70));
        assert!(falling.alarm && falling.z < -9.0, "{falling:?}");
        let steady = &report.tested[1];
        assert!(!steady.alarm && steady.z.abs() < 1e-9, "{steady:?}");
    }

    #[test]
    fn the_z_test_matches_a_hand_computation_and_the_threshold_is_bonferronis() {
        // 60/100 then 45/100: pooled 0.525, se = sqrt(0.525·0.475·0.02) = 0.070622, z = −2.1240.
        let z = two_proportion_z((100, 60), (100, 45));
        assert!((z + 2.124).abs() < 1e-3, "{z}");
        let mut log = counts("a", 1..=1, 100, 60);
        log.extend(counts("a", 8..=8, 100, 45));
        // One cluster: p = Φ(−2.124) = 0.0168 < 0.05 alarms.
        assert!(drift(&log).tested[0].alarm);
        // Four clusters: the threshold is 0.0125, and the same drop no longer alarms.
        for other in ["b", "c", "d"] {
            log.extend(counts(other, 1..=1, 100, 50));
            log.extend(counts(other, 8..=8, 100, 50));
        }
        let report = drift(&log);
        let a = report.tested.iter().find(|c| c.cluster == "a").unwrap();
        assert!(!a.alarm && (a.p_value - 0.0168).abs() < 1e-3, "{a:?}");
    }

    #[test]
    fn no_data_no_window() {
        let report = drift(&[]);
        assert_eq!(report.recent_from, None);
        assert!(report.tested.is_empty());
    }
}
