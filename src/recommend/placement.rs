//! Placing a failure context in its organization's failure clusters, as serving does for every
//! request and `bench pipeline` does for the world's contexts. Pure: the clustering model is
//! given.

use crate::candidates::FailureObservation;
use crate::clustering::{Assignment, ClusterError, ClusterModel, FailureInput, FailureText};

/// Why a context could not be placed.
#[derive(Debug, thiserror::Error)]
pub enum PlacementError {
    /// The client's input cannot be used (wrong embedding dimension, not finite, zero).
    #[error("{field}: {message}")]
    Context { field: String, message: String },
    #[error(transparent)]
    Cluster(ClusterError),
}

/// Places the context in a cluster. A client embedding an organization clustered from text
/// cannot use is not an error (the contract allows any one of the inputs): the failures place
/// it then, or nothing does.
pub fn place(
    model: &ClusterModel,
    embedding: Option<&[f32]>,
    failures: &[FailureObservation],
) -> Result<Option<Assignment>, PlacementError> {
    let texts: Vec<FailureText> = failures
        .iter()
        .map(|f| FailureText {
            failure_category: f.failure_category.clone().unwrap_or_default(),
            error_message: f.error_message.clone().unwrap_or_default(),
            tool_name: f.tool_name.clone(),
            error_type: None,
        })
        .collect();
    let input = match (embedding, texts.is_empty()) {
        (Some(e), true) => FailureInput::Embedding(e.to_vec()),
        (Some(e), false) => FailureInput::Both {
            embedding: e.to_vec(),
            failures: texts.clone(),
        },
        (None, false) => FailureInput::Failures(texts.clone()),
        (None, true) => return Ok(None),
    };
    match model.assign(&input) {
        Ok(assignment) => Ok(Some(assignment)),
        Err(ClusterError::NoEmbeddingModel { .. }) if !texts.is_empty() => model
            .assign(&FailureInput::Failures(texts))
            .map(Some)
            .map_err(PlacementError::Cluster),
        Err(ClusterError::NoEmbeddingModel { .. } | ClusterError::EmptyInput) => Ok(None),
        Err(
            e @ (ClusterError::DimensionMismatch { .. }
            | ClusterError::NonFiniteEmbedding { .. }
            | ClusterError::ZeroEmbedding),
        ) => Err(PlacementError::Context {
            field: "failure_context.failure_cluster_embedding".into(),
            message: strip_field(&e.to_string()),
        }),
        Err(other) => Err(PlacementError::Cluster(other)),
    }
}

fn strip_field(message: &str) -> String {
    message
        .split_once(": ")
        .map_or(message, |(_, m)| m)
        .to_owned()
}
