//! Snapshots round-trip bit for bit and corrupt snapshots are errors, never panics.

use bandit::{BanditError, FORMAT_VERSION, ModelKind, PolicyState, ThompsonPolicy};
use proptest::prelude::*;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::helpers::{policy, random_context, random_observations, small_layout, uniform_vec};

fn trained(model: ModelKind) -> ThompsonPolicy {
    let layout = small_layout();
    let mut p = policy(model, Some(500.0));
    let mut rng = ChaCha8Rng::seed_from_u64(21);
    for obs in random_observations(&layout, &mut rng, 40, 1000.0) {
        p.update(&obs).unwrap();
    }
    p.decay_to(1200.0).unwrap();
    p.refresh_bank_seeded(99);
    p
}

#[test]
fn state_round_trips_through_json() {
    for model in [ModelKind::Linear, ModelKind::Logistic] {
        let original = trained(model);
        let state = original.to_state();
        assert_eq!(state.format_version, FORMAT_VERSION);
        let parsed = PolicyState::from_json(&state.to_json()).unwrap();
        assert_eq!(parsed, state, "JSON keeps every f64 exactly");
        let restored = ThompsonPolicy::from_state(&parsed).unwrap();
        assert_eq!(restored.to_state(), state);
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let z = random_context(original.layout(), &mut rng);
        let candidates: Vec<Vec<f64>> = (0..8).map(|_| uniform_vec(&mut rng, 3)).collect();
        for seed in 0..20 {
            assert_eq!(
                original.rank_seeded(&z, &candidates, 3, seed).unwrap(),
                restored.rank_seeded(&z, &candidates, 3, seed).unwrap()
            );
        }
    }
    let fresh = ThompsonPolicy::new(small_layout(), Default::default()).unwrap();
    ThompsonPolicy::from_state(&fresh.to_state()).unwrap();
}

/// One way to damage a snapshot.
type Corruption = fn(&mut PolicyState);

#[test]
fn structural_corruption_is_an_error() {
    let good = trained(ModelKind::Linear).to_state();
    let corruptions: [(&str, Corruption); 12] = [
        ("version", |s| s.format_version = 2),
        ("layout", |s| s.layout.cluster_dims += 1),
        ("huge layout", |s| s.layout.cluster_dims = usize::MAX),
        ("config", |s| s.config.noise_scale = -1.0),
        ("precision length", |s| s.precision.truncate(3)),
        ("cholesky length", |s| s.cholesky_upper.push(1.0)),
        ("mean length", |s| s.mean.clear()),
        ("nan", |s| s.natural_mean[3] = f64::NAN),
        ("clock", |s| s.last_decay_s = Some(f64::INFINITY)),
        ("asymmetric", |s| s.precision[1] += 1.0),
        ("negative pivot", |s| s.cholesky_upper[0] = -1.0),
        ("model swap", |s| s.config.prior_precision *= 2.0),
    ];
    for (name, corrupt) in corruptions {
        let mut state = good.clone();
        corrupt(&mut state);
        let result = ThompsonPolicy::from_state(&state);
        // Changing λ alone is consistent data (λ only enters through future decays), so that
        // one must load; everything else must not.
        if name == "model swap" {
            assert!(result.is_ok(), "{name}: {:?}", result.err());
        } else {
            assert!(result.is_err(), "{name} was accepted");
        }
    }
    let err = ThompsonPolicy::from_state(&PolicyState {
        format_version: 0,
        ..good
    })
    .unwrap_err();
    assert!(matches!(err, BanditError::CorruptState(_)), "{err}");
    assert!(PolicyState::from_json(r#"{"format_version": 1}"#).is_err());
    assert!(PolicyState::from_json("not json").is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Perturbing any single stored number of Λ, L, η or μ is detected.
    #[test]
    fn any_numeric_edit_is_detected(field in 0usize..4, index in any::<prop::sample::Index>(), factor in 0.01f64..0.5) {
        let good = trained(ModelKind::Logistic).to_state();
        let mut state = good.clone();
        let values = match field {
            0 => &mut state.precision,
            1 => &mut state.cholesky_upper,
            2 => &mut state.natural_mean,
            _ => &mut state.mean,
        };
        let i = index.index(values.len());
        values[i] += factor * (1.0 + values[i].abs());
        prop_assert!(ThompsonPolicy::from_state(&state).is_err(), "edit of field {field} at {i} accepted");
    }
}
