//! `arc-rec bench loop`'s scores: a phase of world traffic (`traffic::Played`, each shown item
//! with its true acceptance) and what serving logged about each decision (the exploration
//! floor's pick, the priors it ranked model ideas with) become the phase's figures — served
//! top-1 true acceptance with its interval, the gain over phase 0 on the same contexts, model
//! against heuristic picks, the floor's cost, the priors' calibration against the truth.
//! HTTP-free and pure.

use std::collections::HashMap;

use serde::Serialize;
use uuid::Uuid;

use crate::traffic::Played;

/// What serving logged of one decision: whether the exploration floor could pick (`None`: it
/// did not apply) and did, and the prior each priced model item was ranked with.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Logged {
    pub floor_pick: Option<bool>,
    pub priors: HashMap<String, f64>,
}

/// A mean with its 95 % interval (normal approximation).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Mean {
    pub mean: f64,
    pub ci95: [f64; 2],
    pub n: usize,
}

impl Mean {
    pub fn of(values: &[f64]) -> Option<Self> {
        let n = values.len();
        if n == 0 {
            return None;
        }
        let mean = values.iter().sum::<f64>() / n as f64;
        let var = if n > 1 {
            values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64
        } else {
            0.0
        };
        let half = 1.96 * (var / n as f64).sqrt();
        Some(Self {
            mean,
            ci95: [mean - half, mean + half],
            n,
        })
    }
}

/// One phase's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PhaseScore {
    pub phase: usize,
    pub decisions: usize,
    /// True acceptance of the served top item.
    pub top1: Option<Mean>,
    /// Against phase 0 on the same contexts (context by context).
    pub paired_gain: Option<Mean>,
    /// Share of top items that were a model's idea.
    pub model_top_share: f64,
    /// True acceptance of top items by where they came from.
    pub model_picks: Option<Mean>,
    pub heuristic_picks: Option<Mean>,
    /// Decisions where the exploration floor could pick, and those it did.
    pub floor_eligible: usize,
    pub floor_picks: usize,
    /// First-item true acceptance lost to the floor per decision of the phase: the policy's own
    /// top items in the floor's decisions against the floor's picks, times the picks' share.
    pub exploration_cost: Option<f64>,
    /// The learned grader's priors of the shown model items against their truth.
    pub prior_calibration: Option<PriorCalibration>,
    /// Drawn answers to the top items that were accepted.
    pub accepted: usize,
}

/// Priors against truth over shown model items.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PriorCalibration {
    pub items: usize,
    pub mean_prior: f64,
    pub mean_truth: f64,
    /// Mean |prior − truth|.
    pub mean_abs_error: f64,
}

/// Scores a phase; `baseline` is phase 0's decisions (the same contexts, in order).
pub fn score(
    phase: usize,
    played: &[Played],
    logged: &HashMap<Uuid, Logged>,
    baseline: Option<&[Played]>,
) -> PhaseScore {
    let top = |p: &Played| p.shown.first().map_or(0.0, |s| s.truth);
    let tops: Vec<f64> = played.iter().map(top).collect();
    let paired_gain = baseline.and_then(|base| {
        let gains: Vec<f64> = played
            .iter()
            .zip(base)
            .map(|(now, then)| top(now) - top(then))
            .collect();
        Mean::of(&gains)
    });
    let by_source = |model: bool| -> Vec<f64> {
        played
            .iter()
            .filter_map(|p| p.shown.first())
            .filter(|s| s.model_version_id.is_some() == model)
            .map(|s| s.truth)
            .collect()
    };
    let model = by_source(true);
    let floor = |pick: bool| -> Vec<f64> {
        played
            .iter()
            .filter(|p| logged.get(&p.event_id).and_then(|l| l.floor_pick) == Some(pick))
            .map(top)
            .collect()
    };
    let (picks, policy) = (floor(true), floor(false));
    let exploration_cost = match (Mean::of(&picks), Mean::of(&policy)) {
        (Some(p), Some(q)) => Some((q.mean - p.mean) * picks.len() as f64 / played.len() as f64),
        _ => None,
    };
    PhaseScore {
        phase,
        decisions: played.len(),
        top1: Mean::of(&tops),
        paired_gain,
        model_top_share: model.len() as f64 / played.len().max(1) as f64,
        model_picks: Mean::of(&model),
        heuristic_picks: Mean::of(&by_source(false)),
        floor_eligible: picks.len() + policy.len(),
        floor_picks: picks.len(),
        exploration_cost,
        prior_calibration: calibration(played, logged),
        accepted: played.iter().filter(|p| p.accepted).count(),
    }
}

