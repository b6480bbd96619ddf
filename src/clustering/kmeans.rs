//! Clustering in the reduced space: linfa's k-means (k-means++ starts, several runs, seeded), with
//! k chosen by the silhouette of an even subsample unless given.
//!
//! k-means won the measurement against a Gaussian mixture at the same k and DBSCAN over a grid of
//! radii (see `clustering::eval` and the README's figures): the reduced failure vectors form
//! compact, roughly spherical groups, and DBSCAN either merged modes or shed many points as noise.

use clustering_kernels::KMeansSettings;
use ndarray::{Array1, Array2, Axis};

use super::ClusterError;

/// A grouping of the fine groups must reach this silhouette (Kaufman & Rousseeuw's "weak
/// structure" floor) to replace them: with a handful of equally distant groups every merge scores
/// a little above the singletons' 0 without meaning anything.
const MIN_GROUPING_SILHOUETTE: f64 = 0.25;

/// Each k-means fit: the best of six k-means++ starts.
const KMEANS: KMeansSettings = KMeansSettings {
    runs: 6,
    max_iterations: 200,
    tolerance: 1e-6,
};

/// Points the silhouette is computed on at most (it is quadratic).
const SILHOUETTE_SAMPLE: usize = 1500;

/// A clustering of the reduced vectors.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Partition {
    /// Cluster of each row.
    pub labels: Vec<usize>,
    /// Centroid of each cluster (`k x dims`).
    pub centroids: Array2<f64>,
    /// Silhouette of this partition (on the subsample); `None` for a single cluster.
    pub silhouette: Option<f64>,
    /// Silhouette of every k tried, for reports.
    pub tried: Vec<(usize, f64)>,
}

/// How k is chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum KChoice {
    /// Exactly this many (capped by the number of distinct points).
    Fixed(usize),
    /// k-means into `max` fine groups, then the fine groups grouped with k by silhouette.
    Auto { max: usize },
}

/// Clusters the rows of `x` (finite values).
pub(crate) fn cluster(x: &Array2<f64>, k: KChoice, seed: u64) -> Result<Partition, ClusterError> {
    let n = x.nrows();
    if n == 0 {
        return Err(ClusterError::EmptyInput);
    }
    let distinct = distinct_rows(x, 64);
    match k {
        KChoice::Fixed(k) => {
            let k = k.clamp(1, distinct);
            let mut p = fit_k(x, k, seed)?;
            p.silhouette = silhouette_of(x, &p.labels);
            Ok(p)
        }
        KChoice::Auto { max } => {
            // Every cluster should be able to hold a handful of failures.
            let fine_k = max.min(distinct).min(n / 3);
            if fine_k < 2 {
                return fit_k(x, 1, seed);
            }
            // Level 1: fine groups. Failures of one cause come in a few wordings, each a tight
            // (often exact) group, so the silhouette of points rises all the way to one cluster
            // per wording; k-means at the largest k finds those groups.
            let fine = fit_k(x, fine_k, seed)?;
            let m = fine.centroids.nrows();
            // Level 2: group the fine groups, k by the silhouette of the fine centroids, where a
            // wording is one point and a cluster of one scores 0 — so causes, not wordings, win.
            let mut best: (Vec<usize>, f64) = ((0..m).collect(), MIN_GROUPING_SILHOUETTE);
            let mut tried = Vec::new();
            for g in 2..m {
                let grouped = fit_k(&fine.centroids, g, seed)?;
                let Some(s) = silhouette_of(&fine.centroids, &grouped.labels) else {
                    continue;
                };
                tried.push((grouped.centroids.nrows(), s));
                if s > best.1 {
                    best = (grouped.labels, s);
                }
            }
            let labels: Vec<usize> = fine.labels.iter().map(|&l| best.0[l]).collect();
            let mut p = partition_of(x, &labels);
            p.silhouette = silhouette_of(x, &p.labels);
            p.tried = tried;
            Ok(p)
        }
    }
}

