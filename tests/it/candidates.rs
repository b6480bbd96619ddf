//! Candidate generation against a simulated world: statistics load from a real database, every
//! generated set meets the hard constraints, and by the world's hidden ground truth the
//! heuristics' choices are much better than the world's plausible-but-random candidate diffs.

use std::collections::HashMap;

use arc_rec::candidates::{
    CandidateIndex, CandidateRequest, FailureObservation, MAX_CANDIDATES, candidate_features,
    config_features, generate, same_json, usable,
};
use arc_rec::domain::{Candidate, CandidateSource, RecommendationType};
use arc_rec::storage::candidate_stats::{
    load_model_candidates, save_model_candidates_by_cluster, tools_called,
};
use arc_rec::world::{Context, Environment};
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::json;

use crate::helpers::{arc_rec, fresh_database};

const SEED: u64 = 5;
const CONTEXTS: usize = 150;

fn request_for(ctx: &Context) -> CandidateRequest {
    CandidateRequest {
        failures: ctx.failures.iter().map(FailureObservation::from).collect(),
        ..CandidateRequest::new(ctx.current_config.clone())
    }
}

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len().max(1) as f64
}

fn assert_constraints(
    env: &Environment,
    ctx: &Context,
    candidates: &[Candidate],
    cap: Option<f64>,
) {
    assert!(candidates.len() <= MAX_CANDIDATES);
    for (i, c) in candidates.iter().enumerate() {
        let patched = usable(&ctx.current_config, &c.diff)
            .unwrap_or_else(|| panic!("invalid or no-op candidate {c:?}"));
        for other in &candidates[..i] {
            let before = usable(&ctx.current_config, &other.diff).unwrap();
            assert!(!same_json(&before, &patched), "duplicate {c:?}");
        }
        assert_eq!(
            c.candidate_id,
            Candidate::id_for(c.recommendation_type, &c.diff)
        );
        if let Some(cap) = cap {
            assert!(c.expected_cost_delta_usd <= cap);
        }
        // Models are only ever ones the organization has run: the world knows them all.
        assert!(env.effect(ctx, &c.diff).applicable, "{c:?}");
    }
}

