//! Tests of the whole pipeline on hand-made failures and a small synthetic world.

use std::collections::BTreeSet;

use super::eval::{measure, world_patterns};
use super::*;

fn pattern(id: usize, category: &str, message: &str, tool: Option<&str>) -> PatternInput {
    PatternInput {
        pattern_id: format!("p{id}"),
        failure_type: "tool_error".to_owned(),
        failure_category: category.to_owned(),
        error_message: message.to_owned(),
        failing_tools: tool.map(str::to_owned).into_iter().collect(),
        tools: tool.map(str::to_owned).into_iter().collect(),
        ..PatternInput::default()
    }
}

/// Three clearly different failures, many wordings of numbers and tools each.
fn hand_made() -> Vec<PatternInput> {
    let tools = ["web_search", "sql_query", "crm_lookup"];
    (0..60)
        .map(|i| {
            let tool = tools[i % 3];
            match i % 3 {
                0 => pattern(
                    i,
                    "timeout",
                    &format!("{tool} timed out after {} ms", 1000 + i * 37),
                    Some(tool),
                ),
                1 => pattern(
                    i,
                    "model_error",
                    &format!("HTTP 429 Too Many Requests (retry-after {}s)", i % 50),
                    None,
                ),
                _ => pattern(
                    i,
                    "sandbox_error",
                    &format!("Sandbox container sb-{:010x} was OOM-killed", i * 7919),
                    None,
                ),
            }
        })
        .collect()
}

fn options() -> ClusterOptions {
    ClusterOptions {
        dims: 4,
        ..ClusterOptions::default()
    }
}

#[test]
fn hand_made_failures_form_their_three_clusters() {
    let patterns = hand_made();
    let fit = fit_org("acme", &patterns, &Previous::default(), &options()).unwrap();
    assert_eq!(fit.summary.k, 3, "{:?}", fit.summary);
    assert_eq!(fit.assignments.len(), patterns.len());
    let labels: BTreeSet<&str> = fit.model.clusters().map(|(_, l, _)| l).collect();
    assert!(labels.contains("timeout-web_search"), "{labels:?}");
    assert!(labels.contains("model_error"), "{labels:?}");
    for (a, p) in fit.assignments.iter().zip(&patterns) {
        let first = fit
            .assignments
            .iter()
            .zip(&patterns)
            .find(|(_, q)| q.failure_category == p.failure_category)
            .unwrap()
            .0;
        assert_eq!(a.cluster_id, first.cluster_id);
        assert!((0.0..=1.0).contains(&a.confidence));
    }
    // A fresh wording of a known failure lands with its kind.
    let timeout = fit
        .assignments
        .iter()
        .zip(&patterns)
        .find(|(_, p)| p.failure_category == "timeout")
        .unwrap()
        .0
        .cluster_id
        .clone();
    let a = fit
        .model
        .assign(&FailureInput::Failures(vec![FailureText {
            failure_category: "timeout".into(),
            error_message: "pdf_extract timed out after 12000 ms".into(),
            tool_name: Some("pdf_extract".into()),
            error_type: None,
        }]))
        .unwrap();
    assert_eq!(a.cluster_id, timeout);
    assert_eq!(a.reduced.len(), 4);
    assert_eq!(a.placed_by, PlacedBy::Text);
    assert!(a.confidence > 0.5, "{a:?}");
}

#[test]
fn refitting_keeps_ids_and_new_failures_get_new_ids() {
    let patterns = hand_made();
    let first = fit_org("acme", &patterns, &Previous::default(), &options()).unwrap();
    let ids: BTreeSet<String> = first
        .model
        .clusters()
        .map(|(id, _, _)| id.to_owned())
        .collect();
    let previous = Previous {
        model: Some(first.model.clone()),
        cluster_ids: ids.clone(),
    };
    // Same data, reversed order (k-means sees a permutation): same ids, same placements.
    let mut reversed = patterns.clone();
    reversed.reverse();
    let second = fit_org("acme", &reversed, &previous, &options()).unwrap();
    assert_eq!(second.summary.ids_kept, 3);
    assert_eq!(second.summary.ids_new, 0);
    assert_eq!(second.model.version(), 2);
    for a in &second.assignments {
        let before = first
            .assignments
            .iter()
            .find(|b| b.pattern_id == a.pattern_id)
            .unwrap();
        assert_eq!(a.cluster_id, before.cluster_id);
    }
    // A new kind of failure appears: old ids stay, the new one gets its own.
    let mut grown = patterns.clone();
    grown.extend((100..130).map(|i| {
        pattern(
            i,
            "validation_error",
            &format!("Final answer failed schema validation: missing field f{i}"),
            None,
        )
    }));
    let third = fit_org("acme", &grown, &previous, &options()).unwrap();
    let third_ids: BTreeSet<String> = third
        .model
        .clusters()
        .map(|(id, _, _)| id.to_owned())
        .collect();
    assert!(ids.is_subset(&third_ids), "{ids:?} vs {third_ids:?}");
    assert_eq!(third.summary.ids_new, third_ids.len() - 3);
    assert!(third.summary.retired.is_empty());
}

