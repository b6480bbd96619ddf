//! Small sampling helpers over `rand`, written so that no input can make them panic (`rand`'s own
//! `random_bool` and `random_range` panic on probabilities outside [0, 1] and empty ranges).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use rand_distr::StandardNormal;

/// A ChaCha8 generator for one independent stream of the world: the same `(seed, stream)` always
/// yields the same numbers, whatever other streams were used before.
pub(crate) fn stream_rng(seed: u64, stream: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(stream);
    rng
}

/// A standard normal draw scaled to `mean` and `sd`.
pub(crate) fn normal<R: Rng + ?Sized>(rng: &mut R, mean: f64, sd: f64) -> f64 {
    let z: f64 = rng.sample(StandardNormal);
    mean + sd * z
}

/// A log-normal factor with mean exactly 1, so multiplying an expected value by it keeps the
/// expectation (the ground truth's closed forms rely on this).
pub(crate) fn mean_one_factor<R: Rng + ?Sized>(rng: &mut R, sigma: f64) -> f64 {
    (normal(rng, 0.0, sigma) - sigma * sigma / 2.0).exp()
}

/// True with probability `p`; NaN and values outside [0, 1] are clamped rather than panicking.
pub(crate) fn chance<R: Rng + ?Sized>(rng: &mut R, p: f64) -> bool {
    rng.random::<f64>() < p
}

/// Uniform in `[lo, hi)`; returns `lo` for an empty or inverted interval.
pub(crate) fn uniform<R: Rng + ?Sized>(rng: &mut R, lo: f64, hi: f64) -> f64 {
    if hi > lo {
        lo + (hi - lo) * rng.random::<f64>()
    } else {
        lo
    }
}

/// Uniform integer in `[lo, hi]` (inclusive); returns `lo` when `hi < lo`.
pub(crate) fn int_between<R: Rng + ?Sized>(rng: &mut R, lo: u64, hi: u64) -> u64 {
    if hi > lo {
        rng.random_range(lo..=hi)
    } else {
        lo
    }
}

/// A uniformly chosen element, or `None` for an empty slice.
pub(crate) fn pick<'a, T, R: Rng + ?Sized>(rng: &mut R, items: &'a [T]) -> Option<&'a T> {
    if items.is_empty() {
        None
    } else {
        items.get(rng.random_range(0..items.len()))
    }
}

/// An index drawn with probability proportional to `weights` (negative and NaN weights count as
/// zero); `None` when nothing has positive weight.
pub(crate) fn weighted_index<R: Rng + ?Sized>(rng: &mut R, weights: &[f64]) -> Option<usize> {
    let clean = |w: f64| if w.is_finite() && w > 0.0 { w } else { 0.0 };
    let total: f64 = weights.iter().copied().map(clean).sum();
    if total <= 0.0 {
        return None;
    }
    let mut target = rng.random::<f64>() * total;
    let mut last_positive = None;
    for (i, w) in weights.iter().copied().map(clean).enumerate() {
        if w > 0.0 {
            last_positive = Some(i);
            if target < w {
                return Some(i);
            }
            target -= w;
        }
    }
    // Rounding can leave a sliver of `target`; it belongs to the last positive weight.
    last_positive
}

/// A version-4-shaped UUID drawn from `rng`: the platform's ids are UUIDs, and drawing them from
/// the world's generator keeps the history deterministic.
pub(crate) fn uuid<R: Rng + ?Sized>(rng: &mut R) -> String {
    let hi: u64 = rng.random();
    let lo: u64 = rng.random();
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xffff,
        hi & 0x0fff,
        0x8000 | ((lo >> 48) & 0x3fff),
        lo & 0xffff_ffff_ffff
    )
}

/// A short lowercase hex string of `digits` digits (request ids, container ids).
pub(crate) fn hex_id<R: Rng + ?Sized>(rng: &mut R, digits: usize) -> String {
    let value: u64 = rng.random();
    let text = format!("{value:016x}");
    text[..digits.min(16)].to_owned()
}

/// `value` rounded to `decimals` decimal places. Records carry rounded figures: they read like
/// real exports, and short decimals parse back to exactly the same `f64` (serde_json's default
/// parser is exact only for short mantissas), which the round-trip guarantee needs.
pub(crate) fn round_to(value: f64, decimals: i32) -> f64 {
    let scale = 10f64.powi(decimals);
    (value * scale).round() / scale
}

/// The logistic function.
pub(crate) fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers_tolerate_degenerate_inputs() {
        let mut rng = stream_rng(1, 0);
        assert!(!chance(&mut rng, f64::NAN));
        assert_eq!(weighted_index(&mut rng, &[0.0, f64::NAN, -1.0]), None);
        assert_eq!(weighted_index(&mut rng, &[0.0, 2.0]), Some(1));
        assert_eq!(pick::<u8, _>(&mut rng, &[]), None);
        assert_eq!(int_between(&mut rng, 5, 2), 5);
        let id = uuid(&mut rng);
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "4");
    }
}
