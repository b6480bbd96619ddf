//! Tests of the world as a whole: determinism, sizes, record validity and order, message variety,
//! and the properties later benchmarks rely on (the oracle beats random, approvals help, some
//! failures cannot be fixed).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Instant;

use chrono::{TimeZone, Utc};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::domain::records::{ApprovalStatus, RecordData, RecordKind};
use crate::domain::{IngestRecord, apply_merge_patch};

use super::failure::{FailureFacts, render_message, template_count};
use super::*;

fn params(seed: u64, outcomes: usize) -> WorldParams {
    WorldParams {
        seed,
        outcomes,
        ..WorldParams::default()
    }
}

fn world(seed: u64, outcomes: usize) -> World {
    World::new(params(seed, outcomes)).expect("valid params")
}

fn lines(world: &World) -> Vec<String> {
    world.history().map(|r| r.to_line()).collect()
}

fn count_kind(world: &World, kind: RecordKind) -> usize {
    world.history().filter(|r| r.kind() == kind).count()
}

#[test]
fn same_params_give_byte_identical_history() {
    let a = lines(&world(7, 400));
    let b = lines(&world(7, 400));
    assert_eq!(a, b);
    assert_ne!(a, lines(&world(8, 400)), "another seed gives another world");
}

#[test]
fn catalogue_is_broad_enough() {
    assert!(MODELS.len() >= 9);
    assert!(providers().len() >= 5);
    assert!(FailureMode::ALL.len() >= 8);
    assert!(TOOLS.len() >= 7);
    let w = world(1, 0);
    assert_eq!(w.orgs().len(), 3);
    for org in w.orgs() {
        let roles: BTreeSet<&str> = org.users.iter().map(|u| u.role.as_str()).collect();
        assert!(roles.len() >= 5, "{roles:?}");
        assert!(org.scenarios.len() >= 10);
    }
}

#[test]
fn outcome_count_hits_the_target() {
    for target in [0usize, 1, 37, 1000, 3000] {
        let w = world(3, target);
        let got = count_kind(&w, RecordKind::Outcome);
        let tolerance = target / 20;
        assert!(
            got.abs_diff(target) <= tolerance,
            "target {target}, got {got}"
        );
    }
}

#[test]
fn invalid_params_are_errors_not_panics() {
    let with = |f: fn(&mut WorldParams)| {
        let mut p = WorldParams::default();
        f(&mut p);
        World::new(p)
    };
    assert_eq!(with(|p| p.orgs.clear()).unwrap_err(), WorldError::NoOrgs);
    assert!(matches!(
        with(|p| p.orgs = vec!["a b".into()]),
        Err(WorldError::InvalidOrg(_))
    ));
    assert!(matches!(
        with(|p| p.orgs = vec!["a".into(), "a".into()]),
        Err(WorldError::DuplicateOrg(_))
    ));
    assert_eq!(
        with(|p| p.embedding_dim = Some(0)).unwrap_err(),
        WorldError::EmbeddingDim(0)
    );
    assert!(matches!(
        with(|p| p.outcomes = usize::MAX),
        Err(WorldError::TooManyOutcomes(_))
    ));
    assert!(matches!(
        with(|p| p.start = Utc.with_ymd_and_hms(9999, 1, 1, 0, 0, 0).unwrap()),
        Err(WorldError::Start(_))
    ));
    // Many organizations, one of them, tiny embeddings: all fine.
    assert!(with(|p| p.orgs = (0..20).map(|i| format!("org-{i}")).collect()).is_ok());
    let one = World::new(WorldParams {
        orgs: vec!["solo".into()],
        embedding_dim: Some(1),
        outcomes: 50,
        ..WorldParams::default()
    })
    .expect("valid");
    assert_eq!(count_kind(&one, RecordKind::Outcome), 50);
}

