//! What `bench bandit` and `bench pipeline` read from the database before their rounds: a bandit
//! world's history in a database of its own, each organization's candidate index (and
//! clustering), and the logged decisions their warm starts learn.

use std::collections::HashMap;

use sqlx::PgPool;

use super::pipeline_bench::OrgData;
use super::service::WARM_START_DECISIONS;
use super::warm_start::LoggedDecision;
use crate::candidates::CandidateIndex;
use crate::clustering::{ClusterError, ClusterModel};
use crate::domain::RecordKind;
use crate::storage::export_rows::{ExportFilter, for_each_row, warm_start_rows};
use crate::storage::record_writer::{RecordWriter, table_counts};
use crate::storage::{Database, StorageError, create_database_if_missing};
use crate::world::{World, WorldParams};

/// Outcomes in the bandit bench world's history by default (what the candidate statistics are
/// computed from).
pub const BANDIT_WORLD_OUTCOMES: u64 = 20_000;

/// Why the data could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BenchDataError {
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("the clustering model of {org}")]
    Clusters {
        org: String,
        #[source]
        source: ClusterError,
    },
    #[error("the logged decisions of {org}")]
    Logged {
        org: String,
        #[source]
        source: StorageError,
    },
}

/// The database a bandit world's history lives in, on the same server: one per world (seed and
/// shape), so a rerun finds it loaded. The default shape keeps its short historical name.
pub fn world_database_name(seed: u64, orgs: &[String], outcomes: u64) -> String {
    if orgs == WorldParams::default().orgs && outcomes == BANDIT_WORLD_OUTCOMES {
        return format!("arc_rec_bench_world_{seed}");
    }
    let shape = format!("{}|{}", orgs.join(","), outcomes);
    let digest = <sha2::Sha256 as sha2::Digest>::digest(shape.as_bytes());
    format!("arc_rec_bench_world_{seed}_{}", hex::encode(&digest[..4]))
}

/// Opens the database `name` on `database`'s server, creating it when missing, its schema up to
/// date.
pub async fn open_world_database(
    database: &Database,
    name: &str,
) -> Result<Database, StorageError> {
    let admin = database.connect_options().clone().database("postgres");
    create_database_if_missing(&admin, name).await?;
    let world_db = Database::open_with(
        database.connect_options().clone().database(name),
        String::new(),
        database.psql().to_path_buf(),
    )
    .await?;
    world_db.migrate().await?;
    Ok(world_db)
}

/// Whether the database holds a history already (any outcome).
pub async fn holds_history(database: &Database) -> Result<bool, StorageError> {
    let outcomes = table_counts(database.pool())
        .await?
        .get(&RecordKind::Outcome)
        .copied()
        .unwrap_or(0);
    Ok(outcomes != 0)
}

/// Writes the world's history, in one transaction.
pub async fn load_history(database: &Database, world: &World) -> Result<(), StorageError> {
    let mut writer = RecordWriter::begin(database.pool()).await?;
    for record in world.history() {
        writer.push(&record).await?;
    }
    writer.commit().await?;
    Ok(())
}

/// Each organization's candidate index, as serving loads it.
pub async fn candidate_indexes(
    pool: &PgPool,
    orgs: &[String],
) -> Result<HashMap<String, CandidateIndex>, StorageError> {
    let mut indexes = HashMap::new();
    for org in orgs {
        indexes.insert(org.clone(), CandidateIndex::load(pool, org).await?);
    }
    Ok(indexes)
}

/// Every decided diff of the database's log, as the bandit bench's warm start reads it: the
/// export's view (the before-version's failure groups, its configuration, the owner's segment),
/// never the world's truth.
pub async fn logged_decisions(database: &Database) -> Result<Vec<LoggedDecision>, StorageError> {
    let mut logged = Vec::new();
    for_each_row(
        database,
        &ExportFilter::default(),
        |row| -> Result<(), StorageError> {
            logged.push(LoggedDecision::of_export_row(row));
            Ok(())
        },
    )
    .await?;
    Ok(logged)
}

/// Each organization's serving data: its candidate index and stored clustering model.
pub async fn org_data(
    pool: &PgPool,
    orgs: &[String],
) -> Result<HashMap<String, OrgData>, BenchDataError> {
    let mut data = HashMap::new();
    for org in orgs {
        let index = CandidateIndex::load(pool, org).await?;
        let clusters = crate::storage::clusters::load_model(pool, org)
            .await?
            .map(ClusterModel::from_stored)
            .transpose()
            .map_err(|source| BenchDataError::Clusters {
                org: org.clone(),
                source,
            })?;
        data.insert(org.clone(), OrgData { index, clusters });
    }
    Ok(data)
}

/// The organizations' logged decisions as a learner of each reads them at start-up
/// (`recommend::service`: the newest [`WARM_START_DECISIONS`]).
pub async fn serving_logged_decisions(
    pool: &PgPool,
    orgs: &[String],
) -> Result<Vec<LoggedDecision>, BenchDataError> {
    let mut logged = Vec::new();
    for org in orgs {
        let rows = warm_start_rows(pool, org, WARM_START_DECISIONS)
            .await
            .map_err(|source| BenchDataError::Logged {
                org: org.clone(),
                source,
            })?;
        logged.extend(rows.into_iter().map(LoggedDecision::of_export_row));
    }
    Ok(logged)
}
