//! `arc-rec keys`: create, list and revoke API keys.

use clap::{Args, Subcommand};

use crate::auth::{Role, create_key};
use crate::domain::OrgId;
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
}

fn parse_org(raw: &str) -> anyhow::Result<OrgId> {
    OrgId::parse(raw).map_err(|m| anyhow::anyhow!("--org: {m}"))
}

/// Runs the command.
pub async fn run(command: &KeysCommand, database: &Database) -> anyhow::Result<()> {
    match command {
        KeysCommand::Create(args) => {
            let org = parse_org(&args.org)?;
            let key = create_key(database.pool(), &org, args.role, args.label.as_deref()).await?;
            eprintln!(
                "created {} key {} for {org}; store the token now, it is not shown again:",
                args.role.as_str(),
                key.key_id
            );
            println!("{}", key.token);
        }
        KeysCommand::List { org } => {
            let org = parse_org(org)?;
            println!(
                "{:<18} {:<10} {:<26} {:<8} label",
                "key_id", "role", "created_at", "revoked"
            );
            for (key_id, role, label, created_at, revoked) in
                api_keys::list(database.pool(), org.as_str()).await?
            {
                let created = created_at.format("%Y-%m-%dT%H:%M:%SZ").to_string();
                println!(
                    "{key_id:<18} {role:<10} {created:<26} {revoked:<8} {}",
                    label.unwrap_or_default()
                );
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