#[tokio::test]
async fn heuristics_beat_random_diffs_by_the_worlds_ground_truth() {
    let db = fresh_database().await;
    let output = arc_rec(&db.url)
        .args(["simulate", "--seed", "5", "--outcomes", "3000"])
        .output()
        .expect("run arc-rec simulate");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    let indexes: HashMap<String, CandidateIndex> = CandidateIndex::load_all(db.pool())
        .await
        .expect("load statistics")
        .into_iter()
        .map(|index| (index.org.clone(), index))
        .collect();
    assert_eq!(indexes.len(), 3);
    for index in indexes.values() {
        assert!(index.org_stats.runs > 500, "{}", index.org_stats.runs);
        assert!(index.models.iter().filter(|m| m.proposable()).count() >= 3);
        let decided: u64 = index.levers.iter().flatten().map(|agg| agg.decided()).sum();
        assert!(decided > 20, "past diffs per org: {decided}");
        assert!(index.typical.retry_attempts.is_some());
        assert!(index.tools.iter().any(|t| t.p90_ok_s.is_some()));
    }
    let runs: u64 = indexes.values().map(|i| i.org_stats.runs).sum();
    assert_eq!(
        runs, 3000,
        "every outcome counted once, in its own organization"
    );
    // An organization nobody knows has empty statistics, not an error.
    let unknown = CandidateIndex::load(db.pool(), "nobody").await.unwrap();
    assert!(unknown.models.is_empty());

    let env = Environment::from_seed(SEED);
    let mut rng = StdRng::seed_from_u64(11);
    let (mut ours_all, mut random_all) = (Vec::new(), Vec::new());
    let (mut ours_top, mut ours_best, mut random_best) = (Vec::new(), Vec::new(), Vec::new());
    let (mut accept_top, mut accept_random) = (Vec::new(), Vec::new());
    let mut sizes = Vec::new();
    let mut types: HashMap<RecommendationType, usize> = HashMap::new();
    for _ in 0..CONTEXTS {
        let ctx = env.next_context(&mut rng);
        let index = &indexes[&ctx.org];
        let mut request = request_for(&ctx);
        let candidates = generate(index, &request);
        assert_constraints(&env, &ctx, &candidates, None);
        // The world's random candidates know no cost cap, so quality is compared uncapped; the
        // cap is checked on its own.
        let cap = [0.0, 0.002, 0.01][sizes.len() % 3];
        request.max_cost_increase_usd_per_run = Some(cap);
        let capped = generate(index, &request);
        assert_constraints(&env, &ctx, &capped, Some(cap));
        assert!(capped.len() <= candidates.len());
        assert!(!candidates.is_empty());
        sizes.push(candidates.len() as f64);
        for c in &candidates {
            *types.entry(c.recommendation_type).or_default() += 1;
            assert_eq!(
                candidate_features(c, &ctx.current_config).len(),
                arc_rec::candidates::CANDIDATE_FEATURES
            );
        }
        assert!(
            config_features(&ctx.current_config, index)
                .iter()
                .all(|x| x.is_finite())
        );

        let truth = |diff: &serde_json::Value| env.effect(&ctx, diff).reliability_delta;
        let ours: Vec<f64> = candidates.iter().map(|c| truth(&c.diff)).collect();
        let random: Vec<f64> = env
            .candidate_diffs(&ctx)
            .iter()
            .map(|(_, diff, _)| truth(diff))
            .collect();
        ours_all.extend(&ours);
        random_all.push(mean(&random));
        // The candidates come sorted by expected reliability delta: the first is our top pick.
        ours_top.push(ours[0]);
        ours_best.push(ours.iter().copied().fold(f64::MIN, f64::max));
        random_best.push(random.iter().copied().fold(f64::MIN, f64::max));
        accept_top.push(env.acceptance_probability(&ctx, &candidates[0].diff));
        let world = env.candidate_diffs(&ctx);
        accept_random.push(mean(
            &world
                .iter()
                .map(|(_, diff, _)| env.acceptance_probability(&ctx, diff))
                .collect::<Vec<_>>(),
        ));
    }
    let report = format!(
        "candidates per context {:.1} (min {}, max {}); types {types:?}\n\
         true reliability delta: all ours {:.4}, random candidate {:.4}, our top pick {:.4}, \
         best of ours {:.4}, best of random set {:.4}\n\
         acceptance probability: our top pick {:.3}, random candidate {:.3}",
        mean(&sizes),
        sizes.iter().copied().fold(f64::MAX, f64::min),
        sizes.iter().copied().fold(f64::MIN, f64::max),
        mean(&ours_all),
        mean(&random_all),
        mean(&ours_top),
        mean(&ours_best),
        mean(&random_best),
        mean(&accept_top),
        mean(&accept_random),
    );
    println!("{report}");
    assert!(mean(&sizes) >= 9.0, "{report}");
    assert!(sizes.iter().all(|n| *n >= 3.0), "{report}");
    assert!(types.len() == 8, "every type appears: {report}");
    assert!(mean(&ours_all) > mean(&random_all) + 0.01, "{report}");
    assert!(
        mean(&ours_top) > 2.0 * mean(&random_all).max(0.01),
        "{report}"
    );
    // The oracle's pick among ours beats the oracle's pick among the world's candidates.
    assert!(mean(&ours_best) > mean(&random_best), "{report}");
    assert!(mean(&accept_top) > mean(&accept_random) + 0.05, "{report}");
}

