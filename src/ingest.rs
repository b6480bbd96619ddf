//! Ingest: loads platform records (JSON lines in the platform's field names) into Postgres.
//!
//! Two passes over the input keep memory bounded whatever its size. The first parses and
//! validates every line and resolves every reference (to an earlier line or a stored row); the
//! second writes the good lines in one transaction. So a rejected input writes nothing, a
//! skipped line is never half-written, and lines that depend on a skipped line are skipped too.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use indicatif::ProgressBar;
use sqlx::PgPool;

use crate::domain::FieldError;
use crate::domain::records::{IngestRecord, RecordKind};
use crate::storage::StorageError;
use crate::storage::record_writer::{self, RecordWriter, WriteStats};

/// Most line errors kept in a report (the count is always exact).
const MAX_REPORTED_LINES: usize = 100;

/// What to do with a bad line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum BadLinePolicy {
    /// Reject the whole input; nothing is written.
    #[default]
    RejectAll,
    /// Skip bad lines (and lines that depend on them) and load the rest.
    Skip,
}

/// The problems of one input line.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LineError {
    /// 1-based line number.
    pub line: usize,
    /// Every problem found on that line, each naming its field.
    pub errors: Vec<FieldError>,
}

impl fmt::Display for LineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.errors.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "line {}: {error}", self.line)?;
        }
        Ok(())
    }
}

/// What an ingest did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct IngestReport {
    /// Non-blank lines read.
    pub lines: usize,
    /// Lines written (inserted, updated or found unchanged).
    pub loaded: usize,
    /// Number of lines skipped.
    pub skipped: usize,
    /// The first skipped lines with their errors.
    pub skipped_lines: Vec<LineError>,
    /// Rows inserted, updated and unchanged by kind.
    pub stats: WriteStats,
}

/// Why an ingest wrote nothing.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// Some lines are bad and the policy is to reject the whole input.
    #[error("{bad} of {lines} lines rejected; nothing was written")]
    Rejected {
        /// Non-blank lines read.
        lines: usize,
        /// Number of bad lines.
        bad: usize,
        /// The first bad lines with their errors.
        errors: Vec<LineError>,
    },
    /// The input could not be read.
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The database failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// Input that can be read more than once, line by line.
pub trait LineSource {
    /// A fresh iterator over the lines.
    fn lines(&self) -> Result<Box<dyn Iterator<Item = std::io::Result<String>> + '_>, IngestError>;
    /// Total size in bytes, for progress.
    fn size_hint(&self) -> u64;
}

/// A JSON-lines file.
#[derive(Debug)]
pub struct FileSource(pub PathBuf);

impl LineSource for FileSource {
    fn lines(&self) -> Result<Box<dyn Iterator<Item = std::io::Result<String>> + '_>, IngestError> {
        let file = File::open(&self.0).map_err(|source| IngestError::Read {
            path: self.0.clone(),
            source,
        })?;
        Ok(Box::new(BufReader::with_capacity(1 << 20, file).lines()))
    }
    fn size_hint(&self) -> u64 {
        std::fs::metadata(&self.0).map(|m| m.len()).unwrap_or(0)
    }
}

/// Lines already in memory (an HTTP body).
impl LineSource for [String] {
    fn lines(&self) -> Result<Box<dyn Iterator<Item = std::io::Result<String>> + '_>, IngestError> {
        Ok(Box::new(self.iter().cloned().map(Ok)))
    }
    fn size_hint(&self) -> u64 {
        self.iter().map(|l| l.len() as u64 + 1).sum()
    }
}

type RecordKey = (RecordKind, String, String);

/// A reference seen in pass 1, waiting to be resolved.
struct PendingRef {
    field: &'static str,
    key: RecordKey,
}

