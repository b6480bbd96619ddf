//! Command-line interface: one binary, one `Command` enum.

use clap::{Parser, Subcommand};

use crate::commands::DatabaseArgs;

/// arc-rec: exports Configuration→Outcome trajectories, fine-tunes a recommender, and serves
/// configuration recommendations ranked by a Thompson-sampling bandit.
#[derive(Debug, Parser)]
#[command(name = "arc-rec", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    #[command(flatten)]
    pub database: DatabaseArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// The things arc-rec does.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create or update the database schema (other commands also do this on start).
    Migrate,
    /// Generate a synthetic Arc-Eval platform history and load it (or write it with --out).
    Simulate(crate::commands::simulate::SimulateArgs),
    /// Load platform records from a JSON-lines file (`-` for stdin).
    Ingest(crate::commands::ingest::IngestArgs),
    /// Write Configuration→Outcome training examples as JSON lines: the platform's decided config
    /// diffs, then the answered recommendations arc-rec served (origin `served`).
    Export(crate::commands::export::ExportArgs),
    /// Serve the HTTP API (recommendations, feedback, trajectories, analytics).
    Serve(crate::commands::serve::ServeArgs),
    /// Create, list, rate-limit and revoke API keys.
    #[command(subcommand)]
    Keys(crate::commands::keys::KeysCommand),
    /// Model versions' lifecycle: list what each served and how it was answered, retire one
    /// (its candidates leave serving) or promote it back.
    #[command(subcommand)]
    Models(crate::commands::models::ModelsCommand),
    /// Analysts' numbers in a terminal: acceptance rates with intervals, grouped.
    #[command(subcommand)]
    Analytics(crate::commands::analytics::AnalyticsCommand),
    /// A period's acceptance rates with intervals, drift alarms and training runs as a one-page
    /// HTML summary with SVG and PNG charts (the dashboard's figures, written to --out).
    Report(crate::commands::report::ReportArgs),
    /// Cluster failure patterns per organization (stable ids; the bandit's failure context).
    Cluster(crate::commands::cluster::ClusterArgs),
    /// Manage the embedded Postgres cluster under --data-dir.
    #[command(subcommand)]
    Db(DbCommand),
    /// Measure performance.
    #[command(subcommand)]
    Bench(crate::commands::bench::BenchCommand),
    /// Create recommender model checkpoints (no database needed).
    #[cfg(feature = "rft")]
    #[command(subcommand)]
    Model(crate::commands::model::ModelCommand),
    /// Reinforcement fine-tune the recommender: warm-up on accepted recommendations, then
    /// pass@k-aware policy-gradient steps (resumable run directory).
    #[cfg(feature = "rft")]
    Train(crate::commands::train::TrainArgs),
    /// Compare a run's base, warm-up and RL models on the held-out prompts: pass@k and maj@k
    /// for k = 1..n, format validity and, with the world grader, true acceptance (and, for a
    /// learned-grader run, the truth of what its learned grader picks among k; no database).
    #[cfg(feature = "rft")]
    Eval(crate::commands::eval::EvalArgs),
    /// Write the trained recommender's candidates for serving: k recommendations per
    /// (organization, failure cluster, typical configuration), tagged with the run's model version.
    ///
    /// Contexts: the run's data (its export file) grouped by organization and by each context's
    /// dominant failure cluster as the export wrote it (the stored cluster id when the history was
    /// clustered with `arc-rec cluster` before the export, else the dominant failure category);
    /// contexts without a recorded failure are left out. For each group the typical configuration
    /// is the one with the most decided examples among the group's contexts (configurations
    /// compared by content), asked with the user turn the export rendered for it.
    ///
    /// The run's RL model (warm-up model + adapter) samples k recommendations for each; those that
    /// pass the graders' format check, bring in only models and tools the organization has run (a
    /// model with statistics in the database, a tool some configuration of it has or whose calls
    /// worked; the summary's `unknown` column counts the others) and pass serving's hard
    /// constraints (a valid configuration after the diff, a real change, no two alike) are
    /// written to candidate_recommendations with
    /// source `model`: diff = the canonical (minimal) merge patch, description = the rationale,
    /// expected deltas and evidence 0. A candidate is stored for its cluster when that is an
    /// active cluster in the database and only that cluster proposed it, else for any cluster.
    /// `serve` ranks them beside the heuristic candidates and says which came from the model.
    /// Fails, writing nothing, when no recommendation passes.
    #[cfg(feature = "rft")]
    Candidates(crate::commands::candidates::CandidatesArgs),
    /// One learning round of an organization on its own data: export its history with the
    /// answers to what was served → train with the learned grader → the checkpoint gate →
    /// candidates (the new version goes live). Resumable, one at a time per organization,
    /// recorded in the `rounds` table; `round list` shows them.
    #[cfg(feature = "rft")]
    #[command(subcommand)]
    Round(crate::commands::round::RoundCommand),
    /// A run's grader for a trainer outside arc-rec (verl, see docs/SCALE-OUT.md): JSON lines of
    /// completions in, rewards and verdicts out (no database).
    #[cfg(feature = "rft")]
    #[command(subcommand)]
    Grade(crate::commands::grade::GradeCommand),
}

/// `arc-rec db ...`.
#[derive(Debug, Subcommand)]
pub enum DbCommand {
    /// Say whether the embedded cluster is running.
    Status,
    /// Stop the embedded cluster (e.g. one left running by a crashed process or a test run).
    Stop,
    /// Print the libpq URL of the running embedded cluster's database, for psql and other
    /// tools: `psql "$(arc-rec db url)"`.
    Url,
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn cli_definition_is_valid() {
        Cli::command().debug_assert();
    }
}
