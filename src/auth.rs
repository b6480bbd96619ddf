//! API keys and roles, HTTP-free. A key reads `arc_<key id>_<secret>`: the id (16 hex digits)
//! finds the stored row, the secret (32 random bytes, hex) is checked against its SHA-256 in
//! constant time. Secrets are never stored or logged.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::RwLock;
use std::time::{Duration, Instant};

use rand::RngCore;
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use subtle::ConstantTimeEq;

use crate::domain::OrgId;
use crate::quota::DailyQuota;
use crate::rate_limit::RateLimit;
use crate::storage::{StorageError, api_keys};

/// What a key may do.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The evaluation platform: recommendations, feedback, trajectories.
    Platform,
    /// Analysts: analytics, read only.
    Analyst,
    /// Administrators: keys and analytics.
    Admin,
}

/// An action a request performs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permission {
    Recommend,
    Feedback,
    Ingest,
    ReadAnalytics,
    ManageKeys,
}

impl Role {
    /// The database label.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Platform => "platform",
            Role::Analyst => "analyst",
            Role::Admin => "admin",
        }
    }

    fn parse(label: &str) -> Option<Self> {
        [Role::Platform, Role::Analyst, Role::Admin]
            .into_iter()
            .find(|r| r.as_str() == label)
    }

    /// Whether this role may perform `permission`.
    pub fn allows(self, permission: Permission) -> bool {
        use Permission::*;
        match self {
            Role::Platform => matches!(permission, Recommend | Feedback | Ingest),
            Role::Analyst => matches!(permission, ReadAnalytics),
            Role::Admin => matches!(permission, ReadAnalytics | ManageKeys),
        }
    }
}

/// A setting of each role's keys (`None`: none, i.e. unlimited), unless a key has its own: the
/// request rate limit ([`RoleRateLimits`]) and the daily quota ([`RoleQuotas`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PerRole<T> {
    pub platform: Option<T>,
    pub analyst: Option<T>,
    pub admin: Option<T>,
}

/// Each role's request rate limit.
pub type RoleRateLimits = PerRole<RateLimit>;
/// Each role's daily request quota.
pub type RoleQuotas = PerRole<DailyQuota>;

impl Default for RoleRateLimits {
    /// The platform sends every evaluation's recommendation and feedback requests, so its keys
    /// get room for a busy platform; analysts and admins click through dashboards and scripts.
    fn default() -> Self {
        Self {
            platform: Some(RateLimit {
                per_second: 1000.0,
                burst: 2000,
            }),
            analyst: Some(RateLimit {
                per_second: 20.0,
                burst: 40,
            }),
            admin: Some(RateLimit {
                per_second: 20.0,
                burst: 40,
            }),
        }
    }
}

impl Default for RoleQuotas {
    /// No quota: a deployment that bills or rations requests sets one per role or per key.
    fn default() -> Self {
        Self {
            platform: None,
            analyst: None,
            admin: None,
        }
    }
}

impl<T: Copy> PerRole<T> {
    /// The setting of `role`'s keys.
    pub fn of(&self, role: Role) -> Option<T> {
        match role {
            Role::Platform => self.platform,
            Role::Analyst => self.analyst,
            Role::Admin => self.admin,
        }
    }

    /// Applies one `ROLE=VALUE` or `ROLE=off` setting (`serve --rate-limit`, `--daily-quota`).
    pub fn apply(&mut self, setting: &RoleSetting<T>) {
        let slot = match setting.role {
            Role::Platform => &mut self.platform,
            Role::Analyst => &mut self.analyst,
            Role::Admin => &mut self.admin,
        };
        *slot = setting.value;
    }
}

/// A value a role's setting takes on the command line, and how it reads.
pub trait RoleSettingValue: FromStr<Err = String> {
    /// The form of the value, for errors (e.g. `RATE/BURST`).
    const FORM: &'static str;
}

impl RoleSettingValue for RateLimit {
    const FORM: &'static str = "RATE/BURST";
}

impl RoleSettingValue for DailyQuota {
    const FORM: &'static str = "REQUESTS";
}

/// One role's setting as `serve` reads it: `ROLE=VALUE` or `ROLE=off`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoleSetting<T> {
    pub role: Role,
    pub value: Option<T>,
}

/// `serve --rate-limit ROLE=RATE/BURST|off`.
pub type RoleRateLimit = RoleSetting<RateLimit>;
/// `serve --daily-quota ROLE=REQUESTS|off`.
pub type RoleQuota = RoleSetting<DailyQuota>;

