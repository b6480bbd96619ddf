//! A LoRA adapter trained here, saved with `peft::save_adapter`, gives the same logits in Hugging
//! Face PEFT (scripts/reference/peft_logits.py) as in our model, for both fixtures, unmerged and
//! merged (`merge_and_unload()` against `peft::merge_adapters` with the adapters switched off).

use std::path::Path;
use std::process::Command;

use crate::common::{FIXTURES, fixture_dir, load_model, repo_root, venv_python};
use serde::Deserialize;
use tch::{Kind, Tensor};
use trainer::logprobs::TrainBatch;
use trainer::model::{CausalLm, LORA_TARGETS, Logits, LoraConfig};
use trainer::peft::{AdapterConfig, merge_adapters, save_adapter};
use trainer::train_step::{Trainer, TrainerConfig};

const RANK: i64 = 4;
const ALPHA: f64 = 8.0;
const STEPS: usize = 5;
/// fp32 on CPU on both sides: only float rounding may differ.
const TOLERANCE: f64 = 1e-4;

#[derive(Debug, Deserialize)]
struct Reference {
    prompts: Vec<Vec<i64>>,
}

#[derive(Debug, Deserialize)]
struct PeftReport {
    /// One per job, in order.
    results: Vec<PeftLogits>,
}

#[derive(Debug, Deserialize)]
struct PeftLogits {
    /// Per prompt, `[len, vocab]` with the adapter applied by PEFT.
    adapter: Vec<Vec<Vec<f32>>>,
    /// The same after `merge_and_unload()`.
    merged: Vec<Vec<Vec<f32>>>,
    /// LoRA modules PEFT created.
    modules: usize,
}

