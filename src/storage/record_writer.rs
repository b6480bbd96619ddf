//! Writes ingest records: batched upserts inside one transaction, so a file lands whole or not at
//! all, and loading the same data twice changes nothing.
//!
//! Each batch is sent as one JSON array and unpacked by `jsonb_to_recordset`, which keeps the SQL
//! one statement per kind whatever the batch size. An upsert only touches a row whose content
//! changed (`IS DISTINCT FROM`), so the counts tell inserted, updated and unchanged apart.

use std::collections::{BTreeMap, HashSet};

use serde_json::{Value, json};
use sqlx::{PgPool, Postgres, Transaction};

use super::{QueryContext, StorageError};
use crate::domain::config_hash;
use crate::domain::records::{IngestRecord, RecordData, RecordKind};

/// Flush once this many rows are buffered: bounds memory (an outcome with its trajectory is a
/// few kB) while keeping round trips few.
const FLUSH_ROWS: usize = 1000;

/// How one kind maps onto its table.
struct TableSpec {
    table: &'static str,
    key: &'static str,
    /// `(column, SQL type)`, in insert order, `org_id` and the key excluded.
    columns: &'static [(&'static str, &'static str)],
}

const fn spec(kind: RecordKind) -> TableSpec {
    match kind {
        RecordKind::User => TableSpec {
            table: "users",
            key: "user_id",
            columns: &[("user_role", "text"), ("domain", "text")],
        },
        RecordKind::Configuration => TableSpec {
            table: "configurations",
            key: "config_id",
            columns: &[
                ("name", "text"),
                ("user_id", "text"),
                ("latest_version_id", "text"),
                ("is_active", "boolean"),
                ("modal_app_id", "text"),
                ("sandbox_config", "jsonb"),
                ("created_at", "timestamptz"),
            ],
        },
        RecordKind::ConfigVersion => TableSpec {
            table: "config_versions",
            key: "version_id",
            columns: &[
                ("config_id", "text"),
                ("version_number", "integer"),
                ("raw_yaml", "text"),
                ("parsed_config", "jsonb"),
                ("config_hash", "text"),
                ("generated_by", "text"),
                ("created_at", "timestamptz"),
            ],
        },
        RecordKind::Scenario => TableSpec {
            table: "scenarios",
            key: "scenario_id",
            columns: &[
                ("name", "text"),
                ("description", "text"),
                ("expected_tools", "text[]"),
                ("difficulty_level", "text"),
                ("domain", "text"),
                ("scenario_embedding", "real[]"),
            ],
        },
        RecordKind::Simulation => TableSpec {
            table: "simulations",
            key: "simulation_id",
            columns: &[
                ("config_version_id", "text"),
                ("scenario_set", "text[]"),
                ("status", "text"),
                ("overall_score", "real"),
                ("execution_time_ms", "bigint"),
                ("total_cost_usd", "float8"),
                ("metadata", "jsonb"),
                ("created_at", "timestamptz"),
            ],
        },
        RecordKind::Outcome => TableSpec {
            table: "outcomes",
            key: "outcome_id",
            columns: &[
                ("simulation_id", "text"),
                ("scenario_id", "text"),
                ("execution_time", "timestamptz"),
                ("status", "text"),
                ("reliability_score", "float8"),
                ("execution_time_ms", "bigint"),
                ("tokens_used", "bigint"),
                ("cost_usd", "float8"),
                ("trajectory", "jsonb"),
                ("trajectory_embedding", "real[]"),
                ("metrics", "jsonb"),
                ("retry_count", "integer"),
                ("error_code", "text"),
                ("error_category", "text"),
            ],
        },
        RecordKind::FailurePattern => TableSpec {
            table: "failure_patterns",
            key: "pattern_id",
            columns: &[
                ("outcome_id", "text"),
                ("execution_time", "timestamptz"),
                ("failure_type", "text"),
                ("failure_category", "text"),
                ("error_message", "text"),
                ("error_embedding", "real[]"),
                ("pattern_cluster_id", "text"),
                ("cluster_confidence", "real"),
                ("similar_failures_count", "integer"),
                ("recovery_attempted", "boolean"),
                ("recovery_successful", "boolean"),
                ("resolution_steps", "jsonb"),
                ("llm_analysis", "jsonb"),
            ],
        },
        RecordKind::ConfigDiff => TableSpec {
            table: "config_diffs",
            key: "diff_id",
            columns: &[
                ("config_id", "text"),
                ("version_before", "text"),
                ("version_after", "text"),
                ("diff_yaml", "text"),
                ("change_summary", "text"),
                ("diff", "jsonb"),
                ("recommendation_type", "text"),
                ("impact_prediction", "jsonb"),
                ("llm_generated", "boolean"),
                ("approval_status", "text"),
                ("approved_by", "text"),
                ("created_at", "timestamptz"),
            ],
        },
    }
}

