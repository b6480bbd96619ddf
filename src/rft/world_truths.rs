//! The synthetic world's hidden truth about the configurations of a set of prompts: each one's
//! owner and hidden circumstances, from which the world's acceptance probability and effect of any
//! patch follow. The world grader and `arc-rec eval`'s baselines judge with the same truths.

use std::collections::HashMap;

use serde_json::Value;

use super::dataset::RftPrompt;
use crate::world::{Effect, GroundTruth, HiddenState, UserProfile, World, WorldError, WorldParams};

/// Why the truths of a set of prompts cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum WorldTruthError {
    #[error("the world cannot be built")]
    World(#[from] WorldError),
    #[error(
        "configuration {config_id} (prompt {prompt}) is not in the world of seed {seed} with {outcomes} outcomes"
    )]
    UnknownConfig {
        prompt: String,
        config_id: String,
        seed: u64,
        outcomes: usize,
    },
}

/// The owner and hidden state of every configuration some prompts name.
#[derive(Debug, Clone)]
pub struct WorldTruths {
    /// `config_id` → (owner, hidden state).
    truths: HashMap<String, (UserProfile, HiddenState)>,
    /// The world's seed and outcomes, for errors.
    seed: u64,
    outcomes: usize,
}

impl WorldTruths {
    /// Draws the world `params` describes and keeps the truth of the configurations `prompts`
    /// name; every one must be in that world.
    pub fn new<'a>(
        params: WorldParams,
        prompts: impl IntoIterator<Item = &'a RftPrompt>,
    ) -> Result<Self, WorldTruthError> {
        let (seed, outcomes) = (params.seed, params.outcomes);
        let world = World::new(params)?;
        let mut all: HashMap<String, (UserProfile, HiddenState)> = world
            .config_truths()
            .map(|t| (t.config_id, (t.user, t.hidden)))
            .collect();
        let mut truths = HashMap::new();
        for prompt in prompts {
            if truths.contains_key(&prompt.config_id) {
                continue;
            }
            let truth = all
                .remove(&prompt.config_id)
                .ok_or_else(|| unknown(prompt, seed, outcomes))?;
            truths.insert(prompt.config_id.clone(), truth);
        }
        Ok(Self {
            truths,
            seed,
            outcomes,
        })
    }

    fn truth(&self, prompt: &RftPrompt) -> Result<&(UserProfile, HiddenState), WorldTruthError> {
        self.truths
            .get(&prompt.config_id)
            .ok_or_else(|| unknown(prompt, self.seed, self.outcomes))
    }

    /// The true probability that the owner of `prompt`'s configuration accepts `patch` over its
    /// current configuration.
    pub fn acceptance_probability(
        &self,
        prompt: &RftPrompt,
        patch: &Value,
    ) -> Result<f64, WorldTruthError> {
        let (user, hidden) = self.truth(prompt)?;
        Ok(GroundTruth.acceptance_probability(user, hidden, &prompt.current_config, patch))
    }

    /// What applying `patch` to `prompt`'s configuration truly does.
    pub fn effect(&self, prompt: &RftPrompt, patch: &Value) -> Result<Effect, WorldTruthError> {
        let (_, hidden) = self.truth(prompt)?;
        Ok(GroundTruth.effect(hidden, &prompt.current_config, patch))
    }
}

fn unknown(prompt: &RftPrompt, seed: u64, outcomes: usize) -> WorldTruthError {
    WorldTruthError::UnknownConfig {
        prompt: prompt.id.clone(),
        config_id: prompt.config_id.clone(),
        seed,
        outcomes,
    }
}
