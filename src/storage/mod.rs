//! Storage: every SQL statement arc-rec issues lives under this module. The rest of the code sees
//! typed functions and [`StorageError`], never `sqlx`.

pub mod analytics;
pub mod api_keys;
pub mod bandit_state;
pub mod candidate_stats;
pub mod clusters;
pub mod decisions;
pub mod embedded;
pub mod export_rows;
pub mod model_versions;
pub mod record_writer;
pub mod rounds;
pub mod training_runs;
pub mod writeback_pacer;

use std::path::PathBuf;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, Executor, PgPool};

pub use embedded::{EmbeddedError, EmbeddedOptions, EmbeddedPostgres};

/// The migrations in `sql/`, embedded in the binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./sql");

/// Name of the database arc-rec uses inside its embedded cluster.
pub const EMBEDDED_DATABASE: &str = "arc_rec";

/// Errors from the storage layer.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The embedded cluster could not be started or stopped.
    #[error(transparent)]
    Embedded(#[from] EmbeddedError),
    /// `DATABASE_URL` could not be parsed.
    #[error("invalid DATABASE_URL")]
    BadUrl(#[source] sqlx::Error),
    /// The database could not be reached.
    #[error("cannot connect to the database")]
    Connect(#[source] sqlx::Error),
    /// A blocking task (starting or stopping the embedded cluster) died.
    #[error("background task failed")]
    Task(#[from] tokio::task::JoinError),
    /// Applying migrations failed.
    #[error("cannot apply migrations")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A query failed.
    #[error("database query failed: {context}")]
    Query {
        context: &'static str,
        #[source]
        source: sqlx::Error,
    },
}

impl StorageError {
    /// Whether the database is out of reach (down, restarting, refusing connections, the pool
    /// exhausted past its acquire timeout) rather than the query wrong: the caller may retry
    /// later, and the API answers 503, not 500.
    pub fn is_unavailable(&self) -> bool {
        match self {
            StorageError::Connect(_) | StorageError::Embedded(_) => true,
            StorageError::Query { source, .. } => sqlx_unavailable(source),
            StorageError::Migrate(sqlx::migrate::MigrateError::Execute(source)) => {
                sqlx_unavailable(source)
            }
            StorageError::BadUrl(_) | StorageError::Task(_) | StorageError::Migrate(_) => false,
        }
    }
}

/// The analyst queries' pool on the database `connect` names (see
/// [`Database::analytics_pool`]).
pub fn analytics_pool(connect: &PgConnectOptions) -> PgPool {
    PgPoolOptions::new()
        .max_connections(ANALYTICS_CONNECTIONS)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect_lazy_with(connect.clone().options([
            ("statement_timeout", ANALYTICS_STATEMENT_TIMEOUT),
            ("max_parallel_workers_per_gather", "0"),
        ]))
}

/// Whether a sqlx error means the server is out of reach: no connection to be had in time,
/// a broken connection, Postgres refusing work while it shuts down or starts up (SQLSTATE
/// class 08 connection exceptions, 57P01–57P03, 53300 too many connections), or a statement
/// cancelled at its timeout (57014: the analytics pool's, [`ANALYTICS_STATEMENT_TIMEOUT`]).
pub fn sqlx_unavailable(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            code.starts_with("08")
                || matches!(&*code, "57P01" | "57P02" | "57P03" | "53300" | "57014")
        }),
        _ => false,
    }
}

/// The migrations this binary knows that the database has not applied (by version, oldest
/// first): a server on a database restored from an older backup, or one a newer binary's
/// migration half-applied, is not ready.
pub async fn pending_migrations(pool: &PgPool) -> Result<Vec<i64>, StorageError> {
    let applied: Vec<i64> =
        match sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
            .fetch_all(pool)
            .await
        {
            Ok(applied) => applied,
            // No migration table: nothing was ever applied.
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("42P01") => Vec::new(),
            Err(source) => {
                return Err(StorageError::Query {
                    context: "read applied migrations",
                    source,
                });
            }
        };
    Ok(MIGRATOR
        .iter()
        .map(|migration| migration.version)
        .filter(|version| !applied.contains(version))
        .collect())
}