/// `created_at` keeps its first value: a re-load without timestamps must not count as a change.
const INSERT_ONLY: &[&str] = &["created_at"];

impl TableSpec {
    fn upsert_sql(&self) -> String {
        let mut names = vec!["org_id", self.key];
        names.extend(self.columns.iter().map(|(c, _)| *c));
        let defs: Vec<String> = [("org_id", "text"), (self.key, "text")]
            .iter()
            .chain(self.columns.iter())
            .map(|(c, t)| format!("{c} {t}"))
            .collect();
        let selects: Vec<String> = names
            .iter()
            .map(|c| match *c {
                "created_at" => "coalesce(r.created_at, now())".to_owned(),
                "expected_tools" => "coalesce(r.expected_tools, '{}')".to_owned(),
                c => format!("r.{c}"),
            })
            .collect();
        let updatable: Vec<&str> = self
            .columns
            .iter()
            .map(|(c, _)| *c)
            .filter(|c| !INSERT_ONLY.contains(c))
            .collect();
        let sets: Vec<String> = updatable
            .iter()
            .map(|c| format!("{c} = EXCLUDED.{c}"))
            .collect();
        let old: Vec<String> = updatable.iter().map(|c| format!("t.{c}")).collect();
        let new: Vec<String> = updatable.iter().map(|c| format!("EXCLUDED.{c}")).collect();
        let conflict = if sets.is_empty() {
            "DO NOTHING".to_owned()
        } else {
            format!(
                "DO UPDATE SET {} WHERE ({}) IS DISTINCT FROM ({})",
                sets.join(", "),
                old.join(", "),
                new.join(", ")
            )
        };
        format!(
            "INSERT INTO {table} AS t ({names}) SELECT {selects} FROM jsonb_to_recordset($1) AS r({defs}) \
             ON CONFLICT (org_id, {key}) {conflict} RETURNING (xmax = 0) AS inserted",
            table = self.table,
            names = names.join(", "),
            selects = selects.join(", "),
            defs = defs.join(", "),
            key = self.key,
        )
    }
}

/// The row JSON for a record: keys are column names (see [`spec`]).
fn row_of(record: &IngestRecord) -> Value {
    let to = |v: &dyn erased::Ser| v.to_value();
    let mut row = match &record.data {
        RecordData::User(d) => to(d),
        RecordData::Configuration(d) => to(d),
        RecordData::ConfigVersion(d) => {
            let mut row = to(d);
            let hash = d
                .config_hash
                .clone()
                .unwrap_or_else(|| config_hash(&d.parsed_config));
            row["config_hash"] = Value::String(hash);
            row
        }
        RecordData::Scenario(d) => to(d),
        RecordData::Simulation(d) => to(d),
        RecordData::Outcome(d) => to(d.as_ref()),
        RecordData::FailurePattern(d) => to(d),
        RecordData::ConfigDiff(d) => to(d),
    };
    row["org_id"] = json!(record.org.as_str());
    row
}

/// Object-safe serialization so `row_of` can treat every record type alike.
mod erased {
    pub(super) trait Ser {
        fn to_value(&self) -> serde_json::Value;
    }
    impl<T: serde::Serialize> Ser for T {
        fn to_value(&self) -> serde_json::Value {
            serde_json::to_value(self).expect("ingest records serialize to JSON")
        }
    }
}

/// What one kind's writes did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct KindCounts {
    pub inserted: u64,
    pub updated: u64,
    pub unchanged: u64,
}

/// What a whole ingest did, by kind.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct WriteStats {
    pub by_kind: BTreeMap<RecordKind, KindCounts>,
}

impl WriteStats {
    /// Rows inserted or updated over all kinds.
    pub fn changed(&self) -> u64 {
        self.by_kind.values().map(|c| c.inserted + c.updated).sum()
    }
}

