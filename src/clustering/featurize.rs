//! arc-rec's own failure featurizer: hashed TF-IDF over normalized error messages, error types,
//! categories and tool names, L2-normalized.
//!
//! Messages are normalized before tokenizing so that wording that differs only in numbers, ids,
//! durations, tool or provider names lands on the same tokens ("web_search timed out after 5000
//! ms" and "sql_query timed out after 3000 ms" both read `<tool> timed out after <dur>`): a
//! cluster should gather failures with the same cause, and which tool or provider it struck is a
//! separate, lightly weighted feature. Tokens are hashed into a fixed number of buckets with
//! FNV-1a (stable across platforms and Rust versions, unlike `DefaultHasher`), so the feature space
//! needs no vocabulary and a request-time failure is featurized without the training data.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// Default number of hash buckets.
pub const DEFAULT_BUCKETS: usize = 2048;

/// How much each block of features weighs in a failure's vector. Each block is L2-normalized on
/// its own and scaled by its weight before the whole vector is normalized, so the weights say how
/// much a block pulls regardless of how many tokens it has.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BlockWeights {
    /// Message unigrams and bigrams.
    pub message: f64,
    /// Exception class names from the trajectory's unrecovered error events.
    pub error_type: f64,
    /// `failure_category` and `failure_type`.
    pub category: f64,
    /// Tool and provider names.
    pub subject: f64,
}

impl Default for BlockWeights {
    fn default() -> Self {
        // Measured on the synthetic world (see `clustering::eval`): one cause comes in several
        // wordings, and the exception class is what ties them together (purity 0.98 / ARI 0.99
        // with it at 1.0, 0.93 / 0.71 at 0.5); tools and providers cut across causes.
        Self {
            message: 1.0,
            error_type: 1.0,
            category: 0.5,
            subject: 0.2,
        }
    }
}

/// One failure as text: what a stored pattern or a request's `failures[]` entry tells.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailureText {
    /// `failure_category` (`timeout`, `tool_error`, ...).
    pub failure_category: String,
    /// The error message as logged.
    pub error_message: String,
    /// The tool involved, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_name: Option<String>,
    /// The exception class (`error_events[].error_type`), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_type: Option<String>,
}

/// Everything the featurizer reads about one failure.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct FailureDoc<'a> {
    pub failure_category: &'a str,
    pub failure_type: Option<&'a str>,
    pub error_message: &'a str,
    pub error_types: Vec<&'a str>,
    /// Tools the failure concerns (failing tool calls, the request's `tool_name`).
    pub tools: Vec<&'a str>,
    /// Providers of the models involved (`openai`, ...).
    pub providers: Vec<&'a str>,
}

/// A sparse feature vector: sorted, distinct bucket indices with their values.
pub(crate) type Sparse = Vec<(u32, f64)>;

/// The fitted featurizer of one organization: bucket count, IDF per bucket, and the tool and
/// provider names its messages are normalized against.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HashedTfIdf {
    /// Number of hash buckets (the input dimension of the text projection).
    pub buckets: usize,
    /// Smoothed inverse document frequency per bucket (`ln((1+n)/(1+df)) + 1`).
    pub idf: Vec<f32>,
    /// Names replaced by `<tool>` in messages.
    pub tools: BTreeSet<String>,
    /// Names replaced by `<provider>` in messages.
    pub providers: BTreeSet<String>,
    /// Block weights.
    pub weights: BlockWeights,
}

impl HashedTfIdf {
    /// Fits IDF over `docs` (one document per failure); `known_tools` adds tool names to
    /// normalize out of messages beyond the documents' own (every tool the trajectories called).
    pub(crate) fn fit<'t>(
        docs: &[FailureDoc<'_>],
        known_tools: impl IntoIterator<Item = &'t str>,
        buckets: usize,
        weights: BlockWeights,
    ) -> Self {
        let buckets = buckets.max(1);
        let mut tools: BTreeSet<String> = known_tools.into_iter().map(str::to_lowercase).collect();
        let mut providers = BTreeSet::new();
        for doc in docs {
            tools.extend(doc.tools.iter().map(|t| t.to_lowercase()));
            providers.extend(doc.providers.iter().map(|p| p.to_lowercase()));
        }
        let mut model = Self {
            buckets,
            idf: vec![1.0; buckets],
            tools,
            providers,
            weights,
        };
        let mut df = vec![0u32; buckets];
        for doc in docs {
            let seen: BTreeSet<u32> = model
                .blocks(doc)
                .iter()
                .flat_map(|block| block.keys().copied())
                .collect();
            for b in seen {
                df[b as usize] += 1;
            }
        }
        let n = docs.len() as f64;
        model.idf = df
            .iter()
            .map(|&d| (((1.0 + n) / (1.0 + f64::from(d))).ln() + 1.0) as f32)
            .collect();
        model
    }

