//! The LoRA training path on the tiny fixtures: chunked log-probs equal a full log-softmax, the
//! reference policy ignores the adapters, the trainer's recomputed-head backward equals plain
//! autograd, AdamW moves only the adapters (or, fully fine-tuning, every weight, which then saves as
//! a checkpoint that loads back to the same logits), and gradient clipping scales the update.

use std::collections::BTreeMap;

use crate::common::{FIXTURES, cpu, fixture_dir, load_model as load, max_abs, read_reference};
use serde::Deserialize;
use tch::{Kind, Tensor};
use trainer::generate::{GenerationRequest, generate};
use trainer::logprobs::{
    TrainBatch, reference_logprobs, score_logprobs, sequence_logprobs_chunked,
};
use trainer::model::{CausalLm, LoraConfig};
use trainer::train_step::{
    Measure, TrainError, Trainer, TrainerConfig, accumulate_gradients, masked_mean_nll,
};

/// Columns before this one are "prompt" and not scored, so masking is exercised.
const FIRST_SCORED: i64 = 3;

#[derive(Debug, Deserialize)]
struct Reference {
    prompts: Vec<Vec<i64>>,
}

/// A model with rank-4 adapters on every projection whose lora_B is random, so the adapters change
/// the logits and lora_A receives gradients.
fn adapted(name: &str, seed: i64) -> CausalLm {
    let mut model = load(name);
    model
        .attach_lora(&LoraConfig {
            r: 4,
            alpha: 8.0,
            ..LoraConfig::default()
        })
        .unwrap();
    tch::manual_seed(seed);
    tch::no_grad(|| {
        for (variable, mut tensor) in model.var_store().variables() {
            if variable.ends_with(".lora_B.weight") {
                tensor.copy_(&(Tensor::randn_like(&tensor) * 0.1));
            }
        }
    });
    model
}

/// The fixture's prompts right-padded with token 0, with the attention mask and a completion mask
/// that scores real tokens from column `FIRST_SCORED` on.
fn batch(name: &str) -> TrainBatch {
    let reference: Reference = read_reference(name);
    let width = reference.prompts.iter().map(Vec::len).max().unwrap();
    let (mut ids, mut mask, mut completion) = (Vec::new(), Vec::new(), Vec::new());
    for prompt in &reference.prompts {
        for column in 0..width {
            let real = column < prompt.len();
            ids.push(if real { prompt[column] } else { 0 });
            mask.push(i64::from(real));
            completion.push(i64::from(real && column as i64 >= FIRST_SCORED));
        }
    }
    let shape = [reference.prompts.len() as i64, width as i64];
    TrainBatch {
        input_ids: Tensor::from_slice(&ids).reshape(shape),
        attention_mask: Some(Tensor::from_slice(&mask).reshape(shape)),
        completion_mask: Tensor::from_slice(&completion).reshape(shape),
        allowed: None,
    }
}

/// Log-probs the obvious way: full `[b, t, vocab]` logits, log-softmax, gather, mask.
fn full_logprobs(model: &CausalLm, batch: &TrainBatch) -> Tensor {
    let logits = model
        .forward_train(&batch.input_ids, batch.attention_mask.as_ref())
        .unwrap();
    let columns = batch.input_ids.size()[1] - 1;
    let targets = batch.input_ids.narrow(1, 1, columns).unsqueeze(2);
    let all = logits
        .narrow(1, 0, columns)
        .log_softmax(-1, Kind::Float)
        .gather(2, &targets, false)
        .squeeze_dim(2);
    let scored = batch
        .completion_mask
        .narrow(1, 1, columns)
        .to_kind(Kind::Bool)
        .logical_and(
            &batch
                .attention_mask
                .as_ref()
                .unwrap()
                .narrow(1, 1, columns)
                .to_kind(Kind::Bool),
        );
    all * scored.to_kind(Kind::Float)
}

fn lora_grads(model: &CausalLm) -> BTreeMap<String, Tensor> {
    model
        .var_store()
        .variables()
        .into_iter()
        .filter(|(name, _)| name.contains(".lora_"))
        .map(|(name, tensor)| (name, tensor.grad().copy()))
        .collect()
}

