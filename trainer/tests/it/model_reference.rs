//! The tch decoder against transformers 5.23.0 on the tiny fixtures from
//! `scripts/reference/make_model_fixtures.py`: logits (unpadded, left-padded, cached), greedy
//! continuations through the KV cache, and LoRA's effect, switch and gradients.

use crate::common::{FIXTURES, load_model, max_abs, read_reference};
use serde::Deserialize;
use tch::{Kind, Tensor};
use trainer::model::{CausalLm, Logits, LoraConfig, greedy_decode};

/// fp32 on CPU must agree with transformers to float rounding.
const TOLERANCE: f64 = 1e-4;

#[derive(Debug, Deserialize)]
struct Reference {
    prompts: Vec<Vec<i64>>,
    /// Per prompt, `[len, vocab]` logits of transformers on that prompt alone.
    logits: Vec<Vec<Vec<f32>>>,
    greedy: Vec<Vec<i64>>,
    new_tokens: i64,
}

fn load(name: &str) -> (CausalLm, Reference) {
    (load_model(name), read_reference(name))
}

fn reference_logits(reference: &Reference, prompt: usize) -> Tensor {
    let rows = &reference.logits[prompt];
    let flat: Vec<f32> = rows.iter().flatten().copied().collect();
    Tensor::from_slice(&flat).reshape([rows.len() as i64, -1])
}

/// The prompts left-padded with token 0 into one batch, and the matching mask.
fn left_padded(prompts: &[Vec<i64>]) -> (Tensor, Tensor, i64) {
    let width = prompts.iter().map(Vec::len).max().unwrap();
    let mut ids = Vec::new();
    let mut mask = Vec::new();
    for prompt in prompts {
        let pad = width - prompt.len();
        ids.extend(std::iter::repeat_n(0i64, pad).chain(prompt.iter().copied()));
        mask.extend(std::iter::repeat_n(0i64, pad).chain(std::iter::repeat_n(1, prompt.len())));
    }
    let shape = [prompts.len() as i64, width as i64];
    (
        Tensor::from_slice(&ids).reshape(shape),
        Tensor::from_slice(&mask).reshape(shape),
        width as i64,
    )
}

#[test]
fn unpadded_logits_match_transformers() {
    for name in FIXTURES {
        let (model, reference) = load(name);
        for (index, prompt) in reference.prompts.iter().enumerate() {
            let ids = Tensor::from_slice(prompt).unsqueeze(0);
            let logits = tch::no_grad(|| model.forward(&ids, None, None, Logits::All)).unwrap();
            let diff = max_abs(&logits.squeeze_dim(0), &reference_logits(&reference, index));
            println!("{name} prompt {index}: max |logit diff| = {diff:e}");
            assert!(diff < TOLERANCE, "{name} prompt {index}: {diff}");
        }
    }
}

#[test]
fn left_padded_batch_matches_each_unpadded_prompt() {
    for name in FIXTURES {
        let (model, reference) = load(name);
        let (ids, mask, width) = left_padded(&reference.prompts);
        let logits = tch::no_grad(|| model.forward(&ids, Some(&mask), None, Logits::All)).unwrap();
        // The same batch through a cache with last-position logits only.
        let mut cache = model.new_cache(2, width).unwrap();
        let last =
            tch::no_grad(|| model.forward(&ids, Some(&mask), Some(&mut cache), Logits::Last))
                .unwrap();
        assert_eq!(last.size(), [2, model.config().vocab_size]);
        for (row, prompt) in reference.prompts.iter().enumerate() {
            let len = prompt.len() as i64;
            let expected = reference_logits(&reference, row);
            let real = logits.get(row as i64).narrow(0, width - len, len);
            let diff = max_abs(&real, &expected);
            println!("{name} padded row {row}: max |logit diff| = {diff:e}");
            assert!(diff < TOLERANCE, "{name} padded row {row}: {diff}");
            let diff_last = max_abs(&last.get(row as i64), &expected.get(len - 1));
            assert!(
                diff_last < TOLERANCE,
                "{name} cached last row {row}: {diff_last}"
            );
        }
    }
}

