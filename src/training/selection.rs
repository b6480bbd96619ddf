//! Checkpoint selection with no world (`train --eval-every N`): every N RL steps (and at RL's
//! first step, where the policy is the warm-up, and at its last) the policy is scored on the
//! validation split's logged decisions, and the run's RL adapter is the checkpoint that scored
//! best, not the last one. A platform has no world to ask, so the criterion reads only what
//! people already decided: in each held-out context where the platform's proposals met both an
//! approval and a rejection, how the policy weighs the logged answers against each other.
//!
//! - **Log-probability margin** (`--select-by logprob-margin`, the default): over every held-out
//!   logged answer, how far the policy's log-probability of it moved since the warm-up, the
//!   mean over accepted answers minus the mean over rejected ones (0 at the warm-up itself;
//!   positive when RL moved mass toward what people accepted). It reads every answer, not only
//!   the contexts with both verdicts, so it is the least noisy of the three; on world 1 it had
//!   the smallest selection regret (`docs/experiments/checkpoint-selection.md`).
//! - **Menu acceptance** (`--select-by menu-acceptance`): a self-normalised
//!   off-policy estimate of the policy's acceptance over the context's logged menu, with every
//!   logged answer counted once (the logging propensity uniform over the menu):
//!   `Σ_a π(a) · accepted(a) / Σ_a π(a)`, π(a) the probability of the answer's completion at the
//!   sampling temperature. Between 0 and 1; a policy that prefers accepted answers scores high.
//! - **Pair accuracy** (`--select-by pair-accuracy`): the share of (accepted, rejected) pairs of a
//!   context whose accepted answer has the larger probability (ties count half), as a reward
//!   model's preference accuracy.
//!
//! For the last two, contexts whose logged answers were all accepted or all rejected say nothing
//! about a preference and are left out. All three come from one teacher-forced pass over the
//! logged completions (no sampling): a few seconds on the tiny preset, against minutes of RL
//! between two points. The noise of a gain is its standard error (over contexts, paired with
//! the warm-up's figures on the same contexts; for the margin, of the two means' difference).
//!
//! The run keeps the best-scoring checkpoint only when it beats the warm-up by more than that
//! noise; otherwise it keeps the warm-up itself (RL step 0), says so, and `candidates` refuses
//! the run's ideas without `--force`: a run ships a regression only when asked to. "More than
//! its noise" allows for the choice: the best of m RL points beats the warm-up by chance far
//! more often than one point does, so its gain must exceed z_m standard errors, z_m the
//! one-sided normal quantile of α/m (Bonferroni over the points compared), α = 1 − Φ(1), the
//! level of one standard error for a single point (z_1 = 1; z_6 = 1.94, z_8 = 2.06). With one
//! standard error for every m, the quick start's run kept a dip of its RL (gain 1.3 standard
//! errors, the best of 6 points) that lost 0.04 best-of-4 and 0.27 greedy true acceptance
//! against its warm-up (`docs/experiments/quickstart-runs.md`).

use serde::{Deserialize, Serialize};

use trainer::chat_policy::{ChatPolicy, Sequence, pack};
use trainer::logprobs::score_logprobs;
use trainer::tch::{self, Kind};

use super::rollout::PromptTokens;

/// `RUN_DIR/eval-point-N`: the adapter of the selection point at global step N, kept until the
/// run ends (and after it with `--keep-eval-points`).
pub const EVAL_POINT_PREFIX: &str = "eval-point-";

/// The directory name of the selection point at global step `step`.
pub fn eval_point_dir(step: u64) -> String {
    format!("{EVAL_POINT_PREFIX}{step}")
}

/// Sequences scored per forward pass.
const ROWS_PER_PASS: usize = 16;

/// The one-sided level of one standard error, 1 − Φ(1): a single point's gain must exceed one
/// standard error.
const SINGLE_POINT_LEVEL: f64 = 0.158_655_253_931_457_05;

/// How many standard errors the best of `rl_points` RL points must beat the warm-up by: the
/// normal quantile of 1 − α/m (see the module docs), 1 for one point.
pub fn noise_z(rl_points: usize) -> f64 {
    normal_quantile(1.0 - SINGLE_POINT_LEVEL / rl_points.max(1) as f64)
}

