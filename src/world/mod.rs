//! The synthetic Arc-Eval world: a deterministic generator of a realistic platform history, and
//! the hidden ground truth that later benchmarks score recommenders against.
//!
//! A [`World`] is drawn from [`WorldParams`] (seed, target number of outcomes, organizations,
//! embedding dimension, start date). [`World::history`] streams it as ingest records in reference
//! order; [`Environment`] draws failure contexts and answers for diffs; [`GroundTruth`] says what a
//! diff really does and whether a person accepts it. Pure and deterministic: no IO, no clock, and
//! the same parameters give a byte-identical history. See `docs/WORLD.md`.

mod agent;
mod candidates;
mod catalogue;
mod embedding;
mod environment;
mod failure;
mod history;
mod sampling;
mod trajectory;
mod truth;

#[cfg(test)]
mod tests;

use chrono::{DateTime, Datelike, TimeZone, Utc};
use serde_json::Value;

use crate::domain::records::OrgId;

pub use candidates::{Candidate, RecommendationType, candidate_diffs, classify_diff};
pub use catalogue::{
    DOMAINS, MODELS, ModelSpec, OrgProfile, ROLES, ScenarioSpec, TOOLS, ToolSpec, UserProfile,
    model_spec, providers, tool_spec,
};
pub use environment::{Context, Environment, Feedback, first_best};
pub use failure::FailureMode;
pub use failure::ObservedFailure;
pub use history::History;
pub use truth::{Effect, GroundTruth, HiddenState, Latent, ScenarioProfile};

use embedding::ErrorEmbedder;
use sampling::{pick, stream_rng};

/// Random stream of the catalogue (organizations, users, scenarios).
const STREAM_CATALOGUE: u64 = 0;
/// Random stream of the embedding space.
const STREAM_EMBEDDING: u64 = 1;
/// Configuration `k` draws everything from stream `STREAM_CONFIG_BASE + k`, so any one of them
/// can be regenerated alone (see [`World::config_truth`]).
const STREAM_CONFIG_BASE: u64 = 1 << 32;

/// Most outcomes a world may have (10^8 lines would be tens of gigabytes of JSON).
pub const MAX_OUTCOMES: usize = 50_000_000;
/// Largest embedding dimension (the ingest limit).
pub const MAX_EMBEDDING_DIM: usize = 16_384;

/// What world to draw.
#[derive(Debug, Clone, PartialEq)]
pub struct WorldParams {
    /// Everything follows from this.
    pub seed: u64,
    /// Number of outcomes the history contains (exactly; 0 gives users and scenarios only).
    pub outcomes: usize,
    /// Organization ids; each gets its own users, scenarios and configurations.
    pub orgs: Vec<String>,
    /// Dimension of synthetic `error_embedding`s on failure patterns; `None` leaves them out.
    pub embedding_dim: Option<usize>,
    /// When the history starts; it spans about five months from here.
    pub start: DateTime<Utc>,
}

impl Default for WorldParams {
    fn default() -> Self {
        Self {
            seed: 42,
            outcomes: 20_000,
            orgs: vec!["acme".to_owned(), "globex".to_owned(), "initech".to_owned()],
            embedding_dim: None,
            start: Utc
                .with_ymd_and_hms(2026, 6, 1, 0, 0, 0)
                .single()
                .unwrap_or_default(),
        }
    }
}

/// Parameters a world cannot be drawn from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorldError {
    /// No organizations were given.
    #[error("orgs: at least one organization is required")]
    NoOrgs,
    /// An organization id is malformed.
    #[error("orgs: {0}")]
    InvalidOrg(String),
    /// An organization id appears twice.
    #[error("orgs: {0:?} is listed twice")]
    DuplicateOrg(String),
    /// Too many outcomes.
    #[error("outcomes: at most {MAX_OUTCOMES} are supported, got {0}")]
    TooManyOutcomes(usize),
    /// Embedding dimension zero or too large.
    #[error("embedding_dim: must be between 1 and {MAX_EMBEDDING_DIM}, got {0}")]
    EmbeddingDim(usize),
    /// A start date whose history would leave the calendar chrono supports.
    #[error("start: must be between 1970 and 9000, got {0}")]
    Start(String),
}

/// A drawn world: its catalogue, and the recipe for its history.
#[derive(Debug, Clone, PartialEq)]
pub struct World {
    params: WorldParams,
    org_ids: Vec<OrgId>,
    pub(crate) orgs: Vec<OrgProfile>,
    pub(crate) embedder: Option<ErrorEmbedder>,
    configurations: usize,
}