#[test]
fn incremental_decode_reproduces_full_forward_logits() {
    for name in FIXTURES {
        let (model, reference) = load(name);
        let prompt = &reference.prompts[1];
        let expected = reference_logits(&reference, 1);
        let split = 5;
        let mut cache = model.new_cache(1, prompt.len() as i64).unwrap();
        let head = Tensor::from_slice(&prompt[..split]).unsqueeze(0);
        let _prefill =
            tch::no_grad(|| model.forward(&head, None, Some(&mut cache), Logits::Last)).unwrap();
        for (position, &token) in prompt.iter().enumerate().skip(split) {
            let step = Tensor::from_slice(&[token]).unsqueeze(0);
            let logits =
                tch::no_grad(|| model.forward(&step, None, Some(&mut cache), Logits::Last))
                    .unwrap();
            let diff = max_abs(&logits.squeeze_dim(0), &expected.get(position as i64));
            assert!(diff < TOLERANCE, "{name} step at {position}: {diff}");
        }
        assert_eq!(cache.len(), prompt.len() as i64);
        let overflow = Tensor::from_slice(&[1i64]).unsqueeze(0);
        let full = tch::no_grad(|| model.forward(&overflow, None, Some(&mut cache), Logits::Last));
        assert!(full.unwrap_err().to_string().contains("KV cache full"));
    }
}

#[test]
fn greedy_through_kv_cache_equals_transformers_generate() {
    for name in FIXTURES {
        let (model, reference) = load(name);
        for (index, prompt) in reference.prompts.iter().enumerate() {
            let ids = Tensor::from_slice(prompt).unsqueeze(0);
            let tokens = greedy_decode(&model, &ids, None, reference.new_tokens).unwrap();
            let tokens = Vec::<i64>::try_from(tokens.squeeze_dim(0)).unwrap();
            assert_eq!(tokens, reference.greedy[index], "{name} prompt {index}");
        }
        // Both prompts at once, left-padded: each row continues as it does alone.
        let (ids, mask, _) = left_padded(&reference.prompts);
        let tokens = greedy_decode(&model, &ids, Some(&mask), reference.new_tokens).unwrap();
        for (row, expected) in reference.greedy.iter().enumerate() {
            let row_tokens = Vec::<i64>::try_from(tokens.get(row as i64)).unwrap();
            assert_eq!(&row_tokens, expected, "{name} padded batch row {row}");
        }
    }
}

#[test]
fn repeated_cache_rows_continue_like_their_source_row() {
    let (model, reference) = load("tiny-qwen2");
    let (ids, mask, width) = left_padded(&reference.prompts);
    let samples = 3;
    let mut cache = model.new_cache(2, width + 2).unwrap();
    let _prefill =
        tch::no_grad(|| model.forward(&ids, Some(&mask), Some(&mut cache), Logits::Last)).unwrap();
    let mut repeated = cache.repeat_interleave(samples).unwrap();
    assert_eq!(repeated.batch_size(), 2 * samples);
    // Every sample of prompt 0 gets token 5, of prompt 1 token 9; all must see their own prompt.
    let step = Tensor::from_slice(&[5i64, 9]);
    let logits =
        tch::no_grad(|| model.forward(&step.unsqueeze(1), None, Some(&mut cache), Logits::Last))
            .unwrap();
    let repeated_step = step
        .repeat_interleave_self_int(samples, 0, None)
        .unsqueeze(1);
    let repeated_logits =
        tch::no_grad(|| model.forward(&repeated_step, None, Some(&mut repeated), Logits::Last))
            .unwrap();
    let expected = logits.repeat_interleave_self_int(samples, 0, None);
    let diff = max_abs(&repeated_logits, &expected);
    // Batch 6 vs batch 2 may take different GEMM blockings: float rounding, not semantics.
    assert!(diff < TOLERANCE, "repeated rows differ by {diff}");
    // Keeping only row 1 of the repeated cache (a sample of prompt 1) decodes like prompt 1.
    let mut kept = repeated.select_rows(&Tensor::from_slice(&[4i64])).unwrap();
    let next = Tensor::from_slice(&[7i64]).unsqueeze(1);
    let mut single = cache.select_rows(&Tensor::from_slice(&[1i64])).unwrap();
    let kept_logits = model
        .forward(&next, None, Some(&mut kept), Logits::Last)
        .unwrap();
    let single_logits = model
        .forward(&next, None, Some(&mut single), Logits::Last)
        .unwrap();
    assert!(max_abs(&kept_logits, &single_logits) < TOLERANCE);
    // Prompt 0's and prompt 1's rows really differ, so the check above cannot pass by accident.
    assert!(max_abs(&logits.get(0), &logits.get(1)) > 1e-2);
}

