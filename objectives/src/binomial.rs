//! Binomial coefficients in f64, with C(n, k) = 0 outside 0 ≤ k ≤ n (what the estimators' sums
//! need at their edges, e.g. C(x, −1) for k = 2).

/// C(n, k) as an f64; 0 when k < 0, n < 0 or k > n.
///
/// Exact up to C(n, k) < 2^53 and within a few ulps beyond; groups are at most
/// [`crate::MAX_GROUP`] samples, so C(n, k) < 1e153 never overflows.
pub fn binomial(n: i64, k: i64) -> f64 {
    if k < 0 || n < 0 || k > n {
        return 0.0;
    }
    let k = k.min(n - k);
    let mut value = 1.0f64;
    for j in 1..=k {
        // Multiply before dividing: each partial product is itself a binomial, so exact while
        // it fits the mantissa.
        value = value * (n - k + j) as f64 / j as f64;
    }
    value
}

#[cfg(test)]
mod tests {
    use super::binomial;

    #[test]
    fn matches_pascals_triangle() {
        let mut row = vec![1.0f64];
        for n in 1..=60i64 {
            let mut next = vec![1.0; n as usize + 1];
            for k in 1..n as usize {
                next[k] = row[k - 1] + row[k];
            }
            row = next;
            for k in 0..=n {
                let expected = row[k as usize];
                let got = binomial(n, k);
                assert!(
                    (got - expected).abs() <= expected * 1e-14,
                    "C({n},{k}) = {got}, expected {expected}"
                );
            }
        }
    }

    #[test]
    fn is_zero_outside_the_triangle() {
        assert_eq!(binomial(5, 6), 0.0);
        assert_eq!(binomial(5, -1), 0.0);
        assert_eq!(binomial(-1, 0), 0.0);
        assert_eq!(binomial(0, 0), 1.0);
    }

    #[test]
    fn does_not_overflow_at_the_largest_group() {
        let c = binomial(crate::MAX_GROUP as i64, crate::MAX_GROUP as i64 / 2);
        assert!(c.is_finite() && c > 1e150);
    }
}