#[tokio::test]
async fn model_candidates_and_called_tools_load_per_organization() {
    let db = fresh_database().await;
    let pool = db.pool();
    for statement in [
        "INSERT INTO organizations (org_id) VALUES ('acme'), ('globex')",
        "INSERT INTO model_versions (org_id, model_version_id, base_model)
         VALUES ('acme', 'mv1', 'Qwen/Qwen2.5-7B'), ('globex', 'mv9', 'Qwen/Qwen2.5-7B')",
        "INSERT INTO failure_clusters (org_id, cluster_id, label, centroid)
         VALUES ('acme', 'tool_timeout-web_search', 'web_search timeouts', '{0.1}')",
        r#"INSERT INTO candidate_recommendations
             (org_id, candidate_id, cluster_id, recommendation_type, diff, description,
              expected_reliability_delta, evidence_count, source, model_version_id)
           VALUES
             ('acme', 'x1', 'tool_timeout-web_search', 'retry_policy', '{"retry": {"max_attempts": 3}}',
              'Retry web_search up to 3 times', 0.1, 4, 'model', 'mv1'),
             ('acme', 'x2', NULL, 'not_a_type', '{"temperature": 0.1}', 'bad type', NULL, 0, 'model', 'mv1'),
             ('acme', 'x3', NULL, 'temperature', '{"temperature": 0.2}', 'heuristic row', NULL, 0, 'heuristic', NULL),
             ('globex', 'x4', NULL, 'temperature', '{"temperature": 0.3}', 'other org', NULL, 0, 'model', 'mv9')"#,
    ] {
        sqlx::query(statement).execute(pool).await.expect(statement);
    }
    let all = load_model_candidates(pool, "acme", None).await.unwrap();
    assert_eq!(all.len(), 1, "{all:?}");
    let c = &all[0];
    assert_eq!(c.recommendation_type, RecommendationType::RetryPolicy);
    assert_eq!(
        c.candidate_id,
        Candidate::id_for(c.recommendation_type, &c.diff)
    );
    assert_eq!(
        c.source,
        CandidateSource::Model {
            model_version_id: "mv1".to_owned(),
            prior: None,
        }
    );
    assert_eq!(c.expected_cost_delta_usd, 0.0);
    let in_cluster = load_model_candidates(pool, "acme", Some("tool_timeout-web_search"))
        .await
        .unwrap();
    assert_eq!(in_cluster.len(), 1);
    assert!(
        load_model_candidates(pool, "acme", Some("other"))
            .await
            .unwrap()
            .is_empty()
    );

    // Model candidates go through the same constraints as heuristic ones.
    let current =
        json!({"model": "openai/gpt-4.1", "temperature": 0.7, "retry": {"max_attempts": 3}});
    let mut request = CandidateRequest::new(current);
    request.model_candidates = all;
    let out = generate(&CandidateIndex::empty("acme"), &request);
    assert!(
        out.iter()
            .all(|c| matches!(c.source, CandidateSource::Heuristic)),
        "the model's retry policy is already in place: {out:?}"
    );

    // Tools called by outcomes, this organization only.
    assert!(
        tools_called(pool, "acme", &["o1".to_owned()])
            .await
            .unwrap()
            .is_empty()
    );
    let output = arc_rec(&db.url)
        .arg("ingest")
        .arg(crate::helpers::fixture("contracts.jsonl"))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        tools_called(pool, "acme", &["o1".to_owned()])
            .await
            .unwrap(),
        ["web_search"]
    );
    assert!(
        tools_called(pool, "globex", &["o1".to_owned()])
            .await
            .unwrap()
            .is_empty()
    );
    let index = CandidateIndex::load(pool, "acme").await.unwrap();
    assert_eq!(index.org_stats.runs, 1);
    // A window after the only outcome and diff leaves nothing.
    let later = "2026-11-21T00:00:00Z".parse().unwrap();
    let windowed = CandidateIndex::load_since(pool, "acme", Some(later))
        .await
        .unwrap();
    assert_eq!(windowed.org_stats.runs, 0);
    assert!(windowed.tools.is_empty() && windowed.models.is_empty());
    assert_eq!(
        windowed
            .levers
            .iter()
            .flatten()
            .map(|a| a.proposed)
            .sum::<u64>(),
        0
    );
    assert_eq!(
        index
            .levers
            .iter()
            .flatten()
            .map(|a| a.proposed)
            .sum::<u64>(),
        1
    );
    assert_eq!(index.models[0].model, "openai/gpt-4.1");
    let web = index.tool("web_search").unwrap();
    assert_eq!((web.calls, web.ok_calls), (1, 0));
}

