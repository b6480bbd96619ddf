//! Dimension reduction: a PCA projection fit per organization (linfa-reduction's truncated SVD,
//! or a dense symmetric eigendecomposition from linfa-linalg when the data is too small for
//! LOBPCG), stored as mean + components so a new failure is projected at request time.
//!
//! The output always has the requested number of dimensions: when the data has fewer directions
//! of variance (few failures, a 3-dimensional client embedding) the missing components are zero,
//! so the bandit's context size never depends on the data.

use ndarray::{Array1, Array2, Axis};

use super::ClusterError;
use super::featurize::Sparse;

/// Rows used to fit the projection at most; larger organizations are subsampled evenly (PCA's
/// directions settle long before that, and the fit stays a few seconds).
pub(crate) const MAX_FIT_ROWS: usize = 4000;

/// A fitted linear projection `x -> C (x - mean)` with `C` of shape `dims x input_dim`.
#[derive(Debug, Clone, PartialEq)]
pub struct Projection {
    input_dim: usize,
    dims: usize,
    mean: Vec<f64>,
    /// `C` transposed, row-major `input_dim x dims`: one input feature's weights are contiguous,
    /// which is what projecting a sparse vector touches.
    components_t: Vec<f64>,
    /// `C mean`, precomputed so a sparse vector projects in O(nonzeros x dims).
    mean_projected: Vec<f64>,
    /// Share of the variance each component explains.
    explained: Vec<f64>,
}

impl Projection {
    /// Builds a projection from stored parts: `mean` of length `input_dim`, `components` row-major
    /// `dims x input_dim`.
    pub fn from_parts(
        input_dim: usize,
        dims: usize,
        mean: Vec<f64>,
        components: &[f64],
        explained: Vec<f64>,
    ) -> Result<Self, ClusterError> {
        if input_dim == 0 || dims == 0 {
            return Err(ClusterError::Corrupt(format!(
                "projection of {input_dim} inputs to {dims} dimensions"
            )));
        }
        if mean.len() != input_dim || components.len() != dims * input_dim {
            return Err(ClusterError::Corrupt(format!(
                "projection {input_dim} -> {dims} has a mean of {} and {} component values",
                mean.len(),
                components.len()
            )));
        }
        if mean.iter().chain(components).any(|x| !x.is_finite()) {
            return Err(ClusterError::Corrupt(
                "projection has non-finite values".into(),
            ));
        }
        let mut components_t = vec![0.0; input_dim * dims];
        for k in 0..dims {
            for j in 0..input_dim {
                components_t[j * dims + k] = components[k * input_dim + j];
            }
        }
        let mut mean_projected = vec![0.0; dims];
        for (j, m) in mean.iter().enumerate() {
            if *m != 0.0 {
                for (k, out) in mean_projected.iter_mut().enumerate() {
                    *out += m * components_t[j * dims + k];
                }
            }
        }
        Ok(Self {
            input_dim,
            dims,
            mean,
            components_t,
            mean_projected,
            explained,
        })
    }

    /// Input dimension.
    pub fn input_dim(&self) -> usize {
        self.input_dim
    }

    /// Output dimension.
    pub fn dims(&self) -> usize {
        self.dims
    }

    /// The mean subtracted before projecting.
    pub fn mean(&self) -> &[f64] {
        &self.mean
    }

    /// Components, row-major `dims x input_dim` (the stored form).
    pub fn components(&self) -> Vec<f64> {
        let mut out = vec![0.0; self.dims * self.input_dim];
        for j in 0..self.input_dim {
            for k in 0..self.dims {
                out[k * self.input_dim + j] = self.components_t[j * self.dims + k];
            }
        }
        out
    }

    /// Share of the variance each component explains (zero for padding components).
    pub fn explained(&self) -> &[f64] {
        &self.explained
    }

    /// Projects a dense vector of `input_dim` values (callers check the length).
    pub fn project_dense(&self, x: &[f64]) -> Vec<f64> {
        let mut out = vec![0.0; self.dims];
        for (j, (xj, mj)) in x.iter().zip(&self.mean).enumerate() {
            let centred = xj - mj;
            if centred != 0.0 {
                let row = &self.components_t[j * self.dims..(j + 1) * self.dims];
                for (o, c) in out.iter_mut().zip(row) {
                    *o += centred * c;
                }
            }
        }
        out
    }