#[test]
fn every_record_validates_round_trips_and_follows_its_references() {
    let w = World::new(WorldParams {
        embedding_dim: Some(16),
        ..params(11, 1500)
    })
    .expect("valid");
    let mut seen: HashSet<(RecordKind, String)> = HashSet::new();
    let mut kinds: BTreeMap<RecordKind, usize> = BTreeMap::new();
    for record in w.history() {
        record
            .validate()
            .unwrap_or_else(|e| panic!("{e:?} in {}", record.to_line()));
        let again = IngestRecord::parse_line(&record.to_line()).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(again, record);
        for reference in record.references() {
            assert!(
                seen.contains(&(reference.target, reference.id.to_owned())),
                "{} refers to {:?} {} before it exists",
                record.to_line(),
                reference.target,
                reference.id
            );
        }
        assert!(
            seen.insert((record.kind(), record.id().to_owned())),
            "duplicate id {}",
            record.id()
        );
        *kinds.entry(record.kind()).or_default() += 1;
    }
    for kind in RecordKind::ALL {
        assert!(
            kinds.get(&kind).copied().unwrap_or(0) > 0,
            "no {kind:?} records: {kinds:?}"
        );
    }
}

#[test]
fn outcomes_look_like_the_platform() {
    let w = world(5, 1200);
    let (mut statuses, mut categories) = (BTreeSet::new(), BTreeSet::new());
    let (mut first, mut last) = (None, None);
    let mut with_tools = 0;
    for record in w.history() {
        if let RecordData::Outcome(o) = &record.data {
            statuses.insert(o.status.as_str());
            if let Some(c) = o.error_category {
                categories.insert(c.as_str());
            }
            assert_eq!(o.trajectory.status, o.status.as_str());
            assert!(!o.trajectory.llm_interactions.is_empty() || o.status.as_str() != "success");
            with_tools += usize::from(!o.trajectory.tool_calls.is_empty());
            first = first.min(Some(o.execution_time)).or(Some(o.execution_time));
            last = last.max(Some(o.execution_time));
        }
    }
    assert_eq!(statuses, BTreeSet::from(["error", "success", "timeout"]));
    assert!(categories.len() >= 5, "{categories:?}");
    assert!(with_tools > 1000);
    let (first, last) = (first.expect("outcomes"), last.expect("outcomes"));
    assert!(first >= WorldParams::default().start);
    let days = (last - first).num_days();
    assert!((120..=170).contains(&days), "history spans {days} days");
}

#[test]
fn every_mode_has_several_wordings() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let facts = FailureFacts {
        tool: "web_search".into(),
        nearest_tool: "calculator".into(),
        available_tools: vec!["calculator".into()],
        model: "openai/gpt-4.1".into(),
        provider: "openai".into(),
        timeout_s: 5.0,
        tokens: 9000,
        context_window: 8192,
        attempt: 1,
        max_attempts: 3,
    };
    for mode in FailureMode::ALL {
        let rendered: Vec<_> = (0..200)
            .map(|_| render_message(mode, &facts, &mut rng))
            .collect();
        let templates: BTreeSet<usize> = rendered.iter().map(|r| r.template).collect();
        let texts: BTreeSet<&str> = rendered.iter().map(|r| r.message.as_str()).collect();
        assert_eq!(templates.len(), template_count(mode), "{mode:?}");
        assert!(templates.len() >= 3 && texts.len() >= 3, "{mode:?}");
    }
}

#[test]
fn history_messages_vary_within_each_category() {
    let w = world(9, 3000);
    let mut messages: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for record in w.history() {
        if let RecordData::FailurePattern(p) = &record.data {
            // Digits and quoted names vary anyway; count wordings by their first three words.
            let shape: String = p
                .error_message
                .split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ");
            messages
                .entry(p.failure_category.clone())
                .or_default()
                .insert(shape);
        }
    }
    assert!(messages.len() >= 5, "{:?}", messages.keys());
    for (category, shapes) in &messages {
        assert!(shapes.len() >= 3, "{category}: {shapes:?}");
    }
}