#[test]
fn chunked_logprobs_equal_a_full_log_softmax() {
    for name in FIXTURES {
        let model = adapted(name, 1);
        let batch = batch(name);
        let expected = tch::no_grad(|| full_logprobs(&model, &batch));
        // Chunks of 3 scored tokens: several full chunks and a remainder.
        for chunk in [3, 1024] {
            let got = tch::no_grad(|| {
                sequence_logprobs_chunked(
                    &model,
                    &batch.input_ids,
                    batch.attention_mask.as_ref(),
                    &batch.completion_mask,
                    chunk,
                )
            })
            .unwrap();
            assert_eq!(got.size(), expected.size());
            let diff = max_abs(&got, &expected);
            assert!(diff < 1e-5, "{name} chunk {chunk}: {diff}");
        }
        // Unscored positions (prompt columns) are exactly zero, scored ones negative.
        let got = score_logprobs(&model, &batch, 1.0).unwrap();
        let prompt_part = got.narrow(1, 0, FIRST_SCORED - 1);
        assert_eq!(prompt_part.abs().max().double_value(&[]), 0.0, "{name}");
        assert!(got.get(0).get(FIRST_SCORED).double_value(&[]) < 0.0);
    }
}

#[test]
fn reference_logprobs_ignore_the_adapters_and_restore_the_switch() {
    for name in FIXTURES {
        let model = adapted(name, 2);
        let base = load(name);
        let batch = batch(name);
        let reference = reference_logprobs(&model, &batch, 1.0).unwrap();
        assert!(model.adapters().enabled(), "{name}: switch left off");
        let base_logprobs = score_logprobs(&base, &batch, 1.0).unwrap();
        let policy = score_logprobs(&model, &batch, 1.0).unwrap();
        assert!(max_abs(&reference, &base_logprobs) < 1e-6, "{name}");
        assert!(
            max_abs(&policy, &base_logprobs) > 1e-3,
            "{name}: adapters should change the policy"
        );
        assert!(!reference.requires_grad());
    }
}

#[test]
fn recomputed_head_backward_equals_plain_autograd() {
    for name in FIXTURES {
        let model = adapted(name, 3);
        let batch = batch(name);
        let logprobs = sequence_logprobs_chunked(
            &model,
            &batch.input_ids,
            batch.attention_mask.as_ref(),
            &batch.completion_mask,
            1024,
        )
        .unwrap();
        let columns = batch.input_ids.size()[1] - 1;
        let mask = batch
            .completion_mask
            .narrow(1, 1, columns)
            .logical_and(&batch.attention_mask.as_ref().unwrap().narrow(1, 1, columns))
            .to_kind(Kind::Float);
        let loss = masked_mean_nll(&logprobs, &mask).unwrap();
        loss.backward();
        let plain = lora_grads(&model);
        for (_, mut tensor) in model.var_store().variables() {
            tensor.zero_grad();
        }

        let trainer::train_step::Accumulated {
            loss: recomputed_loss,
            tokens,
            ..
        } = accumulate_gradients(
            &model,
            &batch,
            &TrainerConfig {
                chunk_tokens: 4,
                ..TrainerConfig::default()
            },
            Measure::LossOnly,
            masked_mean_nll,
        )
        .unwrap();
        assert_eq!(tokens as f64, mask.sum(Kind::Float).double_value(&[]));
        assert!((recomputed_loss - loss.double_value(&[])).abs() < 1e-6);
        let recomputed = lora_grads(&model);
        assert_eq!(plain.len(), recomputed.len());
        assert_eq!(
            plain.len(),
            2 * 7 * model.config().num_hidden_layers as usize
        );
        for (variable, grad) in &plain {
            let scale = grad.abs().max().double_value(&[]);
            assert!(scale > 0.0, "{name} {variable}: no gradient");
            let diff = max_abs(grad, &recomputed[variable]);
            assert!(diff <= 1e-5 * scale.max(1.0), "{name} {variable}: {diff}");
        }
    }
}