    /// Projects a sparse vector (indices below `input_dim`; others are ignored).
    pub(crate) fn project_sparse(&self, x: &Sparse) -> Vec<f64> {
        let mut out: Vec<f64> = self.mean_projected.iter().map(|m| -m).collect();
        for &(j, v) in x {
            let j = j as usize;
            if j < self.input_dim {
                let row = &self.components_t[j * self.dims..(j + 1) * self.dims];
                for (o, c) in out.iter_mut().zip(row) {
                    *o += v * c;
                }
            }
        }
        out
    }

    /// Maps a reduced vector back to the input space (`mean + C^T z`), to compare centroids of
    /// two different fits in the space they share.
    pub fn reconstruct(&self, z: &[f64]) -> Vec<f64> {
        let mut out = self.mean.clone();
        for (j, o) in out.iter_mut().enumerate() {
            let row = &self.components_t[j * self.dims..(j + 1) * self.dims];
            *o += row.iter().zip(z).map(|(c, z)| c * z).sum::<f64>();
        }
        out
    }
}

/// Fits a `dims`-dimensional PCA to the rows of `x` (finite values; callers validate).
pub(crate) fn fit_pca(x: &Array2<f64>, dims: usize) -> Result<Projection, ClusterError> {
    let (n, d) = x.dim();
    if n == 0 || d == 0 {
        return Err(ClusterError::EmptyInput);
    }
    let x = if n > MAX_FIT_ROWS {
        let rows: Vec<usize> = (0..MAX_FIT_ROWS).map(|i| i * n / MAX_FIT_ROWS).collect();
        x.select(Axis(0), &rows)
    } else {
        x.clone()
    };
    let n = x.nrows();
    let mean = x.mean_axis(Axis(0)).unwrap_or_else(|| Array1::zeros(d));
    let centred = &x - &mean;
    let total_variance: f64 = centred.iter().map(|v| v * v).sum();
    // Directions the data can have: at most n - 1 and d; the rest are zero padding.
    let wanted = dims.min(d).min(n.saturating_sub(1));
    let mut components = Array2::<f64>::zeros((dims, d));
    let mut variances = vec![0.0; dims];
    if wanted > 0 && total_variance > 1e-12 {
        // Columns that never vary carry no component weight: fitting without them makes the
        // hashed space (thousands of buckets, a few hundred used) much cheaper.
        let active: Vec<usize> = (0..d)
            .filter(|&j| centred.column(j).iter().any(|v| v.abs() > 1e-15))
            .collect();
        let reduced_input = centred.select(Axis(1), &active);
        let (vectors, values) = top_components(&reduced_input, wanted)?;
        for (k, (row, value)) in vectors.outer_iter().zip(values).enumerate().take(dims) {
            for (a, &j) in active.iter().enumerate() {
                components[[k, j]] = row[a];
            }
            variances[k] = value;
        }
    }
    // A fixed sign per component (largest entry positive) so that refits on the same data give
    // the same projection, not a mirrored one.
    for mut row in components.outer_iter_mut() {
        let pivot = row.iter().copied().fold(
            0.0f64,
            |best, v| if v.abs() > best.abs() { v } else { best },
        );
        if pivot < 0.0 {
            row.mapv_inplace(|v| -v);
        }
    }
    let explained = variances
        .iter()
        .map(|v| {
            if total_variance > 0.0 {
                v / total_variance
            } else {
                0.0
            }
        })
        .collect();
    let flat: Vec<f64> = components.iter().copied().collect();
    Projection::from_parts(d, dims, mean.to_vec(), &flat, explained)
}

/// The top `k` principal directions (rows, unit length) of centred `x` and the variance (sum of
/// squares) along each.
fn top_components(x: &Array2<f64>, k: usize) -> Result<(Array2<f64>, Vec<f64>), ClusterError> {
    let (n, d) = x.dim();
    let small = n.min(d);
    // LOBPCG needs the problem to be several times the block size; small problems are cheaper
    // dense anyway.
    if small <= 400 || small < 5 * k + 10 {
        return dense_components(x, k);
    }
    // LOBPCG fails (or panics, which the kernel catches) on numerically broken input: fall back
    // to the dense solver.
    match clustering_kernels::pca(x, k) {
        Some((components, values))
            if components.iter().all(|v| v.is_finite()) && components.nrows() > 0 =>
        {
            Ok((components, values))
        }
        _ => dense_components(x, k),
    }
}