fn randomise_lora_b(model: &CausalLm) {
    tch::no_grad(|| {
        for (name, variable) in model.var_store().variables() {
            if name.contains(".lora_B.") {
                variable
                    .shallow_clone()
                    .copy_(&(variable.randn_like() * 0.1));
            }
        }
    });
}

#[test]
fn lora_zero_b_keeps_logits_and_switch_restores_base() {
    for name in FIXTURES {
        let (mut model, reference) = load(name);
        let ids = Tensor::from_slice(&reference.prompts[1]).unsqueeze(0);
        let base = tch::no_grad(|| model.forward(&ids, None, None, Logits::All)).unwrap();
        model.attach_lora(&LoraConfig::default()).unwrap();
        let fresh = tch::no_grad(|| model.forward(&ids, None, None, Logits::All)).unwrap();
        assert!(
            max_abs(&fresh, &base) < 1e-6,
            "{name}: zero-B adapter changed logits"
        );
        assert!(max_abs(&fresh.squeeze_dim(0), &reference_logits(&reference, 1)) < TOLERANCE);

        randomise_lora_b(&model);
        let adapted = tch::no_grad(|| model.forward(&ids, None, None, Logits::All)).unwrap();
        assert!(
            max_abs(&adapted, &base) > 1e-2,
            "{name}: adapters had no effect"
        );
        model.adapters().set_enabled(false);
        let reference_policy =
            tch::no_grad(|| model.forward(&ids, None, None, Logits::All)).unwrap();
        assert!(
            max_abs(&reference_policy, &base) < 1e-6,
            "{name}: switch did not restore base"
        );
        model.adapters().set_enabled(true);
        let again = tch::no_grad(|| model.forward(&ids, None, None, Logits::All)).unwrap();
        assert!(max_abs(&again, &adapted) < 1e-6);
    }
}

#[test]
fn gradients_reach_lora_parameters_only() {
    let (mut model, reference) = load("tiny-llama");
    let lora = LoraConfig {
        r: 4,
        alpha: 8.0,
        dropout: 0.1,
        ..LoraConfig::default()
    };
    model.attach_lora(&lora).unwrap();
    assert!(model.attach_lora(&lora).is_err(), "second attach must fail");
    randomise_lora_b(&model);
    let variables = model.var_store().variables();
    let layers = model.config().num_hidden_layers as usize;
    let lora_count = variables
        .keys()
        .filter(|name| name.contains(".lora_"))
        .count();
    assert_eq!(lora_count, 2 * 7 * layers);
    assert_eq!(model.var_store().trainable_variables().len(), lora_count);
    assert_eq!(
        variables["model.layers.1.mlp.down_proj.lora_A.weight"].size(),
        [4, model.config().intermediate_size]
    );
    assert_eq!(
        variables["model.layers.0.self_attn.k_proj.lora_B.weight"].size(),
        [
            model.config().num_key_value_heads * model.config().head_dim,
            4
        ]
    );

    let ids = Tensor::from_slice(&reference.prompts[1]).unsqueeze(0);
    let logits = model.forward_train(&ids, None).unwrap();
    let loss = logits
        .log_softmax(-1, Kind::Float)
        .narrow(1, 0, 11)
        .gather(2, &ids.narrow(1, 1, 11).unsqueeze(-1), false)
        .mean(Kind::Float);
    loss.backward();
    for (name, variable) in &variables {
        let grad = variable.grad();
        if name.contains(".lora_") {
            assert!(grad.defined(), "{name} has no gradient");
            assert!(
                grad.abs().sum(Kind::Float).double_value(&[]) > 0.0,
                "{name}: zero gradient"
            );
        } else {
            assert!(!variable.requires_grad(), "{name} is not frozen");
            assert!(!grad.defined(), "{name} got a gradient");
        }
    }
}