#[tokio::test]
async fn the_newest_model_generation_takes_a_stored_candidate_over() {
    let db = fresh_database().await;
    let pool = db.pool();
    for statement in [
        "INSERT INTO organizations (org_id) VALUES ('acme')",
        "INSERT INTO failure_clusters (org_id, cluster_id, label, centroid)
         VALUES ('acme', 'timeout-web_search', 'web_search timeouts', '{0.1}')",
        r#"INSERT INTO candidate_recommendations
             (org_id, candidate_id, cluster_id, recommendation_type, diff, description,
              evidence_count, source, model_version_id)
           VALUES ('acme', 'c-heuristic', NULL, 'temperature', '{"temperature": 0.2}', 'heuristic row',
                   0, 'heuristic', NULL)"#,
    ] {
        sqlx::query(statement).execute(pool).await.expect(statement);
    }
    let candidate = |kind: RecommendationType, diff: serde_json::Value, version: &str| Candidate {
        candidate_id: Candidate::id_for(kind, &diff),
        recommendation_type: kind,
        diff,
        description: format!("from {version}"),
        expected_reliability_delta: 0.0,
        expected_cost_delta_usd: 0.0,
        evidence_count: 0,
        source: CandidateSource::Model {
            model_version_id: version.to_owned(),
            prior: None,
        },
    };
    let retry = json!({"retry": {"max_attempts": 3}});
    let cooler = json!({"temperature": 0.3});
    let first = vec![
        (
            Some("timeout-web_search".to_owned()),
            candidate(RecommendationType::RetryPolicy, retry.clone(), "rft-1"),
        ),
        (
            None,
            candidate(RecommendationType::Temperature, cooler.clone(), "rft-1"),
        ),
    ];
    let saved = save_model_candidates_by_cluster(pool, "acme", "rft-1", "tiny", &first)
        .await
        .unwrap();
    assert_eq!((saved.inserted, saved.updated), (2, 0));
    // Idempotent for the same generation.
    let saved = save_model_candidates_by_cluster(pool, "acme", "rft-1", "tiny", &first)
        .await
        .unwrap();
    assert_eq!((saved.inserted, saved.updated), (0, 2));
    // A newer model version proposing the same retry policy (now for any cluster) takes its row
    // over; a heuristic row with a colliding id is left alone.
    let mut heuristic_id = candidate(
        RecommendationType::Temperature,
        json!({"temperature": 0.2}),
        "rft-2",
    );
    heuristic_id.candidate_id = "c-heuristic".to_owned();
    let second = vec![
        (
            None,
            candidate(RecommendationType::RetryPolicy, retry, "rft-2"),
        ),
        (None, heuristic_id),
    ];
    let saved = save_model_candidates_by_cluster(pool, "acme", "rft-2", "tiny", &second)
        .await
        .unwrap();
    assert_eq!((saved.inserted, saved.updated), (0, 1));
    /// Type, cluster, source, model version, description.
    type Row = (String, Option<String>, String, Option<String>, String);
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT recommendation_type, cluster_id, source, model_version_id, description
         FROM candidate_recommendations WHERE org_id = 'acme' ORDER BY recommendation_type, source",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(
        rows,
        [
            (
                "retry_policy".to_owned(),
                None,
                "model".to_owned(),
                Some("rft-2".to_owned()),
                "from rft-2".to_owned()
            ),
            (
                "temperature".to_owned(),
                None,
                "heuristic".to_owned(),
                None,
                "heuristic row".to_owned()
            ),
            (
                "temperature".to_owned(),
                None,
                "model".to_owned(),
                Some("rft-1".to_owned()),
                "from rft-1".to_owned()
            ),
        ]
    );
    // Both model versions have their rows (created when missing).
    let versions: Vec<String> = sqlx::query_scalar(
        "SELECT model_version_id FROM model_versions WHERE org_id = 'acme' ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(versions, ["rft-1", "rft-2"]);
}