/// Longest a request waits for a pooled connection before it fails (503 at the API): while the
/// database is down, requests fail within this bound instead of queueing.
/// Connections of the serving pool.
pub const MAX_CONNECTIONS: u32 = 16;

/// Attempts a statement at shutdown deserves: `serve`'s HTTP workers each run their own tokio
/// runtime, and a pooled connection opened by a request on one of them is dead once that
/// runtime has stopped ("A Tokio 1.x context was found, but it is being shutdown"); each failed
/// attempt drops one such connection, so one more than the pool holds always reaches a live
/// one.
pub const SHUTDOWN_ATTEMPTS: u32 = MAX_CONNECTIONS + 1;

pub const ACQUIRE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// Connections analyst queries may hold at once, in a pool of their own, each without parallel
/// workers, so analytics take at most one backend (one core) of the database: a query
/// aggregating the whole decision log costs seconds on a large log, and without a bulkhead a
/// few analysts took every connection and the CPU serving needed (`scripts/soak.sh`: at 15
/// queries/s serving stalled within two minutes; with two connections that could each run
/// parallel workers, serving's p99 still reached 2.4 s on 2 cores).
pub const ANALYTICS_CONNECTIONS: u32 = 1;

/// Longest an analyst query may run before Postgres cancels it (answered 503).
pub const ANALYTICS_STATEMENT_TIMEOUT: &str = "30s";

/// Adds a static description to a sqlx error.
pub(crate) trait QueryContext<T> {
    fn context(self, context: &'static str) -> Result<T, StorageError>;
}

impl<T> QueryContext<T> for Result<T, sqlx::Error> {
    fn context(self, context: &'static str) -> Result<T, StorageError> {
        self.map_err(|source| StorageError::Query { context, source })
    }
}

/// Where the data lives.
#[derive(Debug, Clone)]
pub enum DatabaseTarget {
    /// A server named by a libpq URL (`DATABASE_URL`).
    Url(String),
    /// arc-rec's own cluster under this directory.
    Embedded {
        root: PathBuf,
        options: EmbeddedOptions,
    },
}

/// An open database: a connection pool and, when embedded, the cluster it runs on.
#[derive(Debug)]
pub struct Database {
    pool: PgPool,
    connect: PgConnectOptions,
    libpq_url: String,
    psql: PathBuf,
    embedded: Option<EmbeddedPostgres>,
}

impl Database {
    /// Opens (and for the embedded target starts and creates) the database. Does not migrate.
    pub async fn open(target: &DatabaseTarget) -> Result<Self, StorageError> {
        let (connect, libpq_url, psql, embedded) = match target {
            DatabaseTarget::Url(url) => {
                let connect: PgConnectOptions = url.parse().map_err(StorageError::BadUrl)?;
                let psql = embedded::find_bin_dir()
                    .map(|dir| dir.join("psql"))
                    .unwrap_or_else(|| PathBuf::from("psql"));
                (connect, url.clone(), psql, None)
            }
            DatabaseTarget::Embedded { root, options } => {
                let root = root.clone();
                let options = *options;
                let cluster =
                    tokio::task::spawn_blocking(move || EmbeddedPostgres::start(&root, options))
                        .await??;
                create_database_if_missing(&cluster.connect_options("postgres"), EMBEDDED_DATABASE)
                    .await?;
                let connect = cluster.connect_options(EMBEDDED_DATABASE);
                let url = cluster.libpq_url(EMBEDDED_DATABASE);
                let psql = cluster.bin_dir().join("psql");
                (connect, url, psql, Some(cluster))
            }
        };
        Self::connect(connect, libpq_url, psql, embedded).await
    }

    /// Opens a database on an already running server given its options (tests use this for their
    /// per-test databases).
    pub async fn open_with(
        connect: PgConnectOptions,
        libpq_url: String,
        psql: PathBuf,
    ) -> Result<Self, StorageError> {
        Self::connect(connect, libpq_url, psql, None).await
    }

    async fn connect(
        connect: PgConnectOptions,
        libpq_url: String,
        psql: PathBuf,
        embedded: Option<EmbeddedPostgres>,
    ) -> Result<Self, StorageError> {
        let connect = connect.log_statements(tracing::log::LevelFilter::Trace);
        let pool = PgPoolOptions::new()
            .max_connections(MAX_CONNECTIONS)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with(connect.clone())
            .await
            .map_err(StorageError::Connect)?;
        Ok(Self {
            pool,
            connect,
            libpq_url,
            psql,
            embedded,
        })
    }

