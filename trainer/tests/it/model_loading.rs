//! Checkpoint loading failures name the file, tensor and field at fault; dtype conversion on load.

use std::path::Path;

use crate::common::{cpu, fixture_dir};
use tch::{Kind, Tensor};
use trainer::model::{CausalLm, ModelError};

/// A writable copy of a fixture checkpoint.
fn copy_fixture(name: &str) -> tempfile::TempDir {
    let copy = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixture_dir(name)).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), copy.path().join(entry.file_name())).unwrap();
    }
    copy
}

fn load_error(dir: &Path) -> String {
    match CausalLm::from_pretrained(dir, cpu()) {
        Ok(_) => panic!("loading {} should fail", dir.display()),
        Err(error) => error.to_string(),
    }
}

/// Rewrites `file` with `edit` applied to its tensors.
fn rewrite_safetensors(file: &Path, edit: impl FnOnce(&mut Vec<(String, Tensor)>)) {
    let mut tensors = Tensor::read_safetensors(file).unwrap();
    edit(&mut tensors);
    Tensor::write_safetensors(&tensors, file).unwrap();
}

#[test]
fn fixtures_load_every_declared_tensor() {
    let (model, report) = CausalLm::from_pretrained(&fixture_dir("tiny-qwen2"), cpu()).unwrap();
    assert_eq!(report.files.len(), 2, "the qwen2 fixture is sharded");
    assert_eq!(report.loaded, model.var_store().variables().len());
    let (_, report) = CausalLm::from_pretrained(&fixture_dir("tiny-llama"), cpu()).unwrap();
    assert_eq!(report.files.len(), 1);
}

#[test]
fn deleted_shard_is_named() {
    let dir = copy_fixture("tiny-qwen2");
    std::fs::remove_file(dir.path().join("model-00002-of-00002.safetensors")).unwrap();
    let message = load_error(dir.path());
    assert!(
        message.contains("model-00002-of-00002.safetensors")
            && message.contains("model.safetensors.index.json"),
        "{message}"
    );
}

#[test]
fn wrong_shape_names_tensor_file_and_both_shapes() {
    let dir = copy_fixture("tiny-llama");
    let file = dir.path().join("model.safetensors");
    rewrite_safetensors(&file, |tensors| {
        for (name, tensor) in tensors.iter_mut() {
            if name == "model.layers.1.mlp.up_proj.weight" {
                *tensor = tensor.narrow(0, 0, 95);
            }
        }
    });
    let message = load_error(dir.path());
    for part in [
        "model.layers.1.mlp.up_proj.weight",
        "model.safetensors",
        "[95, 64]",
        "[96, 64]",
    ] {
        assert!(message.contains(part), "{part:?} not in {message}");
    }
}

#[test]
fn unsupported_architecture_names_config_json() {
    let dir = copy_fixture("tiny-qwen2");
    let path = dir.path().join("config.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut config: serde_json::Value = serde_json::from_str(&text).unwrap();
    config["model_type"] = serde_json::json!("gpt2");
    std::fs::write(&path, config.to_string()).unwrap();
    let message = load_error(dir.path());
    assert!(
        message.contains("config.json")
            && message.contains("unsupported architecture")
            && message.contains("gpt2"),
        "{message}"
    );
}

#[test]
fn missing_config_and_missing_weights_are_named() {
    let dir = copy_fixture("tiny-llama");
    std::fs::remove_file(dir.path().join("config.json")).unwrap();
    assert!(load_error(dir.path()).contains("config.json"));

    let dir = copy_fixture("tiny-llama");
    std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    assert!(load_error(dir.path()).contains("model.safetensors"));
}

#[test]
fn missing_and_unexpected_tensors_are_named() {
    let dir = copy_fixture("tiny-llama");
    let file = dir.path().join("model.safetensors");
    rewrite_safetensors(&file, |tensors| {
        tensors.retain(|(name, _)| name != "model.norm.weight");
    });
    let message = load_error(dir.path());
    assert!(
        message.contains("model.norm.weight") && message.contains("missing"),
        "{message}"
    );

    let dir = copy_fixture("tiny-llama");
    let file = dir.path().join("model.safetensors");
    rewrite_safetensors(&file, |tensors| {
        tensors.push((
            "model.layers.0.self_attn.o_proj.bias".into(),
            Tensor::zeros([64], (Kind::Float, tch::Device::Cpu)),
        ));
        // transformers' own rotary buffer is tolerated.
        tensors.push((
            "model.layers.0.self_attn.rotary_emb.inv_freq".into(),
            Tensor::zeros([16], (Kind::Float, tch::Device::Cpu)),
        ));
    });
    let message = load_error(dir.path());
    assert!(
        message.contains("model.layers.0.self_attn.o_proj.bias") && !message.contains("inv_freq"),
        "{message}"
    );
}

#[test]
fn unsupported_dtype_is_named() {
    let dir = copy_fixture("tiny-llama");
    let file = dir.path().join("model.safetensors");
    rewrite_safetensors(&file, |tensors| {
        for (name, tensor) in tensors.iter_mut() {
            if name == "model.embed_tokens.weight" {
                *tensor = tensor.to_kind(Kind::Double);
            }
        }
    });
    let message = load_error(dir.path());
    assert!(
        message.contains("model.embed_tokens.weight") && message.contains("F64"),
        "{message}"
    );
}

#[test]
fn bf16_checkpoint_converts_to_runtime_kind() {
    let dir = copy_fixture("tiny-llama");
    let file = dir.path().join("model.safetensors");
    let original = Tensor::read_safetensors(&file).unwrap();
    rewrite_safetensors(&file, |tensors| {
        for (_, tensor) in tensors.iter_mut() {
            *tensor = tensor.to_kind(Kind::BFloat16);
        }
    });
    let (model, _) = CausalLm::from_pretrained(dir.path(), cpu()).unwrap();
    let variables = model.var_store().variables();
    for (name, tensor) in &original {
        let loaded = &variables[name];
        assert_eq!(loaded.kind(), Kind::Float, "{name}");
        let rounded = tensor.to_kind(Kind::BFloat16).to_kind(Kind::Float);
        assert!(loaded.equal(&rounded), "{name} not the bf16 value widened");
    }
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    let (model, _) = CausalLm::from_pretrained(&fixture_dir("tiny-llama"), cpu()).unwrap();
    let out_of_vocab = Tensor::from_slice(&[1i64, 256]).unsqueeze(0);
    let error = model
        .forward(&out_of_vocab, None, None, trainer::model::Logits::All)
        .unwrap_err();
    assert!(matches!(error, ModelError::Input(_)), "{error}");
    let wrong_kind = Tensor::from_slice(&[1i32, 2]).unsqueeze(0);
    assert!(
        model
            .forward(&wrong_kind, None, None, trainer::model::Logits::All)
            .is_err()
    );
    let ids = Tensor::from_slice(&[1i64, 2]).unsqueeze(0);
    let wrong_mask = Tensor::from_slice(&[1i64, 1, 1]).unsqueeze(0);
    assert!(
        model
            .forward(&ids, Some(&wrong_mask), None, trainer::model::Logits::All)
            .is_err()
    );
}
