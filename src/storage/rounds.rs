//! Learning rounds (`arc-rec round`): one row per round of an organization, the lock that keeps
//! two rounds of one organization from running at once, and the count of new answers a round
//! learns from.

use chrono::{DateTime, Utc};
use sqlx::{Connection, PgConnection, PgPool};

use super::{QueryContext, StorageError};

/// How a round ended (or that it has not).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RoundStatus {
    Running,
    /// Its model version's ideas went into serving.
    Served,
    /// RL did not beat its warm-up (the gate); nothing was written.
    Refused,
}

impl RoundStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RoundStatus::Running => "running",
            RoundStatus::Served => "served",
            RoundStatus::Refused => "refused",
        }
    }
}

impl TryFrom<String> for RoundStatus {
    type Error = String;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        match text.as_str() {
            "running" => Ok(RoundStatus::Running),
            "served" => Ok(RoundStatus::Served),
            "refused" => Ok(RoundStatus::Refused),
            _ => Err(format!("unknown round status {text:?}")),
        }
    }
}

/// One round as stored.
#[derive(Debug, Clone, PartialEq, serde::Serialize, sqlx::FromRow)]
pub struct Round {
    pub org_id: String,
    pub round_no: i32,
    #[sqlx(try_from = "String")]
    pub status: RoundStatus,
    pub window_since: Option<DateTime<Utc>>,
    pub window_until: DateTime<Utc>,
    /// Answers to served recommendations received in the window.
    pub new_answers: i64,
    pub dir: String,
    pub model_version_id: Option<String>,
    pub figures: serde_json::Value,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// The lock on an organization's rounds: a session-level advisory lock on a connection of its
/// own, released when [`RoundLock::release`] closes it (or the process dies and Postgres closes
/// it), so a crashed round never blocks the next.
#[derive(Debug)]
pub struct RoundLock {
    connection: PgConnection,
}

impl RoundLock {
    /// Takes the lock of `org`'s rounds, or `None` when another session holds it.
    pub async fn try_take(pool: &PgPool, org: &str) -> Result<Option<Self>, StorageError> {
        // Detached: a pooled connection would go back to the pool still holding the lock.
        let mut connection = pool
            .acquire()
            .await
            .context("connect for the round lock")?
            .detach();
        let taken: bool =
            sqlx::query_scalar("SELECT pg_try_advisory_lock(hashtextextended($1, 7))")
                .bind(format!("arc-rec round {org}"))
                .fetch_one(&mut connection)
                .await
                .context("take the round lock")?;
        Ok(taken.then_some(Self { connection }))
    }

    /// Releases the lock (closing its connection).
    pub async fn release(self) -> Result<(), StorageError> {
        self.connection
            .close()
            .await
            .context("release the round lock")
    }
}

const COLUMNS: &str = "org_id, round_no, status, window_since, window_until, new_answers, dir,
                       model_version_id, figures, started_at, finished_at";

/// `org`'s rounds, newest first.
pub async fn list(pool: &PgPool, org: Option<&str>) -> Result<Vec<Round>, StorageError> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM rounds WHERE $1::text IS NULL OR org_id = $1
         ORDER BY org_id, round_no DESC"
    ))
    .bind(org)
    .fetch_all(pool)
    .await
    .context("list rounds")
}

/// `org`'s open (running) round, if any.
pub async fn open_round(pool: &PgPool, org: &str) -> Result<Option<Round>, StorageError> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM rounds WHERE org_id = $1 AND status = 'running'"
    ))
    .bind(org)
    .fetch_optional(pool)
    .await
    .context("read the open round")
}

/// `org`'s last finished round, if any.
pub async fn last_finished(pool: &PgPool, org: &str) -> Result<Option<Round>, StorageError> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM rounds WHERE org_id = $1 AND status <> 'running'
         ORDER BY round_no DESC LIMIT 1"
    ))
    .bind(org)
    .fetch_optional(pool)
    .await
    .context("read the last round")
}

/// Answers to recommendations served to `org` received in [since, until) (`since` `None`: from
/// the beginning), counted once per shown item.
pub async fn answers_between(
    pool: &PgPool,
    org: &str,
    since: Option<DateTime<Utc>>,
    until: DateTime<Utc>,
) -> Result<i64, StorageError> {
    sqlx::query_scalar(
        "SELECT count(DISTINCT (event_id, recommendation_id)) FROM feedback
         WHERE org_id = $1 AND ($2::timestamptz IS NULL OR received_at >= $2)
           AND received_at < $3",
    )
    .bind(org)
    .bind(since)
    .bind(until)
    .fetch_one(pool)
    .await
    .context("count answers in the round's window")
}

/// Whether `org` exists.
pub async fn organization_exists(pool: &PgPool, org: &str) -> Result<bool, StorageError> {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM organizations WHERE org_id = $1)")
        .bind(org)
        .fetch_one(pool)
        .await
        .context("look up the organization")
}

/// Opens round `max + 1` of `org` over the window; `dir_for` names its directory from its
/// number. Fails (unique index) when one is already open.
pub async fn start(
    pool: &PgPool,
    org: &str,
    window: (Option<DateTime<Utc>>, DateTime<Utc>),
    new_answers: i64,
    dir_for: impl Fn(i32) -> String,
) -> Result<Round, StorageError> {
    let mut tx = pool.begin().await.context("begin round")?;
    let next: i32 =
        sqlx::query_scalar("SELECT coalesce(max(round_no), 0) + 1 FROM rounds WHERE org_id = $1")
            .bind(org)
            .fetch_one(&mut *tx)
            .await
            .context("number the round")?;
    let round: Round = sqlx::query_as(&format!(
        "INSERT INTO rounds (org_id, round_no, status, window_since, window_until, new_answers, dir)
         VALUES ($1, $2, 'running', $3, $4, $5, $6)
         RETURNING {COLUMNS}"
    ))
    .bind(org)
    .bind(next)
    .bind(window.0)
    .bind(window.1)
    .bind(new_answers)
    .bind(dir_for(next))
    .fetch_one(&mut *tx)
    .await
    .context("open the round")?;
    tx.commit().await.context("commit round")?;
    Ok(round)
}

/// Closes an open round with its verdict, version and figures.
pub async fn finish(
    pool: &PgPool,
    org: &str,
    round_no: i32,
    status: RoundStatus,
    model_version_id: Option<&str>,
    figures: &serde_json::Value,
) -> Result<(), StorageError> {
    sqlx::query(
        "UPDATE rounds SET status = $3, model_version_id = $4, figures = $5,
                           finished_at = clock_timestamp()
         WHERE org_id = $1 AND round_no = $2 AND status = 'running'",
    )
    .bind(org)
    .bind(round_no)
    .bind(status.as_str())
    .bind(model_version_id)
    .bind(sqlx::types::Json(figures))
    .execute(pool)
    .await
    .context("close the round")?;
    Ok(())
}
