//! The embedded Postgres: a private cluster run from the system's `initdb`/`pg_ctl` in a data
//! directory (default `./.arc-rec/`), reached over a unix socket in a private directory with
//! trust authentication (only the owner of that directory can connect), no TCP listener.
//!
//! Postgres refuses to run as root, and CI runs as root: then the cluster is owned and run by the
//! unprivileged `postgres` user of Debian's package. Several arc-rec processes may share one
//! cluster: each holds a shared lock on `users.lock` while it runs, and on exit the process that
//! can take that lock exclusively (the last one out) stops the server. `start.lock` serialises
//! starting and stopping.

use std::fs::{self, File};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use nix::fcntl::{Flock, FlockArg};
use sha2::Digest;
use sqlx::postgres::PgConnectOptions;

/// Fixed port: it only names the socket file inside our private socket directory.
const PORT: u16 = 5432;
/// Superuser created by `initdb -U`.
pub const SUPERUSER: &str = "postgres";

/// What can go wrong starting or stopping the embedded cluster.
#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    /// No `initdb`/`pg_ctl` on PATH or under /usr/lib/postgresql.
    #[error(
        "PostgreSQL server binaries (initdb, pg_ctl) not found on PATH or under /usr/lib/postgresql/*/bin; \
         run scripts/setup.sh (installs Debian's postgresql) or set DATABASE_URL to use a server"
    )]
    BinariesNotFound,
    /// Running as root but there is no unprivileged user to own the cluster.
    #[error(
        "running as root, and Postgres refuses to run as root, but there is no `postgres` user to run it as; \
         install Debian's postgresql package (scripts/setup.sh) or set DATABASE_URL"
    )]
    NoPostgresUser,
    /// The `postgres` user cannot reach the cluster's files.
    #[error(
        "the postgres user cannot reach the cluster for {path} (a parent directory is not \
         world-searchable); choose another --data-dir, or set DATABASE_URL"
    )]
    Unreachable { path: PathBuf },
    /// The socket path would exceed the kernel's limit for unix socket names.
    #[error(
        "socket path {path} is too long for a unix socket (max 107 bytes); use a shorter --data-dir"
    )]
    SocketPathTooLong { path: PathBuf },
    /// A filesystem operation failed.
    #[error("{action} {path}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// `initdb` or `pg_ctl` exited unsuccessfully.
    #[error("`{command}` failed: {output}")]
    Command { command: String, output: String },
}

