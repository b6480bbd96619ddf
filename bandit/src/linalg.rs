//! Dense Cholesky algebra for the posterior precision: factor, rank-1 update, triangular solves.
//!
//! The factor of Λ = LLᵀ is stored as the upper triangle U = Lᵀ, row-major in a full d×d buffer
//! (strict lower part zero). Column k of L is then row k of U, so the rank-1 update, the forward
//! solve (column-oriented) and the back solve (dot-product form) all walk memory contiguously. At
//! d ≈ 300 that is the difference between cache-friendly loops and strided ones; nothing here is
//! worth a LAPACK dependency.

/// The Cholesky factor of a symmetric positive-definite d×d matrix.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Cholesky {
    d: usize,
    /// U = Lᵀ, row-major, d×d, zero below the diagonal.
    u: Vec<f64>,
}

impl Cholesky {
    /// The factor of s·I (s > 0).
    pub(crate) fn scaled_identity(d: usize, s: f64) -> Self {
        let mut u = vec![0.0; d * d];
        let root = s.sqrt();
        for i in 0..d {
            u[i * d + i] = root;
        }
        Self { d, u }
    }

    /// Factors the row-major symmetric matrix `a` (only its upper triangle is read). `None` when
    /// `a` has the wrong length or is not (numerically) positive definite.
    ///
    /// Right-looking outer-product form: after taking row k of U, every later row i is updated
    /// by an axpy with row k, which vectorizes; d³/6 multiply-adds in all.
    pub(crate) fn factor(a: &[f64], d: usize) -> Option<Self> {
        if a.len() != d.checked_mul(d)? {
            return None;
        }
        let mut u = a.to_vec();
        for k in 0..d {
            let (head, tail) = u.split_at_mut((k + 1) * d);
            let row_k = &mut head[k * d..];
            let pivot = row_k[k];
            if !(pivot.is_finite() && pivot > 0.0) {
                return None;
            }
            let root = pivot.sqrt();
            row_k[k] = root;
            for v in &mut row_k[k + 1..] {
                *v /= root;
            }
            for (offset, row_i) in tail.chunks_exact_mut(d).enumerate() {
                let i = k + 1 + offset;
                let f = row_k[i];
                if f != 0.0 {
                    for (dst, &src) in row_i[i..].iter_mut().zip(&row_k[i..]) {
                        *dst -= f * src;
                    }
                }
            }
        }
        for i in 1..d {
            u[i * d..i * d + i].fill(0.0);
        }
        Some(Self { d, u })
    }

    /// Rebuilds a factor from its packed upper triangle (rows of U from the diagonal on), as
    /// [`Cholesky::to_packed_upper`] writes it. `None` unless the length fits and the diagonal
    /// is finite and positive.
    pub(crate) fn from_packed_upper(packed: &[f64], d: usize) -> Option<Self> {
        if packed.len() != d.checked_mul(d.checked_add(1)?)? / 2 {
            return None;
        }
        let mut u = vec![0.0; d * d];
        let mut at = 0;
        for i in 0..d {
            let len = d - i;
            u[i * d + i..(i + 1) * d].copy_from_slice(&packed[at..at + len]);
            at += len;
            let diag = u[i * d + i];
            if !(diag.is_finite() && diag > 0.0) {
                return None;
            }
        }
        Some(Self { d, u })
    }

    /// The upper triangle of U, row by row from the diagonal: d(d+1)/2 numbers.
    pub(crate) fn to_packed_upper(&self) -> Vec<f64> {
        let d = self.d;
        let mut out = Vec::with_capacity(d * (d + 1) / 2);
        for i in 0..d {
            out.extend_from_slice(&self.u[i * d + i..(i + 1) * d]);
        }
        out
    }

