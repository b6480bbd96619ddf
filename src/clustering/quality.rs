//! Agreement between a clustering and known classes (the synthetic world's latent failure modes):
//! purity and the adjusted Rand index.

use std::collections::HashMap;
use std::hash::Hash;

use serde::Serialize;

/// How well clusters match known classes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Agreement {
    /// Share of items in their cluster's majority class (1 = every cluster is pure).
    pub purity: f64,
    /// Adjusted Rand index (1 = identical partitions, about 0 = chance).
    pub adjusted_rand_index: f64,
    /// Items compared.
    pub items: usize,
}

/// Compares `clusters[i]` with `classes[i]`; `None` when the slices are empty or differ in length.
pub fn agreement<C: Eq + Hash, K: Eq + Hash>(clusters: &[C], classes: &[K]) -> Option<Agreement> {
    let n = clusters.len();
    if n == 0 || n != classes.len() {
        return None;
    }
    let mut table: HashMap<(&C, &K), u64> = HashMap::new();
    let mut by_cluster: HashMap<&C, u64> = HashMap::new();
    let mut by_class: HashMap<&K, u64> = HashMap::new();
    for (c, k) in clusters.iter().zip(classes) {
        *table.entry((c, k)).or_insert(0) += 1;
        *by_cluster.entry(c).or_insert(0) += 1;
        *by_class.entry(k).or_insert(0) += 1;
    }
    let mut majority: HashMap<&C, u64> = HashMap::new();
    for ((c, _), &count) in &table {
        let m = majority.entry(c).or_insert(0);
        *m = (*m).max(count);
    }
    let purity = majority.values().sum::<u64>() as f64 / n as f64;

    let pairs = |x: u64| (x * x.saturating_sub(1)) as f64 / 2.0;
    let index: f64 = table.values().map(|&x| pairs(x)).sum();
    let a: f64 = by_cluster.values().map(|&x| pairs(x)).sum();
    let b: f64 = by_class.values().map(|&x| pairs(x)).sum();
    let total = pairs(n as u64);
    let expected = if total > 0.0 { a * b / total } else { 0.0 };
    let max = (a + b) / 2.0;
    let adjusted_rand_index = if (max - expected).abs() < 1e-12 {
        // Both partitions trivial (all singletons or one block): identical by construction.
        1.0
    } else {
        (index - expected) / (max - expected)
    };
    Some(Agreement {
        purity,
        adjusted_rand_index,
        items: n,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_partitions_score_one_whatever_the_names() {
        let a = agreement(&[0, 0, 1, 1, 2], &["x", "x", "y", "y", "z"]).unwrap();
        assert_eq!(a.purity, 1.0);
        assert!((a.adjusted_rand_index - 1.0).abs() < 1e-12);
    }

    #[test]
    fn known_values() {
        // sklearn: adjusted_rand_score([0,0,1,1], [0,0,1,2]) = 0.5714...
        let a = agreement(&[0, 0, 1, 2], &[0, 0, 1, 1]).unwrap();
        assert!((a.adjusted_rand_index - 0.571_428_571).abs() < 1e-6);
        assert_eq!(a.purity, 1.0);
        let b = agreement(&[0, 0, 0, 0], &[0, 0, 1, 1]).unwrap();
        assert_eq!(b.purity, 0.5);
        assert!(b.adjusted_rand_index.abs() < 1e-12);
        assert!(agreement::<i32, i32>(&[], &[]).is_none());
        assert!(agreement(&[1], &[1, 2]).is_none());
    }
}