/// Φ⁻¹(p) for p in (0, 1), by Acklam's rational approximation (relative error below 1.2e-9).
fn normal_quantile(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] = [
        7.784_695_709_041_462e-3,
        3.224_671_290_700_398e-1,
        2.445_134_137_142_996,
        3.754_408_661_907_416,
    ];
    const LOW: f64 = 0.024_25;
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p <= 0.0 {
        f64::NEG_INFINITY
    } else if p >= 1.0 {
        f64::INFINITY
    } else if p < LOW {
        tail((-2.0 * p.ln()).sqrt())
    } else if p > 1.0 - LOW {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}

/// `--select-by`: the world-free figure a run's checkpoints are chosen by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Criterion {
    /// Mean change of log-probability since the warm-up on accepted answers minus rejected ones.
    #[default]
    LogprobMargin,
    /// The self-normalised estimate of acceptance over each held-out context's logged menu.
    MenuAcceptance,
    /// The share of held-out (accepted, rejected) pairs the policy orders right.
    PairAccuracy,
}

impl Criterion {
    pub fn as_str(self) -> &'static str {
        match self {
            Criterion::LogprobMargin => "log-probability margin",
            Criterion::MenuAcceptance => "menu acceptance",
            Criterion::PairAccuracy => "pair accuracy",
        }
    }
}

/// One held-out context's logged answers, tokenized.
#[derive(Debug)]
struct Menu {
    prompt: usize,
    /// Each logged answer's completion tokens.
    items: Vec<Vec<i64>>,
}

/// The validation contexts the criterion reads, tokenized once per run.
#[derive(Debug)]
pub struct HeldOutMenus<'p> {
    prompts: Vec<PromptTokens<'p>>,
    menus: Vec<Menu>,
    /// Every scored answer's context (index into `menus`) and verdict, in scoring order.
    answers: Vec<Answer>,
}

impl<'p> HeldOutMenus<'p> {
    /// Every logged answer of `prompts` (validation).
    pub fn new(policy: &ChatPolicy, prompts: Vec<PromptTokens<'p>>) -> anyhow::Result<Self> {
        let mut menus = Vec::new();
        let mut answers = Vec::new();
        for (index, tokens) in prompts.iter().enumerate() {
            let prompt = tokens.prompt;
            let mut items = Vec::with_capacity(prompt.logged_completions.len());
            for (answer, completion) in &prompt.logged_completions {
                answers.push(Answer {
                    context: menus.len() as u32,
                    accepted: prompt.logged.get(answer).is_some_and(|v| v.accepted()),
                });
                items.push(policy.target_ids(completion)?);
            }
            if !items.is_empty() {
                menus.push(Menu {
                    prompt: index,
                    items,
                });
            }
        }
        Ok(Self {
            prompts,
            menus,
            answers,
        })
    }

    /// Contexts that carry a preference: at least one accepted and one rejected answer.
    pub fn contexts(&self) -> usize {
        Scored::new(self.answers.clone(), vec![0.0; self.answers.len()])
            .mixed_contexts()
            .len()
    }

    /// Logged answers scored.
    pub fn answers(&self) -> usize {
        self.answers.len()
    }

    /// The log-probability of every logged answer's completion under `policy` (adapters as
    /// switched, no dropout) at `temperature`.
    pub fn score(&self, policy: &ChatPolicy, temperature: f64) -> anyhow::Result<Scored> {
        let sequences: Vec<Sequence<'_>> = self
            .menus
            .iter()
            .flat_map(|menu| {
                let prompt = &self.prompts[menu.prompt].ids;
                menu.items.iter().map(move |completion| Sequence {
                    prompt,
                    completion,
                    sampling_logprobs: None,
                    allowed: None,
                })
            })
            .collect();
        let mut logprobs = Vec::with_capacity(sequences.len());
        for chunk in sequences.chunks(ROWS_PER_PASS) {
            let packed = pack(chunk, policy.pad_id, policy.model.runtime().device)?;
            let per_token =
                tch::no_grad(|| score_logprobs(&policy.model, &packed.batch, temperature))?;
            let sums = per_token.f_to_kind(Kind::Double)?.f_sum_dim_intlist(
                &[1i64][..],
                false,
                Kind::Double,
            )?;
            logprobs.extend(Vec::<f64>::try_from(&sums)?);
        }
        Ok(Scored::new(self.answers.clone(), logprobs))
    }
}

