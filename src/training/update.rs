//! The RL step's policy update: μ passes (`--update-epochs`) over the rollout batch, each split
//! into minibatches of whole groups (`--minibatches`), one clipped-surrogate optimizer step per
//! minibatch. From the second minibatch on the policy differs from the one that sampled, so the
//! PPO clip (with clip-higher's ε_high) is what bounds each step: with one step per batch the
//! ratio is exactly 1 where the gradient is taken and the clip never binds.
//!
//! The "old" log-probs are the sampler's own (the policy at the sampling temperature, adapters'
//! dropout off; below f32 the trainer's forward of the same tokens, as the sampler's rounding
//! differs), the reference log-probs are the warm-up model's at the same temperature, and
//! the loss is scored the same way, so the first minibatch's ratio is 1 up to rounding
//! ([`UpdateStats::max_abs_log_ratio`] reports it).

use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

use trainer::chat_policy::{PackedBatch, Sequence, pack, split_evenly};
use trainer::logprobs::{TrainBatch, reference_logprobs};
use trainer::model::CausalLm;
use trainer::rl_loss::{Aggregation, PolicyLossConfig, PolicyLossInputs, mean_k3_kl, policy_loss};
use trainer::tch::Tensor;
use trainer::train_step::{Measure, TrainError, Trainer};

use super::rollout::RlBatch;
use super::seeds::{StepSeeds, Stream};
use super::settings::TrainSettings;

/// What the update did.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct UpdateStats {
    /// Mean loss over the optimizer steps (0 without one).
    pub loss: f64,
    /// Mean pre-clip gradient norm over the optimizer steps.
    pub grad_norm: f64,
    /// Completion tokens one pass scores.
    pub tokens: i64,
    /// Mean share of clipped tokens over the optimizer steps.
    pub clip_fraction: f64,
    /// |log ρ| at the first minibatch (see the module docs).
    pub max_abs_log_ratio: f64,
    pub optimizer_steps: usize,
    /// Constrained samples: the unmasked model's mean probability on forbidden tokens at the
    /// first minibatch, before any update of the step.
    pub forbidden_mass: Option<f64>,
}

/// The batch's sequences packed once, with the reference log-probs every minibatch reads.
#[derive(Debug)]
pub struct ScoredBatch {
    packed: PackedBatch,
    reference: Tensor,
    /// Mean k3 KL per token of the sampling policy to the reference over every drawn sample.
    pub kl: f64,
    /// See [`trainer::chat_policy::PackedBatch::rescore_in_reduced_precision`].
    pub sampler_gap: Option<f64>,
    /// Per drawn group, its rows in `packed`.
    group_rows: Vec<std::ops::Range<usize>>,
}

/// Packs every drawn sample and scores it under the reference (the warm-up model: adapters off)
/// at the sampling temperature; below f32 also under the policy, `minibatches` being the update's
/// split (see [`trainer::chat_policy::PackedBatch::rescore_in_reduced_precision`]).
pub fn score_batch(
    model: &CausalLm,
    pad_id: i64,
    batch: &RlBatch<'_>,
    temperature: f64,
    minibatches: usize,
) -> Result<ScoredBatch, TrainError> {
    let mut group_rows = Vec::with_capacity(batch.drawn.len());
    let mut sequences = Vec::new();
    for (pick, group) in &batch.drawn {
        let start = sequences.len();
        sequences.extend(group.samples.iter().map(|sample| {
            Sequence::sampled(&pick.ids, &sample.tokens, &sample.logprobs, &sample.allowed)
        }));
        group_rows.push(start..sequences.len());
    }
    let mut packed = pack(&sequences, pad_id, model.runtime().device)?;
    // A minibatch's rows: its groups (`policy_update` splits the kept ones evenly) × group size.
    let group_size = batch
        .drawn
        .first()
        .map_or(1, |(_, group)| group.samples.len());
    let groups_per_minibatch = batch.kept.len().div_ceil(minibatches.max(1)).max(1);
    let sampler_gap = packed.rescore_in_reduced_precision(
        model,
        temperature,
        group_size * groups_per_minibatch,
    )?;
    let reference = reference_logprobs(model, &packed.batch, temperature)?;
    // The [b, t − 1] log-probs score tokens 1..t: the completion mask shifts by one column.
    let width = packed.batch.completion_mask.size()[1];
    let scored = packed.batch.completion_mask.f_narrow(1, 1, width - 1)?;
    let kl = mean_k3_kl(&packed.sampling_logprobs, &reference, &scored)?;
    Ok(ScoredBatch {
        packed,
        reference,
        kl,
        sampler_gap,
        group_rows,
    })
}