impl<T: RoleSettingValue> FromStr for RoleSetting<T> {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let (role, value) = text
            .split_once('=')
            .ok_or_else(|| format!("{text:?}: expected ROLE={} or ROLE=off", T::FORM))?;
        let role = Role::parse(role.trim()).ok_or_else(|| {
            format!("{text:?}: unknown role {role:?} (platform, analyst or admin)")
        })?;
        let value = match value.trim() {
            "off" => None,
            value => Some(value.parse()?),
        };
        Ok(Self { role, value })
    }
}

/// A key's own limits, set when it is created (`arc-rec keys create`); `None`: its role's.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct KeyLimits {
    pub rate_limit: Option<RateLimit>,
    pub daily_quota: Option<DailyQuota>,
}

/// Who a request is, once its key checked out.
#[derive(Debug, Clone, PartialEq)]
pub struct Principal {
    pub org: OrgId,
    pub role: Role,
    pub key_id: String,
    /// The key's own rate limit, where `arc-rec keys` set one (else its role's applies).
    pub rate_limit: Option<RateLimit>,
    /// The key's own daily quota, where `arc-rec keys` set one (else its role's applies).
    pub daily_quota: Option<DailyQuota>,
}

/// A freshly created key; `token` is shown once and never again.
#[derive(Debug, Clone)]
pub struct NewKey {
    pub key_id: String,
    pub token: String,
}

/// Why a token was not accepted. Deliberately uninformative towards clients.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("malformed API key")]
    Malformed,
    #[error("unknown or revoked API key")]
    Unknown,
    #[error(transparent)]
    Storage(#[from] StorageError),
}

fn sha256_hex(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// Creates and stores a key for `org` with `role`.
pub async fn create_key(
    pool: &PgPool,
    org: &OrgId,
    role: Role,
    label: Option<&str>,
    limits: KeyLimits,
) -> Result<NewKey, StorageError> {
    let mut rng = rand::rng();
    let mut id = [0u8; 8];
    let mut secret = [0u8; 32];
    rng.fill_bytes(&mut id);
    rng.fill_bytes(&mut secret);
    let key_id = hex::encode(id);
    let secret = hex::encode(secret);
    api_keys::insert(
        pool,
        org.as_str(),
        &key_id,
        &sha256_hex(&secret),
        role.as_str(),
        label,
        api_keys::StoredLimits {
            rate_limit: limits.rate_limit.map(stored_rate_limit),
            daily_quota: limits.daily_quota.map(stored_daily_quota),
        },
    )
    .await?;
    Ok(NewKey {
        token: format!("arc_{key_id}_{secret}"),
        key_id,
    })
}

/// A rate limit as `api_keys` stores it (the burst saturating at the column's range).
pub fn stored_rate_limit(limit: RateLimit) -> (f64, i32) {
    (
        limit.per_second,
        i32::try_from(limit.burst).unwrap_or(i32::MAX),
    )
}

/// A daily quota as `api_keys` stores it (saturating at the column's range).
pub fn stored_daily_quota(quota: DailyQuota) -> i64 {
    i64::try_from(quota.0).unwrap_or(i64::MAX)
}

/// A key's own daily quota from its `api_keys` column: `None` when it has none (or, against the
/// table's check, an invalid one: the role's applies).
pub fn daily_quota_of_stored(daily_quota: Option<i64>) -> Option<DailyQuota> {
    DailyQuota::new(u64::try_from(daily_quota?).ok()?).ok()
}

/// A key's own rate limit from its `api_keys` columns: `None` when it has none. The table's
/// checks keep a stored limit valid; one that is not anyway counts as none (the role's applies),
/// not a reason to lock the key out.
pub fn rate_limit_of_stored(rate_per_second: Option<f64>, burst: Option<i32>) -> Option<RateLimit> {
    let burst = u32::try_from(burst?).ok()?;
    RateLimit::new(rate_per_second?, burst).ok()
}

/// Splits a token into (key id, secret).
fn parse_token(token: &str) -> Result<(&str, &str), AuthError> {
    let rest = token.strip_prefix("arc_").ok_or(AuthError::Malformed)?;
    let (id, secret) = rest.split_once('_').ok_or(AuthError::Malformed)?;
    let hex = |s: &str, len| s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit());
    if !hex(id, 16) || !hex(secret, 64) {
        return Err(AuthError::Malformed);
    }
    Ok((id, secret))
}