/// k-means with k clusters; k = 1 is the mean.
fn fit_k(x: &Array2<f64>, k: usize, seed: u64) -> Result<Partition, ClusterError> {
    if k <= 1 {
        let centroid = x
            .mean_axis(Axis(0))
            .unwrap_or_else(|| Array1::zeros(x.ncols()));
        return Ok(Partition {
            labels: vec![0; x.nrows()],
            centroids: centroid.insert_axis(Axis(0)),
            silhouette: None,
            tried: Vec::new(),
        });
    }
    let seed = seed ^ (k as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let labels = clustering_kernels::kmeans(x, k, seed, KMEANS)
        .map_err(|e| ClusterError::Clustering(e.to_string()))?;
    Ok(partition_of(x, &labels))
}

/// Centroids from memberships, clusters renumbered densely (empty ones dropped), so every
/// cluster the caller sees has members.
fn partition_of(x: &Array2<f64>, labels: &[usize]) -> Partition {
    let k = labels.iter().copied().max().map_or(1, |m| m + 1);
    let mut sums = Array2::<f64>::zeros((k, x.ncols()));
    let mut counts = vec![0usize; k];
    for (row, &l) in x.outer_iter().zip(labels) {
        let mut s = sums.row_mut(l);
        s += &row;
        counts[l] += 1;
    }
    let kept: Vec<usize> = (0..k).filter(|&c| counts[c] > 0).collect();
    let mut renumber = vec![0usize; k];
    for (new, &old) in kept.iter().enumerate() {
        renumber[old] = new;
    }
    let mut centroids = Array2::<f64>::zeros((kept.len(), x.ncols()));
    for (new, &old) in kept.iter().enumerate() {
        centroids
            .row_mut(new)
            .assign(&(&sums.row(old) / counts[old] as f64));
    }
    Partition {
        labels: labels.iter().map(|&l| renumber[l]).collect(),
        centroids,
        silhouette: None,
        tried: Vec::new(),
    }
}

/// Mean silhouette of `labels` on an even subsample of at most [`SILHOUETTE_SAMPLE`] rows;
/// `None` with fewer than two clusters.
pub(crate) fn silhouette_of(x: &Array2<f64>, labels: &[usize]) -> Option<f64> {
    let n = x.nrows();
    let rows: Vec<usize> = if n > SILHOUETTE_SAMPLE {
        (0..SILHOUETTE_SAMPLE)
            .map(|i| i * n / SILHOUETTE_SAMPLE)
            .collect()
    } else {
        (0..n).collect()
    };
    let sample_labels: Vec<usize> = rows.iter().map(|&i| labels[i]).collect();
    let k = sample_labels.iter().copied().max()? + 1;
    let mut sizes = vec![0usize; k];
    for &l in &sample_labels {
        sizes[l] += 1;
    }
    if sizes.iter().filter(|&&s| s > 0).count() < 2 {
        return None;
    }
    let points = x.select(Axis(0), &rows);
    let m = rows.len();
    let mut total = 0.0;
    let mut sums = vec![0.0f64; k];
    for i in 0..m {
        sums.iter_mut().for_each(|s| *s = 0.0);
        let pi = points.row(i);
        for j in 0..m {
            if i != j {
                let d: f64 = pi
                    .iter()
                    .zip(points.row(j))
                    .map(|(a, b)| (a - b) * (a - b))
                    .sum::<f64>()
                    .sqrt();
                sums[sample_labels[j]] += d;
            }
        }
        let own = sample_labels[i];
        if sizes[own] <= 1 {
            // A singleton's silhouette is 0 by convention.
            continue;
        }
        let a = sums[own] / (sizes[own] - 1) as f64;
        let b = (0..k)
            .filter(|&c| c != own && sizes[c] > 0)
            .map(|c| sums[c] / sizes[c] as f64)
            .fold(f64::INFINITY, f64::min);
        let denom = a.max(b);
        if denom > 0.0 && denom.is_finite() {
            total += (b - a) / denom;
        }
    }
    Some(total / m as f64)
}

/// Number of distinct rows, counted up to `cap` (k-means cannot make more clusters than that).
fn distinct_rows(x: &Array2<f64>, cap: usize) -> usize {
    let mut seen: Vec<Vec<u64>> = Vec::new();
    for row in x.outer_iter() {
        let key: Vec<u64> = row.iter().map(|v| (v + 0.0).to_bits()).collect();
        if !seen.contains(&key) {
            seen.push(key);
            if seen.len() >= cap {
                break;
            }
        }
    }
    seen.len().max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blobs() -> Array2<f64> {
        // Three tight groups in 2-D.
        let centres = [(0.0, 0.0), (5.0, 5.0), (-5.0, 5.0)];
        Array2::from_shape_fn((90, 2), |(i, j)| {
            let c = centres[i % 3];
            let jitter = ((i * 7919 + j * 104_729) % 100) as f64 / 100.0 - 0.5;
            if j == 0 { c.0 + jitter } else { c.1 + jitter }
        })
    }

    #[test]
    fn silhouette_picks_the_right_k() {
        let p = cluster(&blobs(), KChoice::Auto { max: 8 }, 1).unwrap();
        assert_eq!(p.centroids.nrows(), 3);
        assert!(p.silhouette.unwrap() > 0.8);
        // Same seed, same answer.
        assert_eq!(p, cluster(&blobs(), KChoice::Auto { max: 8 }, 1).unwrap());
    }

    #[test]
    fn degenerate_inputs_give_one_cluster() {
        let same = Array2::from_elem((20, 3), 1.0);
        let p = cluster(&same, KChoice::Auto { max: 8 }, 1).unwrap();
        assert_eq!(p.centroids.nrows(), 1);
        let p = cluster(&same, KChoice::Fixed(5), 1).unwrap();
        assert_eq!(p.centroids.nrows(), 1);
        let one = Array2::from_elem((1, 3), 1.0);
        assert_eq!(
            cluster(&one, KChoice::Auto { max: 8 }, 1).unwrap().labels,
            [0]
        );
        assert!(cluster(&Array2::zeros((0, 3)), KChoice::Fixed(2), 1).is_err());
    }
}
