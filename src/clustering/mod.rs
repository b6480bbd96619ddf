//! Failure clustering: groups an organization's failure patterns into clusters with stable,
//! readable ids, and places new failures into them at request time.
//!
//! Pipeline per organization ([`fit_org`]): featurize (client embeddings when nearly every pattern
//! has one of the same dimension, else arc-rec's hashed TF-IDF of the failure's text) → PCA to the
//! bandit's context size ([`reduce`]) → k-means with k by silhouette ([`kmeans`]) → match the new
//! clusters to the previous ones so ids persist ([`ids`]) → a [`ClusterModel`] that
//! [`ClusterModel::assign`]s failures without IO. Storage (`storage::clusters`) persists the model,
//! the clusters and each pattern's cluster in one transaction.

mod featurize;
mod ids;
mod kmeans;
mod model;
pub mod quality;
mod reduce;

#[cfg(test)]
mod eval;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};

use ndarray::Array2;
use serde::Serialize;

pub use featurize::{BlockWeights, DEFAULT_BUCKETS, FailureText, HashedTfIdf};
pub use model::{
    Assignment, ClusterModel, FailureInput, FeaturizerKind, PlacedBy, StoredCluster, StoredModel,
    StoredProjection,
};
pub use reduce::Projection;

use featurize::{FailureDoc, Sparse};
use ids::{LabelParts, distance, dominant, fresh, match_by_cost, unique_labels};
use kmeans::KChoice;

/// Smallest and largest reduced dimension.
pub const MIN_DIMS: usize = 2;
/// Largest reduced dimension.
pub const MAX_DIMS: usize = 64;
/// Most clusters per organization.
pub const MAX_CLUSTERS: usize = 64;
/// The method [`fit_org`] uses.
pub const METHOD: &str = "kmeans";

/// Errors of clustering and assignment.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// Nothing to cluster or place.
    #[error("no failures to cluster or place")]
    EmptyInput,
    /// A client embedding of the wrong length.
    #[error(
        "failure_cluster_embedding: expected {expected} dimensions (the organization's model), got {actual}"
    )]
    DimensionMismatch { expected: usize, actual: usize },
    /// A client embedding with NaN or infinity.
    #[error("failure_cluster_embedding: value {index} is not a finite number")]
    NonFiniteEmbedding { index: usize },
    /// A client embedding of zeros has no direction.
    #[error("failure_cluster_embedding: all values are zero")]
    ZeroEmbedding,
    /// An embedding came for an organization whose clusters were built from text.
    #[error(
        "failure_cluster_embedding: organization {org_id} is clustered from failure text; send failures instead"
    )]
    NoEmbeddingModel { org_id: String },
    /// Bad options.
    #[error("{0}")]
    InvalidOption(String),
    /// Dimension reduction failed.
    #[error("dimension reduction failed: {0}")]
    Reduction(String),
    /// The clustering algorithm failed.
    #[error("clustering failed: {0}")]
    Clustering(String),
    /// A stored model is inconsistent.
    #[error("stored cluster model is inconsistent: {0}")]
    Corrupt(String),
}

/// How to cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterOptions {
    /// Reduced dimension, [`MIN_DIMS`]..=[`MAX_DIMS`].
    pub dims: usize,
    /// Number of clusters; `None` chooses by silhouette up to `max_k`.
    pub k: Option<usize>,
    /// Fine groups found before they are grouped into clusters (the most clusters k can be).
    pub max_k: usize,
    /// Hash buckets of the text featurizer.
    pub buckets: usize,
    /// Feature block weights of the text featurizer.
    pub weights: BlockWeights,
    /// Seed of k-means.
    pub seed: u64,
    /// Centroids of two fits closer than this (in the shared input space, where failure vectors
    /// have unit length) are the same cluster.
    pub match_threshold: f64,
    /// Client embeddings are used when at least this share of patterns has one of the same
    /// dimension.
    pub min_embedding_share: f64,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        Self {
            dims: 16,
            k: None,
            max_k: 32,
            buckets: DEFAULT_BUCKETS,
            weights: BlockWeights::default(),
            seed: 17,
            match_threshold: 0.35,
            min_embedding_share: 0.9,
        }
    }
}

