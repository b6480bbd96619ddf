//! The fitted clustering of one organization and request-time assignment: [`ClusterModel::assign`]
//! places a failure (a client embedding, failure texts, or both) in a cluster in microseconds,
//! with no IO. [`StoredModel`] is its plain-data form for storage.
//!
//! A model has a *text view* always (hashed TF-IDF, its projection and every cluster's centroid in
//! it) and an *embedding view* when the organization sends embeddings; the primary view (the one
//! clustered in, whose reduced vectors the bandit sees) is the embedding view when there is one.
//! The text view lets failure texts be placed even where clustering ran on embeddings, as the
//! recommendations API promises ("any one of the embedding, the failures ... is enough").

use serde::{Deserialize, Serialize};

use super::ClusterError;
use super::featurize::{FailureDoc, FailureText, HashedTfIdf, Sparse};
use super::reduce::Projection;

/// Where a model's primary vectors come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FeaturizerKind {
    /// arc-rec's hashed TF-IDF of the failure's text.
    HashedTfidf,
    /// The client's `error_embedding`s.
    ClientEmbedding,
}

impl FeaturizerKind {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            FeaturizerKind::HashedTfidf => "hashed_tfidf",
            FeaturizerKind::ClientEmbedding => "client_embedding",
        }
    }

    /// Parses a stored name.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "hashed_tfidf" => Some(FeaturizerKind::HashedTfidf),
            "client_embedding" => Some(FeaturizerKind::ClientEmbedding),
            _ => None,
        }
    }
}

/// A projection as stored: `components` row-major `dims x input_dim`.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredProjection {
    /// Input dimension.
    pub input_dim: usize,
    /// Mean subtracted before projecting.
    pub mean: Vec<f32>,
    /// Components, row-major.
    pub components: Vec<f32>,
    /// Share of variance per component.
    pub explained: Vec<f32>,
}

/// One cluster as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredCluster {
    /// Stable id (`failure_clusters.cluster_id`).
    pub cluster_id: String,
    /// Readable label, unique among the organization's active clusters.
    pub label: String,
    /// Centroid in the primary reduced space (`failure_clusters.centroid`).
    pub centroid: Vec<f32>,
    /// Centroid in the text view's reduced space.
    pub text_centroid: Vec<f32>,
    /// 90th percentile of members' distance to the centroid (primary space).
    pub radius: f64,
    /// The same in the text view.
    pub text_radius: f64,
    /// Members.
    pub size: usize,
}

/// A model as stored: everything [`ClusterModel`] needs, as plain data.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredModel {
    /// The organization.
    pub org_id: String,
    /// Increases with every re-clustering.
    pub version: i32,
    /// What the primary view reads.
    pub featurizer: FeaturizerKind,
    /// Reduced dimension (the bandit's cluster-context size).
    pub dims: usize,
    /// Clustering method (`kmeans`).
    pub method: String,
    /// The text featurizer.
    pub text_featurizer: HashedTfIdf,
    /// The text view's projection.
    pub text: StoredProjection,
    /// The embedding view's projection (client-embedding models only).
    pub embedding: Option<StoredProjection>,
    /// Shared per-dimension variance of members around their centroid (primary space).
    pub sigma2: f64,
    /// The same in the text view.
    pub text_sigma2: f64,
    /// Patterns the model was fit on.
    pub patterns: usize,
    /// Fit figures (silhouette, k tried, ...), for people.
    pub quality: serde_json::Value,
    /// The active clusters.
    pub clusters: Vec<StoredCluster>,
}

/// What to place: a client embedding, failure texts, or both (the embedding wins where the model
/// has an embedding view; the texts are used otherwise).
#[derive(Debug, Clone, PartialEq)]
pub enum FailureInput {
    /// `failure_cluster_embedding`.
    Embedding(Vec<f32>),
    /// `failures[]`.
    Failures(Vec<FailureText>),
    /// Both.
    Both {
        embedding: Vec<f32>,
        failures: Vec<FailureText>,
    },
}

/// Which view placed a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PlacedBy {
    /// The client embedding.
    Embedding,
    /// The failure texts.
    Text,
}

