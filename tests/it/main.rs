//! arc-rec's integration tests: one test binary (fast to link), one module per area, each test
//! on a fresh migrated database of a shared throwaway Postgres cluster.

/// The shared cluster and per-test databases.
mod helpers;

/// The HTTP API.
mod api;
/// `arc-rec bench model`: our model against the PyTorch reference on the tiny preset.
#[cfg(feature = "rft")]
mod bench_model;
/// Candidate generation: statistics from a simulated world, constraints, ground truth.
mod candidates;
/// `arc-rec` the binary: exit codes and messages people see.
mod cli;
/// Failure clustering on a simulated world: quality, stable ids, request-time placement.
mod cluster;
/// The analysts' dashboard in a browser: sign-in, figures against SQL, the API and the CLI.
mod dashboard;
/// The decision log and feedback storage.
mod decisions;
/// The embedded cluster's settings.
mod embedded;
/// Export: reward rules on hand-made rows, filters, formats, atomic output.
mod export;
/// Faults: Postgres stopped and started under the service, missing migrations.
mod faults;
/// Ingest: the contract examples, idempotency, bad input naming line and field.
mod ingest;
/// `arc-rec model init`: the preset checkpoint through the binary.
#[cfg(feature = "rft")]
mod model;
/// `arc-rec candidates`: a trained model's candidates served beside the heuristic ones.
#[cfg(feature = "rft")]
mod model_candidates;
/// `arc-rec round`: two learning rounds end to end over HTTP, and a loop's bad inputs.
#[cfg(feature = "rft")]
mod rounds;
/// The schema: constraints, organization isolation, analyst views.
mod schema;
/// Recommendations, feedback, replicas and restarts.
mod serving;
/// The synthetic world through the binary.
mod simulate;
/// The source tree: no import cycles, imports follow the declared layers.
mod tidy;
/// `arc-rec train`: crash and resume, rollback, records, bad input.
#[cfg(feature = "rft")]
mod train;
/// The verl integration: rows, the grader process, compute_score against eval's rewards.
#[cfg(feature = "rft")]
mod verl;