/// Validates and loads `source`; see the module docs for the guarantees.
pub async fn ingest(
    pool: &PgPool,
    source: &(impl LineSource + ?Sized),
    policy: BadLinePolicy,
    progress: &ProgressBar,
) -> Result<IngestReport, IngestError> {
    // Pass 1: parse, validate, collect definitions and references.
    progress.set_length(source.size_hint());
    progress.set_message("checking");
    let mut lines = 0usize;
    let mut bad: BTreeMap<usize, Vec<FieldError>> = BTreeMap::new();
    let mut defined: HashMap<RecordKey, usize> = HashMap::new();
    let mut refs: Vec<(usize, Vec<PendingRef>)> = Vec::new();
    for (index, line) in source.lines()?.enumerate() {
        let line_no = index + 1;
        let line = line.map_err(|source| read_error(source, line_no))?;
        progress.inc(line.len() as u64 + 1);
        if line.trim().is_empty() {
            continue;
        }
        lines += 1;
        match IngestRecord::parse_line(&line) {
            Ok(record) => {
                let org = record.org.as_str().to_owned();
                let line_refs: Vec<PendingRef> = record
                    .references()
                    .into_iter()
                    .map(|r| PendingRef {
                        field: r.field,
                        key: (r.target, org.clone(), r.id.to_owned()),
                    })
                    .collect();
                if !line_refs.is_empty() {
                    refs.push((line_no, line_refs));
                }
                defined
                    .entry((record.kind(), org, record.id().to_owned()))
                    .or_insert(line_no);
            }
            Err(errors) => {
                if let Some(key) = IngestRecord::identify_bad_line(&line) {
                    defined.entry(key).or_insert(line_no);
                }
                bad.insert(line_no, errors);
            }
        }
    }

    // References not defined on an earlier line must already be stored.
    let mut wanted: HashMap<(RecordKind, String), HashSet<String>> = HashMap::new();
    for (line_no, line_refs) in &refs {
        for r in line_refs {
            if defined.get(&r.key).is_none_or(|def| def >= line_no) {
                wanted
                    .entry((r.key.0, r.key.1.clone()))
                    .or_default()
                    .insert(r.key.2.clone());
            }
        }
    }
    let mut stored: HashSet<RecordKey> = HashSet::new();
    for ((kind, org), ids) in wanted {
        let ids: Vec<String> = ids.into_iter().collect();
        for chunk in ids.chunks(10_000) {
            for id in record_writer::existing_ids(pool, kind, &org, chunk).await? {
                stored.insert((kind, org.clone(), id));
            }
        }
    }
    // Forward pass: a line is bad if a reference is missing or points at a bad line.
    for (line_no, line_refs) in &refs {
        let mut errors = Vec::new();
        for r in line_refs {
            let (kind, _, id) = &r.key;
            match defined.get(&r.key) {
                Some(def) if def < line_no && bad.contains_key(def) => errors.push(FieldError::new(
                    r.field,
                    format!("{} `{id}` (line {def}) was rejected", kind.as_str()),
                )),
                Some(def) if def < line_no => {}
                _ if stored.contains(&r.key) => {}
                Some(def) => errors.push(FieldError::new(
                    r.field,
                    format!(
                        "{} `{id}` is defined later (line {def}); references must point at earlier lines or stored records",
                        kind.as_str()
                    ),
                )),
                None => errors.push(FieldError::new(
                    r.field,
                    format!("{} `{id}` not found earlier in the input or in the database", kind.as_str()),
                )),
            }
        }
        if !errors.is_empty() {
            bad.entry(*line_no).or_default().extend(errors);
        }
    }

    let bad_count = bad.len();
    let reported: Vec<LineError> = bad
        .iter()
        .take(MAX_REPORTED_LINES)
        .map(|(line, errors)| LineError {
            line: *line,
            errors: errors.clone(),
        })
        .collect();
    if bad_count > 0 && policy == BadLinePolicy::RejectAll {
        return Err(IngestError::Rejected {
            lines,
            bad: bad_count,
            errors: reported,
        });
    }

    // Pass 2: write the good lines in one transaction.
    progress.set_position(0);
    progress.set_message("loading");
    let mut writer = RecordWriter::begin(pool).await?;
    let mut loaded = 0usize;
    for (index, line) in source.lines()?.enumerate() {
        let line_no = index + 1;
        let line = line.map_err(|source| read_error(source, line_no))?;
        progress.inc(line.len() as u64 + 1);
        if line.trim().is_empty() || bad.contains_key(&line_no) {
            continue;
        }
        // Pass 1 accepted this line; a failure now means the input changed under us.
        let record = IngestRecord::parse_line(&line).map_err(|errors| IngestError::Rejected {
            lines,
            bad: 1,
            errors: vec![LineError {
                line: line_no,
                errors,
            }],
        })?;
        writer.push(&record).await?;
        loaded += 1;
    }
    let stats = writer.commit().await?;
    progress.finish_and_clear();
    Ok(IngestReport {
        lines,
        loaded,
        skipped: bad_count,
        skipped_lines: reported,
        stats,
    })
}

fn read_error(source: std::io::Error, line_no: usize) -> IngestError {
    IngestError::Read {
        path: PathBuf::from(format!("input line {line_no}")),
        source,
    }
}

/// Convenience for a file path.
pub async fn ingest_file(
    pool: &PgPool,
    path: &Path,
    policy: BadLinePolicy,
    progress: &ProgressBar,
) -> Result<IngestReport, IngestError> {
    ingest(pool, &FileSource(path.to_path_buf()), policy, progress).await
}