/// Where a failure belongs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Assignment {
    /// Stable cluster id.
    pub cluster_id: String,
    /// Readable label.
    pub label: String,
    /// Distance to the cluster's centroid in the view that placed it.
    pub distance: f64,
    /// How sure, 0–1: the cluster's posterior among all clusters (isotropic, shared variance),
    /// shrunk when the failure lies beyond the cluster's usual radius.
    pub confidence: f64,
    /// The failure's vector in the primary reduced space (the bandit's context). Placed by text
    /// in an embedding model, it is the cluster's centroid.
    pub reduced: Vec<f64>,
    /// Which view placed it.
    pub placed_by: PlacedBy,
}

#[derive(Debug, Clone, PartialEq)]
struct Cluster {
    id: String,
    label: String,
    centroid: Vec<f64>,
    text_centroid: Vec<f64>,
    radius: f64,
    text_radius: f64,
    size: usize,
}

/// An organization's fitted clustering, ready to place failures.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterModel {
    stored: StoredModel,
    text: Projection,
    embedding: Option<Projection>,
    clusters: Vec<Cluster>,
}

impl ClusterModel {
    /// Validates stored parts and builds the runtime model.
    pub fn from_stored(stored: StoredModel) -> Result<Self, ClusterError> {
        let dims = stored.dims;
        if !(1..=super::MAX_DIMS).contains(&dims) {
            return Err(ClusterError::Corrupt(format!("reduced dimension {dims}")));
        }
        if stored.clusters.is_empty() {
            return Err(ClusterError::Corrupt("a model without clusters".into()));
        }
        let projection = |p: &StoredProjection| {
            Projection::from_parts(
                p.input_dim,
                dims,
                widen(&p.mean),
                &widen(&p.components),
                widen(&p.explained),
            )
        };
        let text = projection(&stored.text)?;
        if text.input_dim() != stored.text_featurizer.buckets
            || stored.text_featurizer.idf.len() != stored.text_featurizer.buckets
        {
            return Err(ClusterError::Corrupt(format!(
                "text projection over {} inputs for {} buckets and {} idf values",
                text.input_dim(),
                stored.text_featurizer.buckets,
                stored.text_featurizer.idf.len()
            )));
        }
        let embedding = stored.embedding.as_ref().map(projection).transpose()?;
        if (stored.featurizer == FeaturizerKind::ClientEmbedding) != embedding.is_some() {
            return Err(ClusterError::Corrupt(
                "featurizer kind and embedding projection disagree".into(),
            ));
        }
        let mut clusters = Vec::with_capacity(stored.clusters.len());
        for c in &stored.clusters {
            if c.centroid.len() != dims || c.text_centroid.len() != dims {
                return Err(ClusterError::Corrupt(format!(
                    "cluster {} has a centroid of {} values for {dims} dimensions",
                    c.cluster_id,
                    c.centroid.len()
                )));
            }
            let centroid = widen(&c.centroid);
            let text_centroid = widen(&c.text_centroid);
            if centroid
                .iter()
                .chain(&text_centroid)
                .any(|v| !v.is_finite())
            {
                return Err(ClusterError::Corrupt(format!(
                    "cluster {} has a non-finite centroid",
                    c.cluster_id
                )));
            }
            clusters.push(Cluster {
                id: c.cluster_id.clone(),
                label: c.label.clone(),
                centroid,
                text_centroid,
                radius: finite_positive(c.radius),
                text_radius: finite_positive(c.text_radius),
                size: c.size,
            });
        }
        Ok(Self {
            stored,
            text,
            embedding,
            clusters,
        })
    }

    /// The plain-data form, for storage.
    pub fn stored(&self) -> &StoredModel {
        &self.stored
    }

    /// The organization.
    pub fn org_id(&self) -> &str {
        &self.stored.org_id
    }

    /// Model version.
    pub fn version(&self) -> i32 {
        self.stored.version
    }

    /// Reduced dimension.
    pub fn dims(&self) -> usize {
        self.stored.dims
    }

    /// What the primary view reads.
    pub fn featurizer(&self) -> FeaturizerKind {
        self.stored.featurizer
    }

    /// The client embedding dimension this model expects, if it reads embeddings.
    pub fn embedding_dim(&self) -> Option<usize> {
        self.embedding.as_ref().map(Projection::input_dim)
    }

    /// `(cluster_id, label, size)` of every cluster.
    pub fn clusters(&self) -> impl Iterator<Item = (&str, &str, usize)> {
        self.clusters
            .iter()
            .map(|c| (c.id.as_str(), c.label.as_str(), c.size))
    }

