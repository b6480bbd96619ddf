//! API keys and roles, HTTP-free. A key reads `arc_<key id>_<secret>`: the id (16 hex digits)
//! finds the stored row, the secret (32 random bytes, hex) is checked against its SHA-256 in
//! constant time. Secrets are never stored or logged.

use std::collections::HashMap;
use std::sync::RwLock;
use std::time::{Duration, Instant};

use rand::RngCore;
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use subtle::ConstantTimeEq;

use crate::domain::OrgId;
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

/// Who a request is, once its key checked out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub org: OrgId,
    pub role: Role,
    pub key_id: String,
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
    )
    .await?;
    Ok(NewKey {
        token: format!("arc_{key_id}_{secret}"),
        key_id,
    })
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
#[derive(Debug, Default)]
pub struct KeyCache {
    entries: RwLock<HashMap<String, (Instant, api_keys::StoredKey)>>,
}

impl KeyCache {
    /// How long a verified key is trusted without asking the database again.
    pub const TTL: Duration = Duration::from_secs(30);

    /// Authenticates `token`.
    pub async fn authenticate(&self, pool: &PgPool, token: &str) -> Result<Principal, AuthError> {
        let (key_id, secret) = parse_token(token)?;
        let cached = self.entries.read().ok().and_then(|map| {
            map.get(key_id)
                .filter(|(at, _)| at.elapsed() < Self::TTL)
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
            key_id: stored.key_id,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