fn io_err(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> EmbeddedError {
    let path = path.to_path_buf();
    move |source| EmbeddedError::Io {
        action,
        path,
        source,
    }
}

/// Server settings given at every start (so clusters initialised by older versions get them too).
/// All keep commits durable; they cut the bytes each commit's WAL flush must write, which is
/// what a decision-log write waits for: full-page images are compressed, and checkpoints (after
/// which the first change to every page logs a full-page image) come every 15 minutes rather
/// than every 5. Backends that evict a dirty buffer ask the kernel to write it back now
/// (`backend_flush_after`) instead of leaving it in the page cache for the kernel's periodic
/// writeback, whose bursts queue ahead of the next commit's WAL flush.
const SERVER_OPTIONS: &str = "-c wal_compression=on -c checkpoint_timeout=15min -c max_wal_size=2GB \
     -c backend_flush_after=256kB";

/// WAL segment size given to `initdb`, in MB (Postgres' default is 16). A segment that is not a
/// recycled one is zero-filled and fsynced by whichever backend first needs it, while every other
/// commit waits on the WAL lock. At 1,000 decisions/s a fresh cluster needed a new 16 MB segment
/// every 4 s, and each one held ten or so `arc-rec bench serve` requests past 10 ms (up to
/// 20 ms); with 1 MB segments the same work comes in pieces a sixteenth the size and no such
/// tick shows. Only clusters initialised from now on get it (the size is fixed at `initdb`).
const WAL_SEGMENT_MB: u32 = 1;

/// How the cluster should be tuned.
#[derive(Debug, Clone, Copy, Default)]
pub struct EmbeddedOptions {
    /// `fsync=off`, `synchronous_commit=off`: for throwaway test clusters only. A 2xx from the
    /// API promises durability, so production clusters keep the defaults.
    pub unsafe_fast: bool,
    /// Leave the server running when this process exits (test harnesses share one per run).
    pub keep_running: bool,
}

/// A running embedded cluster. Call [`EmbeddedPostgres::release`] when done; dropping it without
/// releasing leaves the server running for the next process.
#[derive(Debug)]
pub struct EmbeddedPostgres {
    /// Where the locks live (the data dir the user named).
    root: PathBuf,
    /// Where the cluster's files live (`root`, or a reachable stand-in; see
    /// `cluster_home_for_postgres_user`).
    home: PathBuf,
    data_dir: PathBuf,
    socket_dir: PathBuf,
    bin_dir: PathBuf,
    owner: Option<nix::unistd::User>,
    options: EmbeddedOptions,
    users_lock: Option<Flock<File>>,
}

impl EmbeddedPostgres {
    /// Starts the cluster under `root` (initialising it on first use) or joins the one already
    /// running there.
    pub fn start(root: &Path, options: EmbeddedOptions) -> Result<Self, EmbeddedError> {
        let bin_dir = find_bin_dir().ok_or(EmbeddedError::BinariesNotFound)?;
        fs::create_dir_all(root).map_err(io_err("cannot create", root))?;
        let root = root
            .canonicalize()
            .map_err(io_err("cannot resolve", root))?;
        let (owner, home) = Self::owner_and_home(&root)?;
        let data_dir = home.join("pgdata");
        let socket_dir = home.join("run");
        let socket_file = socket_dir.join(format!(".s.PGSQL.{PORT}"));
        if socket_file.as_os_str().len() > 107 {
            return Err(EmbeddedError::SocketPathTooLong { path: socket_file });
        }

        let start_lock = lock(&root.join("start.lock"), FlockArg::LockExclusive)?;
        let users_lock = lock(&root.join("users.lock"), FlockArg::LockShared)?;
        let cluster = Self {
            root,
            home,
            data_dir,
            socket_dir,
            bin_dir,
            owner,
            options,
            users_lock: Some(users_lock),
        };
        if !cluster.data_dir.join("PG_VERSION").exists() {
            cluster.init()?;
        }
        if !cluster.is_running() {
            cluster.prepare_dirs()?;
            cluster.pg_ctl_start()?;
        }
        drop(start_lock);
        Ok(cluster)
    }

    /// Stops the cluster under `root` if it is running, whoever started it. Returns whether it
    /// was running.
    pub fn stop_cluster(root: &Path) -> Result<bool, EmbeddedError> {
        let Some(cluster) = Self::locate(root)? else {
            return Ok(false);
        };
        let _start_lock = lock(&cluster.root.join("start.lock"), FlockArg::LockExclusive)?;
        if !cluster.is_running() {
            return Ok(false);
        }
        cluster.run(cluster.pg_ctl(["stop", "-m", "fast", "-w"]))?;
        Ok(true)
    }

    /// Whether a server is running for the cluster under `root`.
    pub fn is_cluster_running(root: &Path) -> Result<bool, EmbeddedError> {
        Ok(Self::locate(root)?.is_some_and(|cluster| cluster.is_running()))
    }

    /// The libpq URL of arc-rec's database in the cluster under `root` when it is running.
    pub fn running_url(root: &Path) -> Result<Option<String>, EmbeddedError> {
        Ok(Self::locate(root)?
            .filter(Self::is_running)
            .map(|cluster| cluster.libpq_url(super::EMBEDDED_DATABASE)))
    }

    /// The cluster under `root` without starting or joining it; `None` when there is none.
    fn locate(root: &Path) -> Result<Option<Self>, EmbeddedError> {
        let Ok(root) = root.canonicalize() else {
            return Ok(None);
        };
        let bin_dir = find_bin_dir().ok_or(EmbeddedError::BinariesNotFound)?;
        let (owner, home) = Self::owner_and_home(&root)?;
        let cluster = Self {
            data_dir: home.join("pgdata"),
            socket_dir: home.join("run"),
            root,
            home,
            bin_dir,
            owner,
            options: EmbeddedOptions {
                keep_running: true,
                ..EmbeddedOptions::default()
            },
            users_lock: None,
        };
        Ok(cluster
            .data_dir
            .join("PG_VERSION")
            .exists()
            .then_some(cluster))
    }

    /// Who runs the cluster (the `postgres` user when we are root) and where its files live.
    fn owner_and_home(root: &Path) -> Result<(Option<nix::unistd::User>, PathBuf), EmbeddedError> {
        if nix::unistd::geteuid().is_root() {
            let user = nix::unistd::User::from_name("postgres")
                .ok()
                .flatten()
                .ok_or(EmbeddedError::NoPostgresUser)?;
            Ok((Some(user), cluster_home_for_postgres_user(root)?))
        } else {
            Ok((None, root.to_path_buf()))
        }
    }

    /// Connection options for `database` over the private socket.
    pub fn connect_options(&self, database: &str) -> PgConnectOptions {
        PgConnectOptions::new()
            .socket(&self.socket_dir)
            .port(PORT)
            .username(SUPERUSER)
            .database(database)
    }

    /// A libpq connection string for tools like `psql` (`host` is the socket directory).
    pub fn libpq_url(&self, database: &str) -> String {
        // `localhost` only fills the URL's host slot; the `host` parameter (a directory) wins
        // and makes libpq and sqlx use the unix socket in it.
        format!(
            "postgresql://{SUPERUSER}@localhost:{PORT}/{database}?host={}",
            percent_encode_path(&self.socket_dir)
        )
    }

    /// The directory holding `psql`, `pg_ctl` and friends of the running server's version.
    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    /// The directory the user named (`--data-dir`), which other arc-rec processes join it by.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The Postgres data directory (tables and WAL).
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// Leaves the cluster: stops the server if no other arc-rec process is using it (and this
    /// one was not asked to keep it running).
    pub fn release(mut self) -> Result<(), EmbeddedError> {
        self.release_inner()
    }

    fn release_inner(&mut self) -> Result<(), EmbeddedError> {
        let Some(users_lock) = self.users_lock.take() else {
            return Ok(());
        };
        if self.options.keep_running {
            return Ok(());
        }
        let _start_lock = lock(&self.root.join("start.lock"), FlockArg::LockExclusive)?;
        drop(users_lock);
        let file = open_lock_file(&self.root.join("users.lock"))?;
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            // Nobody else holds a shared lock: we are the last user.
            Ok(_exclusive) => {
                if self.is_running() {
                    self.run(self.pg_ctl(["stop", "-m", "fast", "-w"]))?;
                }
                Ok(())
            }
            Err(_) => Ok(()),
        }
    }

    fn init(&self) -> Result<(), EmbeddedError> {
        fs::create_dir_all(&self.data_dir).map_err(io_err("cannot create", &self.data_dir))?;
        self.chown(&self.data_dir)?;
        fs::set_permissions(&self.data_dir, fs::Permissions::from_mode(0o700))
            .map_err(io_err("cannot set permissions on", &self.data_dir))?;
        let mut initdb = self.command("initdb");
        initdb.arg("-D").arg(&self.data_dir).args([
            "-U",
            SUPERUSER,
            "-E",
            "UTF8",
            "--no-locale",
            "--auth=trust",
            "--no-instructions",
        ]);
        initdb.arg(format!("--wal-segsize={WAL_SEGMENT_MB}"));
        self.run(initdb)?;
        let conf = self.data_dir.join("postgresql.conf");
        let mut text = fs::read_to_string(&conf).map_err(io_err("cannot read", &conf))?;
        text.push_str(&format!(
            "\n# arc-rec embedded cluster: unix socket only, in a private directory.\n\
             listen_addresses = ''\n\
             unix_socket_directories = '{}'\n\
             unix_socket_permissions = 0700\n\
             max_connections = 200\n\
             shared_buffers = 256MB\n\
             work_mem = 16MB\n",
            self.socket_dir.display()
        ));
        if self.options.unsafe_fast {
            text.push_str("fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n");
        }
        fs::write(&conf, text).map_err(io_err("cannot write", &conf))
    }

    fn prepare_dirs(&self) -> Result<(), EmbeddedError> {
        fs::create_dir_all(&self.socket_dir).map_err(io_err("cannot create", &self.socket_dir))?;
        fs::set_permissions(&self.socket_dir, fs::Permissions::from_mode(0o700))
            .map_err(io_err("cannot set permissions on", &self.socket_dir))?;
        self.chown(&self.socket_dir)?;
        let log = self.home.join("postgres.log");
        if !log.exists() {
            File::create(&log).map_err(io_err("cannot create", &log))?;
        }
        self.chown(&log)
    }

    fn pg_ctl_start(&self) -> Result<(), EmbeddedError> {
        let log = self.home.join("postgres.log");
        let mut cmd = self.pg_ctl(["start", "-w", "-t", "60"]);
        cmd.arg("-l").arg(&log).arg("-o").arg(SERVER_OPTIONS);
        self.run(cmd).map_err(|err| match err {
            EmbeddedError::Command { command, output } => {
                let tail = fs::read_to_string(&log).unwrap_or_default();
                let tail: Vec<&str> = tail.lines().rev().take(8).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                EmbeddedError::Command {
                    command,
                    output: format!(
                        "{output}\nlast lines of {}:\n{}",
                        log.display(),
                        tail.join("\n")
                    ),
                }
            }
            other => other,
        })
    }

    fn is_running(&self) -> bool {
        let mut status = self.pg_ctl(["status"]);
        status
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        status.status().is_ok_and(|s| s.success())
    }

    fn pg_ctl<const N: usize>(&self, args: [&str; N]) -> Command {
        let mut cmd = self.command("pg_ctl");
        cmd.arg("-D").arg(&self.data_dir).args(args);
        cmd
    }

    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(self.bin_dir.join(program));
        // The server must not inherit our locale quirks; --no-locale already fixes the cluster's.
        cmd.env("LC_ALL", "C").env_remove("PGDATA");
        if let Some(user) = &self.owner {
            cmd.uid(user.uid.as_raw())
                .gid(user.gid.as_raw())
                .env("HOME", &user.dir);
            cmd.current_dir(&self.home);
        }
        cmd
    }

    fn run(&self, mut cmd: Command) -> Result<(), EmbeddedError> {
        let command = format!("{cmd:?}");
        let output = cmd.output().map_err(|source| EmbeddedError::Io {
            action: "cannot run",
            path: PathBuf::from(cmd.get_program()),
            source,
        })?;
        if output.status.success() {
            Ok(())
        } else {
            let mut text = String::from_utf8_lossy(&output.stderr).into_owned();
            text.push_str(&String::from_utf8_lossy(&output.stdout));
            Err(EmbeddedError::Command {
                command,
                output: text.trim().to_owned(),
            })
        }
    }

    fn chown(&self, path: &Path) -> Result<(), EmbeddedError> {
        if let Some(user) = &self.owner {
            std::os::unix::fs::chown(path, Some(user.uid.as_raw()), Some(user.gid.as_raw()))
                .map_err(io_err("cannot change the owner of", path))?;
        }
        Ok(())
    }
}