    /// The primary projection (embedding view if any, else text view).
    pub(crate) fn primary(&self) -> &Projection {
        self.embedding.as_ref().unwrap_or(&self.text)
    }

    /// Primary-space centroids, in cluster order.
    pub(crate) fn centroids(&self) -> impl Iterator<Item = (&str, &[f64])> {
        self.clusters
            .iter()
            .map(|c| (c.id.as_str(), c.centroid.as_slice()))
    }

    /// Places a failure.
    pub fn assign(&self, input: &FailureInput) -> Result<Assignment, ClusterError> {
        let (embedding, failures) = match input {
            FailureInput::Embedding(e) => (Some(e.as_slice()), None),
            FailureInput::Failures(f) => (None, Some(f.as_slice())),
            FailureInput::Both {
                embedding,
                failures,
            } => (Some(embedding.as_slice()), Some(failures.as_slice())),
        };
        match (&self.embedding, embedding, failures) {
            (Some(_), Some(e), _) => self.assign_embedding(e),
            (None, Some(_), Some(f)) | (_, None, Some(f)) => self.assign_texts(f),
            (None, Some(_), None) => Err(ClusterError::NoEmbeddingModel {
                org_id: self.stored.org_id.clone(),
            }),
            (_, None, None) => Err(ClusterError::EmptyInput),
        }
    }

    /// Places a client embedding (checked: dimension, finite, not zero).
    pub fn assign_embedding(&self, embedding: &[f32]) -> Result<Assignment, ClusterError> {
        let Some(projection) = &self.embedding else {
            return Err(ClusterError::NoEmbeddingModel {
                org_id: self.stored.org_id.clone(),
            });
        };
        let x = normalized_embedding(embedding, projection.input_dim())?;
        let reduced = projection.project_dense(&x);
        Ok(self.place_primary(reduced, PlacedBy::Embedding))
    }

    /// Places failure texts (their vectors summed, as one context).
    pub fn assign_texts(&self, failures: &[FailureText]) -> Result<Assignment, ClusterError> {
        if failures.is_empty() {
            return Err(ClusterError::EmptyInput);
        }
        let docs: Vec<FailureDoc<'_>> = failures.iter().map(text_doc).collect();
        let vector = self.text_vector(&docs);
        if vector.is_empty() {
            return Err(ClusterError::EmptyInput);
        }
        let reduced = self.text.project_sparse(&vector);
        if self.embedding.is_none() {
            return Ok(self.place_primary(reduced, PlacedBy::Text));
        }
        let (i, distance, confidence) = self.nearest(&reduced, true);
        let c = &self.clusters[i];
        Ok(Assignment {
            cluster_id: c.id.clone(),
            label: c.label.clone(),
            distance,
            confidence,
            reduced: c.centroid.clone(),
            placed_by: PlacedBy::Text,
        })
    }

