//! Number formatting for one-line descriptions in the platform's style:
//! "Switch to anthropic/claude-3-haiku (98.7% lower cost, 96% reliability)",
//! "Retry web_search up to 3 times (fixes 71% of similar timeouts, +$0.002/run)".

/// A share as a percentage: one decimal near the ends (98.7%, 0.4%), none in between.
pub fn pct(share: f64) -> String {
    let p = share * 100.0;
    if !p.is_finite() {
        return "?%".to_owned();
    }
    if (p.abs() >= 90.0 || p.abs() < 10.0) && (p - p.round()).abs() >= 0.05 {
        format!("{p:.1}%")
    } else {
        format!("{p:.0}%")
    }
}

/// A signed reliability change relative to a base, e.g. "+15%" or "-3%".
pub fn relative_change(delta: f64, base: f64) -> String {
    let share = delta / base.max(0.05);
    let sign = if share >= 0.0 { "+" } else { "-" };
    format!("{sign}{}", pct(share.abs()))
}

/// A signed cost per run: "+$0.002/run", "-$0.0004/run", "+$0/run".
pub fn usd_per_run(usd: f64) -> String {
    if !usd.is_finite() {
        return "cost unknown".to_owned();
    }
    let sign = if usd < 0.0 { "-" } else { "+" };
    let a = usd.abs();
    if a == 0.0 {
        "+$0/run".to_owned()
    } else if a < 0.001 {
        format!("{sign}${a:.4}/run")
    } else {
        format!("{sign}${a:.3}/run")
    }
}

/// Seconds as people write them: `5`, `2.5`.
pub fn secs(seconds: f64) -> String {
    if (seconds - seconds.round()).abs() < 1e-9 {
        format!("{}", seconds.round() as i64)
    } else {
        format!("{seconds:.1}")
    }
}

/// A temperature with at most two decimals and no trailing zeros: `0.3`, `1`, `0.25`.
pub fn temp(t: f64) -> String {
    let s = format!("{t:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_read_like_the_platform() {
        assert_eq!(pct(0.987), "98.7%");
        assert_eq!(pct(0.96), "96%");
        assert_eq!(pct(0.71), "71%");
        assert_eq!(pct(0.004), "0.4%");
        assert_eq!(usd_per_run(0.002), "+$0.002/run");
        assert_eq!(usd_per_run(-0.0004), "-$0.0004/run");
        assert_eq!(relative_change(0.12, 0.6), "+20%");
        assert_eq!(secs(15.0), "15");
        assert_eq!(temp(0.30000001), "0.3");
        assert_eq!(temp(1.0), "1");
    }
}
