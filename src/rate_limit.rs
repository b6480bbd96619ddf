//! Per-key request rate limits, HTTP-free and without IO: a token bucket per API key (GCRA, the
//! "generic cell rate algorithm": one timestamp per key). Which limit a key gets (its role's
//! default or its own) is `auth`'s business. Each server process limits on its own, so behind a
//! load balancer over N replicas a key gets up to N times its limit; the limits protect each
//! process and the database, they are not a billing quota.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A sustained rate with a burst: at most `burst + per_second · t` requests in any window of
/// `t` seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    /// Requests per second, sustained (> 0).
    pub per_second: f64,
    /// Requests that may arrive at once (≥ 1).
    pub burst: u32,
}

impl RateLimit {
    /// The limit, checked: a finite positive rate and a burst of at least one.
    pub fn new(per_second: f64, burst: u32) -> Result<Self, String> {
        if !(per_second.is_finite() && per_second > 0.0) {
            return Err(format!(
                "the rate must be a positive number of requests per second, not {per_second}"
            ));
        }
        if burst == 0 {
            return Err("the burst must be at least 1 request".to_owned());
        }
        Ok(Self { per_second, burst })
    }
}

impl fmt::Display for RateLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.per_second, self.burst)
    }
}

impl FromStr for RateLimit {
    type Err = String;

    /// `RATE/BURST` (requests per second / requests at once), e.g. `50/100`; `RATE` alone takes
    /// a burst of twice the rate (at least 1).
    fn from_str(text: &str) -> Result<Self, String> {
        let (rate, burst) = match text.split_once('/') {
            Some((rate, burst)) => (rate, Some(burst)),
            None => (text, None),
        };
        let per_second: f64 = rate.trim().parse().map_err(|_| {
            format!("{text:?}: expected RATE/BURST, e.g. 50/100 (requests per second / at once)")
        })?;
        let burst = match burst {
            Some(burst) => burst.trim().parse().map_err(|_| {
                format!("{text:?}: the burst after '/' must be a whole number of requests")
            })?,
            // Saturating: a huge rate gets the largest burst, not a wrapped one.
            None => (2.0 * per_second).ceil().clamp(1.0, f64::from(u32::MAX)) as u32,
        };
        Self::new(per_second, burst).map_err(|message| format!("{text:?}: {message}"))
    }
}

/// The buckets of every key seen, by key id. One entry per key that made a request: bounded by
/// the number of keys, which only `arc-rec keys` creates.
#[derive(Debug, Default)]
pub struct RateLimiter {
    /// Key id → its theoretical arrival time: when the bucket will be full again.
    full_at: Mutex<HashMap<String, Instant>>,
}

impl RateLimiter {
    /// Admits one request of `key` at `now` under `limit`, or says how long to wait before one
    /// would be admitted. A refused request does not use up anything.
    pub fn admit(&self, key: &str, limit: RateLimit, now: Instant) -> Result<(), Duration> {
        let interval = 1.0 / limit.per_second;
        // How far ahead of `now` the bucket may be "owed": a full bucket holds `burst` requests.
        let tolerance = interval * f64::from(limit.burst);
        // A poisoned lock only means another request panicked mid-update of a timestamp; the
        // map is still a valid map.
        let mut full_at = self
            .full_at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let previous = full_at.get(key).copied().unwrap_or(now).max(now);
        let owed = previous.duration_since(now).as_secs_f64() + interval;
        if owed > tolerance + 1e-12 {
            return Err(Duration::from_secs_f64(owed - tolerance));
        }
        full_at.insert(key.to_owned(), now + Duration::from_secs_f64(owed));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn limits_parse_with_their_errors_naming_what_is_wrong() {
        assert_eq!(
            "50/100".parse::<RateLimit>().unwrap(),
            RateLimit {
                per_second: 50.0,
                burst: 100
            }
        );
        assert_eq!("0.5".parse::<RateLimit>().unwrap().burst, 1);
        assert_eq!("10".parse::<RateLimit>().unwrap().burst, 20);
        for bad in ["", "x/2", "5/x", "0/3", "-1/3", "5/0", "NaN/2", "inf/2"] {
            assert!(bad.parse::<RateLimit>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_burst_passes_then_requests_wait_one_interval_each_and_keys_are_independent() {
        let limiter = RateLimiter::default();
        let limit = RateLimit::new(2.0, 3).unwrap();
        let t0 = Instant::now();
        for _ in 0..3 {
            limiter.admit("a", limit, t0).unwrap();
        }
        let wait = limiter.admit("a", limit, t0).unwrap_err();
        assert!((wait.as_secs_f64() - 0.5).abs() < 1e-9, "{wait:?}");
        limiter.admit("b", limit, t0).unwrap();
        let later = t0 + Duration::from_millis(500);
        limiter.admit("a", limit, later).unwrap();
        assert!(limiter.admit("a", limit, later).is_err());
        // Idle long enough, the whole burst is back.
        let idle = t0 + Duration::from_secs(10);
        for _ in 0..3 {
            limiter.admit("a", limit, idle).unwrap();
        }
    }

    proptest! {
        /// Against the definition: in every window of t seconds at most burst + rate·t requests
        /// are admitted, and a refused request would have broken that bound for some window
        /// ending at it (the limiter refuses nothing it could have let through).
        #[test]
        fn admits_exactly_what_the_window_bound_allows(
            per_second in 0.5f64..50.0,
            burst in 1u32..20,
            gaps_ms in proptest::collection::vec(0u64..400, 1..200),
        ) {
            let limit = RateLimit::new(per_second, burst).unwrap();
            let limiter = RateLimiter::default();
            let t0 = Instant::now();
            let mut now = 0u64;
            let mut admitted: Vec<f64> = Vec::new();
            for gap in gaps_ms {
                now += gap;
                let at = now as f64 / 1000.0;
                let admitted_now = limiter
                    .admit("k", limit, t0 + Duration::from_millis(now))
                    .is_ok();
                // The oracle, a token bucket written out: admitting at `at` keeps, for every
                // earlier admitted request s, the count in [s, at] within burst + rate·(at − s).
                let fits = |slack: f64| {
                    admitted.iter().enumerate().all(|(i, &start)| {
                        let count = (admitted.len() - i + 1) as f64;
                        count <= f64::from(burst) + per_second * (at - start) + slack
                    })
                };
                if admitted_now {
                    prop_assert!(fits(1e-6), "admitted at {at} beyond the bound");
                    admitted.push(at);
                } else {
                    prop_assert!(!fits(-1e-6), "refused at {at} within the bound");
                }
            }
        }
    }
}
