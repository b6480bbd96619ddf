//! Cross-check of `trainer::peft` against Hugging Face PEFT itself (scripts/reference/peft_roundtrip.py):
//! an adapter PEFT saved loads into our VarStore with every value equal, and an adapter plus a
//! merged checkpoint we save load in PEFT / transformers with every value (and the logits) equal.

use crate::common::{repo_root, venv_python};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use serde_json::Value;
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};
use trainer::peft::{AdapterConfig, load_adapter, save_adapter, save_merged_checkpoint};

use trainer::model::LORA_TARGETS as TARGETS;
const RANK: i64 = 4;
const ALPHA: f64 = 8.0;

/// Runs the reference script with the project's virtualenv; a missing venv or package is a
/// failure, not a skip, so CI cannot pass without the cross-check having run.
fn run_reference(args: &[&Path]) {
    let python = venv_python();
    let script = repo_root().join("scripts/reference/peft_roundtrip.py");
    let output = Command::new(&python)
        .arg(&script)
        .args(args)
        // The reference must not try the network (there is no Hugging Face Hub here).
        .env("HF_HUB_OFFLINE", "1")
        .env("TRANSFORMERS_VERBOSITY", "error")
        .output()
        .unwrap_or_else(|error| panic!("cannot run {}: {error}", python.display()));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{} {args:?} failed ({}); if peft or transformers is missing, run scripts/setup.sh\nstdout:\n{stdout}\nstderr:\n{stderr}",
        script.display(),
        output.status
    );
}

/// The base checkpoint's tensors under their own names, plus random LoRA variables of rank `RANK`
/// next to every targeted projection (random so that a load that skips a tensor shows).
fn store_for(base_dir: &Path) -> VarStore {
    let vs = VarStore::new(Device::Cpu);
    let tensors = Tensor::read_safetensors(base_dir.join("model.safetensors")).unwrap();
    for (name, tensor) in &tensors {
        let mut parts: Vec<&str> = name.split('.').collect();
        let leaf = parts.pop().unwrap();
        let path = parts.iter().fold(vs.root(), |path, part| path / *part);
        let _ = path.var_copy(leaf, tensor);
        let module = &parts[..];
        if leaf == "weight" && TARGETS.contains(module.last().unwrap()) {
            let shape = tensor.size();
            let random = tch::nn::Init::Randn {
                mean: 0.0,
                stdev: 1.0,
            };
            let _ = (&path / "lora_A").var("weight", &[RANK, shape[1]], random);
            let _ = (&path / "lora_B").var("weight", &[shape[0], RANK], random);
        }
    }
    vs
}

/// `{module: {"lora_A"|"lora_B": {"shape", "values"}}}`, the script's JSON form.
fn lora_values(vs: &VarStore) -> Value {
    let mut modules: BTreeMap<String, BTreeMap<String, Value>> = BTreeMap::new();
    for (name, tensor) in vs.variables() {
        for which in ["lora_A", "lora_B"] {
            if let Some(module) = name.strip_suffix(&format!(".{which}.weight")) {
                let flat: Vec<f32> = Vec::try_from(tensor.flatten(0, -1)).unwrap();
                let entry = serde_json::json!({ "shape": tensor.size(), "values": flat });
                modules
                    .entry(module.to_owned())
                    .or_default()
                    .insert(which.to_owned(), entry);
            }
        }
    }
    serde_json::to_value(modules).unwrap()
}

fn tensor_from_json(spec: &Value) -> Tensor {
    let shape: Vec<i64> = serde_json::from_value(spec["shape"].clone()).unwrap();
    let values: Vec<f32> = serde_json::from_value(spec["values"].clone()).unwrap();
    Tensor::from_slice(&values).reshape(shape)
}

#[test]
fn adapters_and_merged_checkpoints_round_trip_through_real_peft() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    run_reference(&[Path::new("make"), root]);

    // (b) PEFT's save_pretrained output loads into our VarStore, every value equal.
    let vs = store_for(&root.join("base"));
    let config = load_adapter(&vs, &root.join("peft_adapter")).unwrap();
    assert_eq!((config.r, config.lora_alpha), (RANK, ALPHA));
    let expected: BTreeMap<String, Value> =
        serde_json::from_str(&std::fs::read_to_string(root.join("peft_values.json")).unwrap())
            .unwrap();
    assert_eq!(
        expected.len(),
        2 * TARGETS.len(),
        "two layers of seven projections"
    );
    let variables = vs.variables();
    for (module, pair) in &expected {
        for which in ["lora_A", "lora_B"] {
            let want = tensor_from_json(&pair[which]);
            let got = &variables[&format!("{module}.{which}.weight")];
            assert!(got.equal(&want), "{module}.{which} differs from PEFT's");
        }
    }

    // (c) Ours, with fresh random values, loads in PEFT; our merge equals merge_and_unload().
    tch::no_grad(|| {
        for (name, mut tensor) in vs.variables() {
            if name.contains(".lora_") {
                tensor.copy_(&(Tensor::randn_like(&tensor) * 0.1));
            }
        }
    });
    let mut ours = AdapterConfig::new(RANK, ALPHA, &TARGETS);
    ours.base_model_name_or_path = Some(root.join("base").display().to_string());
    let adapter = root.join("rust_adapter");
    save_adapter(&vs, &ours, &adapter).unwrap();
    let values = root.join("rust_values.json");
    std::fs::write(&values, lora_values(&vs).to_string()).unwrap();
    let merged = root.join("rust_merged");
    // 64 KiB shards: the tiny model spans several, so the sharded index is what transformers reads.
    save_merged_checkpoint(&vs, &ours, &root.join("base"), &merged, 64 << 10).unwrap();
    assert!(merged.join("model.safetensors.index.json").exists());
    assert!(vs.variables().values().all(|t| t.kind() == Kind::Float));
    run_reference(&[Path::new("check"), root, &adapter, &values, &merged]);
}