/// A logged answer of a held-out context.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Answer {
    /// Its context's index among the scored contexts.
    pub context: u32,
    pub accepted: bool,
}

/// Every held-out logged answer with the policy's log-probability of it: what a selection point
/// keeps, so that any criterion can be computed from `metrics.jsonl` afterwards.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Scored {
    pub answers: Vec<Answer>,
    pub logprobs: Vec<f64>,
}

impl Scored {
    pub fn new(answers: Vec<Answer>, logprobs: Vec<f64>) -> Self {
        Self { answers, logprobs }
    }

    /// The (log π, accepted) of each context that has both verdicts, in context order.
    fn mixed_contexts(&self) -> Vec<Vec<(f64, bool)>> {
        let mut contexts: std::collections::BTreeMap<u32, Vec<(f64, bool)>> = Default::default();
        for (answer, logprob) in self.answers.iter().zip(&self.logprobs) {
            contexts
                .entry(answer.context)
                .or_default()
                .push((*logprob, answer.accepted));
        }
        contexts
            .into_values()
            .filter(|judged| judged.iter().any(|(_, ok)| *ok) && judged.iter().any(|(_, ok)| !*ok))
            .collect()
    }

    /// Each mixed context's figure by `figure` (menu acceptance or pair accuracy).
    fn per_context(&self, figure: fn(&[(f64, bool)]) -> f64) -> Vec<f64> {
        self.mixed_contexts()
            .iter()
            .map(|judged| figure(judged))
            .collect()
    }

    /// The log-probability margin over `warmup` (the same answers scored at RL step 0) and its
    /// standard error: mean Δ log π over accepted answers minus mean Δ log π over rejected ones.
    /// `None` unless both verdicts have at least two answers (no noise to judge a gain by).
    pub fn margin_over(&self, warmup: &Scored) -> Option<(f64, f64)> {
        if self.answers != warmup.answers || self.logprobs.len() != warmup.logprobs.len() {
            return None;
        }
        let (mut accepted, mut rejected) = (Vec::new(), Vec::new());
        for ((answer, now), then) in self
            .answers
            .iter()
            .zip(&self.logprobs)
            .zip(&warmup.logprobs)
        {
            let delta = now - then;
            if answer.accepted {
                accepted.push(delta);
            } else {
                rejected.push(delta);
            }
        }
        if accepted.len() < 2 || rejected.len() < 2 {
            return None;
        }
        let margin = mean(&accepted) - mean(&rejected);
        let se = standard_error(&accepted).hypot(standard_error(&rejected));
        Some((margin, se))
    }
}

/// Σ π(a)·accepted(a) / Σ π(a) over one menu of (log π(a), accepted).
pub fn menu_acceptance(judged: &[(f64, bool)]) -> f64 {
    let top = judged
        .iter()
        .map(|(logprob, _)| *logprob)
        .fold(f64::NEG_INFINITY, f64::max);
    if !top.is_finite() {
        return 0.0;
    }
    let (mut accepted, mut total) = (0.0, 0.0);
    for (logprob, ok) in judged {
        let weight = (logprob - top).exp();
        total += weight;
        if *ok {
            accepted += weight;
        }
    }
    accepted / total
}

/// The share of (accepted, rejected) pairs of one menu ordered right (ties half); 0.5 without a
/// pair.
pub fn pair_accuracy(judged: &[(f64, bool)]) -> f64 {
    let (mut right, mut pairs) = (0.0, 0usize);
    for (good, _) in judged.iter().filter(|(_, ok)| *ok) {
        for (bad, _) in judged.iter().filter(|(_, ok)| !*ok) {
            pairs += 1;
            right += match good.partial_cmp(bad) {
                Some(std::cmp::Ordering::Greater) => 1.0,
                Some(std::cmp::Ordering::Equal) => 0.5,
                _ => 0.0,
            };
        }
    }
    if pairs == 0 {
        0.5
    } else {
        right / pairs as f64
    }
}

/// One scored checkpoint: a line of `metrics.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SelectionPoint {
    /// The global step the policy stands at (its updates so far: `sft_steps + rl_step`).
    pub step: u64,
    /// RL steps taken; 0 is the warm-up model itself.
    pub rl_step: u64,
    /// Means over the contexts with both verdicts.
    pub menu_acceptance: f64,
    pub pair_accuracy: f64,
    /// The log-probability margin over the warm-up's point (0 at the warm-up; 0 on lines
    /// written before the margin existed).
    #[serde(default)]
    pub logprob_margin: f64,
    /// Held-out contexts with both verdicts.
    pub contexts: usize,
    /// Every held-out logged answer and its log-probability.
    pub scored: Scored,
    /// Wall time of the scoring.
    pub seconds: f64,
}

