//! Gradient checkpointing of the decoder layers gives the same gradients as the plain backward
//! pass, for LoRA adapters with dropout (recomputed layers must draw the same masks) and for full
//! fine-tuning. Dropout draws from libtorch's global generator, which the binary's other tests
//! draw from too: run under cargo-nextest (a process per test, as `scripts/test.sh` does) or,
//! with plain `cargo test`, with `--test-threads=1`.

use std::collections::BTreeMap;

use crate::common::{FIXTURES, load_model as load, max_abs, nll_gradients, read_reference};
use serde::Deserialize;
use tch::Tensor;
use trainer::logprobs::TrainBatch;
use trainer::model::{CausalLm, LoraConfig};
use trainer::train_step::TrainerConfig;

#[derive(Debug, Deserialize)]
struct Reference {
    prompts: Vec<Vec<i64>>,
}

/// The fixture's prompts right-padded with token 0; every real token after the first is scored.
fn batch(name: &str) -> TrainBatch {
    let reference: Reference = read_reference(name);
    let width = reference.prompts.iter().map(Vec::len).max().unwrap();
    let (mut ids, mut mask) = (Vec::new(), Vec::new());
    for prompt in &reference.prompts {
        for column in 0..width {
            let real = column < prompt.len();
            ids.push(if real { prompt[column] } else { 0 });
            mask.push(i64::from(real));
        }
    }
    let shape = [reference.prompts.len() as i64, width as i64];
    let mask = Tensor::from_slice(&mask).reshape(shape);
    TrainBatch {
        input_ids: Tensor::from_slice(&ids).reshape(shape),
        completion_mask: mask.copy(),
        allowed: None,
        attention_mask: Some(mask),
    }
}

/// Every trainable variable's gradient after one backward of the mean NLL, dropout drawn from
/// `seed`.
fn gradients(
    model: &CausalLm,
    batch: &TrainBatch,
    checkpoint: bool,
    seed: i64,
) -> BTreeMap<String, Tensor> {
    tch::manual_seed(seed);
    let config = TrainerConfig {
        chunk_tokens: 5,
        gradient_checkpointing: checkpoint,
        ..TrainerConfig::default()
    };
    nll_gradients(model, batch, &config)
}

#[test]
fn gradient_checkpointing_gives_the_same_gradients() {
    for name in FIXTURES {
        // LoRA with dropout (the recomputed layers must draw the same masks), then every weight.
        let mut lora = load(name);
        lora.attach_lora(&LoraConfig {
            r: 4,
            alpha: 8.0,
            dropout: 0.3,
            ..LoraConfig::default()
        })
        .unwrap();
        tch::no_grad(|| {
            for (variable, mut tensor) in lora.var_store().variables() {
                if variable.ends_with(".lora_B.weight") {
                    tensor.copy_(&(Tensor::randn_like(&tensor) * 0.1));
                }
            }
        });
        let full = load(name);
        full.set_base_trainable(true);
        for (label, model) in [("lora", &lora), ("full", &full)] {
            let batch = batch(name);
            let plain = gradients(model, &batch, false, 3);
            let checkpointed = gradients(model, &batch, true, 3);
            assert_eq!(plain.len(), checkpointed.len());
            assert!(!plain.is_empty());
            for (variable, expected) in &plain {
                let got = &checkpointed[variable];
                let scale = expected.abs().max().double_value(&[]).max(1e-12);
                let diff = max_abs(expected, got);
                assert!(
                    diff <= 1e-5 * scale,
                    "{name} {label}: {variable} differs by {diff} (max |grad| {scale})"
                );
            }
            // Dropout is live: another seed gives other LoRA gradients.
            if label == "lora" {
                let other = gradients(model, &batch, true, 4);
                assert!(
                    plain.iter().any(|(v, g)| !g.equal(&other[v])),
                    "{name}: dropout inactive"
                );
            }
        }
    }
}