/// Dense PCA through the eigendecomposition of the smaller Gram matrix (`X^T X` or `X X^T`).
fn dense_components(x: &Array2<f64>, k: usize) -> Result<(Array2<f64>, Vec<f64>), ClusterError> {
    let (n, d) = x.dim();
    let by_features = d <= n;
    let gram = if by_features {
        x.t().dot(x)
    } else {
        x.dot(&x.t())
    };
    let (values, vectors) = clustering_kernels::symmetric_eigh(&gram)
        .map_err(|e| ClusterError::Reduction(e.to_string()))?;
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&a, &b| values[b].total_cmp(&values[a]));
    let mut components = Array2::<f64>::zeros((k, d));
    let mut variances = Vec::with_capacity(k);
    for (row, &i) in order.iter().take(k).enumerate() {
        let value = values[i];
        if value.is_nan() || value <= 1e-12 {
            break;
        }
        if by_features {
            components.row_mut(row).assign(&vectors.column(i));
        } else {
            // Right singular vector from a left one: v = X^T u / sigma.
            let v = x.t().dot(&vectors.column(i)) / value.sqrt();
            components.row_mut(row).assign(&v);
        }
        variances.push(value);
    }
    variances.resize(k, 0.0);
    Ok((components, variances))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, d: usize) -> Array2<f64> {
        // Deterministic data with two strong directions and a little of everything else.
        Array2::from_shape_fn((n, d), |(i, j)| {
            let t = i as f64;
            (t * 0.37).sin() * if j % 2 == 0 { 3.0 } else { 0.0 }
                + (t * 0.11).cos() * if j % 3 == 0 { 1.5 } else { 0.0 }
                + ((i * 31 + j * 17) % 13) as f64 * 0.01
        })
    }

    #[test]
    fn projection_has_requested_shape_even_with_few_directions() {
        for (n, d, dims) in [(50, 8, 16), (3, 100, 16), (1, 5, 4), (600, 700, 16)] {
            let x = data(n, d);
            let p = fit_pca(&x, dims).unwrap();
            assert_eq!((p.input_dim(), p.dims()), (d, dims));
            assert_eq!(p.components().len(), dims * d);
            let z = p.project_dense(x.row(0).as_slice().unwrap());
            assert_eq!(z.len(), dims);
            assert!(z.iter().all(|v| v.is_finite()));
            let share: f64 = p.explained().iter().sum();
            assert!(share <= 1.0 + 1e-9, "{share}");
        }
    }

    #[test]
    fn sparse_and_dense_projection_agree_and_reconstruction_inverts() {
        let x = data(120, 30);
        let p = fit_pca(&x, 4).unwrap();
        let row: Vec<f64> = x.row(7).to_vec();
        let sparse: Sparse = row
            .iter()
            .enumerate()
            .filter(|(_, v)| **v != 0.0)
            .map(|(j, v)| (j as u32, *v))
            .collect();
        let a = p.project_dense(&row);
        let b = p.project_sparse(&sparse);
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() < 1e-9);
        }
        // The two strong directions hold nearly all the variance, so reconstruction is close.
        let back = p.reconstruct(&a);
        let err: f64 = back.iter().zip(&row).map(|(u, v)| (u - v).powi(2)).sum();
        assert!(err < 0.05, "{err}");
        // Stored parts round-trip.
        let again = Projection::from_parts(
            30,
            4,
            p.mean().to_vec(),
            &p.components(),
            p.explained().to_vec(),
        )
        .unwrap();
        assert_eq!(again, p);
        assert!(Projection::from_parts(30, 4, vec![0.0; 29], &p.components(), vec![]).is_err());
    }

    #[test]
    fn identical_rows_give_zero_components() {
        let x = Array2::from_elem((10, 6), 0.5);
        let p = fit_pca(&x, 3).unwrap();
        assert!(p.components().iter().all(|v| *v == 0.0));
        assert_eq!(p.project_dense(&[0.5; 6]), vec![0.0; 3]);
        assert!(fit_pca(&Array2::zeros((0, 3)), 2).is_err());
    }

    #[test]
    fn lobpcg_path_matches_dense_path() {
        let x = data(900, 500);
        let mean = x.mean_axis(Axis(0)).unwrap();
        let centred = &x - &mean;
        let (a, va) = top_components(&centred, 2).unwrap();
        let (b, vb) = dense_components(&centred, 2).unwrap();
        for k in 0..2 {
            let cos: f64 = a.row(k).dot(&b.row(k)).abs();
            assert!(cos > 0.99, "component {k}: {cos}");
            assert!((va[k] - vb[k]).abs() / vb[k] < 1e-3);
        }
    }
}