#[test]
fn adamw_steps_move_only_the_adapters_and_lower_the_loss() {
    for name in FIXTURES {
        let mut model = load(name);
        model.attach_lora(&LoraConfig::default()).unwrap();
        let base_before: BTreeMap<String, Tensor> = model
            .var_store()
            .variables()
            .into_iter()
            .filter(|(variable, _)| !variable.contains(".lora_"))
            .map(|(variable, tensor)| (variable, tensor.copy()))
            .collect();
        let config = TrainerConfig {
            learning_rate: 1e-2,
            ..TrainerConfig::default()
        };
        let mut trainer = Trainer::new(&model, config).unwrap();
        let lora_values: usize = model
            .var_store()
            .variables()
            .iter()
            .filter(|(variable, _)| variable.contains(".lora_"))
            .map(|(_, tensor)| tensor.numel())
            .sum();
        assert_eq!(trainer.trainable_parameters(), lora_values as i64);

        let batch = batch(name);
        let stats: Vec<_> = (0..4)
            .map(|_| trainer.supervised_step(&model, &batch).unwrap())
            .collect();
        assert!(
            stats[3].loss < stats[0].loss - 0.1,
            "{name}: loss {:?}",
            stats.iter().map(|s| s.loss).collect::<Vec<_>>()
        );
        assert!(stats.iter().all(|s| s.grad_norm > 0.0 && s.tokens > 0));
        for (variable, tensor) in model.var_store().variables() {
            match base_before.get(&variable) {
                Some(before) => assert!(tensor.equal(before), "{name}: {variable} changed"),
                None => {
                    let grad = tensor.grad();
                    let cleared = !grad.defined() || grad.abs().max().double_value(&[]) == 0.0;
                    assert!(cleared, "{name}: {variable} gradient left behind");
                }
            }
        }
    }
}

/// The policy log-probs the trainer takes of a sample equal the ones the sampler drew it with:
/// at the sampling temperature, with the adapters' dropout off. Scored at temperature 1 (the
/// trainer before it had a temperature) or with dropout on, they differ, and the first PPO ratio
/// of an RL step would not be 1.
#[test]
fn the_trainer_scores_a_sample_as_the_sampler_drew_it() {
    let name = FIXTURES[0];
    let mut model = load(name);
    model
        .attach_lora(&LoraConfig {
            r: 4,
            alpha: 8.0,
            dropout: 0.3,
            ..LoraConfig::default()
        })
        .unwrap();
    tch::manual_seed(5);
    tch::no_grad(|| {
        for (variable, mut tensor) in model.var_store().variables() {
            if variable.ends_with(".lora_B.weight") {
                tensor.copy_(&(Tensor::randn_like(&tensor) * 0.1));
            }
        }
    });
    let prompt = read_reference::<Reference>(name).prompts[0].clone();
    let mut request = GenerationRequest::new(vec![prompt.clone()]);
    request.num_samples = 3;
    request.max_new_tokens = 6;
    request.temperature = 0.6;
    request.seed = 3;
    let generation = generate(&model, &request).unwrap();
    for sample in &generation.samples {
        let ids: Vec<i64> = prompt.iter().chain(&sample.tokens).copied().collect();
        let width = ids.len() as i64;
        let completion: Vec<i64> = (0..ids.len())
            .map(|i| i64::from(i >= prompt.len()))
            .collect();
        let batch = TrainBatch {
            input_ids: Tensor::from_slice(&ids).reshape([1, width]),
            attention_mask: None,
            completion_mask: Tensor::from_slice(&completion).reshape([1, width]),
            allowed: None,
        };
        let scored_with = |temperature: f64, adapter_dropout: bool| -> Vec<f32> {
            let mut captured = None;
            accumulate_gradients(
                &model,
                &batch,
                &TrainerConfig {
                    temperature,
                    adapter_dropout,
                    ..TrainerConfig::default()
                },
                Measure::LossOnly,
                |logprobs, mask| {
                    captured = Some(logprobs.detach().copy());
                    masked_mean_nll(logprobs, mask)
                },
            )
            .unwrap();
            let logprobs = captured.unwrap();
            let first = prompt.len() as i64 - 1;
            Vec::<f32>::try_from(logprobs.get(0).narrow(0, first, width - 1 - first)).unwrap()
        };
        let gap = |got: &[f32]| {
            got.iter()
                .zip(&sample.sampling_logprobs)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max)
        };
        let consistent = scored_with(0.6, false);
        assert!(
            gap(&consistent) < 1e-4,
            "{consistent:?} vs {:?}",
            sample.sampling_logprobs
        );
        assert!(gap(&scored_with(1.0, false)) > 1e-3);
        tch::manual_seed(1);
        assert!(gap(&scored_with(0.6, true)) > 1e-3);
    }
}