impl SelectionPoint {
    /// The point of `scored`; `warmup` is the warm-up's point (`None` for the warm-up itself).
    pub fn new(
        step: u64,
        rl_step: u64,
        scored: Scored,
        warmup: Option<&Scored>,
        seconds: f64,
    ) -> Self {
        let menu = scored.per_context(menu_acceptance);
        let logprob_margin = warmup
            .and_then(|warmup| scored.margin_over(warmup))
            .map_or(0.0, |(margin, _)| margin);
        Self {
            step,
            rl_step,
            menu_acceptance: mean(&menu),
            pair_accuracy: mean(&scored.per_context(pair_accuracy)),
            logprob_margin,
            contexts: menu.len(),
            scored,
            seconds,
        }
    }

    pub fn value(&self, criterion: Criterion) -> f64 {
        match criterion {
            Criterion::LogprobMargin => self.logprob_margin,
            Criterion::MenuAcceptance => self.menu_acceptance,
            Criterion::PairAccuracy => self.pair_accuracy,
        }
    }

    /// This point's gain over `warmup` by `criterion` and the gain's standard error; `None`
    /// when there is too little to measure its noise by.
    fn gain_over(&self, warmup: &SelectionPoint, criterion: Criterion) -> Option<(f64, f64)> {
        let paired = |figure: fn(&[(f64, bool)]) -> f64| {
            let gains: Vec<f64> = self
                .scored
                .per_context(figure)
                .iter()
                .zip(&warmup.scored.per_context(figure))
                .map(|(now, then)| now - then)
                .collect();
            (gains.len() >= 2).then(|| (mean(&gains), standard_error(&gains)))
        };
        match criterion {
            Criterion::LogprobMargin => self.scored.margin_over(&warmup.scored),
            Criterion::MenuAcceptance => paired(menu_acceptance),
            Criterion::PairAccuracy => paired(pair_accuracy),
        }
    }
}

/// Which checkpoint a run keeps, and whether it beat the warm-up: `summary.json`'s `selection`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Choice {
    pub criterion: Criterion,
    /// The kept point's global and RL step (RL step 0: the warm-up model) and figure.
    pub step: u64,
    pub rl_step: u64,
    pub value: f64,
    pub warmup_value: f64,
    /// The best-scoring point's RL step and figure (kept only when it beats the warm-up).
    pub best_rl_step: u64,
    pub best_value: f64,
    /// The last point's RL step and figure (what a run without selection would have kept).
    pub last_rl_step: u64,
    pub last_value: f64,
    /// The best point's gain over the warm-up and its standard error.
    pub gain: f64,
    pub gain_se: f64,
    /// How many standard errors the gain had to exceed: [`noise_z`] of the RL points compared
    /// (1 in runs recorded before it allowed for the choice).
    #[serde(default = "one")]
    pub noise_z: f64,
    /// `gain > noise_z · gain_se` (and > 0): the best point is kept, and `candidates` writes the
    /// run's ideas.
    pub beats_warmup: bool,
    pub contexts: usize,
    pub points: usize,
}

fn one() -> f64 {
    1.0
}

impl Choice {
    /// One sentence for people: what was kept and whether it beat the warm-up.
    pub fn describe(&self) -> String {
        let figures = format!(
            "warm-up {:.3}, best {:.3} at RL step {}, last {:.3} at RL step {}",
            self.warmup_value,
            self.best_value,
            self.best_rl_step,
            self.last_value,
            self.last_rl_step
        );
        let verdict = if self.beats_warmup {
            format!(
                "kept RL step {}: it beats the warm-up by {:+.3}, {:.2} standard errors of {:.3} (the best of {} RL points must beat it by {:.2})",
                self.rl_step,
                self.gain,
                self.gain / self.gain_se,
                self.gain_se,
                self.points.saturating_sub(1),
                self.noise_z
            )
        } else if self.best_rl_step == 0 {
            "kept the warm-up model (RL step 0): no RL checkpoint scored above it, so `candidates` refuses this run's ideas without --force".to_owned()
        } else {
            format!(
                "kept the warm-up model (RL step 0): no checkpoint beat it by more than its noise (best gain {:+.3} at RL step {}, standard error {:.3}; the best of {} RL points must beat it by {:.2} standard errors), so `candidates` refuses this run's ideas without --force",
                self.gain,
                self.best_rl_step,
                self.gain_se,
                self.points.saturating_sub(1),
                self.noise_z
            )
        };
        format!(
            "checkpoint selection by held-out {} on {} validation contexts ({figures}): {verdict}",
            self.criterion.as_str(),
            self.contexts,
        )
    }
}