#[test]
fn oracle_beats_uniform_random_by_two() {
    let env = Environment::new(&world(21, 0));
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let (mut random, mut oracle, mut sizes) = (0.0, 0.0, Vec::new());
    let contexts = 2000;
    for _ in 0..contexts {
        let ctx = env.next_context(&mut rng);
        let diffs: Vec<_> = env
            .candidate_diffs(&ctx)
            .into_iter()
            .map(|(_, diff, _)| diff)
            .collect();
        sizes.push(diffs.len());
        let probabilities: Vec<f64> = diffs
            .iter()
            .map(|d| env.acceptance_probability(&ctx, d))
            .collect();
        random += probabilities.iter().sum::<f64>() / probabilities.len().max(1) as f64;
        let best = env.best_of(&ctx, &diffs).expect("candidates");
        assert_eq!(first_best(&probabilities), Some(best));
        oracle += probabilities[best];
        assert!(probabilities.iter().all(|p| *p <= probabilities[best]));
    }
    let (random, oracle) = (random / contexts as f64, oracle / contexts as f64);
    let mean_size = sizes.iter().sum::<usize>() as f64 / sizes.len() as f64;
    assert!(
        (10.0..=30.0).contains(&mean_size),
        "mean candidates {mean_size}"
    );
    assert!(
        oracle >= 2.0 * random,
        "oracle {oracle:.3} vs random {random:.3}"
    );
    assert!(
        oracle >= 0.45 && random <= 0.3,
        "oracle {oracle:.3} vs random {random:.3}"
    );
}

#[test]
fn contexts_are_failing_configurations_with_reports() {
    let env = Environment::new(
        &World::new(WorldParams {
            embedding_dim: Some(8),
            ..params(2, 0)
        })
        .expect("valid"),
    );
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let mut dominant = BTreeSet::new();
    for _ in 0..300 {
        let ctx = env.next_context(&mut rng);
        assert!(!ctx.failures.is_empty() && ctx.failures.len() <= 4);
        assert_eq!(ctx.embedding.as_ref().map(Vec::len), Some(8));
        let rates = ctx.hidden().failure_rates();
        assert!(rates.windows(2).all(|w| w[0].1 >= w[1].1));
        dominant.extend(ctx.hidden().dominant_mode());
        let feedback = env.feedback(
            &ctx,
            &serde_json::json!({"retry": {"max_attempts": 3}}),
            &mut rng,
        );
        assert!(feedback.reliability_delta.is_finite());
    }
    assert!(dominant.len() >= 7, "dominant modes seen: {dominant:?}");
}

#[test]
fn sandbox_and_auth_failures_cannot_be_fixed_by_any_candidate() {
    let env = Environment::from_seed(4);
    let truth = env.ground_truth();
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let mut checked = 0;
    for _ in 0..300 {
        let ctx = env.next_context(&mut rng);
        let rate = |config: &serde_json::Value, mode: FailureMode| {
            truth
                .failure_rates(ctx.hidden(), config)
                .and_then(|r| r.into_iter().find(|(m, _)| *m == mode))
                .map(|(_, r)| r)
        };
        for mode in [FailureMode::SandboxFailure, FailureMode::ToolAuth] {
            let Some(before) = rate(&ctx.current_config, mode).filter(|r| *r > 0.0) else {
                continue;
            };
            checked += 1;
            assert!(!mode.fixable_by_config());
            for (_, diff, _) in env.candidate_diffs(&ctx) {
                let mut patched = ctx.current_config.clone();
                apply_merge_patch(&mut patched, &diff);
                let after = rate(&patched, mode).expect("candidates are valid");
                assert!(
                    after >= before - 1e-12,
                    "{mode:?} fell from {before} to {after} with {diff}"
                );
            }
        }
    }
    assert!(
        checked > 20,
        "only {checked} contexts had an unfixable mode"
    );
}

/// Per version, the mean reliability of its outcomes; and the approved diffs.
fn version_means_and_approvals(
    w: &World,
) -> (
    HashMap<String, (f64, usize)>,
    Vec<crate::domain::records::ConfigDiff>,
) {
    let mut sim_version: HashMap<String, String> = HashMap::new();
    let mut sums: HashMap<String, (f64, usize)> = HashMap::new();
    let mut approved = Vec::new();
    for record in w.history() {
        match record.data {
            RecordData::Simulation(s) => {
                sim_version.insert(s.simulation_id, s.config_version_id);
            }
            RecordData::Outcome(o) => {
                let version = sim_version[&o.simulation_id].clone();
                let entry = sums.entry(version).or_default();
                entry.0 += o.reliability_score;
                entry.1 += 1;
            }
            RecordData::ConfigDiff(d) if d.approval_status == ApprovalStatus::Approved => {
                approved.push(d);
            }
            _ => {}
        }
    }
    (sums, approved)
}