/// Over a bf16 base (CUDA's kind; here on the CPU) the adapters and AdamW's moments stay f32, so
/// small updates land: with bf16 adapters a 1e-5 step on lora_A entries of about 0.1 rounds away
/// (bf16 resolves 2⁻⁸ of a value), and lora_A would come out of three steps unchanged.
#[test]
fn adapters_and_their_optimizer_state_are_f32_over_a_bf16_base() {
    let runtime = trainer::device::Runtime {
        device: tch::Device::Cpu,
        kind: Kind::BFloat16,
    };
    let name = FIXTURES[0];
    let (mut model, _) = CausalLm::from_pretrained(&fixture_dir(name), runtime).unwrap();
    model.attach_lora(&LoraConfig::default()).unwrap();
    let lora_a_before: BTreeMap<String, Tensor> = model
        .var_store()
        .variables()
        .into_iter()
        .filter(|(variable, _)| variable.ends_with(".lora_A.weight"))
        .map(|(variable, tensor)| (variable, tensor.copy()))
        .collect();
    for (variable, tensor) in model.var_store().variables() {
        let expected = if variable.contains(".lora_") {
            Kind::Float
        } else {
            Kind::BFloat16
        };
        assert_eq!(tensor.kind(), expected, "{variable}");
    }
    let mut trainer = Trainer::new(
        &model,
        TrainerConfig {
            learning_rate: 1e-5,
            ..TrainerConfig::default()
        },
    )
    .unwrap();
    let batch = batch(name);
    for _ in 0..3 {
        let stats = trainer.supervised_step(&model, &batch).unwrap();
        assert!(stats.loss.is_finite() && stats.grad_norm > 0.0);
    }
    let moved = model
        .var_store()
        .variables()
        .into_iter()
        .filter_map(|(variable, tensor)| {
            let before = lora_a_before.get(&variable)?;
            Some(max_abs(&tensor, before))
        })
        .fold(0.0f64, f64::max);
    assert!(moved > 1e-6, "lora_A moved by at most {moved}");
    // The optimizer's moments are saved like the adapters: f32.
    let dir = tempfile::tempdir().unwrap();
    trainer.save_state(&model, dir.path()).unwrap();
    let state =
        Tensor::read_safetensors(dir.path().join(trainer::train_step::OPTIMIZER_STATE_FILE))
            .unwrap();
    let moments: Vec<_> = state
        .iter()
        .filter(|(_, tensor)| tensor.numel() > 1)
        .collect();
    assert!(!moments.is_empty());
    for (key, tensor) in moments {
        assert_eq!(tensor.kind(), Kind::Float, "{key}");
    }
}

