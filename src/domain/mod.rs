//! Domain types shared by every door into arc-rec: ingest records in the platform's own field
//! names, the agent configuration and its merge-patch diffs, and field-level validation errors.
//!
//! Nothing here does IO; parsing and validation happen at the edge so the rest of the code can
//! trust what it is handed.

pub mod agent_config;
pub mod candidate;
pub mod recommendation;
pub mod records;
pub mod segments;
pub mod validation;

pub use agent_config::{apply_merge_patch, config_hash};
pub use candidate::{Candidate, CandidatePrior, CandidateSource};
pub use recommendation::RecommendationType;
pub use records::{IngestRecord, OrgId, RecordKind};
pub use validation::{FieldError, FieldErrors};