    /// Turns the factor of Λ into the factor of Λ + x xᵀ in O(d²) (LINPACK's `dchud`, a
    /// sequence of Givens rotations). `x` is used as scratch and left overwritten.
    pub(crate) fn rank_one_update(&mut self, x: &mut [f64]) {
        let d = self.d;
        for k in 0..d.min(x.len()) {
            let xk = x[k];
            if xk == 0.0 {
                // A zero leading entry makes the rotation the identity; skipping it is exact.
                continue;
            }
            let row = &mut self.u[k * d + k..(k + 1) * d];
            let ukk = row[0];
            let r = ukk.hypot(xk);
            let c = r / ukk;
            let s = xk / ukk;
            row[0] = r;
            for (ukj, xj) in row[1..].iter_mut().zip(&mut x[k + 1..]) {
                *ukj = (*ukj + s * *xj) / c;
                *xj = c * *xj - s * *ukj;
            }
        }
    }

    /// Solves L y = b in place (b becomes L⁻¹ b). Column-oriented so it reads rows of U.
    pub(crate) fn solve_lower(&self, b: &mut [f64]) {
        let d = self.d;
        for j in 0..d.min(b.len()) {
            let row = &self.u[j * d + j..(j + 1) * d];
            let yj = b[j] / row[0];
            b[j] = yj;
            for (bi, &uji) in b[j + 1..].iter_mut().zip(&row[1..]) {
                *bi -= uji * yj;
            }
        }
    }

    /// Solves Lᵀ θ = y in place (y becomes L⁻ᵀ y). Back substitution in dot-product form.
    pub(crate) fn solve_upper(&self, y: &mut [f64]) {
        let d = self.d;
        for i in (0..d.min(y.len())).rev() {
            let row = &self.u[i * d + i..(i + 1) * d];
            let dot: f64 = row[1..].iter().zip(&y[i + 1..]).map(|(a, b)| a * b).sum();
            y[i] = (y[i] - dot) / row[0];
        }
    }

    /// Solves Lᵀ X = B in place for a d×`cols` row-major B (B becomes L⁻ᵀB). Row-axpy form:
    /// row i of X is B's row minus a combination of the later rows, so the inner loop runs over
    /// `cols` contiguous, independent values and vectorizes — several times faster than `cols`
    /// separate back substitutions, whose dot products are one long dependency chain.
    pub(crate) fn solve_upper_multi(&self, b: &mut [f64], cols: usize) {
        let d = self.d;
        if cols == 0 || b.len() != d * cols {
            return;
        }
        for i in (0..d).rev() {
            let (head, tail) = b.split_at_mut((i + 1) * cols);
            let row_i = &mut head[i * cols..];
            let u = &self.u[i * d + i..(i + 1) * d];
            for (&uik, row_k) in u[1..].iter().zip(tail.chunks_exact(cols)) {
                if uik != 0.0 {
                    for (x, &y) in row_i.iter_mut().zip(row_k) {
                        *x -= uik * y;
                    }
                }
            }
            let inv = 1.0 / u[0];
            for x in row_i.iter_mut() {
                *x *= inv;
            }
        }
    }

    /// Solves Λ θ = b in place: θ = L⁻ᵀ L⁻¹ b.
    pub(crate) fn solve(&self, b: &mut [f64]) {
        self.solve_lower(b);
        self.solve_upper(b);
    }

