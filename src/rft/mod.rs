//! Reinforcement fine-tuning of the recommender, the parts that need no libtorch: the prompts of
//! a run read from an export file ([`dataset`]), a completion read as a recommendation with its
//! canonical answer ([`completion`]), and the graders that turn a completion into a reward
//! ([`grader`], judging the synthetic world's cases with [`world_truths`]), and the JSON Schema
//! of a recommendation that constrained generation compiles ([`schema`]). The advantages are the `objectives` crate's; the model side is `trainer`'s.
//! [`model_candidates`] chooses the contexts `arc-rec candidates` asks a trained model about and
//! turns its completions into serving candidates.

pub mod completion;
pub mod dataset;
pub mod grader;
pub mod learned_grader;
pub mod model_candidates;
pub mod schema;
pub mod verl_rows;
pub mod world_truths;

pub use completion::{FormatError, ParsedRecommendation, canonical_answer, parse_recommendation};
pub use dataset::{
    DatasetError, LoggedDecision, LoggedVerdicts, PromptFacts, RftDataset, RftPrompt,
};
pub use grader::{Grader, GraderError, GraderKind, Verdict, WorldReward};
pub use learned_grader::{LearnedGrader, LearnedGraderError, LearnedGraderFile};
pub use world_truths::{WorldTruthError, WorldTruths};
