//! arc-rec child processes over the caller's database: an `arc-rec serve` on a free port for
//! the benchmarks that measure serving through its front door (`bench serve`, `bench loop`),
//! and any other command (`bench loop`'s rounds).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use anyhow::Context;

use crate::storage::Database;

/// `exe` (an arc-rec binary) pointed at `database`: on the embedded cluster the child joins it
/// as users do (and so, as a server, paces its writeback); a database named by URL is reached
/// the same way as here.
pub fn arc_rec_on(exe: &Path, database: &Database) -> Command {
    let mut command = Command::new(exe);
    match database.embedded_root() {
        Some(root) => command
            .arg("--data-dir")
            .arg(root)
            .env_remove("DATABASE_URL"),
        None => command.env("DATABASE_URL", database.libpq_url()),
    };
    command
}

/// A running server; stopped (SIGTERM, then waited for) when dropped.
#[derive(Debug)]
pub struct ServerProcess {
    child: Child,
    pub port: u16,
}

impl ServerProcess {
    /// Starts `exe serve --listen 127.0.0.1:0` with platform keys not rate-limited (the benches
    /// measure serving, not the limiter) and `extra` flags; returns once it listens.
    pub fn start(exe: &Path, database: &Database, extra: &[&str]) -> anyhow::Result<Self> {
        let mut command = arc_rec_on(exe, database);
        command
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(["--rate-limit", "platform=off"])
            .args(extra)
            .stderr(Stdio::piped())
            .stdout(Stdio::null());
        let mut child = command.spawn().context("cannot start arc-rec serve")?;
        let stderr = child.stderr.take().context("no stderr")?;
        let mut lines = BufReader::new(stderr).lines();
        // `arc-rec serve` announces "listening on ... (port N)" on stderr once it is bound.
        let port = loop {
            let Some(line) = lines.next() else {
                let _ = child.kill();
                anyhow::bail!("arc-rec serve exited before listening");
            };
            let line = line?;
            if let Some(rest) = line.split("(port ").nth(1) {
                break rest
                    .trim_end_matches(')')
                    .parse::<u16>()
                    .context("unreadable port")?;
            }
        };
        // Keep draining stderr so the server never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Ok(Self { child, port })
    }

    /// The server's peak resident memory so far.
    pub fn peak_rss_mb(&self) -> f64 {
        super::peak_memory::peak_rss_mb_of(&self.child.id().to_string())
    }

    /// Stops the server and waits for it to drain.
    pub fn stop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.child.wait();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.stop();
        }
    }
}