    /// (L Lᵀ) v, for consistency checks on loaded states: Lᵀv = U v first, then L(·) = Uᵀ(·).
    pub(crate) fn reconstruct_times(&self, v: &[f64]) -> Vec<f64> {
        let d = self.d;
        let mut t = vec![0.0; d];
        for (i, ti) in t.iter_mut().enumerate() {
            let row = &self.u[i * d + i..(i + 1) * d];
            *ti = row.iter().zip(&v[i..]).map(|(a, b)| a * b).sum();
        }
        let mut out = vec![0.0; d];
        for (i, &ti) in t.iter().enumerate() {
            let row = &self.u[i * d + i..(i + 1) * d];
            for (o, &uij) in out[i..].iter_mut().zip(row) {
                *o += uij * ti;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Λ = λI + Σ x xᵀ built naively.
    fn gram(d: usize, lambda: f64, xs: &[Vec<f64>]) -> Vec<f64> {
        let mut a = vec![0.0; d * d];
        for i in 0..d {
            a[i * d + i] = lambda;
        }
        for x in xs {
            for i in 0..d {
                for j in 0..d {
                    a[i * d + j] += x[i] * x[j];
                }
            }
        }
        a
    }

    fn mat_vec(a: &[f64], v: &[f64]) -> Vec<f64> {
        let d = v.len();
        (0..d)
            .map(|i| (0..d).map(|j| a[i * d + j] * v[j]).sum())
            .collect()
    }

    fn vectors(d: usize, n: usize) -> impl Strategy<Value = Vec<Vec<f64>>> {
        prop::collection::vec(prop::collection::vec(-3.0f64..3.0, d), n)
    }

    #[test]
    fn factor_of_a_known_matrix() {
        // [[4, 2], [2, 3]] = L Lᵀ with L = [[2, 0], [1, √2]].
        let c = Cholesky::factor(&[4.0, 2.0, 2.0, 3.0], 2).unwrap();
        assert_eq!(c.to_packed_upper(), vec![2.0, 1.0, 2f64.sqrt()]);
    }

    #[test]
    fn factor_rejects_indefinite_and_misshapen() {
        assert!(Cholesky::factor(&[1.0, 2.0, 2.0, 1.0], 2).is_none());
        assert!(Cholesky::factor(&[1.0, f64::NAN, f64::NAN, 1.0], 2).is_none());
        assert!(Cholesky::factor(&[1.0, 0.0, 0.0], 2).is_none());
        assert!(Cholesky::from_packed_upper(&[1.0, 0.0, -1.0], 2).is_none());
        assert!(Cholesky::from_packed_upper(&[1.0, 0.0], 2).is_none());
    }

    proptest! {
        #[test]
        fn rank_one_updates_match_a_fresh_factor(xs in vectors(6, 12), lambda in 0.1f64..5.0) {
            let d = 6;
            let mut c = Cholesky::scaled_identity(d, lambda);
            for x in &xs {
                c.rank_one_update(&mut x.clone());
            }
            let fresh = Cholesky::factor(&gram(d, lambda, &xs), d).unwrap();
            for (a, b) in c.to_packed_upper().iter().zip(fresh.to_packed_upper()) {
                prop_assert!((a - b).abs() < 1e-9 * (1.0 + b.abs()), "{a} vs {b}");
            }
        }

        #[test]
        fn solve_inverts_the_matrix(xs in vectors(5, 8), b in prop::collection::vec(-5.0f64..5.0, 5)) {
            let d = 5;
            let a = gram(d, 0.7, &xs);
            let c = Cholesky::factor(&a, d).unwrap();
            let mut theta = b.clone();
            c.solve(&mut theta);
            let back = mat_vec(&a, &theta);
            for (u, v) in back.iter().zip(&b) {
                prop_assert!((u - v).abs() < 1e-8 * (1.0 + v.abs()));
            }
            let mut single = b.clone();
            c.solve_upper(&mut single);
            let mut multi: Vec<f64> = b.iter().flat_map(|&v| [v, 2.0 * v]).collect();
            c.solve_upper_multi(&mut multi, 2);
            for (i, s) in single.iter().enumerate() {
                prop_assert!((multi[2 * i] - s).abs() < 1e-9 * (1.0 + s.abs()));
                prop_assert!((multi[2 * i + 1] - 2.0 * s).abs() < 1e-9 * (1.0 + s.abs()));
            }
            let rebuilt = c.reconstruct_times(&b);
            for (u, v) in rebuilt.iter().zip(mat_vec(&a, &b)) {
                prop_assert!((u - v).abs() < 1e-8 * (1.0 + v.abs()));
            }
        }
    }
}
