//! What the trainer's integration tests share: the reference fixtures (`tests/fixtures/*`, tiny
//! checkpoints written by transformers with the `reference.json` it computed), loading them on
//! the CPU, and comparing tensors.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use tch::Tensor;
use trainer::device::{DeviceRequest, Runtime};
use trainer::logprobs::TrainBatch;
use trainer::model::CausalLm;
use trainer::train_step::{Measure, TrainerConfig, accumulate_gradients, masked_mean_nll};

/// Both architectures the loader supports, as transformers wrote them.
pub const FIXTURES: [&str; 2] = ["tiny-qwen2", "tiny-llama"];

pub fn fixture_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

pub fn cpu() -> Runtime {
    Runtime::select(DeviceRequest::Cpu).unwrap()
}

/// The fixture checkpoint `name` on the CPU.
pub fn load_model(name: &str) -> CausalLm {
    CausalLm::from_pretrained(&fixture_dir(name), cpu())
        .unwrap()
        .0
}

/// The fixture's `reference.json`, read into whichever part of it a test needs.
pub fn read_reference<R: DeserializeOwned>(name: &str) -> R {
    let text = std::fs::read_to_string(fixture_dir(name).join("reference.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The largest absolute elementwise difference.
pub fn max_abs(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).abs().max().double_value(&[])
}

/// Every trainable variable's gradient after one backward of the mean NLL of `batch` under
/// `config` (earlier gradients cleared first, nothing drawn from libtorch's generator before the
/// forward, so a seed set just before the call decides the dropout masks).
pub fn nll_gradients(
    model: &CausalLm,
    batch: &TrainBatch,
    config: &TrainerConfig,
) -> BTreeMap<String, Tensor> {
    for (_, tensor) in model.var_store().variables() {
        let mut grad = tensor.grad();
        if grad.defined() {
            let _ = grad.zero_();
        }
    }
    accumulate_gradients(model, batch, config, Measure::LossOnly, masked_mean_nll).unwrap();
    model
        .var_store()
        .variables()
        .into_iter()
        .filter(|(_, tensor)| tensor.requires_grad())
        .map(|(name, tensor)| (name, tensor.grad().copy()))
        .collect()
}

/// The repository's root (the trainer crate's parent).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The project's virtualenv Python (`scripts/setup.sh` makes it, with torch, transformers and
/// peft); a missing one is a failure, not a skip, so CI cannot pass without the cross-checks.
pub fn venv_python() -> PathBuf {
    let python = repo_root().join(".venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/setup.sh to create .venv with torch, transformers and peft",
        python.display()
    );
    python
}
