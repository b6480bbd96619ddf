//! What a finished (or failed) run leaves for people and the database: `summary.json` with the
//! last RL step's figures, a binned RL curve and the checkpoint selection's choice, and the PNG
//! curves beside `metrics.jsonl`.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::metrics::{MetricsLine, Phase, RlMetrics, StepMetrics};
use super::run_dir::{CURVES_FILE, OVEROPTIMISATION_FILE, SUMMARY_FILE};
use super::session::TrainOutcome;

/// The files a finished run's report wrote, and the summary it recorded.
#[derive(Debug)]
pub struct RunReport {
    /// `summary.json`'s content (also the database's record of the run).
    pub summary: Value,
    pub curves: PathBuf,
    /// Learned reward against the world's truth: only a `--grader learned` run on a world's data.
    pub overoptimisation: Option<PathBuf>,
}

/// Writes `curves.png`, `overoptimisation.png` (when the run has both figures) and
/// `summary.json` into the run directory `root`.
pub fn write_report(
    root: &Path,
    run_id: &str,
    outcome: &TrainOutcome,
    lines: &[MetricsLine],
) -> anyhow::Result<RunReport> {
    let curves = root.join(CURVES_FILE);
    super::curves::write_curves(&curves, lines)?;
    let overoptimisation = root.join(OVEROPTIMISATION_FILE);
    let overoptimisation = super::curves::write_overoptimisation(&overoptimisation, lines)
        .transpose()?
        .map(|()| overoptimisation);
    let summary = json!({
        "run_id": run_id,
        "steps": outcome.steps,
        "rollbacks": outcome.rollbacks,
        "device": outcome.device,
        "train_prompts": outcome.train_prompts,
        "trainable_parameters": outcome.trainable_parameters,
        "final": summarize(lines),
        "selection": outcome.selection,
    });
    std::fs::write(
        root.join(SUMMARY_FILE),
        serde_json::to_vec_pretty(&summary)?,
    )?;
    Ok(RunReport {
        summary,
        curves,
        overoptimisation,
    })
}

/// The last RL step's figures (and the last warm-up loss), for the summary and the database.
pub fn summarize(lines: &[MetricsLine]) -> Value {
    let steps: Vec<&StepMetrics> = super::metrics::steps(lines).collect();
    let last_rl = steps.iter().rev().find(|s| s.rl.is_some());
    let last_warmup = steps.iter().rev().find(|s| s.phase == Phase::Warmup);
    json!({
        "last_rl_step": last_rl,
        "last_warmup_loss": last_warmup.map(|s| s.loss),
        "rl_curve": rl_curve(&steps),
    })
}

/// Most points of the RL curve a run's summary keeps (the database's copy of it, which the
/// dashboard draws; `metrics.jsonl` keeps every step).
const RL_CURVE_POINTS: usize = 100;

/// The RL steps' pass@1, pass@k and mean reward, averaged over consecutive bins so that at most
/// [`RL_CURVE_POINTS`] remain; each point is at its bin's last step.
fn rl_curve(steps: &[&StepMetrics]) -> Vec<Value> {
    let rl: Vec<(u64, &RlMetrics)> = steps
        .iter()
        .filter_map(|s| s.rl.as_ref().map(|rl| (s.step, rl)))
        .collect();
    let bin = rl.len().div_ceil(RL_CURVE_POINTS).max(1);
    rl.chunks(bin)
        .filter_map(|chunk| {
            let (step, _) = chunk.last()?;
            let mean = |f: fn(&RlMetrics) -> f64| {
                chunk.iter().map(|(_, rl)| f(rl)).sum::<f64>() / chunk.len() as f64
            };
            Some(json!({
                "step": step,
                "pass_at_1": mean(|rl| rl.pass_at_1),
                "pass_at_k": mean(|rl| rl.pass_at_k),
                "reward_mean": mean(|rl| rl.reward_mean),
            }))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rl_step(step: u64, pass_at_1: f64) -> StepMetrics {
        serde_json::from_value(json!({
            "step": step, "phase": "rl", "learning_rate": 1e-4, "loss": 0.0, "grad_norm": 0.0,
            "updated": true, "tokens": 10, "reward_mean": 2.0 * pass_at_1 - 1.0, "reward_std": 1.0,
            "pass_at_1": pass_at_1, "pass_at_k": 0.5, "maj_at_k": 0.5,
            "nonzero_advantage_fraction": 1.0, "kl": 0.0, "entropy": 1.0, "clip_fraction": 0.0,
            "format_validity": 1.0, "completion_tokens_mean": 10.0, "completion_tokens_max": 12,
            "prompts_drawn": 4, "step_seconds": 1.0, "tokens_per_second": 10.0
        }))
        .unwrap()
    }

    #[test]
    fn the_rl_curve_keeps_at_most_a_hundred_bin_means_at_their_last_steps() {
        // 250 RL steps (10..260): bins of 3, the last of one; pass@1 = step / 1000.
        let steps: Vec<StepMetrics> = (10..260).map(|s| rl_step(s, s as f64 / 1000.0)).collect();
        let refs: Vec<&StepMetrics> = steps.iter().collect();
        let curve = rl_curve(&refs);
        assert_eq!(curve.len(), 84);
        assert_eq!(curve[0]["step"], 12);
        assert!((curve[0]["pass_at_1"].as_f64().unwrap() - 0.011).abs() < 1e-12);
        assert_eq!(curve[83]["step"], 259);
        assert!((curve[83]["pass_at_1"].as_f64().unwrap() - 0.259).abs() < 1e-12);
        assert!((curve[0]["reward_mean"].as_f64().unwrap() + 0.978).abs() < 1e-12);
        // Fewer steps than points: one point per step; none without RL steps.
        assert_eq!(rl_curve(&refs[..7]).len(), 7);
        assert!(rl_curve(&[]).is_empty());
    }
}