/// The point of `points` (in step order) with the highest `criterion` (the earliest of equals)
/// when it beats the warm-up's (RL step 0) by more than its noise, else the warm-up. `None`
/// without a warm-up point or a held-out preference to score.
pub fn choose(points: &[&SelectionPoint], criterion: Criterion) -> Option<Choice> {
    let warmup = points.iter().find(|p| p.rl_step == 0)?;
    let last = points.last()?;
    if warmup.contexts == 0 {
        return None;
    }
    let best = points.iter().fold(*warmup, |best, point| {
        if point.value(criterion) > best.value(criterion) {
            point
        } else {
            best
        }
    });
    // With too few answers there is no noise to measure a gain against: it cannot count.
    let (gain, gain_se, measured) = match best.gain_over(warmup, criterion) {
        Some((gain, se)) => (gain, se, true),
        None => (best.value(criterion) - warmup.value(criterion), 0.0, false),
    };
    let rl_points = points.iter().filter(|point| point.rl_step > 0).count();
    let noise_z = noise_z(rl_points);
    let beats_warmup = best.rl_step > 0 && measured && gain > 0.0 && gain > noise_z * gain_se;
    let kept = if beats_warmup { best } else { warmup };
    Some(Choice {
        criterion,
        step: kept.step,
        rl_step: kept.rl_step,
        value: kept.value(criterion),
        warmup_value: warmup.value(criterion),
        best_rl_step: best.rl_step,
        best_value: best.value(criterion),
        last_rl_step: last.rl_step,
        last_value: last.value(criterion),
        gain,
        gain_se,
        noise_z,
        beats_warmup,
        contexts: warmup.contexts,
        points: points.len(),
    })
}

/// The choice a finished run recorded in `summary.json` (`None` for a run that selected
/// nothing, or one trained before selection existed).
pub fn read_choice(root: &std::path::Path) -> anyhow::Result<Option<Choice>> {
    use anyhow::Context;
    let path = root.join(super::run_dir::SUMMARY_FILE);
    let text = match std::fs::read(&path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => {
            return Err(error).with_context(|| format!("cannot read {}", path.display()));
        }
    };
    let summary: serde_json::Value =
        serde_json::from_slice(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    match summary.get("selection") {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(selection) => serde_json::from_value(selection.clone())
            .map(Some)
            .with_context(|| format!("{}: field `selection`", path.display())),
    }
}

fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        0.0
    } else {
        values.iter().sum::<f64>() / values.len() as f64
    }
}

