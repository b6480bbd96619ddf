//! The numeric kernels of failure clustering (k-means, PCA by LOBPCG, the dense symmetric
//! eigendecomposition), instantiated for `f64` in this crate. Pure, no IO.
//!
//! Why a crate of its own: linfa's algorithms are generic over the float type, so their machine
//! code is generated in the crate that names `f64`. Named inside arc-rec, that was arc-rec's
//! unoptimized test build, where a `cluster` run of 3,000 outcomes took ~20 s, two thirds of it
//! in k-means' distance loop and a seventh in the eigensolver; the workspace's dev profile builds
//! this crate at `opt-level = 2` (Cargo.toml). arc-rec's `clustering` module decides what to run
//! (k, seeds, the fallbacks) and calls these; the results are the same bits either way.

use linfa::DatasetBase;
use linfa::traits::{Fit, Predict};
use linfa_clustering::KMeans;
use linfa_linalg::eigh::Eigh;
use linfa_reduction::Pca;
use ndarray::{Array1, Array2};
use rand_xoshiro::Xoshiro256Plus;
use rand_xoshiro::rand_core::SeedableRng;

/// A kernel's failure, in linfa's words.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct KernelError(String);

/// How [`kmeans`] runs: the best of `runs` k-means++ starts, each for at most `max_iterations`
/// or until the centroids move less than `tolerance`.
#[derive(Debug, Clone, Copy)]
pub struct KMeansSettings {
    pub runs: usize,
    pub max_iterations: u64,
    pub tolerance: f64,
}

/// The cluster (`0..k`) of each row of `x` by linfa's k-means, its starts drawn from a xoshiro
/// generator seeded with `seed`.
pub fn kmeans(
    x: &Array2<f64>,
    k: usize,
    seed: u64,
    settings: KMeansSettings,
) -> Result<Vec<usize>, KernelError> {
    let dataset = DatasetBase::from(x.clone());
    let rng = Xoshiro256Plus::seed_from_u64(seed);
    let model = KMeans::params_with_rng(k, rng)
        .n_runs(settings.runs)
        .max_n_iterations(settings.max_iterations)
        .tolerance(settings.tolerance)
        .fit(&dataset)
        .map_err(|e| KernelError(e.to_string()))?;
    let labels: Array1<usize> = model.predict(x);
    Ok(labels.to_vec())
}

/// The top `k` principal directions (rows) of `x` and the variance along each, by
/// linfa-reduction's PCA (a truncated SVD by LOBPCG); `None` where it fails, which includes the
/// panics LOBPCG can raise on numerically broken input (NaN ordering).
pub fn pca(x: &Array2<f64>, k: usize) -> Option<(Array2<f64>, Vec<f64>)> {
    let dataset = DatasetBase::from(x.clone());
    let fitted = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        Pca::params(k).fit(&dataset)
    }));
    let pca = fitted.ok()?.ok()?;
    let values = pca.singular_values().iter().map(|s| s * s).collect();
    Some((pca.components().clone(), values))
}

/// Eigenvalues and eigenvectors (columns) of the symmetric matrix `m`, in no particular order.
pub fn symmetric_eigh(m: &Array2<f64>) -> Result<(Array1<f64>, Array2<f64>), KernelError> {
    m.eigh().map_err(|e| KernelError(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kmeans_separates_two_far_groups() {
        let x = Array2::from_shape_fn((40, 2), |(i, j)| {
            let centre = if i < 20 { 0.0 } else { 10.0 };
            centre + ((i * 7 + j * 3) % 5) as f64 * 0.1
        });
        let settings = KMeansSettings {
            runs: 3,
            max_iterations: 100,
            tolerance: 1e-6,
        };
        let labels = kmeans(&x, 2, 1, settings).unwrap();
        assert!(labels[..20].iter().all(|&l| l == labels[0]));
        assert!(labels[20..].iter().all(|&l| l == labels[20]));
        assert_ne!(labels[0], labels[20]);
        assert_eq!(kmeans(&x, 2, 1, settings).unwrap(), labels, "seeded");
    }

    #[test]
    fn eigh_of_a_diagonal_matrix_is_its_diagonal() {
        let m = Array2::from_diag(&Array1::from(vec![3.0, 1.0, 2.0]));
        let (values, vectors) = symmetric_eigh(&m).unwrap();
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        assert_eq!(sorted, vec![1.0, 2.0, 3.0]);
        for (i, value) in values.iter().enumerate() {
            let v = vectors.column(i);
            let mv = m.dot(&v);
            assert!(mv.iter().zip(v).all(|(a, b)| (a - value * b).abs() < 1e-12));
        }
    }

    #[test]
    fn pca_finds_the_direction_of_spread() {
        let x = Array2::from_shape_fn((600, 450), |(i, j)| {
            let t = i as f64 - 300.0;
            if j == 3 {
                t
            } else {
                ((i * 31 + j * 17) % 13) as f64 * 0.01
            }
        });
        let mean = x.mean_axis(ndarray::Axis(0)).unwrap();
        let (components, values) = pca(&(&x - &mean), 1).expect("PCA fits");
        assert!(components[[0, 3]].abs() > 0.99, "{:?}", components.row(0));
        assert!(values[0] > 0.0);
    }
}
