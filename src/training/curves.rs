//! The main curves of a run as one PNG: reward, pass@1/pass@k/maj@k, KL and entropy, format
//! validity and the share of groups with signal, the warm-up loss, and the checkpoint criterion
//! of `--eval-every` on the validation split.

use std::path::Path;

use super::metrics::{MetricsLine, Phase, StepMetrics, selection_points, steps};
use super::selection::SelectionPoint;
use crate::plot::{Panel, PlotError, Series, write_png};

/// Draws `lines` (a run's `metrics.jsonl`) into `path`.
pub fn write_curves(path: &Path, lines: &[MetricsLine]) -> Result<(), PlotError> {
    let steps: Vec<&StepMetrics> = steps(lines).collect();
    let points: Vec<&SelectionPoint> = selection_points(lines).collect();
    let selection_series = |name: &str, value: fn(&SelectionPoint) -> f64| Series {
        name: name.to_owned(),
        points: points.iter().map(|p| (p.step as f64, value(p))).collect(),
    };
    let rl_series = |name: &str, value: fn(&super::RlMetrics) -> f64| Series {
        name: name.to_owned(),
        points: steps
            .iter()
            .filter_map(|s| s.rl.as_ref().map(|rl| (s.step as f64, value(rl))))
            .collect(),
    };
    let panel = |title: &str, y_label: &str, series: Vec<Series>| Panel {
        title: title.to_owned(),
        x_label: "step".to_owned(),
        y_label: y_label.to_owned(),
        series,
    };
    let panels = [
        panel(
            "RL reward (batch)",
            "reward",
            vec![rl_series("mean", |rl| rl.reward_mean)],
        ),
        panel(
            "Acceptance on the batch",
            "rate",
            vec![
                rl_series("pass@1", |rl| rl.pass_at_1),
                rl_series("pass@k", |rl| rl.pass_at_k),
                rl_series("maj@k", |rl| rl.maj_at_k),
            ],
        ),
        panel(
            "KL to the warm-up model and entropy (per token)",
            "nats",
            vec![
                rl_series("KL", |rl| rl.kl),
                rl_series("entropy", |rl| rl.entropy),
            ],
        ),
        panel(
            "Format validity and signal",
            "share",
            vec![
                rl_series("format valid", |rl| rl.format_validity),
                rl_series("groups with signal", |rl| rl.nonzero_advantage_fraction),
            ],
        ),
        panel(
            "Warm-up loss",
            "NLL per token",
            vec![Series {
                name: "loss".to_owned(),
                points: steps
                    .iter()
                    .filter(|s| s.phase == Phase::Warmup)
                    .map(|s| (s.step as f64, s.loss))
                    .collect(),
            }],
        ),
        panel(
            "Completion length",
            "tokens",
            vec![rl_series("mean", |rl| rl.completion_tokens_mean)],
        ),
        panel(
            "Checkpoint criterion: log-prob margin over the warm-up (validation)",
            "nats",
            vec![selection_series("accepted − rejected", |p| {
                p.logprob_margin
            })],
        ),
        panel(
            "Checkpoint criterion: held-out logged menus (validation)",
            "share",
            vec![
                selection_series("menu acceptance", |p| p.menu_acceptance),
                selection_series("pair accuracy", |p| p.pair_accuracy),
            ],
        ),
    ];
    write_png(path, &panels, 3)
}

/// The learned grader's over-optimisation figure (Gao et al. 2022): its reward against the
/// world's true acceptance, by step and by KL from the warm-up model. A reward model is
/// over-optimised where its probability keeps rising while true acceptance stalls or falls.
/// `None` (nothing written) unless the run's steps carry both the learned grader's and the
/// world's probabilities.
pub fn write_overoptimisation(path: &Path, lines: &[MetricsLine]) -> Option<Result<(), PlotError>> {
    let rl: Vec<(f64, &super::RlMetrics)> = steps(lines)
        .filter_map(|s| s.rl.as_ref().map(|rl| (s.step as f64, rl)))
        .filter(|(_, rl)| rl.learned_probability.is_some() && rl.acceptance_probability.is_some())
        .collect();
    if rl.is_empty() {
        return None;
    }
    type Pick = fn(&super::RlMetrics) -> f64;
    let picks: [(&str, Pick); 3] = [
        ("learned σ(μ)", |m| m.learned_probability.unwrap_or(0.0)),
        ("learned lower bound (reward)", |m| {
            m.learned_lower_bound.unwrap_or(0.0)
        }),
        ("true acceptance (world)", |m| {
            m.acceptance_probability.unwrap_or(0.0)
        }),
    ];
    // The three curves against x(step, metrics), in order of x.
    let against = |x: &dyn Fn(f64, &super::RlMetrics) -> f64| -> Vec<Series> {
        picks
            .iter()
            .map(|(name, y)| {
                let mut points: Vec<(f64, f64)> =
                    rl.iter().map(|(step, m)| (x(*step, m), y(m))).collect();
                points.sort_by(|a, b| a.0.total_cmp(&b.0));
                Series {
                    name: (*name).to_owned(),
                    points,
                }
            })
            .collect()
    };
    let panels = [
        Panel {
            title: "Learned reward vs true acceptance, by step (batch means)".to_owned(),
            x_label: "step".to_owned(),
            y_label: "probability".to_owned(),
            series: against(&|step, _| step),
        },
        Panel {
            title: "… by KL to the warm-up model".to_owned(),
            x_label: "KL (nats per token)".to_owned(),
            y_label: "probability".to_owned(),
            series: against(&|_, m| m.kl),
        },
    ];
    Some(write_png(path, &panels, 2))
}
