//! The main curves of a run as one PNG: reward, pass@1/pass@k/maj@k, KL and entropy, format
//! validity and the share of groups with signal, and the warm-up loss.

use std::path::Path;

use super::metrics::{MetricsLine, Phase, StepMetrics, steps};
use crate::plot::{Panel, PlotError, Series, write_png};

/// Draws `lines` (a run's `metrics.jsonl`) into `path`.
pub fn write_curves(path: &Path, lines: &[MetricsLine]) -> Result<(), PlotError> {
    let steps: Vec<&StepMetrics> = steps(lines).collect();
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
    ];
    write_png(path, &panels, 3)
}
