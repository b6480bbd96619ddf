//! `arc-rec keys`: create, list and revoke API keys, and set a key's own limits.

use clap::{Args, Subcommand};

use super::parse_org;
use crate::auth::{
    KeyLimits, Role, create_key, daily_quota_of_stored, rate_limit_of_stored, stored_daily_quota,
    stored_rate_limit,
};
use crate::domain::OrgId;
use crate::quota::DailyQuota;
use crate::rate_limit::RateLimit;
use crate::storage::{Database, api_keys};

/// `arc-rec keys ...`.
#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Create a key; the token is printed once and cannot be shown again.
    Create(CreateKeyArgs),
    /// List an organization's keys (ids, roles, labels; never secrets).
    List {
        /// Organization id.
        #[arg(long)]
        org: String,
    },
    /// Set or clear a key's own request rate limit (takes effect within 30 seconds on running
    /// servers; without one, the key gets its role's, `serve --rate-limit`).
    SetRateLimit {
        /// Organization id.
        #[arg(long)]
        org: String,
        /// The key id (the 16 hex digits after `arc_`).
        #[arg(long)]
        key_id: String,
        /// RATE/BURST (requests per second / at once), e.g. 50/100, or `default` for the
        /// role's limit.
        #[arg(long, value_parser = parse_key_rate_limit)]
        rate_limit: KeyRateLimit,
    },
    /// Set or clear a key's own daily request quota (takes effect within 30 seconds on running
    /// servers; without one, the key gets its role's, `serve --daily-quota`).
    SetQuota {
        /// Organization id.
        #[arg(long)]
        org: String,
        /// The key id (the 16 hex digits after `arc_`).
        #[arg(long)]
        key_id: String,
        /// Requests per UTC day, e.g. 100000, or `default` for the role's quota.
        #[arg(long, value_parser = parse_key_quota)]
        daily_quota: KeyQuota,
    },
    /// Revoke a key (takes effect within 30 seconds on running servers).
    Revoke {
        /// Organization id.
        #[arg(long)]
        org: String,
        /// The key id (the 16 hex digits after `arc_`).
        #[arg(long)]
        key_id: String,
    },
}

/// Arguments of `arc-rec keys create`.
#[derive(Debug, Args)]
pub struct CreateKeyArgs {
    /// Organization id the key acts for.
    #[arg(long)]
    pub org: String,
    /// What the key may do.
    #[arg(long, value_enum)]
    pub role: Role,
    /// A note for humans (who holds it).
    #[arg(long)]
    pub label: Option<String>,
    /// The key's own request rate limit, RATE/BURST (requests per second / at once), e.g.
    /// 50/100, instead of its role's (`serve --rate-limit`).
    #[arg(long)]
    pub rate_limit: Option<RateLimit>,
    /// The key's own daily request quota (requests per UTC day), instead of its role's
    /// (`serve --daily-quota`).
    #[arg(long)]
    pub daily_quota: Option<DailyQuota>,
}

/// `keys set-rate-limit --rate-limit`: a key's own limit, or back to its role's.
#[derive(Debug, Clone, Copy)]
pub enum KeyRateLimit {
    Own(RateLimit),
    RoleDefault,
}

fn parse_key_rate_limit(text: &str) -> Result<KeyRateLimit, String> {
    if text.trim() == "default" {
        Ok(KeyRateLimit::RoleDefault)
    } else {
        text.parse().map(KeyRateLimit::Own)
    }
}

/// `keys set-quota --daily-quota`: a key's own quota, or back to its role's.
#[derive(Debug, Clone, Copy)]
pub enum KeyQuota {
    Own(DailyQuota),
    RoleDefault,
}

fn parse_key_quota(text: &str) -> Result<KeyQuota, String> {
    if text.trim() == "default" {
        Ok(KeyQuota::RoleDefault)
    } else {
        text.parse().map(KeyQuota::Own)
    }
}

/// Runs the command.
pub async fn run(command: &KeysCommand, database: &Database) -> anyhow::Result<()> {
    match command {
        KeysCommand::Create(args) => create(args, database).await?,
        KeysCommand::List { org } => list(&parse_org(org)?, database).await?,
        KeysCommand::SetRateLimit {
            org,
            key_id,
            rate_limit,
        } => {
            let org = parse_org(org)?;
            let stored = match rate_limit {
                KeyRateLimit::Own(limit) => Some(stored_rate_limit(*limit)),
                KeyRateLimit::RoleDefault => None,
            };
            if !api_keys::set_rate_limit(database.pool(), org.as_str(), key_id, stored).await? {
                anyhow::bail!("no active key {key_id} in organization {org}");
            }
            match rate_limit {
                KeyRateLimit::Own(limit) => println!("{key_id}: rate limit {limit}"),
                KeyRateLimit::RoleDefault => println!("{key_id}: its role's rate limit"),
            }
        }
        KeysCommand::SetQuota {
            org,
            key_id,
            daily_quota,
        } => {
            let org = parse_org(org)?;
            let stored = match daily_quota {
                KeyQuota::Own(quota) => Some(stored_daily_quota(*quota)),
                KeyQuota::RoleDefault => None,
            };
            if !api_keys::set_daily_quota(database.pool(), org.as_str(), key_id, stored).await? {
                anyhow::bail!("no active key {key_id} in organization {org}");
            }
            match daily_quota {
                KeyQuota::Own(quota) => println!("{key_id}: daily quota {quota}"),
                KeyQuota::RoleDefault => println!("{key_id}: its role's daily quota"),
            }
        }
        KeysCommand::Revoke { org, key_id } => {
            let org = parse_org(org)?;
            if api_keys::revoke(database.pool(), org.as_str(), key_id).await? {
                println!("revoked {key_id}");
            } else {
                anyhow::bail!("no active key {key_id} in organization {org}");
            }
        }
    }
    Ok(())
}

/// Creates a key and prints its token (shown once) on stdout, the rest on stderr.
async fn create(args: &CreateKeyArgs, database: &Database) -> anyhow::Result<()> {
    let org = parse_org(&args.org)?;
    let key = create_key(
        database.pool(),
        &org,
        args.role,
        args.label.as_deref(),
        KeyLimits {
            rate_limit: args.rate_limit,
            daily_quota: args.daily_quota,
        },
    )
    .await?;
    eprintln!(
        "created {} key {} for {org}; store the token now, it is not shown again:",
        args.role.as_str(),
        key.key_id
    );
    println!("{}", key.token);
    Ok(())
}

/// Prints an organization's keys, revoked ones included.
async fn list(org: &OrgId, database: &Database) -> anyhow::Result<()> {
    println!(
        "{:<18} {:<10} {:<26} {:<8} {:<14} {:<14} {:<14} label",
        "key_id", "role", "created_at", "revoked", "rate_limit", "daily_quota", "used_today"
    );
    for key in api_keys::list(database.pool(), org.as_str()).await? {
        let created = key.created_at.format("%Y-%m-%dT%H:%M:%SZ").to_string();
        let limit = rate_limit_of_stored(key.rate_per_second, key.burst)
            .map_or_else(|| "role".to_owned(), |limit| limit.to_string());
        let quota = daily_quota_of_stored(key.daily_quota)
            .map_or_else(|| "role".to_owned(), |quota| quota.to_string());
        println!(
            "{:<18} {:<10} {created:<26} {:<8} {limit:<14} {quota:<14} {:<14} {}",
            key.key_id,
            key.role,
            key.revoked,
            key.requests_today,
            key.label.unwrap_or_default()
        );
    }
    Ok(())
}
