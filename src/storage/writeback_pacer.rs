//! Writeback pacing for the embedded cluster while it serves: a thread that flushes the data
//! directory's filesystem every second, so the kernel's page cache never holds more than about a
//! second of the server's writes.
//!
//! Why: Postgres extends a table by writing a zeroed page through the page cache, and nothing
//! asks the kernel to write those pages soon (its `*_flush_after` settings cover only buffers
//! Postgres itself writes back later). Left alone the kernel writes an inode's dirty pages once
//! they are 30 s old, all of them at once: at 1,000 decisions/s that is about 100 MB every 30 s,
//! and each commit's WAL flush queues behind it (measured with `arc-rec bench serve`: windows
//! with a p99 of 34 ms and maxima of 100 ms, against under 10 ms once paced). Flushing every
//! second turns that burst into 3–4 MB a second. The pacer only moves writes earlier; it never
//! holds one back, so durability is what Postgres makes of it either way.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the filesystem is flushed: short enough that a flush is a few MB at serving rates.
pub const PACE: Duration = Duration::from_secs(1);

/// A running pacer; dropping it stops the thread.
#[derive(Debug)]
pub struct WritebackPacer {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    flushes: Arc<AtomicU64>,
}

impl WritebackPacer {
    /// Starts flushing the filesystem that holds `dir` every `period`.
    pub fn start(dir: &Path, period: Duration) -> std::io::Result<Self> {
        let handle = File::open(dir)?;
        // Fail here, where the caller can report it, rather than in the thread.
        nix::unistd::syncfs(&handle)?;
        let (stop, stopped) = mpsc::channel::<()>();
        let flushes = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&flushes);
        let dir = dir.to_path_buf();
        let thread = std::thread::Builder::new()
            .name("writeback-pacer".to_owned())
            .spawn(move || {
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(period) {
                    if let Err(err) = nix::unistd::syncfs(&handle) {
                        tracing::warn!(dir = %dir.display(), error = %err, "writeback pacing stopped");
                        return;
                    }
                    counter.fetch_add(1, Ordering::Relaxed);
                }
            })?;
        Ok(Self {
            stop: Some(stop),
            thread: Some(thread),
            flushes,
        })
    }

    /// Flushes done so far by the thread.
    pub fn flushes(&self) -> u64 {
        self.flushes.load(Ordering::Relaxed)
    }
}

impl Drop for WritebackPacer {
    fn drop(&mut self) {
        // Closing the channel wakes the thread at once.
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flushes_until_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let pacer = WritebackPacer::start(dir.path(), Duration::from_millis(5)).unwrap();
        while pacer.flushes() < 3 {
            std::thread::sleep(Duration::from_millis(5));
        }
        let flushes = Arc::clone(&pacer.flushes);
        drop(pacer);
        let after_drop = flushes.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(flushes.load(Ordering::Relaxed), after_drop);
    }

    #[test]
    fn a_missing_directory_is_an_error_not_a_thread() {
        let dir = tempfile::tempdir().unwrap();
        let err = WritebackPacer::start(&dir.path().join("absent"), PACE).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
    }
}