#[test]
fn approved_diffs_improve_measured_reliability_as_the_truth_says() {
    let w = world(13, 6000);
    let (sums, approved) = version_means_and_approvals(&w);
    let mean = |v: &str| sums.get(v).map(|(s, n)| s / *n as f64);
    let truth = w.ground_truth();
    let mut configs: HashMap<String, ConfigTruth> = HashMap::new();
    let mut versions: HashMap<String, serde_json::Value> = HashMap::new();
    for record in w.history() {
        if let RecordData::ConfigVersion(v) = record.data {
            versions.insert(v.version_id, v.parsed_config);
        }
    }
    let (mut measured, mut predicted, mut n) = (0.0, 0.0, 0usize);
    for diff in &approved {
        let Some(after_id) = &diff.version_after else {
            panic!("approved diff without version_after")
        };
        let (Some(before), Some(after)) = (mean(&diff.version_before), mean(after_id)) else {
            continue;
        };
        let config_truth = configs.entry(diff.config_id.clone()).or_insert_with(|| {
            w.config_truth(&diff.config_id)
                .expect("config of the history")
        });
        let effect = truth.effect(
            &config_truth.hidden,
            &versions[&diff.version_before],
            &diff.diff,
        );
        measured += after - before;
        predicted += effect.reliability_delta;
        n += 1;
    }
    assert!(
        n >= 30,
        "only {n} approved diffs with outcomes on both sides"
    );
    let (measured, predicted) = (measured / n as f64, predicted / n as f64);
    assert!(
        measured > 0.03,
        "approved diffs should help: measured {measured:.3}"
    );
    assert!(
        (measured - predicted).abs() < 0.03,
        "data {measured:.3} vs truth {predicted:.3}"
    );
}

#[test]
fn diffs_mix_approved_rejected_and_pending() {
    let w = world(17, 8000);
    let mut by_status: BTreeMap<&str, usize> = BTreeMap::new();
    let mut types = BTreeSet::new();
    for record in w.history() {
        if let RecordData::ConfigDiff(d) = &record.data {
            *by_status.entry(d.approval_status.as_str()).or_default() += 1;
            types.insert(d.recommendation_type.clone().unwrap_or_default());
            assert_eq!(
                d.version_after.is_some(),
                d.approval_status == ApprovalStatus::Approved
            );
        }
    }
    let total: usize = by_status.values().sum();
    let approved = by_status.get("approved").copied().unwrap_or(0) as f64 / total as f64;
    println!("approval: {by_status:?} ({approved:.2} approved)");
    assert!(
        (0.3..=0.52).contains(&approved),
        "approved share {approved:.2}: {by_status:?}"
    );
    assert!(
        by_status.get("rejected").copied().unwrap_or(0) > total / 5,
        "{by_status:?}"
    );
    assert!(by_status.contains_key("pending"), "{by_status:?}");
    assert_eq!(types.len(), 8, "{types:?}");
}

#[test]
fn config_truth_regenerates_history_configurations() {
    let w = world(19, 300);
    let first = w
        .history()
        .find_map(|r| match r.data {
            RecordData::ConfigVersion(v) => Some((v.config_id, v.parsed_config)),
            _ => None,
        })
        .expect("a version");
    let truth = w.config_truth(&first.0).expect("found");
    assert_eq!(truth.initial_config, first.1);
    assert!(w.config_truth("no-such-config").is_none());
}

/// Generation speed; run with
/// `cargo test --release --no-default-features --lib world::tests::generation_speed -- --ignored --nocapture`.
#[test]
#[ignore = "timing; run in release"]
fn generation_speed() {
    for outcomes in [20_000, 200_000] {
        let started = Instant::now();
        let w = world(42, outcomes);
        let (mut records, mut bytes, mut got) = (0usize, 0usize, 0usize);
        for record in w.history() {
            records += 1;
            got += usize::from(record.kind() == RecordKind::Outcome);
            bytes += record.to_line().len() + 1;
        }
        let elapsed = started.elapsed();
        assert_eq!(got, outcomes);
        println!(
            "{outcomes} outcomes: {records} records, {:.1} MB of JSON lines, {:.2} s (generate + serialize)",
            bytes as f64 / 1e6,
            elapsed.as_secs_f64()
        );
    }
}