impl Drop for EmbeddedPostgres {
    fn drop(&mut self) {
        // Dropping without release keeps the server for the next process, which is safe; only
        // log so a missed release is visible.
        if self.users_lock.is_some() && !self.options.keep_running {
            tracing::debug!(root = %self.root.display(), "embedded postgres left running");
        }
    }
}

fn open_lock_file(path: &Path) -> Result<File, EmbeddedError> {
    fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)
        .map_err(io_err("cannot open lock file", path))
}

fn lock(path: &Path, arg: FlockArg) -> Result<Flock<File>, EmbeddedError> {
    let file = open_lock_file(path)?;
    Flock::lock(file, arg).map_err(|(_, errno)| EmbeddedError::Io {
        action: "cannot lock",
        path: path.to_path_buf(),
        source: std::io::Error::from(errno),
    })
}

/// Where the cluster's files live when the `postgres` user runs it: under `root` when that user
/// can reach it, else (a checkout under a private home directory, say) in a directory of its
/// own under `/var/lib/arc-rec`, named by a hash of `root` so each data dir keeps its cluster.
fn cluster_home_for_postgres_user(root: &Path) -> Result<PathBuf, EmbeddedError> {
    if is_reachable_by_others(root)? {
        return Ok(root.to_path_buf());
    }
    let digest = sha2::Sha256::digest(root.as_os_str().as_encoded_bytes());
    let base = Path::new("/var/lib/arc-rec/clusters");
    let home = base.join(&hex::encode(digest)[..16]);
    fs::create_dir_all(&home).map_err(io_err("cannot create", &home))?;
    for dir in [Path::new("/var/lib/arc-rec"), base, &home] {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o755))
            .map_err(io_err("cannot set permissions on", dir))?;
    }
    if !is_reachable_by_others(&home)? {
        return Err(EmbeddedError::Unreachable {
            path: root.to_path_buf(),
        });
    }
    tracing::info!(data_dir = %root.display(), cluster = %home.display(),
        "the postgres user cannot reach the data directory; keeping the cluster files elsewhere");
    Ok(home)
}

/// Every ancestor of `path` must be searchable by others, or the `postgres` user cannot reach it.
fn is_reachable_by_others(path: &Path) -> Result<bool, EmbeddedError> {
    for dir in path.ancestors().skip(1) {
        let meta = fs::metadata(dir).map_err(io_err("cannot inspect", dir))?;
        if meta.mode() & 0o001 == 0 {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Percent-encodes a path for a URL query value, keeping `/` and unreserved characters.
fn percent_encode_path(path: &Path) -> String {
    let mut out = String::new();
    for byte in path.as_os_str().as_encoded_bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => {
                out.push(char::from(*byte));
            }
            other => out.push_str(&format!("%{other:02X}")),
        }
    }
    out
}

/// `pg_ctl` on PATH (resolving Debian's symlinks), else the newest `/usr/lib/postgresql/*/bin`.
pub fn find_bin_dir() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let pg_ctl = dir.join("pg_ctl");
            if pg_ctl.is_file() && dir.join("initdb").exists() {
                let resolved = pg_ctl.canonicalize().ok()?;
                return resolved.parent().map(Path::to_path_buf);
            }
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("pg_ctl").is_file().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}