/// Checks tokens against the database, remembering verified keys for a short while so a busy
/// service does not query Postgres on every request. A revoked key stops working within
/// [`KeyCache::TTL`].
#[derive(Debug)]
pub struct KeyCache {
    entries: RwLock<HashMap<String, (Instant, api_keys::StoredKey)>>,
    ttl: Duration,
}

impl Default for KeyCache {
    fn default() -> Self {
        Self::with_ttl(Self::TTL)
    }
}

impl KeyCache {
    /// How long a verified key is trusted without asking the database again (the bound on a
    /// revocation or a changed rate limit reaching a running server).
    pub const TTL: Duration = Duration::from_secs(30);

    /// A cache that trusts a verified key for `ttl` (tests shorten it).
    pub fn with_ttl(ttl: Duration) -> Self {
        Self {
            entries: RwLock::new(HashMap::new()),
            ttl,
        }
    }

    /// Authenticates `token`.
    pub async fn authenticate(&self, pool: &PgPool, token: &str) -> Result<Principal, AuthError> {
        let (key_id, secret) = parse_token(token)?;
        let cached = self.entries.read().ok().and_then(|map| {
            map.get(key_id)
                .filter(|(at, _)| at.elapsed() < self.ttl)
                .map(|(_, k)| k.clone())
        });
        let stored = match cached {
            Some(stored) => stored,
            None => {
                let stored = api_keys::find_active(pool, key_id)
                    .await?
                    .ok_or(AuthError::Unknown)?;
                if let Ok(mut map) = self.entries.write() {
                    map.insert(key_id.to_owned(), (Instant::now(), stored.clone()));
                }
                stored
            }
        };
        let presented = sha256_hex(secret);
        if !bool::from(presented.as_bytes().ct_eq(stored.secret_hash.as_bytes())) {
            return Err(AuthError::Unknown);
        }
        let role = Role::parse(&stored.role).ok_or(AuthError::Unknown)?;
        let org = OrgId::parse(&stored.org_id).map_err(|_| AuthError::Unknown)?;
        Ok(Principal {
            org,
            role,
            rate_limit: rate_limit_of_stored(stored.rate_per_second, stored.burst),
            daily_quota: daily_quota_of_stored(stored.daily_quota),
            key_id: stored.key_id,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_rate_limits_parse_and_apply() {
        let setting: RoleRateLimit = "analyst=off".parse().unwrap();
        assert_eq!(setting.value, None);
        let error = "robot=5/5".parse::<RoleRateLimit>().unwrap_err();
        assert!(error.contains("unknown role"), "{error}");
        let mut limits = RoleRateLimits::default();
        limits.apply(&"platform=3/4".parse().unwrap());
        assert_eq!(
            limits.of(Role::Platform),
            Some(RateLimit::new(3.0, 4).unwrap())
        );
        limits.apply(&setting);
        assert_eq!(limits.of(Role::Analyst), None);
        let mut quotas = RoleQuotas::default();
        assert_eq!(quotas.of(Role::Platform), None);
        quotas.apply(&"platform=5000".parse().unwrap());
        assert_eq!(quotas.of(Role::Platform), Some(DailyQuota(5000)));
        let error = "admin=0".parse::<RoleQuota>().unwrap_err();
        assert!(error.contains("at least 1"), "{error}");
        let error = "admin".parse::<RoleQuota>().unwrap_err();
        assert!(error.contains("ROLE=REQUESTS"), "{error}");
    }

    #[test]
    fn roles_grant_what_the_issue_says() {
        assert!(Role::Platform.allows(Permission::Recommend));
        assert!(Role::Platform.allows(Permission::Ingest));
        assert!(!Role::Platform.allows(Permission::ManageKeys));
        assert!(Role::Analyst.allows(Permission::ReadAnalytics));
        for write in [
            Permission::Recommend,
            Permission::Feedback,
            Permission::Ingest,
            Permission::ManageKeys,
        ] {
            assert!(!Role::Analyst.allows(write), "{write:?}");
        }
        assert!(Role::Admin.allows(Permission::ManageKeys));
    }

    #[test]
    fn token_shape_is_checked() {
        let good = format!("arc_{}_{}", "a".repeat(16), "b".repeat(64));
        assert!(parse_token(&good).is_ok());
        for bad in [
            "",
            "arc_",
            "arc_abc_def",
            &good.replace("arc_", "key_"),
            &format!("arc_{}_{}", "g".repeat(16), "b".repeat(64)),
        ] {
            assert!(
                matches!(parse_token(bad), Err(AuthError::Malformed)),
                "{bad}"
            );
        }
    }
}