impl ClusterOptions {
    fn validate(&self) -> Result<(), ClusterError> {
        if !(MIN_DIMS..=MAX_DIMS).contains(&self.dims) {
            return Err(ClusterError::InvalidOption(format!(
                "dims: must be between {MIN_DIMS} and {MAX_DIMS}, got {}",
                self.dims
            )));
        }
        if let Some(k) = self.k
            && !(1..=MAX_CLUSTERS).contains(&k)
        {
            return Err(ClusterError::InvalidOption(format!(
                "k: must be between 1 and {MAX_CLUSTERS}, got {k}"
            )));
        }
        if !(2..=MAX_CLUSTERS).contains(&self.max_k) {
            return Err(ClusterError::InvalidOption(format!(
                "max_k: must be between 2 and {MAX_CLUSTERS}, got {}",
                self.max_k
            )));
        }
        if !(16..=1 << 20).contains(&self.buckets) {
            return Err(ClusterError::InvalidOption(format!(
                "buckets: must be between 16 and {}, got {}",
                1 << 20,
                self.buckets
            )));
        }
        Ok(())
    }
}

/// One stored failure pattern with what its outcome's trajectory says about it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PatternInput {
    /// `failure_patterns.pattern_id`.
    pub pattern_id: String,
    /// `failure_type`.
    pub failure_type: String,
    /// `failure_category`.
    pub failure_category: String,
    /// `error_message`.
    pub error_message: String,
    /// `error_embedding`, when the client sent one.
    pub error_embedding: Option<Vec<f32>>,
    /// `error_type`s of the trajectory's unrecovered error events.
    pub error_types: Vec<String>,
    /// Tools whose calls failed in the trajectory.
    pub failing_tools: Vec<String>,
    /// Every tool the trajectory called (names to normalize out of messages).
    pub tools: Vec<String>,
    /// Providers of the trajectory's models (`openai` from `openai/gpt-4.1`).
    pub providers: Vec<String>,
    /// The pattern's cluster before this run.
    pub previous_cluster: Option<String>,
}

impl PatternInput {
    fn doc(&self) -> FailureDoc<'_> {
        FailureDoc {
            failure_category: &self.failure_category,
            failure_type: Some(&self.failure_type),
            error_message: &self.error_message,
            error_types: self.error_types.iter().map(String::as_str).collect(),
            tools: self.failing_tools.iter().map(String::as_str).collect(),
            providers: self.providers.iter().map(String::as_str).collect(),
        }
    }

    /// The tool or provider a label names: the first failing tool, else the first provider.
    fn subject(&self) -> Option<&str> {
        self.failing_tools
            .first()
            .or(self.providers.first())
            .map(String::as_str)
    }
}

/// What the organization had before this run.
#[derive(Debug, Clone, Default)]
pub struct Previous {
    /// Its last model.
    pub model: Option<ClusterModel>,
    /// Every cluster id it ever used (active or retired): new ids must differ.
    pub cluster_ids: BTreeSet<String>,
}

/// A pattern's cluster.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PatternAssignment {
    /// `failure_patterns.pattern_id`.
    pub pattern_id: String,
    /// Its cluster.
    pub cluster_id: String,
    /// `cluster_confidence`.
    pub confidence: f64,
}