/// Runs peft_logits.py with the project's virtualenv; a missing venv or package is a failure,
/// not a skip, so CI cannot pass without the cross-check having run.
fn peft_logits(jobs: &Path, out: &Path) -> Vec<PeftLogits> {
    let python = venv_python();
    let script = repo_root().join("scripts/reference/peft_logits.py");
    let output = Command::new(&python)
        .arg(&script)
        .args([jobs, out])
        .env("HF_HUB_OFFLINE", "1")
        .env("TRANSFORMERS_VERBOSITY", "error")
        .output()
        .unwrap_or_else(|error| panic!("cannot run {}: {error}", python.display()));
    assert!(
        output.status.success(),
        "{} failed ({}); if peft or transformers is missing, run scripts/setup.sh\nstdout:\n{}\nstderr:\n{}",
        script.display(),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    let report: PeftReport = serde_json::from_str(&std::fs::read_to_string(out).unwrap()).unwrap();
    report.results
}

fn as_tensor(rows: &[Vec<f32>]) -> Tensor {
    let flat: Vec<f32> = rows.iter().flatten().copied().collect();
    Tensor::from_slice(&flat).reshape([rows.len() as i64, -1])
}

/// Every prompt's logits `[len, vocab]`, each prompt alone.
fn our_logits(model: &CausalLm, prompts: &[Vec<i64>]) -> Vec<Tensor> {
    prompts
        .iter()
        .map(|prompt| {
            let ids = Tensor::from_slice(prompt).unsqueeze(0);
            tch::no_grad(|| model.forward(&ids, None, None, Logits::All))
                .unwrap()
                .squeeze_dim(0)
        })
        .collect()
}

fn max_diff(ours: &[Tensor], theirs: &[Vec<Vec<f32>>]) -> f64 {
    assert_eq!(ours.len(), theirs.len());
    ours.iter()
        .zip(theirs)
        .map(|(ours, theirs)| {
            let theirs = as_tensor(theirs);
            assert_eq!(ours.size(), theirs.size());
            (ours - theirs).abs().max().double_value(&[])
        })
        .fold(0.0, f64::max)
}

/// The prompts right-padded into one batch; every real token after the first is a target.
fn training_batch(prompts: &[Vec<i64>]) -> TrainBatch {
    let width = prompts.iter().map(Vec::len).max().unwrap();
    let (mut ids, mut mask) = (Vec::new(), Vec::new());
    for prompt in prompts {
        for column in 0..width {
            ids.push(prompt.get(column).copied().unwrap_or(0));
            mask.push(i64::from(column < prompt.len()));
        }
    }
    let shape = [prompts.len() as i64, width as i64];
    let mask = Tensor::from_slice(&mask).reshape(shape);
    TrainBatch {
        input_ids: Tensor::from_slice(&ids).reshape(shape),
        attention_mask: Some(mask.shallow_clone()),
        completion_mask: mask,
        allowed: None,
    }
}

/// Our side of one fixture's comparison.
#[derive(Debug)]
struct Ours {
    name: &'static str,
    layers: usize,
    /// Adapters on, unmerged.
    adapted: Vec<Tensor>,
    /// Adapters off: the base model.
    base: Vec<Tensor>,
    /// Adapters merged into the weights by `peft::merge_adapters`, then switched off.
    merged: Vec<Tensor>,
}

/// Trains an adapter on the fixture's prompts, saves it to `adapter_dir` and records our logits.
fn train_and_save(name: &'static str, prompts: &[Vec<i64>], adapter_dir: &Path) -> Ours {
    let dir = fixture_dir(name);
    let mut model = load_model(name);
    // Reproducible lora_A initialisation (this binary's only test, so no other thread draws).
    tch::manual_seed(0);
    model
        .attach_lora(&LoraConfig {
            r: RANK,
            alpha: ALPHA,
            dropout: 0.0,
            ..LoraConfig::default()
        })
        .unwrap();

    let config = TrainerConfig {
        learning_rate: 1e-2,
        ..TrainerConfig::default()
    };
    let mut trainer = Trainer::new(&model, config).unwrap();
    let batch = training_batch(prompts);
    let losses: Vec<f64> = (0..STEPS)
        .map(|_| trainer.supervised_step(&model, &batch).unwrap().loss)
        .collect();
    println!("{name}: losses {losses:?}");
    assert!(
        losses[STEPS - 1] < losses[0] - 0.1,
        "{name}: loss did not decrease: {losses:?}"
    );
    let largest_b = model
        .var_store()
        .variables()
        .iter()
        .filter(|(variable, _)| variable.ends_with(".lora_B.weight"))
        .map(|(_, tensor)| tensor.abs().max().double_value(&[]))
        .fold(0.0, f64::max);
    assert!(
        largest_b > 1e-2,
        "{name}: lora_B barely trained ({largest_b})"
    );

    let mut adapter_config = AdapterConfig::new(RANK, ALPHA, &LORA_TARGETS);
    adapter_config.base_model_name_or_path = Some(dir.display().to_string());
    save_adapter(model.var_store(), &adapter_config, adapter_dir).unwrap();

    let adapted = our_logits(&model, prompts);
    model.adapters().set_enabled(false);
    let base = our_logits(&model, prompts);
    merge_adapters(model.var_store(), &adapter_config).unwrap();
    let merged = our_logits(&model, prompts);
    Ours {
        name,
        layers: model.config().num_hidden_layers as usize,
        adapted,
        base,
        merged,
    }
}

#[test]
fn trained_adapter_gives_our_logits_in_peft_unmerged_and_merged() {
    let work = tempfile::tempdir().unwrap();
    let mut ours = Vec::new();
    let mut jobs = Vec::new();
    for name in FIXTURES {
        let dir = fixture_dir(name);
        let text = std::fs::read_to_string(dir.join("reference.json")).unwrap();
        let prompts = serde_json::from_str::<Reference>(&text).unwrap().prompts;
        let adapter_dir = work.path().join(format!("{name}-adapter"));
        ours.push(train_and_save(name, &prompts, &adapter_dir));
        jobs.push(serde_json::json!({ "base": dir, "adapter": adapter_dir, "prompts": prompts }));
    }
    let jobs_path = work.path().join("jobs.json");
    std::fs::write(&jobs_path, serde_json::Value::from(jobs).to_string()).unwrap();
    let theirs = peft_logits(&jobs_path, &work.path().join("peft-logits.json"));
    assert_eq!(theirs.len(), ours.len());

    for (ours, theirs) in ours.iter().zip(&theirs) {
        let name = ours.name;
        assert_eq!(theirs.modules, LORA_TARGETS.len() * ours.layers, "{name}");
        let adapter_diff = max_diff(&ours.adapted, &theirs.adapter);
        let merged_diff = max_diff(&ours.merged, &theirs.merged);
        // The trained adapter must matter on both sides, or equal logits would prove nothing.
        let our_effect = max_diff(&ours.base, &theirs.adapter);
        let their_effect = max_diff(&ours.base, &theirs.merged);
        println!(
            "{name}: max |ours - PEFT| adapter {adapter_diff:e}, merged {merged_diff:e}; the adapter moves logits by up to {our_effect:.3} (PEFT merged: {their_effect:.3})"
        );
        assert!(
            our_effect > 0.1 && their_effect > 0.1,
            "{name}: adapter has no effect"
        );
        assert!(
            adapter_diff < TOLERANCE,
            "{name}: adapter logits differ by {adapter_diff}"
        );
        assert!(
            merged_diff < TOLERANCE,
            "{name}: merged logits differ by {merged_diff}"
        );
        assert_eq!(ours.adapted[0].kind(), Kind::Float);
    }
}