    /// The embedded cluster's directory (`--data-dir`); `None` for a server named by URL.
    pub fn embedded_root(&self) -> Option<&std::path::Path> {
        self.embedded.as_ref().map(EmbeddedPostgres::root)
    }

    /// Starts pacing the kernel's writeback of the embedded cluster's files
    /// ([`writeback_pacer`]); `None` for a server named by URL, whose machine its operator tunes.
    pub fn pace_writeback(&self) -> Option<std::io::Result<writeback_pacer::WritebackPacer>> {
        self.embedded.as_ref().map(|cluster| {
            writeback_pacer::WritebackPacer::start(cluster.data_dir(), writeback_pacer::PACE)
        })
    }

    /// Applies pending migrations from `sql/`.
    pub async fn migrate(&self) -> Result<(), StorageError> {
        MIGRATOR.run(&self.pool).await?;
        Ok(())
    }

    /// The connection pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// A pool of its own for analyst queries: [`ANALYTICS_CONNECTIONS`] connections without
    /// parallel workers, each statement cancelled after [`ANALYTICS_STATEMENT_TIMEOUT`].
    /// Connects on first use.
    pub fn analytics_pool(&self) -> PgPool {
        analytics_pool(&self.connect)
    }

    /// Options for opening a dedicated connection (server-side cursors, COPY).
    pub fn connect_options(&self) -> &PgConnectOptions {
        &self.connect
    }

    /// libpq URL for external tools such as `psql`.
    pub fn libpq_url(&self) -> &str {
        &self.libpq_url
    }

    /// The `psql` binary matching the server, for benchmarks that compare against `\copy`.
    pub fn psql(&self) -> &std::path::Path {
        &self.psql
    }

    /// Brings the database to a steady state after a bulk load, so a measurement that follows
    /// does not share the machine with autovacuum and the load's checkpoint: `VACUUM (ANALYZE)`,
    /// then `CHECKPOINT` when the role may run it (superuser or `pg_checkpoint`; otherwise the
    /// server's own checkpoint comes later, and that is reported, not an error).
    pub async fn settle_after_bulk_load(&self) -> Result<(), StorageError> {
        sqlx::raw_sql("VACUUM (ANALYZE)")
            .execute(&self.pool)
            .await
            .context("vacuum after bulk load")?;
        if let Err(err) = sqlx::raw_sql("CHECKPOINT").execute(&self.pool).await {
            tracing::warn!(error = %err, "no checkpoint after the bulk load");
        }
        Ok(())
    }

    /// Closes the pool and leaves the embedded cluster (stopping it if this was its last user).
    pub async fn close(self) -> Result<(), StorageError> {
        self.pool.close().await;
        if let Some(cluster) = self.embedded {
            tokio::task::spawn_blocking(move || cluster.release()).await??;
        }
        Ok(())
    }
}

/// `CREATE DATABASE name` unless it exists; concurrent callers are fine.
pub async fn create_database_if_missing(
    admin: &PgConnectOptions,
    name: &str,
) -> Result<(), StorageError> {
    create_database(admin, name, None).await
}

/// `CREATE DATABASE name [TEMPLATE template]` unless it exists.
pub async fn create_database(
    admin: &PgConnectOptions,
    name: &str,
    template: Option<&str>,
) -> Result<(), StorageError> {
    let mut conn = sqlx::PgConnection::connect_with(admin)
        .await
        .map_err(StorageError::Connect)?;
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(name)
            .fetch_one(&mut conn)
            .await
            .context("look up database")?;
    if !exists {
        let template = template
            .map(|t| format!(" TEMPLATE {}", quote_ident(t)))
            .unwrap_or_default();
        let result = conn
            .execute(format!("CREATE DATABASE {}{template}", quote_ident(name)).as_str())
            .await;
        match result {
            Ok(_) => {}
            // Another process created it between our check and our CREATE.
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P04") => {}
            Err(e) => {
                return Err(StorageError::Query {
                    context: "create database",
                    source: e,
                });
            }
        }
    }
    conn.close().await.context("close admin connection")?;
    Ok(())
}

/// Quotes an SQL identifier.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}
