//! Stable cluster ids and readable labels.
//!
//! Re-clustering matches the new clusters to the previous ones with the Hungarian algorithm
//! (pathfinding's Kuhn–Munkres) on centroid distances, capped at a threshold so that pairs too far
//! apart cost the same as no pair: a matched cluster keeps its id, an unmatched one gets a new id,
//! and old clusters left unmatched retire. Ids read like the platform's cluster names
//! (`timeout-web_search`, `model_error-openai`): the dominant failure category and the most
//! frequent tool or provider, made unique within the organization.

use std::collections::{BTreeSet, HashMap};

use pathfinding::kuhn_munkres::kuhn_munkres_min;
use pathfinding::matrix::Matrix;

/// Integer scale of distances for Kuhn–Munkres (which needs an ordered integer weight).
const SCALE: f64 = 1e6;

/// Matches `new` items to `old` ones minimizing total cost; `cost(new, old)` above `threshold`
/// (or not finite) never matches. Returns, per new item, the index of its old match.
pub(crate) fn match_by_cost(
    new: usize,
    old: usize,
    threshold: f64,
    cost: impl Fn(usize, usize) -> f64,
) -> Vec<Option<usize>> {
    if new == 0 || old == 0 || threshold.is_nan() || threshold <= 0.0 {
        return vec![None; new];
    }
    let cap = (threshold * SCALE).round() as i64 + 1;
    let columns = new.max(old);
    let capped = |i: usize, j: usize| -> i64 {
        if j >= old {
            // Padding columns: "no match" costs the same as a pair over the threshold.
            return cap;
        }
        let c = cost(i, j);
        if c.is_finite() && c <= threshold {
            (c.max(0.0) * SCALE).round() as i64
        } else {
            cap
        }
    };
    let rows: Vec<Vec<i64>> = (0..new)
        .map(|i| (0..columns).map(|j| capped(i, j)).collect())
        .collect();
    let Ok(matrix) = Matrix::from_rows(rows) else {
        return vec![None; new];
    };
    let (_, assignment) = kuhn_munkres_min(&matrix);
    assignment
        .into_iter()
        .enumerate()
        .map(|(i, j)| (j < old && capped(i, j) < cap).then_some(j))
        .collect()
}

/// Euclidean distance.
pub(crate) fn distance(a: &[f64], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y) * (x - y))
        .sum::<f64>()
        .sqrt()
}

/// What a cluster's label is made of.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LabelParts {
    /// Dominant failure category.
    pub category: String,
    /// Most frequent tool or provider, when there is one.
    pub subject: Option<String>,
    /// Dominant exception class, used to tell apart clusters that would read the same.
    pub error_type: Option<String>,
}

/// The most frequent value (ties go to the smallest, for determinism).
pub(crate) fn dominant<'a>(values: impl IntoIterator<Item = &'a str>) -> Option<String> {
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for v in values {
        if !v.trim().is_empty() {
            *counts.entry(v).or_insert(0) += 1;
        }
    }
    counts
        .into_iter()
        .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(a.0)))
        .map(|(v, _)| v.to_owned())
}

/// Lowercase `[a-z0-9_]` with `-` between parts; anything else becomes `_`.
pub(crate) fn slug(text: &str) -> String {
    let s: String = text
        .trim()
        .to_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let s = s.trim_matches(|c| c == '_' || c == '-').to_owned();
    if s.is_empty() {
        "failure".to_owned()
    } else {
        s
    }
}

/// `RateLimitError` -> `rate_limit_error`, `APIError` -> `api_error`.
pub(crate) fn snake_case(name: &str) -> String {
    let chars: Vec<char> = name.chars().collect();
    let mut out = String::with_capacity(name.len() + 4);
    for (i, &c) in chars.iter().enumerate() {
        if c.is_uppercase() && i > 0 {
            let prev = chars[i - 1];
            let next_lower = chars.get(i + 1).is_some_and(|n| n.is_lowercase());
            if prev.is_lowercase() || prev.is_ascii_digit() || (prev.is_uppercase() && next_lower) {
                out.push('_');
            }
        }
        out.extend(c.to_lowercase());
    }
    out
}