#[test]
fn full_fine_tuning_moves_every_weight_and_saves_a_checkpoint_that_loads_back() {
    for name in FIXTURES {
        let model = load(name);
        let before: BTreeMap<String, Tensor> = model
            .var_store()
            .variables()
            .into_iter()
            .map(|(variable, tensor)| (variable, tensor.copy()))
            .collect();
        model.set_base_trainable(true);
        let config = TrainerConfig {
            learning_rate: 1e-2,
            ..TrainerConfig::default()
        };
        let mut trainer = Trainer::new(&model, config).unwrap();
        let all: usize = before.values().map(Tensor::numel).sum();
        assert_eq!(trainer.trainable_parameters(), all as i64);
        let batch = batch(name);
        let stats: Vec<_> = (0..4)
            .map(|_| trainer.supervised_step(&model, &batch).unwrap())
            .collect();
        assert!(
            stats[3].loss < stats[0].loss - 0.1,
            "{name}: loss {:?}",
            stats.iter().map(|s| s.loss).collect::<Vec<_>>()
        );
        for (variable, tensor) in model.var_store().variables() {
            // Every projection, norm and the embeddings receive gradients and move.
            assert!(
                !tensor.equal(&before[&variable]),
                "{name}: {variable} did not move"
            );
        }

        model.set_base_trainable(false);
        assert!(matches!(
            Trainer::new(&model, TrainerConfig::default()),
            Err(TrainError::Trainable(_))
        ));
        let out = tempfile::tempdir().unwrap();
        let saved = out.path().join("model");
        trainer::peft::save_checkpoint(model.var_store(), &fixture_dir(name), &saved, 1 << 30)
            .unwrap();
        let (reloaded, _) = CausalLm::from_pretrained(&saved, cpu()).unwrap();
        let ours = full_logprobs(&model, &batch);
        let theirs = full_logprobs(&reloaded, &batch);
        assert_eq!(
            max_abs(&ours, &theirs),
            0.0,
            "{name}: reloaded logits differ"
        );
    }
}

#[test]
fn clipping_scales_the_update_when_adam_is_linear_in_the_gradient() {
    // With ε far above |g|, Adam's first update is lr · g / ε: proportional to the (clipped)
    // gradient, so clipping to a tenth of the norm must shrink the update tenfold.
    let name = "tiny-qwen2";
    let batch = batch(name);
    let model = adapted(name, 4);
    let initial: Vec<Tensor> = model
        .var_store()
        .trainable_variables()
        .iter()
        .map(Tensor::copy)
        .collect();
    // Both runs start from the same adapter values with a fresh optimizer (seeding is not enough:
    // tests share libtorch's global generator across threads).
    let update_norm = |max_grad_norm: Option<f64>| {
        tch::no_grad(|| {
            for (mut variable, start) in model
                .var_store()
                .trainable_variables()
                .into_iter()
                .zip(&initial)
            {
                variable.copy_(start);
            }
        });
        let config = TrainerConfig {
            // lr / ε = 0.01: updates large enough that f32 rounding of the weights is negligible.
            learning_rate: 1e4,
            eps: 1e6,
            weight_decay: 0.0,
            max_grad_norm,
            ..TrainerConfig::default()
        };
        let mut trainer = Trainer::new(&model, config).unwrap();
        let stats = trainer.supervised_step(&model, &batch).unwrap();
        let squares: f64 = model
            .var_store()
            .trainable_variables()
            .iter()
            .zip(&initial)
            .map(|(after, before)| {
                (after - before)
                    .square()
                    .sum(Kind::Double)
                    .double_value(&[])
            })
            .sum();
        (stats.grad_norm, squares.sqrt())
    };
    let (norm, unclipped) = update_norm(None);
    let (norm_again, clipped) = update_norm(Some(norm / 10.0));
    assert!(
        (norm - norm_again).abs() < 1e-9 * norm,
        "reported norm is the pre-clip norm"
    );
    let ratio = clipped / unclipped;
    assert!((ratio - 0.1).abs() < 1e-3, "update ratio {ratio}");
}

#[test]
fn trainer_rejects_models_without_adapters_and_batches_without_scored_tokens() {
    let name = "tiny-llama";
    let model = load(name);
    assert!(matches!(
        Trainer::new(&model, TrainerConfig::default()),
        Err(TrainError::Trainable(_))
    ));
    let model = adapted(name, 5);
    let mut trainer = Trainer::new(&model, TrainerConfig::default()).unwrap();
    let mut empty = batch(name);
    empty.completion_mask = empty.completion_mask.zeros_like();
    let error = trainer.supervised_step(&model, &empty).unwrap_err();
    assert!(matches!(error, TrainError::Batch(_)), "{error}");
    let bad = TrainerConfig {
        learning_rate: -1.0,
        ..TrainerConfig::default()
    };
    assert!(matches!(
        Trainer::new(&model, bad),
        Err(TrainError::Config(_))
    ));
}