/// The hidden truth about one configuration of the history.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigTruth {
    /// `configurations.config_id`.
    pub config_id: String,
    /// Its owner, who reviews its diffs (with their hidden strictness).
    pub user: UserProfile,
    /// Its hidden circumstances and workload; failure rates are those of its first version.
    pub hidden: HiddenState,
    /// Its first version's configuration.
    pub initial_config: Value,
}

impl World {
    /// Draws the world's catalogue and plans its history (how many configurations it takes to
    /// reach `params.outcomes`).
    pub fn new(params: WorldParams) -> Result<Self, WorldError> {
        if params.orgs.is_empty() {
            return Err(WorldError::NoOrgs);
        }
        let mut org_ids: Vec<OrgId> = Vec::with_capacity(params.orgs.len());
        for raw in &params.orgs {
            let id = OrgId::parse(raw).map_err(WorldError::InvalidOrg)?;
            if org_ids.contains(&id) {
                return Err(WorldError::DuplicateOrg(raw.clone()));
            }
            org_ids.push(id);
        }
        if params.outcomes > MAX_OUTCOMES {
            return Err(WorldError::TooManyOutcomes(params.outcomes));
        }
        if let Some(dim) = params.embedding_dim
            && (dim == 0 || dim > MAX_EMBEDDING_DIM)
        {
            return Err(WorldError::EmbeddingDim(dim));
        }
        if !(1970..=9000).contains(&params.start.year()) {
            return Err(WorldError::Start(params.start.to_rfc3339()));
        }

        let mut rng = stream_rng(params.seed, STREAM_CATALOGUE);
        // Organizations get different main domains while there are domains to go round.
        let mut domains: Vec<&'static str> = DOMAINS.to_vec();
        let orgs = org_ids
            .iter()
            .map(|id| {
                if domains.is_empty() {
                    domains = DOMAINS.to_vec();
                }
                let i = pick(&mut rng, &(0..domains.len()).collect::<Vec<_>>())
                    .copied()
                    .unwrap_or(0);
                let domain = domains.remove(i);
                catalogue::draw_org(&mut rng, id.as_str(), domain)
            })
            .collect::<Vec<_>>();
        let embedder = params
            .embedding_dim
            .map(|dim| ErrorEmbedder::new(params.seed, dim));

        let mut planned = 0usize;
        let mut configurations = 0usize;
        while planned < params.outcomes {
            let mut config_rng =
                stream_rng(params.seed, STREAM_CONFIG_BASE + configurations as u64);
            planned += history::draw_plan(&mut config_rng, &orgs).outcomes();
            configurations += 1;
        }
        Ok(Self {
            params,
            org_ids,
            orgs,
            embedder,
            configurations,
        })
    }

    /// The parameters this world was drawn from.
    pub fn params(&self) -> &WorldParams {
        &self.params
    }

    /// Organizations with their users and scenarios.
    pub fn orgs(&self) -> &[OrgProfile] {
        &self.orgs
    }

    /// Number of configurations the history contains.
    pub fn configuration_count(&self) -> usize {
        self.configurations
    }

    /// The ground truth (stateless; here for discoverability).
    pub fn ground_truth(&self) -> GroundTruth {
        GroundTruth
    }

    /// The history as a stream of ingest records in reference order: users and scenarios, then
    /// configuration by configuration its versions, simulations, outcomes, failure patterns and
    /// proposed diffs. Generated lazily; memory stays bounded whatever the size.
    pub fn history(&self) -> History<'_> {
        History::new(self)
    }

    /// The hidden truth about a configuration of the history, found by regenerating each
    /// configuration's opening draws (linear in the number of configurations, no history needed).
    pub fn config_truth(&self, config_id: &str) -> Option<ConfigTruth> {
        (0..self.configurations).find_map(|k| {
            let opening = history::open_config(self, k);
            (opening.config_id == config_id).then(|| opening.truth(self))
        })
    }

    /// The hidden truth about every configuration of the history, in history order (as
    /// [`World::config_truth`], without the search).
    pub fn config_truths(&self) -> impl Iterator<Item = ConfigTruth> + '_ {
        (0..self.configurations).map(|k| history::open_config(self, k).truth(self))
    }

    pub(crate) fn org_id(&self, index: usize) -> &OrgId {
        &self.org_ids[index]
    }
}
