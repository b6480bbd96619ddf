//! Daily request quotas per API key, HTTP-free and without IO: how many requests each key made
//! today (UTC), what is not yet written to `api_key_usage`, and whether one more fits. Which
//! quota a key gets (its own or its role's) is `auth`'s business; the flushing task and the
//! first read of a key's usage are the server's (`commands::serve`).
//!
//! Replicas share the count through the database: each server adds its own requests to the
//! stored total every second and learns the others' from the total it gets back, so behind N
//! replicas a key may go over its quota by what the other replicas admitted in the last second.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Mutex;

use chrono::{DateTime, NaiveDate, Utc};

/// Requests a key may make per UTC day (≥ 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DailyQuota(pub u64);

impl DailyQuota {
    /// The quota, checked: at least one request.
    pub fn new(requests: u64) -> Result<Self, String> {
        if requests == 0 {
            return Err("a daily quota must allow at least 1 request".to_owned());
        }
        Ok(Self(requests))
    }
}

impl fmt::Display for DailyQuota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/day", self.0)
    }
}

impl FromStr for DailyQuota {
    type Err = String;

    /// A whole number of requests per UTC day, e.g. `100000`.
    fn from_str(text: &str) -> Result<Self, String> {
        let requests: u64 = text.trim().parse().map_err(|_| {
            format!("{text:?}: expected a whole number of requests per UTC day, e.g. 100000")
        })?;
        Self::new(requests).map_err(|message| format!("{text:?}: {message}"))
    }
}

/// Seconds from `now` to the next UTC midnight, when every quota starts again (at least 1).
pub fn seconds_to_next_day(now: DateTime<Utc>) -> u64 {
    let tomorrow = now
        .date_naive()
        .succ_opt()
        .and_then(|d| d.and_hms_opt(0, 0, 0));
    tomorrow.map_or(86_400, |midnight| {
        u64::try_from((midnight.and_utc() - now).num_seconds())
            .unwrap_or(1)
            .max(1)
    })
}

/// One key's count for one day.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Usage {
    day: NaiveDate,
    /// The stored total (every replica's requests) as of this server's last read or flush.
    stored: u64,
    /// This server's requests not yet added to the stored total.
    pending: u64,
}

/// Requests this server has admitted and not yet stored: (organization, key id, day, count).
pub type PendingUsage = Vec<(String, String, NaiveDate, u64)>;

/// Today's usage of every key seen, by key id. One entry per key that made a request today.
#[derive(Debug, Default)]
pub struct QuotaLedger {
    usage: Mutex<HashMap<String, (String, Usage)>>,
}

/// What [`QuotaLedger::admit`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Admitted,
    /// Over the quota until the day ends.
    Exhausted,
    /// This server has not read the key's stored usage for `day` yet: read it,
    /// [`QuotaLedger::seed`] it, and ask again.
    Unknown,
}

impl QuotaLedger {
    /// Admits one request of `key_id` (of `org`) on `day` under `quota`, counting it; a refused
    /// request counts nothing.
    pub fn admit(&self, key_id: &str, quota: DailyQuota, day: NaiveDate) -> Admission {
        let Ok(mut usage) = self.usage.lock() else {
            // A poisoned lock: admitting is the safe side for a quota (the rate limit still
            // protects the service).
            return Admission::Admitted;
        };
        let Some((_, entry)) = usage.get_mut(key_id).filter(|(_, u)| u.day == day) else {
            return Admission::Unknown;
        };
        if entry.stored.saturating_add(entry.pending) >= quota.0 {
            return Admission::Exhausted;
        }
        entry.pending += 1;
        Admission::Admitted
    }

    /// Records `stored` as `key_id`'s stored usage on `day` as read from the database (a
    /// concurrent first read of the same key keeps the larger).
    pub fn seed(&self, org: &str, key_id: &str, day: NaiveDate, stored: u64) {
        let Ok(mut usage) = self.usage.lock() else {
            return;
        };
        match usage.get_mut(key_id) {
            Some((_, entry)) if entry.day == day => entry.stored = entry.stored.max(stored),
            // A new key, or a new day: today starts from what is stored. (Yesterday's requests
            // admitted in its last second and not yet flushed are dropped from its count; no
            // quota depends on them any more.)
            _ => {
                usage.insert(
                    key_id.to_owned(),
                    (
                        org.to_owned(),
                        Usage {
                            day,
                            stored,
                            pending: 0,
                        },
                    ),
                );
            }
        }
    }

    /// Takes the requests admitted since the last call, to add to the stored totals.
    pub fn take_pending(&self) -> PendingUsage {
        let Ok(mut usage) = self.usage.lock() else {
            return Vec::new();
        };
        usage
            .iter_mut()
            .filter(|(_, (_, u))| u.pending > 0)
            .map(|(key, (org, u))| {
                let taken = std::mem::take(&mut u.pending);
                // Counted as stored from now on; the total read back replaces it.
                u.stored += taken;
                (org.clone(), key.clone(), u.day, taken)
            })
            .collect()
    }