    /// The L2-normalized feature vector of one failure (empty when it has no tokens at all).
    pub(crate) fn transform(&self, doc: &FailureDoc<'_>) -> Sparse {
        let blocks = self.blocks(doc);
        let block_weights = [
            self.weights.message,
            self.weights.error_type,
            self.weights.category,
            self.weights.subject,
        ];
        let mut merged: BTreeMap<u32, f64> = BTreeMap::new();
        for (block, weight) in blocks.iter().zip(block_weights) {
            // Sublinear TF times IDF, normalized within the block.
            let weighted: Vec<(u32, f64)> = block
                .iter()
                .map(|(&b, &tf)| {
                    let idf = f64::from(self.idf.get(b as usize).copied().unwrap_or(1.0));
                    (b, (1.0 + f64::from(tf).ln()) * idf)
                })
                .collect();
            let norm = weighted.iter().map(|(_, v)| v * v).sum::<f64>().sqrt();
            if norm <= 0.0 || !norm.is_finite() || weight <= 0.0 {
                continue;
            }
            for (b, v) in weighted {
                *merged.entry(b).or_insert(0.0) += weight * v / norm;
            }
        }
        let norm = merged.values().map(|v| v * v).sum::<f64>().sqrt();
        if norm <= 0.0 || !norm.is_finite() {
            return Vec::new();
        }
        merged.into_iter().map(|(b, v)| (b, v / norm)).collect()
    }

    /// Term counts per block: message, error type, category, subject.
    fn blocks(&self, doc: &FailureDoc<'_>) -> [BTreeMap<u32, u32>; 4] {
        let mut blocks: [BTreeMap<u32, u32>; 4] = Default::default();
        let extra_tools: Vec<String> = doc.tools.iter().map(|t| t.to_lowercase()).collect();
        let tokens = normalize_message(doc.error_message, |word| {
            if self.tools.contains(word) || extra_tools.iter().any(|t| t == word) {
                Some("<tool>")
            } else if self.providers.contains(word) {
                Some("<provider>")
            } else {
                None
            }
        });
        let mut add = |block: usize, feature: &str| {
            *blocks[block]
                .entry(bucket(feature, self.buckets))
                .or_insert(0) += 1;
        };
        for token in &tokens {
            add(0, &format!("w:{token}"));
        }
        for pair in tokens.windows(2) {
            add(0, &format!("b:{} {}", pair[0], pair[1]));
        }
        for error_type in &doc.error_types {
            add(1, &format!("type:{}", error_type.trim().to_lowercase()));
        }
        let category = doc.failure_category.trim().to_lowercase();
        if !category.is_empty() {
            add(2, &format!("cat:{category}"));
        }
        if let Some(failure_type) = doc.failure_type {
            add(2, &format!("ftype:{}", failure_type.trim().to_lowercase()));
        }
        for tool in &doc.tools {
            add(3, &format!("tool:{}", tool.trim().to_lowercase()));
        }
        for provider in &doc.providers {
            add(3, &format!("provider:{}", provider.trim().to_lowercase()));
        }
        blocks
    }
}

/// FNV-1a of `feature`, reduced to a bucket.
pub(crate) fn bucket(feature: &str, buckets: usize) -> u32 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in feature.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    (hash % buckets.max(1) as u64) as u32
}

/// Words that say nothing about a cause.
const STOP_WORDS: &[&str] = &[
    "a", "an", "the", "of", "for", "to", "in", "on", "at", "by", "is", "was", "be", "been", "your",
    "you", "please", "this", "that", "and", "or", "with", "from", "as", "it", "its", "while",
];

/// Units that turn a preceding number into a duration or a size.
const UNITS: &[&str] = &[
    "ms", "s", "sec", "secs", "second", "seconds", "m", "min", "mins", "minute", "minutes", "h",
    "hr", "hours", "us", "ns", "kb", "mb", "gb", "k",
];

/// Lowercases, splits on anything but letters, digits and `_`, drops stop words, and replaces
/// what varies between occurrences of the same failure by placeholders: numbers (`<num>`), numbers
/// with a unit (`<dur>`), ids (`<id>`: tokens mixing letters and at least three digits, or long
/// hex, or seven digits and more), and whatever `rename` maps (tool and provider names). HTTP-like status codes (400–599)
/// stay literal: `429` and `503` name different causes. Runs of the same placeholder collapse.
pub(crate) fn normalize_message(
    message: &str,
    rename: impl Fn(&str) -> Option<&'static str>,
) -> Vec<String> {
    let lower = message.to_lowercase();
    let words: Vec<&str> = lower
        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .collect();
    let mut out: Vec<String> = Vec::with_capacity(words.len());
    let mut i = 0;
    while i < words.len() {
        let word = words[i];
        i += 1;
        let token: String = if let Some(renamed) = rename(word) {
            renamed.to_owned()
        } else if word.chars().all(|c| c.is_ascii_digit()) {
            // A number followed by a unit word is a duration or size; status codes stay literal.
            if words.get(i).is_some_and(|next| UNITS.contains(next)) {
                i += 1;
                "<dur>".to_owned()
            } else if word.len() == 3 && ("400".."600").contains(&word) {
                word.to_owned()
            } else if word.len() >= 7 {
                // Long digit runs are ids (hex ids that happen to have no letters), not amounts.
                "<id>".to_owned()
            } else {
                "<num>".to_owned()
            }
        } else if let Some(unit) = numeric_with_unit(word) {
            if UNITS.contains(&unit) {
                "<dur>".to_owned()
            } else {
                "<num>".to_owned()
            }
        } else if looks_like_id(word) {
            "<id>".to_owned()
        } else if STOP_WORDS.contains(&word) {
            continue;
        } else {
            word.to_owned()
        };
        if token.starts_with('<') && out.last() == Some(&token) {
            continue;
        }
        out.push(token);
    }
    out
}

