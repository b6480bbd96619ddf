//! Checkpoint selection with no world (`train --eval-every N`): every N RL steps (and at RL's
//! first step, where the policy is the warm-up, and at its last) the policy is scored on the
//! validation split's logged decisions, and the run's RL adapter is the checkpoint that scored
//! best, not the last one. A platform has no world to ask, so the criterion reads only what
//! people already decided: in each held-out context where the platform's proposals met both an
//! approval and a rejection, how the policy weighs the logged answers against each other.
//!
//! - **Menu acceptance** (`--select-by menu-acceptance`, the default): a self-normalised
//!   off-policy estimate of the policy's acceptance over the context's logged menu, with every
//!   logged answer counted once (the logging propensity uniform over the menu):
//!   `Σ_a π(a) · accepted(a) / Σ_a π(a)`, π(a) the probability of the answer's completion at the
//!   sampling temperature. Between 0 and 1; a policy that prefers accepted answers scores high.
//! - **Pair accuracy** (`--select-by pair-accuracy`): the share of (accepted, rejected) pairs of a
//!   context whose accepted answer has the larger probability (ties count half), as a reward
//!   model's preference accuracy.
//!
//! Contexts whose logged answers were all accepted or all rejected say nothing about a
//! preference and are left out. Both figures come from one teacher-forced pass over the logged
//! completions (no sampling): a few seconds on the tiny preset, against minutes of RL between
//! two points. The noise of a gain is its standard error over contexts, paired with the
//! warm-up's figures on the same contexts.

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

/// A checkpoint beats the warm-up when its paired gain exceeds this many standard errors.
pub const NOISE_Z: f64 = 1.0;

/// `--select-by`: the world-free figure a run's checkpoints are chosen by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Criterion {
    /// The self-normalised estimate of acceptance over each held-out context's logged menu.
    #[default]
    MenuAcceptance,
    /// The share of held-out (accepted, rejected) pairs the policy orders right.
    PairAccuracy,
}