/// What a run did for one organization.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FitSummary {
    /// The organization.
    pub org_id: String,
    /// Model version written.
    pub version: i32,
    /// Clustering method.
    pub method: String,
    /// Featurizer of the primary view.
    pub featurizer: FeaturizerKind,
    /// Clusters.
    pub k: usize,
    /// Patterns clustered.
    pub patterns: usize,
    /// Of those, placed through the text view because their embedding was missing or unusable.
    pub placed_by_text: usize,
    /// Reduced dimension.
    pub dims: usize,
    /// Input dimension of the primary view.
    pub input_dim: usize,
    /// Share of the variance the reduced dimensions keep.
    pub explained_variance: f64,
    /// Mean silhouette (subsample), when there are two clusters or more.
    pub silhouette: Option<f64>,
    /// Silhouette per k tried.
    pub k_tried: Vec<(usize, f64)>,
    /// Clusters that kept their id.
    pub ids_kept: usize,
    /// Clusters with a new id.
    pub ids_new: usize,
    /// Old clusters that no longer exist.
    pub retired: Vec<String>,
    /// `(cluster_id, label, size)`, largest first.
    pub clusters: Vec<(String, String, usize)>,
}

/// A run's result, ready to store.
#[derive(Debug, Clone)]
pub struct FitOutcome {
    /// The new model.
    pub model: ClusterModel,
    /// Every input pattern's cluster.
    pub assignments: Vec<PatternAssignment>,
    /// Figures.
    pub summary: FitSummary,
}

