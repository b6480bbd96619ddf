//! `arc-rec models`: the model versions' lifecycle — list what each served and how it was
//! answered, retire a version (its candidates leave serving) or promote it back.

use clap::Subcommand;

use super::parse_org;
use crate::domain::OrgId;
use crate::recommend::service::MODEL_CANDIDATES_RELOAD_BOUND;
use crate::storage::Database;
use crate::storage::model_versions::{self, VersionStatus, VersionSummary};

/// `arc-rec models ...`.
#[derive(Debug, Subcommand)]
pub enum ModelsCommand {
    /// Every model version, newest first: status, candidates held, decisions that showed its
    /// ideas, answers, acceptance with its 95% interval, and what the exploration floor
    /// (`serve --explore-share`) did for it and gave up.
    List {
        /// Only this organization's versions.
        #[arg(long)]
        org: Option<String>,
        /// One JSON object per version instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Take a version's candidates out of serving (running servers drop them within a few
    /// seconds); its decisions and answers stay.
    Retire(VersionArgs),
    /// Serve a retired version's candidates again (those a later version took over stay with
    /// that version).
    Promote(VersionArgs),
}

/// Which version.
#[derive(Debug, clap::Args)]
pub struct VersionArgs {
    /// Organization id.
    #[arg(long)]
    pub org: String,
    /// The model version (the training run's id, `rft-…`, as `models list` shows it).
    #[arg(value_name = "VERSION")]
    pub model_version: String,
}

/// Runs the command.
pub async fn run(command: &ModelsCommand, database: &Database) -> anyhow::Result<()> {
    match command {
        ModelsCommand::List { org, json } => {
            let org = org.as_deref().map(parse_org).transpose()?;
            let versions =
                model_versions::list(database.pool(), org.as_ref().map(OrgId::as_str)).await?;
            if *json {
                for version in &versions {
                    println!("{}", serde_json::to_string(&list_json(version))?);
                }
            } else {
                print_table(&versions);
            }
        }
        ModelsCommand::Retire(args) => set(args, VersionStatus::Retired, database).await?,
        ModelsCommand::Promote(args) => set(args, VersionStatus::Live, database).await?,
    }
    Ok(())
}

async fn set(args: &VersionArgs, status: VersionStatus, database: &Database) -> anyhow::Result<()> {
    let org = parse_org(&args.org)?;
    let Some(before) =
        model_versions::set_status(database.pool(), org.as_str(), &args.model_version, status)
            .await?
    else {
        anyhow::bail!(
            "no model version {} in organization {org} (`arc-rec models list --org {org}` shows its versions)",
            args.model_version
        );
    };
    if before == status {
        println!("{}: already {}", args.model_version, status.as_str());
    } else {
        println!(
            "{}: {} (was {}); running servers reload within {} s",
            args.model_version,
            status.as_str(),
            before.as_str(),
            MODEL_CANDIDATES_RELOAD_BOUND.as_secs()
        );
    }
    Ok(())
}

fn list_json(version: &VersionSummary) -> serde_json::Value {
    let mut value = serde_json::to_value(version).unwrap_or_default();
    let (rate, interval) = match version.acceptance() {
        Some((rate, ci)) => (serde_json::json!(rate), serde_json::json!(ci)),
        None => (serde_json::Value::Null, serde_json::Value::Null),
    };
    value["acceptance"] = rate;
    value["acceptance_ci95"] = interval;
    value["floor_price"] = serde_json::to_value(version.floor.price()).unwrap_or_default();
    value
}

fn print_table(versions: &[VersionSummary]) {
    if versions.is_empty() {
        println!("no model versions (`arc-rec candidates` writes one's ideas into serving)");
        return;
    }
    println!(
        "{:<12} {:<42} {:<8} {:>10} {:>9} {:>8} {:>22} {:>11} {:>25}  created",
        "org",
        "version",
        "status",
        "candidates",
        "decisions",
        "answers",
        "acceptance [95%]",
        "floor picks",
        "floor gave up [95%]"
    );
    for v in versions {
        let acceptance = match v.acceptance() {
            Some((rate, [lo, hi])) => format!("{rate:.3} [{lo:.3}, {hi:.3}]"),
            None => "–".to_owned(),
        };
        let price = match v.floor.price() {
            Some(p) => format!(
                "{:+.3} [{:+.3}, {:+.3}]",
                p.given_up, p.given_up_ci95[0], p.given_up_ci95[1]
            ),
            None => "–".to_owned(),
        };
        println!(
            "{:<12} {:<42} {:<8} {:>10} {:>9} {:>8} {:>22} {:>11} {:>25}  {}",
            v.org_id,
            v.model_version_id,
            v.status.as_str(),
            v.candidates,
            v.decisions,
            v.answered,
            acceptance,
            format!("{}/{}", v.floor.floor_picks, v.floor.floor_decisions),
            price,
            v.created_at.format("%Y-%m-%d %H:%M")
        );
    }
    if versions.iter().any(|v| v.floor.floor_decisions > 0) {
        println!(
            "floor picks: decisions whose first item the exploration floor chose / decisions where it could; \
             floor gave up: first-item acceptance lost per such decision (the policy's own choices there \
             against the floor's picks, times the share picked)"
        );
    }
}