impl Criterion {
    pub fn as_str(self) -> &'static str {
        match self {
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

    /// Each mixed context's figure by `criterion`.
    pub fn per_context(&self, criterion: Criterion) -> Vec<f64> {
        let figure = match criterion {
            Criterion::MenuAcceptance => menu_acceptance,
            Criterion::PairAccuracy => pair_accuracy,
        };
        self.mixed_contexts()
            .iter()
            .map(|judged| figure(judged))
            .collect()
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
    /// Held-out contexts with both verdicts.
    pub contexts: usize,
    /// Every held-out logged answer and its log-probability.
    pub scored: Scored,
    /// Wall time of the scoring.
    pub seconds: f64,
}

impl SelectionPoint {
    pub fn new(step: u64, rl_step: u64, scored: Scored, seconds: f64) -> Self {
        let menu = scored.per_context(Criterion::MenuAcceptance);
        Self {
            step,
            rl_step,
            menu_acceptance: mean(&menu),
            pair_accuracy: mean(&scored.per_context(Criterion::PairAccuracy)),
            contexts: menu.len(),
            scored,
            seconds,
        }
    }

    pub fn value(&self, criterion: Criterion) -> f64 {
        match criterion {
            Criterion::MenuAcceptance => self.menu_acceptance,
            Criterion::PairAccuracy => self.pair_accuracy,
        }
    }
}

/// Which checkpoint a run keeps, and whether it beat the warm-up: `summary.json`'s `selection`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Choice {
    pub criterion: Criterion,
    /// The chosen point's global and RL step (RL step 0: the warm-up model).
    pub step: u64,
    pub rl_step: u64,
    pub value: f64,
    pub warmup_value: f64,
    /// The last point's RL step and figure (what a run without selection would have kept).
    pub last_rl_step: u64,
    pub last_value: f64,
    /// The chosen point's mean paired gain over the warm-up and its standard error.
    pub gain: f64,
    pub gain_se: f64,
    /// `gain > NOISE_Z · gain_se`: what `candidates` asks before writing the run's ideas.
    pub beats_warmup: bool,
    pub contexts: usize,
    pub points: usize,
}

impl Choice {
    /// One sentence for people: what was kept and whether it beat the warm-up.
    pub fn describe(&self) -> String {
        let kept = if self.rl_step == 0 {
            "kept the warm-up model (RL step 0)".to_owned()
        } else {
            format!("kept RL step {} of {}", self.rl_step, self.last_rl_step)
        };
        let verdict = if self.beats_warmup {
            format!(
                "it beats the warm-up by {:+.3} (standard error {:.3})",
                self.gain, self.gain_se
            )
        } else {
            format!(
                "no checkpoint beat the warm-up by more than its noise (best gain {:+.3}, standard error {:.3}): `candidates` refuses this run's ideas without --force",
                self.gain, self.gain_se
            )
        };
        format!(
            "checkpoint selection by held-out {} on {} validation contexts: {kept} ({:.3}; warm-up {:.3}, last {:.3}); {verdict}",
            self.criterion.as_str(),
            self.contexts,
            self.value,
            self.warmup_value,
            self.last_value
        )
    }
}

/// The point of `points` (in step order) with the highest `criterion` (the earliest of equals),
/// judged against the warm-up's (RL step 0). `None` without a warm-up point or contexts.
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
    let base = warmup.scored.per_context(criterion);
    let gains: Vec<f64> = best
        .scored
        .per_context(criterion)
        .iter()
        .zip(&base)
        .map(|(b, w)| b - w)
        .collect();
    let (gain, gain_se) = (mean(&gains), standard_error(&gains));
    Some(Choice {
        criterion,
        step: best.step,
        rl_step: best.rl_step,
        value: best.value(criterion),
        warmup_value: warmup.value(criterion),
        last_rl_step: last.rl_step,
        last_value: last.value(criterion),
        gain,
        gain_se,
        beats_warmup: best.rl_step > 0 && gain > NOISE_Z * gain_se && gain > 0.0,
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

    /// A point whose contexts each hold one accepted and one rejected answer, with the menu
    /// acceptances `menu`: pair accuracy is 1 where the accepted answer is the likelier.
    fn point(rl_step: u64, menu: &[f64]) -> SelectionPoint {
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
        SelectionPoint::new(100 + rl_step, rl_step, Scored::new(answers, logprobs), 1.0)
    }

    #[test]
    fn the_best_point_is_kept_and_judged_against_the_warm_up() {
        let points = [
            point(0, &[0.4, 0.5, 0.6, 0.5]),
            point(10, &[0.6, 0.7, 0.8, 0.7]),
            point(20, &[0.3, 0.4, 0.5, 0.4]),
        ];
        let refs: Vec<&SelectionPoint> = points.iter().collect();
        let choice = choose(&refs, Criterion::MenuAcceptance).unwrap();
        assert_eq!((choice.rl_step, choice.step), (10, 110));
        assert!((choice.gain - 0.2).abs() < 1e-12);
        assert!(choice.gain_se < 1e-12, "the same gain everywhere");
        assert!(choice.beats_warmup);
        assert_eq!((choice.last_rl_step, choice.points), (20, 3));
        assert!(choice.describe().contains("kept RL step 10 of 20"));
        // Pair accuracy: 0.5 at the warm-up (one pair wrong, one right, two ties), 1 at step 10.
        let choice = choose(&refs, Criterion::PairAccuracy).unwrap();
        assert_eq!(choice.rl_step, 10);
        assert!((choice.warmup_value - 0.5).abs() < 1e-12);
        assert!((choice.value - 1.0).abs() < 1e-12);
    }

    #[test]
    fn a_run_that_only_gets_worse_keeps_its_warm_up() {
        let points = [
            point(0, &[0.6, 0.7, 0.8]),
            point(10, &[0.5, 0.6, 0.7]),
            point(20, &[0.2, 0.3, 0.4]),
        ];
        let refs: Vec<&SelectionPoint> = points.iter().collect();
        for criterion in [Criterion::MenuAcceptance, Criterion::PairAccuracy] {
            let choice = choose(&refs, criterion).unwrap();
            assert_eq!((choice.rl_step, choice.gain), (0, 0.0));
            assert!(!choice.beats_warmup);
            assert!(choice.describe().contains("kept the warm-up model"));
            assert!(
                choice.describe().contains("--force"),
                "{}",
                choice.describe()
            );
        }
    }

    #[test]
    fn a_gain_within_its_noise_does_not_beat_the_warm_up() {
        // Mean gain +0.05 with per-context gains of ±0.5: well within one standard error.
        let points = [
            point(0, &[0.5, 0.5, 0.5, 0.5]),
            point(10, &[1.0, 0.0, 1.0, 0.2]),
        ];
        let refs: Vec<&SelectionPoint> = points.iter().collect();
        let choice = choose(&refs, Criterion::MenuAcceptance).unwrap();
        assert_eq!(choice.rl_step, 10);
        assert!((choice.gain - 0.05).abs() < 1e-12);
        assert!(!choice.beats_warmup);
        // No warm-up point, or no context: nothing to choose by.
        assert!(choose(&refs[1..], Criterion::MenuAcceptance).is_none());
        let empty = [point(0, &[])];
        assert!(choose(&[&empty[0]], Criterion::MenuAcceptance).is_none());
    }
}