/// `5000ms` -> `Some("ms")`; `12s` -> `Some("s")`; `4o` -> `Some("o")`; `abc` -> `None`.
fn numeric_with_unit(word: &str) -> Option<&str> {
    let digits = word.chars().take_while(char::is_ascii_digit).count();
    if digits == 0 || digits == word.len() {
        return None;
    }
    let rest = &word[digits..];
    (rest.chars().all(|c| c.is_ascii_alphabetic()) && UNITS.contains(&rest)).then_some(rest)
}

/// Request ids, container ids, hex digests: letters and digits mixed with several digits, or long
/// runs of hex.
fn looks_like_id(word: &str) -> bool {
    let digits = word.chars().filter(char::is_ascii_digit).count();
    let letters = word.chars().filter(|c| c.is_alphabetic()).count();
    let hex = word.chars().all(|c| c.is_ascii_hexdigit());
    (digits >= 3 && letters >= 1) || (hex && word.len() >= 8 && digits >= 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools(word: &str) -> Option<&'static str> {
        ["web_search", "sql_query"]
            .contains(&word)
            .then_some("<tool>")
    }

    #[test]
    fn numbers_durations_ids_and_tools_become_placeholders() {
        let a = normalize_message("web_search timed out after 5000 ms", tools);
        let b = normalize_message("sql_query timed out after 3000 ms", tools);
        assert_eq!(a, b);
        assert_eq!(a, ["<tool>", "timed", "out", "after", "<dur>"]);
        let c = normalize_message("Timeout: tool 'web_search' exceeded 5s deadline", tools);
        assert_eq!(
            c,
            ["timeout", "tool", "<tool>", "exceeded", "<dur>", "deadline"]
        );
        let d = normalize_message(
            "openai returned 502 Bad Gateway (request id req_9f8e7d6c5b4a3210)",
            |_| None,
        );
        assert_eq!(
            d,
            [
                "openai", "returned", "502", "bad", "gateway", "request", "id", "<id>"
            ]
        );
        let e = normalize_message("Sandbox container sb-3f2a91c0de was OOM-killed", |_| None);
        assert_eq!(e, ["sandbox", "container", "sb", "<id>", "oom", "killed"]);
        // Status codes stay; other numbers do not; repeated placeholders collapse.
        let f = normalize_message("HTTP 429 Too Many Requests, limit 30000 / 2.5", |_| None);
        assert_eq!(
            f,
            ["http", "429", "too", "many", "requests", "limit", "<num>"]
        );
        assert!(normalize_message("", |_| None).is_empty());
        assert!(normalize_message("  ... !!! ", |_| None).is_empty());
    }

    fn doc<'a>(category: &'a str, message: &'a str, tool: &'a str) -> FailureDoc<'a> {
        FailureDoc {
            failure_category: category,
            error_message: message,
            tools: vec![tool],
            ..FailureDoc::default()
        }
    }

    #[test]
    fn vectors_are_unit_length_and_similar_wording_is_close() {
        let docs = [
            doc(
                "timeout",
                "web_search timed out after 5000 ms",
                "web_search",
            ),
            doc("timeout", "sql_query timed out after 3000 ms", "sql_query"),
            doc(
                "model_error",
                "HTTP 429 Too Many Requests from provider openai",
                "x",
            ),
        ];
        let model = HashedTfIdf::fit(&docs, [], 1024, BlockWeights::default());
        let v: Vec<Sparse> = docs.iter().map(|d| model.transform(d)).collect();
        for x in &v {
            let norm: f64 = x.iter().map(|(_, v)| v * v).sum();
            assert!((norm - 1.0).abs() < 1e-9);
            assert!(x.windows(2).all(|w| w[0].0 < w[1].0), "sorted, distinct");
        }
        let dot = |a: &Sparse, b: &Sparse| -> f64 {
            a.iter()
                .filter_map(|(i, x)| b.iter().find(|(j, _)| j == i).map(|(_, y)| x * y))
                .sum()
        };
        assert!(dot(&v[0], &v[1]) > 0.8, "{}", dot(&v[0], &v[1]));
        assert!(dot(&v[0], &v[2]) < 0.2, "{}", dot(&v[0], &v[2]));
        // A failure with nothing in it has no vector rather than NaNs.
        assert!(model.transform(&FailureDoc::default()).is_empty());
    }

    #[test]
    fn buckets_are_stable() {
        // FNV-1a is fixed: a stored model must featurize the same way in every build.
        assert_eq!(bucket("w:timed", 2048), bucket("w:timed", 2048));
        assert_eq!(bucket("", 7), (0xcbf2_9ce4_8422_2325u64 % 7) as u32);
        assert_eq!(bucket("x", 0), 0);
    }
}
