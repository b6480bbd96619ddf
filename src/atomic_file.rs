//! Whole-or-absent file writes: a synced temporary file in the target's directory (made if
//! missing), then a rename.

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
    std::fs::create_dir_all(parent)
        .with_context(|| format!("cannot create the directory {}", parent.display()))?;
    let mut temp = tempfile::NamedTempFile::new_in(parent)
        .with_context(|| format!("cannot write in {}", parent.display()))?;
    temp.write_all(bytes)?;
    temp.as_file().sync_all()?;
    temp.persist(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_whole_files_into_directories_it_makes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a").join("b").join("file.json");
        write_atomically(&path, b"{}").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"{}");
        write_atomically(&path, b"[1]").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"[1]");
        let entries = std::fs::read_dir(path.parent().unwrap()).unwrap().count();
        assert_eq!(entries, 1, "no temporary file is left behind");
        let file_as_dir = path.join("below");
        assert!(write_atomically(&file_as_dir, b"x").is_err());
    }
}