/// Labels for clusters, unique among them: `category-subject`, then the exception class where
/// two read the same, then a number. Clusters are given largest first so the biggest keeps the
/// plain name.
pub(crate) fn unique_labels(parts: &[LabelParts]) -> Vec<String> {
    let base: Vec<String> = parts
        .iter()
        .map(|p| match &p.subject {
            Some(subject) => slug(&format!("{}-{}", p.category, subject)),
            None => slug(&p.category),
        })
        .collect();
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for b in &base {
        *counts.entry(b.as_str()).or_insert(0) += 1;
    }
    let refined: Vec<String> = base
        .iter()
        .zip(parts)
        .map(|(b, p)| match (&p.error_type, counts[b.as_str()] > 1) {
            (Some(t), true) => format!("{b}-{}", slug(&snake_case(t))),
            _ => b.clone(),
        })
        .collect();
    let mut used: BTreeSet<String> = BTreeSet::new();
    let mut out = Vec::with_capacity(refined.len());
    for label in refined {
        let unique = fresh(&label, &used).unwrap_or(label);
        used.insert(unique.clone());
        out.push(unique);
    }
    out
}

/// `label`, or `label-2`, `label-3`, ... whichever is not in `taken`.
pub(crate) fn fresh(label: &str, taken: &BTreeSet<String>) -> Option<String> {
    if !taken.contains(label) {
        return Some(label.to_owned());
    }
    (2..=taken.len() + 2)
        .map(|i| format!("{label}-{i}"))
        .find(|candidate| !taken.contains(candidate))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permuted_centroids_keep_their_ids() {
        let old = [vec![0.0, 0.0], vec![5.0, 5.0], vec![-5.0, 5.0]];
        // The same clusters, refit: moved a little and listed in another order, plus a new one.
        let new = [
            vec![-5.1, 4.9],
            vec![0.1, 0.0],
            vec![20.0, 20.0],
            vec![5.0, 5.2],
        ];
        let m = match_by_cost(new.len(), old.len(), 1.0, |i, j| distance(&new[i], &old[j]));
        assert_eq!(m, [Some(2), Some(0), None, Some(1)]);
        // Fewer new clusters than old: the unmatched old ones simply retire.
        let m = match_by_cost(1, old.len(), 1.0, |_, j| distance(&[5.0, 5.1], &old[j]));
        assert_eq!(m, [Some(1)]);
        // Nothing to match against, or nothing close enough.
        assert_eq!(match_by_cost(2, 0, 1.0, |_, _| 0.0), [None, None]);
        assert_eq!(match_by_cost(1, 1, 1.0, |_, _| 7.0), [None]);
        assert_eq!(match_by_cost(1, 1, 1.0, |_, _| f64::NAN), [None]);
    }

    #[test]
    fn hungarian_beats_greedy() {
        // Greedy would give new 0 its nearest (old 0) and leave new 1 with nothing in range.
        let cost = [[0.1, 0.2], [0.15, 5.0]];
        let m = match_by_cost(2, 2, 1.0, |i, j| cost[i][j]);
        assert_eq!(m, [Some(1), Some(0)]);
    }

    #[test]
    fn labels_are_readable_and_unique() {
        let p = |c: &str, s: Option<&str>, t: Option<&str>| LabelParts {
            category: c.to_owned(),
            subject: s.map(str::to_owned),
            error_type: t.map(str::to_owned),
        };
        let labels = unique_labels(&[
            p("timeout", Some("web_search"), Some("ToolTimeout")),
            p("model_error", Some("openai"), Some("RateLimitError")),
            p("model_error", Some("openai"), Some("APIError")),
            p("timeout", Some("web_search"), Some("ToolTimeout")),
            p("Sandbox Error", None, None),
        ]);
        assert_eq!(
            labels,
            [
                "timeout-web_search-tool_timeout",
                "model_error-openai-rate_limit_error",
                "model_error-openai-api_error",
                "timeout-web_search-tool_timeout-2",
                "sandbox_error",
            ]
        );
        let taken: BTreeSet<String> = ["a".to_owned(), "a-2".to_owned()].into();
        assert_eq!(fresh("a", &taken).as_deref(), Some("a-3"));
        assert_eq!(slug("  ?? "), "failure");
        assert_eq!(dominant(["b", "a", "b", "a", ""]).as_deref(), Some("a"));
    }
}