fn calibration(played: &[Played], logged: &HashMap<Uuid, Logged>) -> Option<PriorCalibration> {
    let pairs: Vec<(f64, f64)> = played
        .iter()
        .flat_map(|p| {
            let priors = logged.get(&p.event_id).map(|l| &l.priors);
            p.shown
                .iter()
                .filter_map(move |s| Some((*priors?.get(&s.recommendation_id)?, s.truth)))
        })
        .collect();
    if pairs.is_empty() {
        return None;
    }
    let n = pairs.len() as f64;
    Some(PriorCalibration {
        items: pairs.len(),
        mean_prior: pairs.iter().map(|p| p.0).sum::<f64>() / n,
        mean_truth: pairs.iter().map(|p| p.1).sum::<f64>() / n,
        mean_abs_error: pairs.iter().map(|p| (p.0 - p.1).abs()).sum::<f64>() / n,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::traffic::ShownItem;

    fn decision(id: u128, truths: &[(f64, Option<&str>)], accepted: bool) -> Played {
        Played {
            event_id: Uuid::from_u128(id),
            shown: truths
                .iter()
                .enumerate()
                .map(|(i, (truth, version))| ShownItem {
                    recommendation_id: format!("r{i}"),
                    model_version_id: version.map(str::to_owned),
                    truth: *truth,
                })
                .collect(),
            accepted,
        }
    }

    #[test]
    fn a_phase_is_scored_by_the_truth_of_its_top_items_against_phase_zero() {
        let base = vec![
            decision(1, &[(0.2, None)], false),
            decision(2, &[(0.4, None)], true),
        ];
        let now = vec![
            decision(3, &[(0.6, Some("v1")), (0.1, None)], true),
            decision(4, &[(0.4, None), (0.9, Some("v1"))], false),
        ];
        let mut logged = HashMap::new();
        logged.insert(
            Uuid::from_u128(3),
            Logged {
                floor_pick: Some(true),
                priors: HashMap::from([("r0".to_owned(), 0.5)]),
            },
        );
        logged.insert(
            Uuid::from_u128(4),
            Logged {
                floor_pick: Some(false),
                priors: HashMap::from([("r1".to_owned(), 0.7)]),
            },
        );
        let score = score(1, &now, &logged, Some(&base));
        assert!((score.top1.unwrap().mean - 0.5).abs() < 1e-12);
        // Context by context: +0.4 and 0.0.
        assert!((score.paired_gain.unwrap().mean - 0.2).abs() < 1e-12);
        assert!((score.model_top_share - 0.5).abs() < 1e-12);
        assert!((score.model_picks.unwrap().mean - 0.6).abs() < 1e-12);
        assert!((score.heuristic_picks.unwrap().mean - 0.4).abs() < 1e-12);
        assert_eq!((score.floor_eligible, score.floor_picks), (2, 1));
        // The policy's own top (0.4) against the floor's pick (0.6), times a half.
        assert!((score.exploration_cost.unwrap() + 0.1).abs() < 1e-12);
        let calibration = score.prior_calibration.unwrap();
        assert_eq!(calibration.items, 2);
        assert!((calibration.mean_abs_error - 0.15).abs() < 1e-12);
        assert_eq!(score.accepted, 1);
    }

    #[test]
    fn an_empty_phase_has_no_means() {
        let score = score(0, &[], &HashMap::new(), None);
        assert_eq!(score.top1, None);
        assert_eq!(score.exploration_cost, None);
        assert_eq!(score.model_top_share, 0.0);
    }
}