/// Runs the update over `batch`'s kept groups with the KL coefficient `kl_coef`. `poison` makes
/// the first loss NaN (the rollback test's fault).
#[expect(
    clippy::too_many_arguments,
    reason = "the step's inputs, each from a different owner"
)]
pub fn policy_update(
    trainer: &mut Trainer,
    model: &CausalLm,
    settings: &TrainSettings,
    batch: &RlBatch<'_>,
    scored: &ScoredBatch,
    kl_coef: f64,
    seeds: StepSeeds,
    poison: bool,
) -> Result<UpdateStats, TrainError> {
    let mut stats = UpdateStats::default();
    if batch.kept.is_empty() {
        return Ok(stats);
    }
    let config = PolicyLossConfig {
        clip_epsilon: settings.clip_epsilon,
        clip_epsilon_high: settings.clip_epsilon_high,
        kl_coef,
        aggregation: Aggregation::Sequence,
    };
    let minibatches = settings.minibatches.min(batch.kept.len()).max(1);
    let mut rng = ChaCha8Rng::seed_from_u64(seeds.of(Stream::Minibatches, &[]));
    let mut order = batch.kept.clone();
    for epoch in 0..settings.update_epochs {
        if epoch > 0 || minibatches > 1 {
            order.shuffle(&mut rng);
        }
        for (index, groups) in split_evenly(&order, minibatches).into_iter().enumerate() {
            let first = epoch == 0 && index == 0;
            let minibatch = Minibatch::select(scored, batch, groups)?;
            let inputs = PolicyLossInputs {
                advantages: &minibatch.advantages,
                sampling_logprobs: &minibatch.sampling,
                reference_logprobs: Some(&minibatch.reference),
                prompts: groups.len() as i64,
            };
            let mut loss_stats = None;
            let measure = Measure::on_first_minibatch(first);
            let step = trainer.step(model, &minibatch.batch, measure, |logprobs, mask| {
                let (loss, stats) = policy_loss(logprobs, mask, &inputs, &config)?;
                loss_stats = Some(stats);
                Ok(if poison && first {
                    loss.f_mul_scalar(f64::NAN)?
                } else {
                    loss
                })
            })?;
            stats.optimizer_steps += 1;
            stats.loss += step.loss;
            stats.grad_norm += step.grad_norm;
            if epoch == 0 {
                stats.tokens += step.tokens;
            }
            if let Some(loss_stats) = loss_stats {
                stats.clip_fraction += loss_stats.clip_fraction;
                if first {
                    stats.max_abs_log_ratio = loss_stats.max_abs_log_ratio;
                }
            }
            if first {
                stats.forbidden_mass = step.forbidden_mass;
            }
        }
    }
    let steps = stats.optimizer_steps as f64;
    stats.loss /= steps;
    stats.grad_norm /= steps;
    stats.clip_fraction /= steps;
    Ok(stats)
}

/// Some groups' rows of a [`ScoredBatch`].
struct Minibatch {
    batch: TrainBatch,
    sampling: Tensor,
    reference: Tensor,
    advantages: Tensor,
}

impl Minibatch {
    fn select(
        scored: &ScoredBatch,
        batch: &RlBatch<'_>,
        groups: &[usize],
    ) -> Result<Self, TrainError> {
        let rows: Vec<i64> = groups
            .iter()
            .flat_map(|&g| scored.group_rows[g].clone().map(|row| row as i64))
            .collect();
        let advantages: Vec<f32> = groups
            .iter()
            .flat_map(|&g| batch.advantages[g].iter().map(|&a| a as f32))
            .collect();
        let PackedBatch {
            batch: rows_batch,
            sampling_logprobs: sampling,
        } = scored.packed.select_rows(&rows)?;
        let device = rows_batch.input_ids.device();
        let index = Tensor::from_slice(&rows).to_device(device);
        Ok(Self {
            batch: rows_batch,
            sampling,
            reference: scored.reference.f_index_select(0, &index)?,
            advantages: Tensor::from_slice(&advantages).to_device(device),
        })
    }
}
