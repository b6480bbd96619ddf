//! Scoring samples over their prompt computed once (`CausalLm::scoring_hidden_states`, the RL
//! step's reference log-probs and update) gives the plain forward's hidden states, log-probs and
//! gradients, and is only used where rows share a right-padded prompt.

use std::collections::BTreeMap;

use crate::common::{FIXTURES, load_model as load, max_abs, nll_gradients};
use tch::{Device, Kind, Tensor};
use trainer::chat_policy::{Sequence, pack};
use trainer::logprobs::{TrainBatch, score_logprobs, sequence_logprobs};
use trainer::model::{CausalLm, LoraConfig, PromptGroup, prompt_groups};
use trainer::train_step::TrainerConfig;

/// A model with LoRA adapters whose B matrices are not zero (so the adapters change the output).
fn adapted(name: &str) -> CausalLm {
    let mut model = load(name);
    model
        .attach_lora(&LoraConfig {
            r: 4,
            alpha: 8.0,
            dropout: 0.0,
            ..LoraConfig::default()
        })
        .unwrap();
    tch::manual_seed(7);
    tch::no_grad(|| {
        for (variable, mut tensor) in model.var_store().variables() {
            if variable.ends_with(".lora_B.weight") {
                tensor.copy_(&(Tensor::randn_like(&tensor) * 0.1));
            }
        }
    });
    model
}

/// Two prompts with three and two samples of different lengths, then a prompt with one.
fn grouped_batch() -> TrainBatch {
    let prompts: [&[i64]; 3] = [&[5, 9, 11, 3, 17, 2, 8], &[4, 6, 10, 12], &[7, 1, 13]];
    let completions: [(usize, &[i64]); 6] = [
        (0, &[21, 22, 23]),
        (0, &[24, 25, 26, 27, 28]),
        (0, &[29, 30]),
        (1, &[31, 32, 33, 34]),
        (1, &[35]),
        (2, &[36, 37]),
    ];
    let sequences: Vec<Sequence<'_>> = completions
        .iter()
        .map(|&(prompt, completion)| Sequence {
            prompt: prompts[prompt],
            completion,
            sampling_logprobs: None,
            allowed: None,
        })
        .collect();
    pack(&sequences, 0, Device::Cpu).unwrap().batch
}

/// Every trainable variable's gradient after one backward of the mean NLL; `plain` scores with
/// adapter dropout on (rate 0: the same function), which takes the plain forward.
fn gradients(model: &CausalLm, batch: &TrainBatch, plain: bool) -> BTreeMap<String, Tensor> {
    let config = TrainerConfig {
        chunk_tokens: 5,
        adapter_dropout: plain,
        ..TrainerConfig::default()
    };
    nll_gradients(model, batch, &config)
}

#[test]
fn rows_that_share_a_prompt_are_grouped_in_order() {
    let batch = grouped_batch();
    let groups = prompt_groups(
        &batch.input_ids,
        batch.attention_mask.as_ref(),
        &batch.completion_mask,
    )
    .unwrap();
    assert_eq!(
        groups,
        Some(vec![
            PromptGroup {
                rows: 0..3,
                prompt_len: 7
            },
            PromptGroup {
                rows: 3..5,
                prompt_len: 4
            },
            PromptGroup {
                rows: 5..6,
                prompt_len: 3
            },
        ])
    );
}

#[test]
fn nothing_is_shared_without_a_shared_right_padded_prompt() {
    let ids = Tensor::from_slice(&[5i64, 9, 21, 0, 4, 6, 31, 32]).reshape([2, 4]);
    let completion = Tensor::from_slice(&[0i64, 0, 1, 0, 0, 0, 1, 1]).reshape([2, 4]);
    let real = Tensor::from_slice(&[1i64, 1, 1, 0, 1, 1, 1, 1]).reshape([2, 4]);
    // Two different prompts.
    assert_eq!(prompt_groups(&ids, Some(&real), &completion).unwrap(), None);
    // The same prompt, but the first row is left-padded.
    let ids = Tensor::from_slice(&[0i64, 5, 9, 21, 0, 5, 9, 22]).reshape([2, 4]);
    let completion = Tensor::from_slice(&[0i64, 0, 0, 1, 0, 0, 0, 1]).reshape([2, 4]);
    let left_padded = Tensor::from_slice(&[0i64, 1, 1, 1, 0, 1, 1, 1]).reshape([2, 4]);
    assert_eq!(
        prompt_groups(&ids, Some(&left_padded), &completion).unwrap(),
        None
    );
    // A row with no scored token.
    let none_scored = Tensor::from_slice(&[0i64, 0, 0, 1, 0, 0, 0, 0]).reshape([2, 4]);
    assert_eq!(prompt_groups(&ids, None, &none_scored).unwrap(), None);
    // Groups that do not cover the batch are refused, not misread.
    let model = adapted(FIXTURES[0]);
    let error = model
        .hidden_states_shared_prompts(
            &ids,
            &[PromptGroup {
                rows: 0..1,
                prompt_len: 3,
            }],
        )
        .unwrap_err()
        .to_string();
    assert!(error.contains("cover the batch's 2 rows"), "{error}");
}

#[test]
fn a_prompt_computed_once_gives_the_plain_forwards_states_log_probs_and_gradients() {
    for name in FIXTURES {
        let model = adapted(name);
        let batch = grouped_batch();
        let mask = batch.attention_mask.as_ref();
        let groups = prompt_groups(&batch.input_ids, mask, &batch.completion_mask)
            .unwrap()
            .unwrap();

        let plain =
            tch::no_grad(|| model.hidden_states(&batch.input_ids, mask, None, false)).unwrap();
        let shared =
            tch::no_grad(|| model.hidden_states_shared_prompts(&batch.input_ids, &groups)).unwrap();
        let real = mask.unwrap().to_kind(Kind::Float).unsqueeze(-1);
        let gap = max_abs(&(&plain * &real), &(&shared * &real));
        assert!(gap < 1e-5, "{name}: hidden states differ by {gap}");

        // Scoring takes the shared path (no dropout); the training forward with dropout the
        // plain one: the same log-probs.
        let scored = score_logprobs(&model, &batch, 1.0).unwrap();
        let reference = tch::no_grad(|| {
            sequence_logprobs(&model, &batch.input_ids, mask, &batch.completion_mask)
        })
        .unwrap();
        let gap = max_abs(&scored, &reference);
        assert!(gap < 1e-5, "{name}: log-probs differ by {gap}");

        let shared = gradients(&model, &batch, false);
        let plain = gradients(&model, &batch, true);
        assert_eq!(shared.len(), plain.len());
        for (variable, gradient) in &plain {
            let scale = gradient.abs().max().double_value(&[]).max(1e-6);
            let gap = max_abs(gradient, &shared[variable]);
            assert!(
                gap <= 1e-4 * scale,
                "{name}: {variable}'s gradient differs by {gap} (largest entry {scale})"
            );
        }
    }
}