/// Buffers records and writes them in batches inside one transaction.
#[derive(Debug)]
pub struct RecordWriter {
    tx: Transaction<'static, Postgres>,
    buffers: BTreeMap<RecordKind, Vec<Value>>,
    buffered_rows: usize,
    orgs_written: HashSet<String>,
    stats: WriteStats,
}

impl RecordWriter {
    /// Opens the transaction the records will be written in.
    pub async fn begin(pool: &PgPool) -> Result<Self, StorageError> {
        let tx = pool.begin().await.context("begin ingest transaction")?;
        Ok(Self {
            tx,
            buffers: BTreeMap::new(),
            buffered_rows: 0,
            orgs_written: HashSet::new(),
            stats: WriteStats::default(),
        })
    }

    /// Adds a record; writes buffered batches when enough have accumulated. Records must arrive
    /// with every reference before the record that makes it.
    pub async fn push(&mut self, record: &IngestRecord) -> Result<(), StorageError> {
        if !self.orgs_written.contains(record.org.as_str()) {
            sqlx::query("INSERT INTO organizations (org_id) VALUES ($1) ON CONFLICT DO NOTHING")
                .bind(record.org.as_str())
                .execute(&mut *self.tx)
                .await
                .context("insert organization")?;
            self.orgs_written.insert(record.org.as_str().to_owned());
        }
        let row = row_of(record);
        self.buffered_rows += 1;
        self.buffers.entry(record.kind()).or_default().push(row);
        if self.buffered_rows >= FLUSH_ROWS {
            self.flush().await?;
        }
        Ok(())
    }

    /// Writes every buffer, parents before children.
    async fn flush(&mut self) -> Result<(), StorageError> {
        for kind in RecordKind::ALL {
            let Some(rows) = self.buffers.remove(&kind) else {
                continue;
            };
            let rows = dedupe_last(rows, spec(kind).key);
            let total = rows.len() as u64;
            let flags: Vec<bool> = sqlx::query_scalar(&spec(kind).upsert_sql())
                .bind(Value::Array(rows))
                .fetch_all(&mut *self.tx)
                .await
                .context("upsert ingest batch")?;
            let counts = self.stats.by_kind.entry(kind).or_default();
            let inserted = flags.iter().filter(|f| **f).count() as u64;
            counts.inserted += inserted;
            counts.updated += flags.len() as u64 - inserted;
            counts.unchanged += total - flags.len() as u64;
        }
        self.buffered_rows = 0;
        Ok(())
    }

    /// Writes what is left and commits; nothing is visible to others before this returns.
    pub async fn commit(mut self) -> Result<WriteStats, StorageError> {
        self.flush().await?;
        self.tx
            .commit()
            .await
            .context("commit ingest transaction")?;
        Ok(self.stats)
    }
}

/// An upsert may not touch one row twice, so within a batch the last line for an id wins, as it
/// would had the lines been written one by one.
fn dedupe_last(rows: Vec<Value>, key: &str) -> Vec<Value> {
    let mut seen = HashSet::new();
    let mut kept: Vec<Value> = rows
        .into_iter()
        .rev()
        .filter(|row| seen.insert((row["org_id"].to_string(), row[key].to_string())))
        .collect();
    kept.reverse();
    kept
}

/// The subset of `ids` (of `kind`, in `org`) already stored.
pub async fn existing_ids(
    pool: &PgPool,
    kind: RecordKind,
    org: &str,
    ids: &[String],
) -> Result<HashSet<String>, StorageError> {
    let spec = spec(kind);
    let sql = format!(
        "SELECT {key} FROM {table} WHERE org_id = $1 AND {key} = ANY($2)",
        key = spec.key,
        table = spec.table
    );
    let found: Vec<String> = sqlx::query_scalar(&sql)
        .bind(org)
        .bind(ids)
        .fetch_all(pool)
        .await
        .context("look up referenced records")?;
    Ok(found.into_iter().collect())
}

/// Row counts of the platform tables, for summaries and tests.
pub async fn table_counts(pool: &PgPool) -> Result<BTreeMap<RecordKind, i64>, StorageError> {
    let mut counts = BTreeMap::new();
    for kind in RecordKind::ALL {
        let sql = format!("SELECT count(*) FROM {}", spec(kind).table);
        let n: i64 = sqlx::query_scalar(&sql)
            .fetch_one(pool)
            .await
            .context("count rows")?;
        counts.insert(kind, n);
    }
    Ok(counts)
}
