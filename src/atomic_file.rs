//! Whole-or-absent file writes: a synced temporary file in the target's directory, then a rename.

use std::io::Write as _;
use std::path::Path;

use anyhow::Context as _;

/// Writes `path` through a synced temporary file and a rename, so it is whole or absent.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    // `file.json`'s parent is the empty path: the current directory.
    let parent = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let mut temp = tempfile::NamedTempFile::new_in(parent)
        .with_context(|| format!("cannot write in {}", parent.display()))?;
    temp.write_all(bytes)?;
    temp.as_file().sync_all()?;
    temp.persist(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}