/// Clusters one organization's patterns.
pub fn fit_org(
    org_id: &str,
    patterns: &[PatternInput],
    previous: &Previous,
    options: &ClusterOptions,
) -> Result<FitOutcome, ClusterError> {
    options.validate()?;
    if patterns.is_empty() {
        return Err(ClusterError::EmptyInput);
    }
    let n = patterns.len();
    let dims = options.dims;

    // Text view: always.
    let docs: Vec<FailureDoc<'_>> = patterns.iter().map(PatternInput::doc).collect();
    let text_featurizer = featurize::HashedTfIdf::fit(
        &docs,
        patterns
            .iter()
            .flat_map(|p| p.tools.iter().map(String::as_str)),
        options.buckets,
        options.weights,
    );
    let text_vectors: Vec<Sparse> = docs.iter().map(|d| text_featurizer.transform(d)).collect();
    let text_projection = reduce::fit_pca(&dense_sample(&text_vectors, options.buckets), dims)?;
    let text_reduced: Vec<Vec<f64>> = text_vectors
        .iter()
        .map(|v| text_projection.project_sparse(v))
        .collect();

    // Embedding view: when nearly every pattern has a usable embedding of one dimension.
    let embedding_dim = common_embedding_dim(patterns, options.min_embedding_share);
    let mut embedding_projection = None;
    let mut primary_rows: Vec<usize> = (0..n).collect();
    let mut primary_reduced = text_reduced.clone();
    if let Some(dim) = embedding_dim {
        let usable: Vec<(usize, Vec<f64>)> = patterns
            .iter()
            .enumerate()
            .filter_map(|(i, p)| {
                let e = p.error_embedding.as_ref()?;
                model::normalized_embedding(e, dim).ok().map(|x| (i, x))
            })
            .collect();
        let mut x = Array2::<f64>::zeros((usable.len(), dim));
        for (row, (_, v)) in usable.iter().enumerate() {
            x.row_mut(row)
                .assign(&ndarray::ArrayView1::from(v.as_slice()));
        }
        let projection = reduce::fit_pca(&x, dims)?;
        primary_rows = usable.iter().map(|(i, _)| *i).collect();
        primary_reduced = usable
            .iter()
            .map(|(_, v)| projection.project_dense(v))
            .collect();
        embedding_projection = Some(projection);
    }

    // Cluster the primary vectors.
    let mut x = Array2::<f64>::zeros((primary_rows.len(), dims));
    for (row, v) in primary_reduced.iter().enumerate() {
        x.row_mut(row)
            .assign(&ndarray::ArrayView1::from(v.as_slice()));
    }
    let choice = match options.k {
        Some(k) => KChoice::Fixed(k),
        None => KChoice::Auto { max: options.max_k },
    };
    let partition = kmeans::cluster(&x, choice, options.seed)?;
    let k = partition.centroids.nrows();

    // Members per cluster (primary rows), and text-view centroids from the same members.
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); k];
    for (row, &label) in partition.labels.iter().enumerate() {
        members[label].push(primary_rows[row]);
    }
    let mut text_centroids = vec![vec![0.0; dims]; k];
    for (c, rows) in members.iter().enumerate() {
        for &i in rows {
            for (t, v) in text_centroids[c].iter_mut().zip(&text_reduced[i]) {
                *t += v;
            }
        }
        let size = rows.len().max(1) as f64;
        text_centroids[c].iter_mut().for_each(|t| *t /= size);
    }
    let centroids: Vec<Vec<f64>> = partition
        .centroids
        .outer_iter()
        .map(|r| r.to_vec())
        .collect();
    let primary_of: BTreeMap<usize, usize> = primary_rows
        .iter()
        .enumerate()
        .map(|(row, &i)| (i, row))
        .collect();
    let (radius, sigma2) = spread(&members, &centroids, |i| &primary_reduced[primary_of[&i]]);
    let (text_radius, text_sigma2) = spread(&members, &text_centroids, |i| &text_reduced[i]);

    // Labels and ids.
    let parts: Vec<LabelParts> = members
        .iter()
        .map(|rows| LabelParts {
            category: dominant(rows.iter().map(|&i| patterns[i].failure_category.as_str()))
                .unwrap_or_else(|| "failure".to_owned()),
            subject: dominant(rows.iter().filter_map(|&i| patterns[i].subject())),
            error_type: dominant(
                rows.iter()
                    .filter_map(|&i| patterns[i].error_types.last().map(String::as_str)),
            ),
        })
        .collect();
    // Largest clusters first, so the biggest gets the plain label.
    let mut order: Vec<usize> = (0..k).collect();
    order.sort_by(|&a, &b| members[b].len().cmp(&members[a].len()).then(a.cmp(&b)));
    let ordered_parts: Vec<LabelParts> = order.iter().map(|&c| parts[c].clone()).collect();
    let ordered_labels = unique_labels(&ordered_parts);

    let primary_projection = embedding_projection.as_ref().unwrap_or(&text_projection);
    let featurizer = if embedding_projection.is_some() {
        FeaturizerKind::ClientEmbedding
    } else {
        FeaturizerKind::HashedTfidf
    };
    let matches = match_previous(
        previous,
        featurizer,
        primary_projection,
        &order
            .iter()
            .map(|&c| centroids[c].clone())
            .collect::<Vec<_>>(),
        &order
            .iter()
            .map(|&c| members[c].clone())
            .collect::<Vec<_>>(),
        patterns,
        options.match_threshold,
    );
    let mut taken = previous.cluster_ids.clone();
    let mut ids_kept = 0;
    let mut ordered_ids = Vec::with_capacity(k);
    for (slot, matched) in matches.iter().enumerate() {
        let id = match matched {
            Some(old_id) => {
                ids_kept += 1;
                old_id.clone()
            }
            None => {
                let id = fresh(&ordered_labels[slot], &taken)
                    .unwrap_or_else(|| format!("cluster-{}", taken.len() + 1));
                taken.insert(id.clone());
                id
            }
        };
        ordered_ids.push(id);
    }
    let kept_ids: BTreeSet<&String> = matches.iter().flatten().collect();
    let retired: Vec<String> = previous
        .model
        .as_ref()
        .map(|m| {
            m.centroids()
                .map(|(id, _)| id.to_owned())
                .filter(|id| !kept_ids.contains(id))
                .collect()
        })
        .unwrap_or_default();

    let version = previous.model.as_ref().map_or(1, |m| m.version() + 1);
    let explained_variance: f64 = primary_projection.explained().iter().sum();
    let stored = StoredModel {
        org_id: org_id.to_owned(),
        version,
        featurizer,
        dims,
        method: METHOD.to_owned(),
        text: stored_projection(&text_projection),
        embedding: embedding_projection.as_ref().map(stored_projection),
        text_featurizer,
        sigma2,
        text_sigma2,
        patterns: n,
        quality: serde_json::json!({
            "silhouette": partition.silhouette,
            "k_tried": partition.tried,
            "explained_variance": explained_variance,
        }),
        clusters: order
            .iter()
            .enumerate()
            .map(|(slot, &c)| StoredCluster {
                cluster_id: ordered_ids[slot].clone(),
                label: ordered_labels[slot].clone(),
                centroid: narrow(&centroids[c]),
                text_centroid: narrow(&text_centroids[c]),
                radius: radius[c],
                text_radius: text_radius[c],
                size: members[c].len(),
            })
            .collect(),
    };
    // The runtime model is built from the stored (f32) form, so patterns are placed exactly as a
    // request would be after a reload.
    let model = ClusterModel::from_stored(stored)?;

    // Place every pattern with the model: primary view where it has a usable vector, text view
    // otherwise.
    let mut placed_by_text = 0;
    let assignments: Vec<PatternAssignment> = patterns
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let primary = match &p.error_embedding {
                Some(e) if model.embedding_dim().is_some() => model.embedding_reduced(e),
                _ if model.embedding_dim().is_none() => Some(text_reduced[i].clone()),
                _ => None,
            };
            let (index, _, confidence) = match primary {
                Some(z) => model.place_reduced(&z, false),
                None => {
                    placed_by_text += 1;
                    model.place_reduced(&text_reduced[i], true)
                }
            };
            PatternAssignment {
                pattern_id: p.pattern_id.clone(),
                cluster_id: model.cluster_id(index).to_owned(),
                confidence,
            }
        })
        .collect();

    let mut sizes: BTreeMap<&str, usize> = BTreeMap::new();
    for a in &assignments {
        *sizes.entry(a.cluster_id.as_str()).or_insert(0) += 1;
    }
    let mut clusters: Vec<(String, String, usize)> = model
        .clusters()
        .map(|(id, label, _)| {
            (
                id.to_owned(),
                label.to_owned(),
                sizes.get(id).copied().unwrap_or(0),
            )
        })
        .collect();
    clusters.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| a.0.cmp(&b.0)));
    let summary = FitSummary {
        org_id: org_id.to_owned(),
        version,
        method: METHOD.to_owned(),
        featurizer,
        k,
        patterns: n,
        placed_by_text,
        dims,
        input_dim: primary_projection.input_dim(),
        explained_variance,
        silhouette: partition.silhouette,
        k_tried: partition.tried.clone(),
        ids_kept,
        ids_new: k - ids_kept,
        retired,
        clusters,
    };
    Ok(FitOutcome {
        model,
        assignments,
        summary,
    })
}