fn standard_error(values: &[f64]) -> f64 {
    let n = values.len();
    if n < 2 {
        return 0.0;
    }
    let m = mean(values);
    let variance = values.iter().map(|v| (v - m).powi(2)).sum::<f64>() / (n - 1) as f64;
    (variance / n as f64).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn menu_acceptance_weighs_each_answer_by_the_policy() {
        // Two answers, the accepted one three times as likely: 0.75.
        let judged = [(3f64.ln(), true), (0.0, false)];
        assert!((menu_acceptance(&judged) - 0.75).abs() < 1e-12);
        // Shifting every log-prob changes nothing (self-normalised); very small ones do not
        // underflow.
        let shifted = [(3f64.ln() - 900.0, true), (-900.0, false)];
        assert!((menu_acceptance(&shifted) - 0.75).abs() < 1e-12);
        assert_eq!(menu_acceptance(&[]), 0.0);
    }

    #[test]
    fn pair_accuracy_counts_ordered_pairs_and_half_ties() {
        let judged = [(-1.0, true), (-2.0, false), (-1.0, false), (-0.5, false)];
        // (−1 vs −2) right, (−1 vs −1) half, (−1 vs −0.5) wrong.
        assert!((pair_accuracy(&judged) - 0.5).abs() < 1e-12);
        assert!((pair_accuracy(&[(-1.0, true), (-3.0, false)]) - 1.0).abs() < 1e-12);
        assert_eq!(pair_accuracy(&[(-1.0, true)]), 0.5);
    }

    /// Points whose contexts each hold one accepted and one rejected answer, with the menu
    /// acceptances of each `(rl_step, menu)`: pair accuracy is 1 where the accepted answer is
    /// the likelier. The first is the warm-up the others' margins are measured from.
    #[test]
    fn the_gate_is_the_normal_quantile_of_one_standard_errors_level_over_the_points() {
        assert!((normal_quantile(0.975) - 1.959_964).abs() < 1e-6);
        assert!((normal_quantile(0.025) + 1.959_964).abs() < 1e-6);
        assert!((normal_quantile(0.001) + 3.090_232).abs() < 1e-6);
        assert!(normal_quantile(0.5).abs() < 1e-12);
        assert!(
            (noise_z(1) - 1.0).abs() < 1e-8,
            "one point: one standard error"
        );
        assert!((noise_z(0) - 1.0).abs() < 1e-8);
        assert!((noise_z(6) - 1.936).abs() < 1e-3);
        assert!((noise_z(8) - 2.057).abs() < 1e-3);
        let rising: Vec<f64> = (1..12).map(noise_z).collect();
        assert!(rising.windows(2).all(|pair| pair[0] < pair[1]));
    }

    #[test]
    fn the_best_of_many_points_must_beat_the_warm_up_by_more() {
        // Per-context gains 0.3, 0, 0.3, 0 at RL step 10: 1.73 standard errors.
        let best: &[f64] = &[0.8, 0.5, 0.8, 0.5];
        let lower: &[f64] = &[0.4, 0.4, 0.4, 0.4];
        let alone = points(&[(0, &[0.5, 0.5, 0.5, 0.5]), (10, best)]);
        let refs: Vec<&SelectionPoint> = alone.iter().collect();
        let choice = choose(&refs, Criterion::MenuAcceptance).unwrap();
        assert!((choice.gain / choice.gain_se - 3f64.sqrt()).abs() < 1e-9);
        assert!(choice.beats_warmup, "one point: 1.73 > 1 standard error");
        assert!((choice.noise_z - 1.0).abs() < 1e-8);
        let many = points(&[
            (0, &[0.5, 0.5, 0.5, 0.5]),
            (10, best),
            (20, lower),
            (30, lower),
            (40, lower),
            (50, lower),
            (60, lower),
        ]);
        let refs: Vec<&SelectionPoint> = many.iter().collect();
        let choice = choose(&refs, Criterion::MenuAcceptance).unwrap();
        assert_eq!((choice.rl_step, choice.best_rl_step), (0, 10));
        assert!(!choice.beats_warmup, "the best of six must beat 1.94");
        let said = choice.describe();
        assert!(
            said.contains("the best of 6 RL points must beat it by 1.94"),
            "{said}"
        );
    }

    fn points(menus: &[(u64, &[f64])]) -> Vec<SelectionPoint> {
        let scored = |menu: &[f64]| {
            let mut answers = Vec::new();
            let mut logprobs = Vec::new();
            for (context, &share) in menu.iter().enumerate() {
                for (accepted, weight) in [(true, share), (false, 1.0 - share)] {
                    answers.push(Answer {
                        context: context as u32,
                        accepted,
                    });
                    logprobs.push(f64::max(weight, 1e-300).ln());
                }
            }
            Scored::new(answers, logprobs)
        };
        let warmup = scored(menus[0].1);
        menus
            .iter()
            .map(|(rl_step, menu)| {
                let base = (*rl_step > 0).then_some(&warmup);
                SelectionPoint::new(100 + rl_step, *rl_step, scored(menu), base, 1.0)
            })
            .collect()
    }

    const ALL: [Criterion; 3] = [
        Criterion::LogprobMargin,
        Criterion::MenuAcceptance,
        Criterion::PairAccuracy,
    ];

    #[test]
    fn the_margin_is_the_accepted_answers_gain_over_the_rejected_ones() {
        let answer = |accepted| Answer {
            context: 0,
            accepted,
        };
        let answers = vec![answer(true), answer(true), answer(false), answer(false)];
        let warmup = Scored::new(answers.clone(), vec![-2.0, -3.0, -2.0, -3.0]);
        // Accepted answers gained 1 and 3 nats (mean 2), rejected ones lost 1 and gained 1 (0).
        let now = Scored::new(answers.clone(), vec![-1.0, 0.0, -3.0, -2.0]);
        let (margin, se) = now.margin_over(&warmup).unwrap();
        assert!((margin - 2.0).abs() < 1e-12);
        // Standard errors 1 and 1: their root sum of squares.
        assert!((se - 2f64.sqrt()).abs() < 1e-12, "{se}");
        // One answer of a verdict, or other answers: nothing to measure.
        let few = Scored::new(answers[1..].to_vec(), vec![0.0, 0.0, 0.0]);
        assert!(few.margin_over(&few).is_none());
        assert!(now.margin_over(&few).is_none());
    }

    #[test]
    fn the_best_point_is_kept_when_it_beats_the_warm_up() {
        let points = points(&[
            (0, &[0.4, 0.5, 0.6, 0.5]),
            (10, &[0.6, 0.7, 0.8, 0.7]),
            (20, &[0.3, 0.4, 0.5, 0.4]),
        ]);
        let refs: Vec<&SelectionPoint> = points.iter().collect();
        for criterion in ALL {
            let choice = choose(&refs, criterion).unwrap();
            assert_eq!((choice.rl_step, choice.step), (10, 110), "{criterion:?}");
            assert_eq!(choice.best_rl_step, 10);
            assert!(choice.beats_warmup);
            assert_eq!((choice.last_rl_step, choice.points), (20, 3));
            assert!(choice.describe().contains("kept RL step 10"));
        }
        let choice = choose(&refs, Criterion::MenuAcceptance).unwrap();
        assert!((choice.gain - 0.2).abs() < 1e-12);
        assert!(choice.gain_se < 1e-12, "the same gain everywhere");
        // Pair accuracy: 0.5 at the warm-up (one pair wrong, one right, two ties), 1 at step 10.
        let choice = choose(&refs, Criterion::PairAccuracy).unwrap();
        assert!((choice.warmup_value - 0.5).abs() < 1e-12);
        assert!((choice.value - 1.0).abs() < 1e-12);
        // The margin is 0 at the warm-up and positive where accepted answers gained.
        assert_eq!(points[0].logprob_margin, 0.0);
        assert!(points[1].logprob_margin > 0.0 && points[2].logprob_margin < 0.0);
    }

    #[test]
    fn a_run_that_only_gets_worse_keeps_its_warm_up() {
        let points = points(&[
            (0, &[0.6, 0.7, 0.8]),
            (10, &[0.5, 0.6, 0.7]),
            (20, &[0.2, 0.3, 0.4]),
        ]);
        let refs: Vec<&SelectionPoint> = points.iter().collect();
        for criterion in ALL {
            let choice = choose(&refs, criterion).unwrap();
            assert_eq!((choice.rl_step, choice.best_rl_step), (0, 0));
            assert_eq!(choice.gain, 0.0);
            assert!(!choice.beats_warmup);
            let said = choice.describe();
            assert!(said.contains("kept the warm-up model"), "{said}");
            assert!(said.contains("--force"), "{said}");
        }
    }

    #[test]
    fn a_gain_within_its_noise_keeps_the_warm_up() {
        // Mean gain +0.05 with per-context gains of ±0.5: well within one standard error.
        let points = points(&[(0, &[0.5, 0.5, 0.5, 0.5]), (10, &[1.0, 0.0, 1.0, 0.2])]);
        let refs: Vec<&SelectionPoint> = points.iter().collect();
        let choice = choose(&refs, Criterion::MenuAcceptance).unwrap();
        assert_eq!((choice.rl_step, choice.best_rl_step), (0, 10));
        assert!((choice.gain - 0.05).abs() < 1e-12);
        assert!(!choice.beats_warmup);
        let said = choice.describe();
        assert!(said.contains("more than its noise"), "{said}");
        // No warm-up point, or no context: nothing to choose by.
        assert!(choose(&refs[1..], Criterion::MenuAcceptance).is_none());
        let empty = self::points(&[(0, &[])]);
        assert!(choose(&[&empty[0]], Criterion::MenuAcceptance).is_none());
    }
}