    /// Gives back what [`Self::take_pending`] took when it could not be stored.
    pub fn restore_pending(&self, pending: PendingUsage) {
        let Ok(mut usage) = self.usage.lock() else {
            return;
        };
        for (_, key, day, count) in pending {
            if let Some((_, u)) = usage.get_mut(&key).filter(|(_, u)| u.day == day) {
                u.stored = u.stored.saturating_sub(count);
                u.pending += count;
            }
        }
    }

    /// Records the stored totals read back after a flush (every replica's requests).
    pub fn record_stored(&self, totals: &[(String, NaiveDate, u64)]) {
        let Ok(mut usage) = self.usage.lock() else {
            return;
        };
        for (key, day, total) in totals {
            if let Some((_, u)) = usage.get_mut(key).filter(|(_, u)| u.day == *day) {
                u.stored = u.stored.max(*total);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn day(d: u32) -> NaiveDate {
        NaiveDate::from_ymd_opt(2026, 11, d).unwrap()
    }

    #[test]
    fn quotas_parse_with_errors_naming_what_is_wrong() {
        assert_eq!("250".parse::<DailyQuota>().unwrap(), DailyQuota(250));
        for bad in ["", "0", "-3", "1.5", "lots"] {
            assert!(bad.parse::<DailyQuota>().is_err(), "{bad}");
        }
    }

    #[test]
    fn retry_after_runs_to_the_next_utc_midnight() {
        let at = |text: &str| text.parse::<DateTime<Utc>>().unwrap();
        assert_eq!(seconds_to_next_day(at("2026-11-27T23:59:30Z")), 30);
        assert_eq!(seconds_to_next_day(at("2026-11-27T00:00:00Z")), 86_400);
        assert_eq!(seconds_to_next_day(at("2026-11-27T12:00:00Z")), 43_200);
    }

    #[test]
    fn a_key_is_read_once_a_day_then_counted_until_its_quota() {
        let ledger = QuotaLedger::default();
        let quota = DailyQuota(5);
        assert_eq!(ledger.admit("k", quota, day(27)), Admission::Unknown);
        ledger.seed("o", "k", day(27), 2);
        for _ in 0..3 {
            assert_eq!(ledger.admit("k", quota, day(27)), Admission::Admitted);
        }
        assert_eq!(ledger.admit("k", quota, day(27)), Admission::Exhausted);
        // A new day is read again and starts from what is stored for it.
        assert_eq!(ledger.admit("k", quota, day(28)), Admission::Unknown);
        ledger.seed("o", "k", day(28), 0);
        assert_eq!(ledger.admit("k", quota, day(28)), Admission::Admitted);
    }

    #[test]
    fn flushes_add_what_was_admitted_and_learn_the_other_replicas_requests() {
        let ledger = QuotaLedger::default();
        let quota = DailyQuota(10);
        ledger.seed("o", "k", day(27), 0);
        for _ in 0..4 {
            ledger.admit("k", quota, day(27));
        }
        let pending = ledger.take_pending();
        assert_eq!(pending, vec![("o".into(), "k".into(), day(27), 4)]);
        assert!(ledger.take_pending().is_empty(), "taken once");
        // A failed write gives it back; the next flush takes it again.
        ledger.restore_pending(pending);
        let pending = ledger.take_pending();
        assert_eq!(pending[0].3, 4);
        // Another replica admitted 5 meanwhile: the stored total says 9.
        ledger.record_stored(&[("k".into(), day(27), 9)]);
        assert_eq!(ledger.admit("k", quota, day(27)), Admission::Admitted);
        assert_eq!(ledger.admit("k", quota, day(27)), Admission::Exhausted);
    }

    proptest! {
        /// Against a plain counter: on one server (every flush succeeding, no other replica),
        /// exactly `quota` requests a day are admitted whatever the interleaving of flushes.
        #[test]
        fn one_server_admits_exactly_the_quota(
            quota in 1u64..30,
            steps in proptest::collection::vec(0u8..3, 1..200),
        ) {
            let ledger = QuotaLedger::default();
            let quota = DailyQuota(quota);
            let mut stored = 0u64;
            let mut admitted = 0u64;
            for step in steps {
                match step {
                    0 | 1 => match ledger.admit("k", quota, day(27)) {
                        Admission::Unknown => ledger.seed("o", "k", day(27), stored),
                        Admission::Admitted => admitted += 1,
                        Admission::Exhausted => prop_assert_eq!(admitted, quota.0),
                    },
                    _ => {
                        for (_, key, d, n) in ledger.take_pending() {
                            stored += n;
                            ledger.record_stored(&[(key, d, stored)]);
                        }
                    }
                }
                prop_assert!(admitted <= quota.0);
            }
        }
    }
}