/// The dimension of client embeddings when at least `share` of the patterns have a usable one of
/// that dimension.
fn common_embedding_dim(patterns: &[PatternInput], share: f64) -> Option<usize> {
    let mut by_dim: BTreeMap<usize, usize> = BTreeMap::new();
    for p in patterns {
        if let Some(e) = &p.error_embedding
            && model::normalized_embedding(e, e.len()).is_ok()
        {
            *by_dim.entry(e.len()).or_insert(0) += 1;
        }
    }
    let (&dim, &count) = by_dim.iter().max_by_key(|(_, c)| **c)?;
    (dim > 0 && count as f64 >= share * patterns.len() as f64).then_some(dim)
}

/// Dense rows of (an even sample of) sparse vectors, for fitting the projection.
fn dense_sample(vectors: &[Sparse], width: usize) -> Array2<f64> {
    let n = vectors.len();
    let rows: Vec<usize> = if n > reduce::MAX_FIT_ROWS {
        (0..reduce::MAX_FIT_ROWS)
            .map(|i| i * n / reduce::MAX_FIT_ROWS)
            .collect()
    } else {
        (0..n).collect()
    };
    let mut x = Array2::<f64>::zeros((rows.len(), width));
    for (r, &i) in rows.iter().enumerate() {
        for &(j, v) in &vectors[i] {
            if (j as usize) < width {
                x[[r, j as usize]] = v;
            }
        }
    }
    x
}