/// The figures quoted in `docs/WORLD.md`; run with
/// `cargo test --release --no-default-features --lib world::tests::summary -- --ignored --nocapture`.
#[test]
#[ignore = "prints the figures of docs/WORLD.md"]
fn summary() {
    let w = world(42, 20_000);
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    let mut statuses: BTreeMap<&str, usize> = BTreeMap::new();
    let mut categories: BTreeMap<String, usize> = BTreeMap::new();
    let mut approvals: BTreeMap<&str, usize> = BTreeMap::new();
    let mut approved_types: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let (mut reliability, mut cost, mut outcomes) = (0.0, 0.0, 0usize);
    for record in w.history() {
        *kinds.entry(record.kind().as_str()).or_default() += 1;
        match &record.data {
            RecordData::Outcome(o) => {
                *statuses.entry(o.status.as_str()).or_default() += 1;
                reliability += o.reliability_score;
                cost += o.cost_usd.unwrap_or(0.0);
                outcomes += 1;
            }
            RecordData::FailurePattern(p) => {
                *categories.entry(p.failure_category.clone()).or_default() += 1;
            }
            RecordData::ConfigDiff(d) => {
                *approvals.entry(d.approval_status.as_str()).or_default() += 1;
                let entry = approved_types
                    .entry(d.recommendation_type.clone().unwrap_or_default())
                    .or_default();
                entry.0 += usize::from(d.approval_status == ApprovalStatus::Approved);
                entry.1 += 1;
            }
            _ => {}
        }
    }
    println!("records {kinds:?}");
    println!("outcome status {statuses:?}");
    println!("failure categories {categories:?}");
    println!("diffs {approvals:?}");
    println!("approved/proposed by type {approved_types:?}");
    println!(
        "mean reliability {:.3}, mean cost/outcome ${:.4}",
        reliability / outcomes as f64,
        cost / outcomes as f64
    );

    let env = Environment::new(&w);
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let (mut random, mut oracle, mut offered, n) = (0.0, 0.0, 0usize, 2000);
    let mut by_mode: BTreeMap<&str, (f64, f64, usize)> = BTreeMap::new();
    let mut best_types: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..n {
        let ctx = env.next_context(&mut rng);
        let candidates = env.candidate_diffs(&ctx);
        offered += candidates.len();
        let p: Vec<f64> = candidates
            .iter()
            .map(|(_, d, _)| env.acceptance_probability(&ctx, d))
            .collect();
        let mean = p.iter().sum::<f64>() / p.len().max(1) as f64;
        let diffs: Vec<_> = candidates.iter().map(|(_, d, _)| d.clone()).collect();
        let best = env.best_of(&ctx, &diffs).unwrap_or(0);
        random += mean;
        oracle += p.get(best).copied().unwrap_or(0.0);
        let mode = ctx
            .hidden()
            .dominant_mode()
            .map_or("none", FailureMode::label);
        let best_type = candidates.get(best).map_or("", |c| c.0.as_str());
        *best_types.entry(format!("{mode}/{best_type}")).or_default() += 1;
        let entry = by_mode.entry(mode).or_default();
        entry.0 += mean;
        entry.1 += p.get(best).copied().unwrap_or(0.0);
        entry.2 += 1;
    }
    println!(
        "contexts: {:.1} candidates each, random {:.3}, oracle {:.3}",
        offered as f64 / n as f64,
        random / n as f64,
        oracle / n as f64
    );
    for (mode, (r, o, k)) in by_mode {
        println!(
            "  {mode}: {k} contexts, random {:.3}, oracle {:.3}",
            r / k as f64,
            o / k as f64
        );
    }
    println!("oracle's pick by type {best_types:?}");
}

#[test]
fn first_best_picks_the_first_of_the_greatest() {
    assert_eq!(first_best(&[]), None);
    assert_eq!(first_best(&[0.2, 0.5, 0.5, 0.1]), Some(1));
    assert_eq!(first_best(&[0.7]), Some(0));
    assert_eq!(first_best(&[0.1, 0.1, 0.3]), Some(2));
}