#[test]
fn embeddings_are_checked() {
    let mut patterns = hand_made();
    for (i, p) in patterns.iter_mut().enumerate() {
        let mut e = vec![0.0f32; 8];
        e[i % 3] = 1.0;
        e[3 + i % 5] = 0.1;
        p.error_embedding = Some(e);
    }
    let fit = fit_org("acme", &patterns, &Previous::default(), &options()).unwrap();
    assert_eq!(fit.summary.featurizer, FeaturizerKind::ClientEmbedding);
    assert_eq!(fit.model.embedding_dim(), Some(8));
    let err = fit
        .model
        .assign(&FailureInput::Embedding(vec![0.1; 1536]))
        .unwrap_err();
    assert!(matches!(
        err,
        ClusterError::DimensionMismatch {
            expected: 8,
            actual: 1536
        }
    ));
    assert!(err.to_string().contains("expected 8"), "{err}");
    let mut nan = vec![0.0f32; 8];
    nan[2] = f32::NAN;
    assert!(matches!(
        fit.model.assign(&FailureInput::Embedding(nan)),
        Err(ClusterError::NonFiniteEmbedding { index: 2 })
    ));
    assert!(matches!(
        fit.model.assign(&FailureInput::Embedding(vec![0.0; 8])),
        Err(ClusterError::ZeroEmbedding)
    ));
    let mut e = vec![0.0f32; 8];
    e[1] = 1.0;
    let a = fit.model.assign(&FailureInput::Embedding(e)).unwrap();
    assert_eq!(a.placed_by, PlacedBy::Embedding);
    // Text still places a failure in an embedding-clustered org.
    let a = fit
        .model
        .assign(&FailureInput::Failures(vec![FailureText {
            failure_category: "model_error".into(),
            error_message: "HTTP 429 Too Many Requests (retry-after 3s)".into(),
            ..FailureText::default()
        }]))
        .unwrap();
    assert_eq!(a.placed_by, PlacedBy::Text);
    assert_eq!(a.reduced.len(), 4);
}

#[test]
fn mixed_and_missing_embeddings_fall_back_without_panicking() {
    let mut patterns = hand_made();
    // Half the patterns with one dimension, a few with another, some broken: too mixed to use.
    for (i, p) in patterns.iter_mut().enumerate() {
        p.error_embedding = match i % 4 {
            0 | 1 => Some(vec![1.0, i as f32, 0.5]),
            2 => Some(vec![f32::NAN; 5]),
            _ => None,
        };
    }
    let fit = fit_org("acme", &patterns, &Previous::default(), &options()).unwrap();
    assert_eq!(fit.summary.featurizer, FeaturizerKind::HashedTfidf);
    // An embedding for a text-clustered org is a clear error, not a guess.
    assert!(matches!(
        fit.model
            .assign(&FailureInput::Embedding(vec![1.0, 0.0, 0.0])),
        Err(ClusterError::NoEmbeddingModel { .. })
    ));
    // With failures alongside, the failures place it.
    let both = FailureInput::Both {
        embedding: vec![1.0, 0.0, 0.0],
        failures: vec![FailureText {
            failure_category: "timeout".into(),
            error_message: "web_search timed out after 10 ms".into(),
            ..FailureText::default()
        }],
    };
    assert!(fit.model.assign(&both).is_ok());
}

#[test]
fn empty_and_degenerate_input() {
    let o = options();
    assert!(matches!(
        fit_org("acme", &[], &Previous::default(), &o),
        Err(ClusterError::EmptyInput)
    ));
    // One pattern, or empty messages: one cluster, no panic.
    let one = [pattern(0, "timeout", "x timed out", None)];
    let fit = fit_org("acme", &one, &Previous::default(), &o).unwrap();
    assert_eq!(fit.summary.k, 1);
    let blank: Vec<PatternInput> = (0..5).map(|i| pattern(i, "", "", None)).collect();
    let fit = fit_org("acme", &blank, &Previous::default(), &o).unwrap();
    assert_eq!(fit.assignments.len(), 5);
    assert!(matches!(
        fit.model.assign(&FailureInput::Failures(vec![])),
        Err(ClusterError::EmptyInput)
    ));
    for bad in [
        ClusterOptions {
            dims: 1,
            ..o.clone()
        },
        ClusterOptions {
            dims: 65,
            ..o.clone()
        },
        ClusterOptions {
            k: Some(0),
            ..o.clone()
        },
    ] {
        assert!(matches!(
            fit_org("acme", &one, &Previous::default(), &bad),
            Err(ClusterError::InvalidOption(_))
        ));
    }
}

#[test]
fn stored_form_round_trips() {
    let fit = fit_org("acme", &hand_made(), &Previous::default(), &options()).unwrap();
    let again = ClusterModel::from_stored(fit.model.stored().clone()).unwrap();
    assert_eq!(again, fit.model);
    let mut broken = fit.model.stored().clone();
    broken.clusters[0].centroid.pop();
    assert!(matches!(
        ClusterModel::from_stored(broken),
        Err(ClusterError::Corrupt(_))
    ));
    let mut broken = fit.model.stored().clone();
    broken.text.mean[0] = f32::NAN;
    assert!(ClusterModel::from_stored(broken).is_err());
}

/// The synthetic world's latent modes are recovered (threshold below the measured figure: see
/// `eval::report`).
#[test]
fn synthetic_world_modes_are_recovered() {
    let orgs = world_patterns(3, 3000, None);
    let (purity, ari, _) = measure(&orgs, &ClusterOptions::default());
    assert!(purity > 0.9, "purity {purity}");
    assert!(ari > 0.7, "ARI {ari}");
}