/// Per cluster: the 90th percentile of member distances (radius); overall: the per-dimension
/// variance of members around their centroids.
fn spread<'a>(
    members: &[Vec<usize>],
    centroids: &[Vec<f64>],
    vector: impl Fn(usize) -> &'a Vec<f64>,
) -> (Vec<f64>, f64) {
    let mut radii = Vec::with_capacity(members.len());
    let (mut sum_sq, mut count, mut dims) = (0.0, 0usize, 1usize);
    for (rows, centroid) in members.iter().zip(centroids) {
        dims = centroid.len().max(1);
        let mut d: Vec<f64> = rows
            .iter()
            .map(|&i| distance(vector(i), centroid))
            .collect();
        sum_sq += d.iter().map(|x| x * x).sum::<f64>();
        count += d.len();
        d.sort_by(f64::total_cmp);
        let radius = if d.is_empty() {
            0.0
        } else {
            d[((d.len() - 1) as f64 * 0.9).round() as usize]
        };
        radii.push(radius);
    }
    let sigma2 = if count > 0 {
        sum_sq / (count * dims) as f64
    } else {
        0.0
    };
    (radii, sigma2)
}

/// For each new cluster (in the given order), the id of the previous cluster it continues.
///
/// When the previous model read the same input space, centroids of both fits are mapped back to
/// that space (`mean + C^T z`) and matched by distance; otherwise (featurizer or dimension
/// changed) by shared members: a new cluster continues the old one that most of its patterns were
/// in.
fn match_previous(
    previous: &Previous,
    featurizer: FeaturizerKind,
    projection: &Projection,
    centroids: &[Vec<f64>],
    members: &[Vec<usize>],
    patterns: &[PatternInput],
    threshold: f64,
) -> Vec<Option<String>> {
    let Some(old) = &previous.model else {
        return vec![None; centroids.len()];
    };
    let old_clusters: Vec<(&str, &[f64])> = old.centroids().collect();
    let same_space =
        old.featurizer() == featurizer && old.primary().input_dim() == projection.input_dim();
    let matches = if same_space {
        let old_full: Vec<Vec<f64>> = old_clusters
            .iter()
            .map(|(_, c)| old.primary().reconstruct(c))
            .collect();
        let new_full: Vec<Vec<f64>> = centroids
            .iter()
            .map(|c| projection.reconstruct(c))
            .collect();
        match_by_cost(new_full.len(), old_full.len(), threshold, |i, j| {
            distance(&new_full[i], &old_full[j])
        })
    } else {
        let index: BTreeMap<&str, usize> = old_clusters
            .iter()
            .enumerate()
            .map(|(j, (id, _))| (*id, j))
            .collect();
        let mut overlap = vec![vec![0usize; old_clusters.len()]; members.len()];
        for (c, rows) in members.iter().enumerate() {
            for &i in rows {
                if let Some(j) = patterns[i]
                    .previous_cluster
                    .as_deref()
                    .and_then(|id| index.get(id))
                {
                    overlap[c][*j] += 1;
                }
            }
        }
        // Cost: share of the new cluster's members that were not in the old one; a majority
        // must have been.
        match_by_cost(members.len(), old_clusters.len(), 0.5, |c, j| {
            1.0 - overlap[c][j] as f64 / members[c].len().max(1) as f64
        })
    };
    matches
        .into_iter()
        .map(|m| m.map(|j| old_clusters[j].0.to_owned()))
        .collect()
}

fn stored_projection(p: &Projection) -> StoredProjection {
    StoredProjection {
        input_dim: p.input_dim(),
        mean: narrow(p.mean()),
        components: narrow(&p.components()),
        explained: narrow(p.explained()),
    }
}

fn narrow(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}