    /// The normalized sum of the documents' vectors.
    pub(crate) fn text_vector(&self, docs: &[FailureDoc<'_>]) -> Sparse {
        let mut sum: Vec<(u32, f64)> = Vec::new();
        for doc in docs {
            sum.extend(self.stored.text_featurizer.transform(doc));
        }
        sum.sort_unstable_by_key(|(b, _)| *b);
        let mut merged: Sparse = Vec::with_capacity(sum.len());
        for (b, v) in sum {
            match merged.last_mut() {
                Some((last, total)) if *last == b => *total += v,
                _ => merged.push((b, v)),
            }
        }
        let norm = merged.iter().map(|(_, v)| v * v).sum::<f64>().sqrt();
        if !(norm > 0.0 && norm.is_finite()) {
            return Vec::new();
        }
        merged.iter_mut().for_each(|(_, v)| *v /= norm);
        merged
    }

    /// Text-view reduced vector of one document.
    #[cfg(test)]
    pub(crate) fn text_reduced(&self, doc: &FailureDoc<'_>) -> Vec<f64> {
        self.text
            .project_sparse(&self.stored.text_featurizer.transform(doc))
    }

    /// Primary-space reduced vector of an embedding, if it is valid for this model.
    pub(crate) fn embedding_reduced(&self, embedding: &[f32]) -> Option<Vec<f64>> {
        let projection = self.embedding.as_ref()?;
        let x = normalized_embedding(embedding, projection.input_dim()).ok()?;
        Some(projection.project_dense(&x))
    }

    /// Cluster index, distance and confidence of a primary-space vector.
    pub(crate) fn place_reduced(&self, reduced: &[f64], text_view: bool) -> (usize, f64, f64) {
        self.nearest(reduced, text_view)
    }

    pub(crate) fn cluster_id(&self, index: usize) -> &str {
        &self.clusters[index].id
    }

    fn place_primary(&self, reduced: Vec<f64>, placed_by: PlacedBy) -> Assignment {
        let (i, distance, confidence) = self.nearest(&reduced, false);
        let c = &self.clusters[i];
        Assignment {
            cluster_id: c.id.clone(),
            label: c.label.clone(),
            distance,
            confidence,
            reduced,
            placed_by,
        }
    }

    /// Nearest cluster by Euclidean distance, with its posterior-based confidence.
    fn nearest(&self, z: &[f64], text_view: bool) -> (usize, f64, f64) {
        let sigma2 = if text_view {
            self.stored.text_sigma2
        } else {
            self.stored.sigma2
        };
        let sigma2 = finite_positive(sigma2);
        let mut best = (0usize, f64::INFINITY);
        // Squared distances, reused for the posterior.
        let mut d2 = [0.0f64; super::MAX_CLUSTERS];
        let k = self.clusters.len().min(super::MAX_CLUSTERS);
        for (i, c) in self.clusters.iter().take(k).enumerate() {
            let centre = if text_view {
                &c.text_centroid
            } else {
                &c.centroid
            };
            let d: f64 = z.iter().zip(centre).map(|(a, b)| (a - b) * (a - b)).sum();
            d2[i] = d;
            if d < best.1 {
                best = (i, d);
            }
        }
        let (i, best_d2) = best;
        // Posterior of the nearest cluster under equal-variance isotropic Gaussians, computed
        // relative to the nearest so nothing underflows.
        let denominator: f64 = d2[..k]
            .iter()
            .map(|d| (-(d - best_d2) / (2.0 * sigma2)).exp())
            .sum();
        let posterior = if denominator.is_finite() && denominator > 0.0 {
            1.0 / denominator
        } else {
            1.0
        };
        let distance = best_d2.sqrt();
        let radius = if text_view {
            self.clusters[i].text_radius
        } else {
            self.clusters[i].radius
        }
        .max(MIN_RADIUS);
        let outside = ((distance - radius) / radius).max(0.0);
        let confidence = (posterior * (-outside).exp()).clamp(0.0, 1.0);
        (
            i,
            distance,
            if confidence.is_finite() {
                confidence
            } else {
                0.0
            },
        )
    }
}

/// Failure vectors have unit length before projection, so reduced distances live in [0, 2]; a
/// cluster whose members are near copies (one wording) has a radius near 0, and without a floor
/// any new wording would get no confidence at all.
const MIN_RADIUS: f64 = 0.1;

/// A request's failure text as a featurizer document.
fn text_doc(f: &FailureText) -> FailureDoc<'_> {
    FailureDoc {
        failure_category: &f.failure_category,
        failure_type: None,
        error_message: &f.error_message,
        error_types: f.error_type.as_deref().into_iter().collect(),
        tools: f.tool_name.as_deref().into_iter().collect(),
        providers: Vec::new(),
    }
}

/// Checks a client embedding and scales it to unit length.
pub(crate) fn normalized_embedding(
    embedding: &[f32],
    expected: usize,
) -> Result<Vec<f64>, ClusterError> {
    if embedding.len() != expected {
        return Err(ClusterError::DimensionMismatch {
            expected,
            actual: embedding.len(),
        });
    }
    if let Some(index) = embedding.iter().position(|v| !v.is_finite()) {
        return Err(ClusterError::NonFiniteEmbedding { index });
    }
    let norm = embedding
        .iter()
        .map(|&v| f64::from(v) * f64::from(v))
        .sum::<f64>()
        .sqrt();
    if norm.is_nan() || norm <= 0.0 {
        return Err(ClusterError::ZeroEmbedding);
    }
    Ok(embedding.iter().map(|&v| f64::from(v) / norm).collect())
}

fn widen(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
}

/// A usable positive scale (radius, variance); tiny or broken values become a small default so
/// confidence stays defined.
fn finite_positive(v: f64) -> f64 {
    if v.is_finite() && v > 1e-9 { v } else { 1e-3 }
}
