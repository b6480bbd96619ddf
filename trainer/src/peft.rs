//! Hugging Face PEFT's LoRA adapter format over a [`VarStore`]: save, load, merge into the base
//! weights (and back), and export a merged checkpoint that vLLM serves without PEFT.
//!
//! Everything here works on variable NAMES only (the agreed convention): a LoRA-adapted module
//! `<module>` (e.g. `model.layers.0.self_attn.q_proj`) has the base weight `<module>.weight`
//! `[out, in]` and the adapters `<module>.lora_A.weight` `[r, in]` and `<module>.lora_B.weight`
//! `[out, r]`; PEFT stores them as `base_model.model.<module>.lora_{A,B}.weight`. So this module
//! needs no model code, and any model that follows the naming works with it.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, SafeTensorError, SafeTensors, View};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tch::nn::VarStore;
use tch::{Device, Kind, TchError, Tensor};

/// The adapter's configuration file inside an adapter directory.
pub const ADAPTER_CONFIG_FILE: &str = "adapter_config.json";
/// The adapter's weights inside an adapter directory.
pub const ADAPTER_WEIGHTS_FILE: &str = "adapter_model.safetensors";
/// A merged checkpoint that fits in one shard.
pub const MERGED_WEIGHTS_FILE: &str = "model.safetensors";
/// The index of a sharded merged checkpoint (Hugging Face's name, which vLLM looks for).
pub const MERGED_INDEX_FILE: &str = "model.safetensors.index.json";
/// Shard size of merged checkpoints unless told otherwise: 5 GB, the size checkpoints on the
/// Hugging Face Hub are customarily split at (transformers 4's default; transformers 5 writes up to
/// 50 GB per file). Smaller files load in parallel and resume better when copied.
pub const DEFAULT_MAX_SHARD_BYTES: u64 = 5_000_000_000;

/// PEFT wraps the model twice (`PeftModel.base_model` is a `LoraModel` whose `.model` is ours).
const PEFT_KEY_PREFIX: &str = "base_model.model.";
const LORA_A: &str = "lora_A";
const LORA_B: &str = "lora_B";
/// The version whose defaults [`AdapterConfig::new`] writes.
const PEFT_VERSION: &str = "0.21.2";

/// Why an adapter or checkpoint could not be read, written or merged.
#[derive(Debug, thiserror::Error)]
pub enum PeftError {
    /// Reading or writing a file or directory failed.
    #[error("{}: {source}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// `adapter_config.json` is not valid JSON or lacks a required field.
    #[error("{}: not a PEFT adapter config: {source}", .path.display())]
    ConfigJson {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// The config asks for something this implementation does not do (DoRA, rank patterns, …).
    #[error("{}: unsupported `{field}` = {value}: {reason}", .path.display())]
    UnsupportedConfig {
        path: PathBuf,
        field: String,
        value: String,
        reason: &'static str,
    },
    /// `target_modules` is a regular expression Rust's `regex` cannot compile (look-around,
    /// back-references).
    #[error("{}: cannot interpret target_modules regex {pattern:?}: {source}", .path.display())]
    TargetRegex {
        path: PathBuf,
        pattern: String,
        #[source]
        source: Box<regex::Error>,
    },
    /// A safetensors file is malformed or could not be written.
    #[error("{}: safetensors: {source}", .path.display())]
    SafeTensors {
        path: PathBuf,
        #[source]
        source: SafeTensorError,
    },
    /// A key in the adapter file is not a LoRA A/B weight.
    #[error(
        "{}: key {key:?} is not a LoRA weight (expected base_model.model.<module>.lora_A.weight or .lora_B.weight, optionally with the adapter name before .weight)",
        .path.display()
    )]
    UnexpectedKey { path: PathBuf, key: String },
    /// Two keys of the adapter file name the same tensor (e.g. with and without adapter name).
    #[error("{}: keys {first:?} and {second:?} both hold {variable}", .path.display())]
    DuplicateKey {
        path: PathBuf,
        first: String,
        second: String,
        variable: String,
    },
    /// A tensor's dtype has no libtorch equivalent, or is not a floating type.
    #[error("{}: tensor {key}: unsupported dtype {dtype}", .path.display())]
    UnsupportedDtype {
        path: PathBuf,
        key: String,
        dtype: String,
    },
    /// A tensor of the file does not have the shape of the model's variable.
    #[error(
        "{}: tensor {key} has shape {file_shape:?} but the model's {variable} has shape {model_shape:?}",
        .path.display()
    )]
    ShapeMismatch {
        path: PathBuf,
        key: String,
        variable: String,
        file_shape: Vec<i64>,
        model_shape: Vec<i64>,
    },
    /// The adapter file adapts a module the model has no LoRA variables for.
    #[error("{}: tensor {key}: the model has no LoRA variable {variable}", .path.display())]
    UnknownModule {
        path: PathBuf,
        key: String,
        variable: String,
    },
    /// A LoRA variable of the model has no tensor in the adapter file.
    #[error("{}: no tensor for the model's LoRA variable {variable} (expected key {key})", .path.display())]
    MissingTensor {
        path: PathBuf,
        key: String,
        variable: String,
    },
    /// A LoRA tensor's rank differs from the config's `r`.
    #[error("{}: {tensor} has rank {found} but the adapter config says r = {expected}", .path.display())]
    RankMismatch {
        path: PathBuf,
        tensor: String,
        found: i64,
        expected: i64,
    },
    /// A module with LoRA weights is not selected by the config's `target_modules`.
    #[error("{}: module {module} has LoRA weights but target_modules {targets} does not select it", .path.display())]
    NotTargeted {
        path: PathBuf,
        module: String,
        targets: String,
    },
    /// A `target_modules` entry selects no module that has LoRA weights.
    #[error("{}: target_modules entry {target:?} matches no module with LoRA weights", .path.display())]
    TargetWithoutModule { path: PathBuf, target: String },
    /// The VarStore has no `*.lora_A.weight` / `*.lora_B.weight` variables at all.
    #[error("the model has no LoRA variables (*.lora_A.weight / *.lora_B.weight)")]
    NoLoraVariables,
    /// A module has one of lora_A / lora_B but not the other.
    #[error("the model's variable {present} has no partner {absent}")]
    IncompletePair { present: String, absent: String },
    /// A module's lora_A, lora_B and (for merging) base weight have inconsistent shapes.
    #[error(
        "module {module}: inconsistent shapes lora_A {lora_a:?}, lora_B {lora_b:?}, base weight {base:?} (expected [r, in], [out, r], [out, in])"
    )]
    InconsistentShapes {
        module: String,
        lora_a: Vec<i64>,
        lora_b: Vec<i64>,
        base: Option<Vec<i64>>,
    },
    /// Merging needs the adapted module's base weight `<module>.weight`.
    #[error("module {module}: no base weight variable {module}.weight to merge into")]
    MissingBaseWeight { module: String },
    /// The merged checkpoint's source directory has no `config.json`.
    #[error("{}: missing; a merged checkpoint needs the base model's config.json", .path.display())]
    MissingModelConfig { path: PathBuf },
    /// The merged checkpoint's destination already holds files.
    #[error("{}: not empty; refusing to mix a merged checkpoint with existing files", .path.display())]
    DestinationNotEmpty { path: PathBuf },
    /// A libtorch operation on a named tensor failed.
    #[error("tensor {name}: {source}")]
    Torch {
        name: String,
        #[source]
        source: TchError,
    },
}

/// Dtype of the tensors [`save_adapter_as`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SaveDtype {
    /// Whatever dtype the VarStore's LoRA variables have.
    #[default]
    AsVariables,
    /// 32-bit float.
    F32,
    /// bfloat16.
    Bf16,
}

/// PEFT's `target_modules`: a list of module-name suffixes, or one regular expression that must
/// match the whole module name (or the special value `all-linear`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TargetModules {
    /// A module is targeted when its name equals an entry or ends with `.` + entry.
    List(Vec<String>),
    /// `re.fullmatch(pattern, module_name)`, or `all-linear` (every linear layer but `lm_head`).
    Pattern(String),
}

/// `adapter_config.json` for LoRA, as PEFT 0.21 writes it. The fields this crate interprets are
/// typed; every other field PEFT writes lives in [`AdapterConfig::other`] so files from newer
/// PEFT versions load and round-trip. Fields that switch on LoRA variants we do not implement
/// (DoRA, rank patterns, `modules_to_save`, …) are rejected by validation rather than ignored,
/// because ignoring them would silently compute a different model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdapterConfig {
    /// Must be `LORA`.
    pub peft_type: String,
    /// `CAUSAL_LM` (or absent).
    #[serde(default)]
    pub task_type: Option<String>,
    /// The LoRA rank.
    pub r: i64,
    /// Scaling numerator: the adapter's output is multiplied by `lora_alpha / r`.
    pub lora_alpha: f64,
    /// Dropout probability on the adapter's input during training.
    #[serde(default)]
    pub lora_dropout: f64,
    /// Which modules carry adapters. PEFT resolves `None` to per-architecture defaults when it
    /// creates a model, and always saves the resolved value, so `None` in a file is rejected.
    pub target_modules: Option<TargetModules>,
    /// Must be `none`: trained biases are not part of this format's support.
    #[serde(default = "bias_none")]
    pub bias: String,
    /// Must be false: the base weights are stored `[out, in]` as in `nn.Linear`.
    #[serde(default)]
    pub fan_in_fan_out: bool,
    /// The base checkpoint the adapter was trained on, informational.
    #[serde(default)]
    pub base_model_name_or_path: Option<String>,
    /// PEFT sets this to true in saved configs; informational here.
    #[serde(default)]
    pub inference_mode: bool,
    /// Rank-stabilised LoRA: scaling is `lora_alpha / sqrt(r)` instead of `lora_alpha / r`.
    #[serde(default)]
    pub use_rslora: bool,
    /// Must be null or empty: fully trained copies of modules are not supported.
    #[serde(default)]
    pub modules_to_save: Option<Vec<String>>,
    /// How PEFT initialises fresh adapters (`true`, `false`, `"gaussian"`, …). Irrelevant for
    /// loaded values except for methods that also rewrite the base weights, which are rejected.
    #[serde(default = "init_lora_weights_default")]
    pub init_lora_weights: Value,
    /// Every other field, kept verbatim (PEFT's defaults when built with [`AdapterConfig::new`]).
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

fn bias_none() -> String {
    "none".to_owned()
}

fn init_lora_weights_default() -> Value {
    Value::Bool(true)
}

/// Fields that turn on LoRA variants or partial adaptation this crate does not implement; each
/// must be absent, null, false or empty.
const MUST_BE_OFF: &[(&str, &str)] = &[
    (
        "use_dora",
        "DoRA adds a magnitude vector this implementation does not apply",
    ),
    (
        "lora_bias",
        "a trained LoRA bias on lora_B is not supported",
    ),
    (
        "rank_pattern",
        "per-module ranks are not supported; use one r",
    ),
    (
        "alpha_pattern",
        "per-module alphas are not supported; use one lora_alpha",
    ),
    (
        "layers_to_transform",
        "adapting only some layers is not supported; use target_modules",
    ),
    (
        "exclude_modules",
        "exclude_modules is not supported; list the targets instead",
    ),
    (
        "target_parameters",
        "adapting raw parameters (not modules) is not supported",
    ),
    (
        "trainable_token_indices",
        "trainable token embeddings are not supported",
    ),
    (
        "layer_replication",
        "layer replication changes the model's depth",
    ),
    (
        "use_qalora",
        "QA-LoRA (quantization-aware pooling) is not supported",
    ),
    (
        "alora_invocation_tokens",
        "activated LoRA changes the forward pass",
    ),
    ("arrow_config", "Arrow routing changes the forward pass"),
    ("use_bdlora", "BD-LoRA changes the adapter's structure"),
    (
        "megatron_config",
        "Megatron-parallel layers are not supported",
    ),
    ("kasa_config", "KaSA changes the adapter's structure"),
    ("velora_config", "VeLoRA changes the adapter's structure"),
    (
        "monteclora_config",
        "MonteCLoRA changes the adapter's structure",
    ),
];

/// `init_lora_weights` values that leave the base weights untouched, so a saved adapter applies
/// to the original base model (PiSSA, OLoRA, CorDA and LoftQ rewrite the base weights).
const BASE_PRESERVING_INITS: &[&str] = &["gaussian", "eva", "orthogonal"];

impl AdapterConfig {
    /// A causal-LM LoRA config with PEFT 0.21's defaults for everything else (dropout 0).
    pub fn new(r: i64, lora_alpha: f64, target_modules: &[&str]) -> Self {
        let other = [
            ("alora_invocation_tokens", Value::Null),
            ("alpha_pattern", Value::Object(Default::default())),
            ("arrow_config", Value::Null),
            ("auto_mapping", Value::Null),
            ("corda_config", Value::Null),
            ("ensure_weight_tying", Value::Bool(false)),
            ("eva_config", Value::Null),
            ("exclude_modules", Value::Null),
            ("kasa_config", Value::Null),
            ("layer_replication", Value::Null),
            ("layers_pattern", Value::Null),
            ("layers_to_transform", Value::Null),
            ("loftq_config", Value::Object(Default::default())),
            ("lora_bias", Value::Bool(false)),
            ("lora_ga_config", Value::Null),
            ("megatron_config", Value::Null),
            ("megatron_core", Value::String("megatron.core".to_owned())),
            ("monteclora_config", Value::Null),
            ("peft_version", Value::String(PEFT_VERSION.to_owned())),
            ("qalora_group_size", Value::from(16)),
            ("rank_pattern", Value::Object(Default::default())),
            ("revision", Value::Null),
            ("target_parameters", Value::Null),
            ("trainable_token_indices", Value::Null),
            ("use_bdlora", Value::Null),
            ("use_dora", Value::Bool(false)),
            ("use_qalora", Value::Bool(false)),
            ("velora_config", Value::Null),
        ]
        .into_iter()
        .map(|(key, value)| (key.to_owned(), value))
        .collect();
        Self {
            peft_type: "LORA".to_owned(),
            task_type: Some("CAUSAL_LM".to_owned()),
            r,
            lora_alpha,
            lora_dropout: 0.0,
            target_modules: Some(TargetModules::List(
                target_modules.iter().map(|&t| t.to_owned()).collect(),
            )),
            bias: bias_none(),
            fan_in_fan_out: false,
            base_model_name_or_path: None,
            inference_mode: false,
            use_rslora: false,
            modules_to_save: None,
            init_lora_weights: init_lora_weights_default(),
            other,
        }
    }

    /// The factor on the adapter's output: `lora_alpha / r`, or `lora_alpha / sqrt(r)` with rsLoRA.
    pub fn scaling(&self) -> f64 {
        let r = self.r as f64;
        if self.use_rslora {
            self.lora_alpha / r.sqrt()
        } else {
            self.lora_alpha / r
        }
    }

    /// Reads `dir/adapter_config.json` (unknown fields are kept, nothing is validated yet).
    pub fn read(dir: &Path) -> Result<Self, PeftError> {
        let path = dir.join(ADAPTER_CONFIG_FILE);
        let text = fs::read_to_string(&path).map_err(|source| PeftError::Io {
            path: path.clone(),
            source,
        })?;
        serde_json::from_str(&text).map_err(|source| PeftError::ConfigJson { path, source })
    }

    /// Writes `dir/adapter_config.json` with sorted keys, as PEFT does.
    pub fn write(&self, dir: &Path) -> Result<(), PeftError> {
        let path = dir.join(ADAPTER_CONFIG_FILE);
        let json_error = |source| PeftError::ConfigJson {
            path: path.clone(),
            source,
        };
        // Through a BTreeMap so the key order is sorted whatever serde_json's map type is.
        let value = serde_json::to_value(self).map_err(json_error)?;
        let sorted: BTreeMap<String, Value> = serde_json::from_value(value).map_err(json_error)?;
        let text = serde_json::to_string_pretty(&sorted).map_err(json_error)?;
        write_file(&path, text.as_bytes())
    }

    /// Checks that the config describes plain LoRA this crate computes exactly, and compiles
    /// `target_modules`. `path` names the config file in error messages.
    fn validate(&self, path: &Path) -> Result<TargetMatcher, PeftError> {
        let unsupported = |field: &str, value: String, reason: &'static str| {
            Err(PeftError::UnsupportedConfig {
                path: path.to_owned(),
                field: field.to_owned(),
                value,
                reason,
            })
        };
        if self.peft_type != "LORA" {
            return unsupported(
                "peft_type",
                format!("{:?}", self.peft_type),
                "only LORA adapters are supported",
            );
        }
        if let Some(task) = &self.task_type
            && task != "CAUSAL_LM"
        {
            return unsupported(
                "task_type",
                format!("{task:?}"),
                "the recommender is a causal LM (CAUSAL_LM)",
            );
        }
        if self.r <= 0 {
            return unsupported("r", self.r.to_string(), "the rank must be positive");
        }
        if !self.lora_alpha.is_finite() {
            return unsupported(
                "lora_alpha",
                self.lora_alpha.to_string(),
                "lora_alpha must be finite",
            );
        }
        if !(0.0..1.0).contains(&self.lora_dropout) {
            return unsupported(
                "lora_dropout",
                self.lora_dropout.to_string(),
                "dropout must be in [0, 1)",
            );
        }
        if self.bias != "none" {
            return unsupported(
                "bias",
                format!("{:?}", self.bias),
                "only bias = \"none\" is supported",
            );
        }
        if self.fan_in_fan_out {
            return unsupported(
                "fan_in_fan_out",
                "true".to_owned(),
                "weights must be stored [out, in] (nn.Linear layout)",
            );
        }
        if self.modules_to_save.as_ref().is_some_and(|m| !m.is_empty()) {
            return unsupported(
                "modules_to_save",
                format!("{:?}", self.modules_to_save),
                "fully trained module copies are not supported",
            );
        }
        match &self.init_lora_weights {
            Value::Bool(_) => {}
            Value::String(method) if BASE_PRESERVING_INITS.contains(&method.as_str()) => {}
            other => {
                return unsupported(
                    "init_lora_weights",
                    other.to_string(),
                    "this initialisation rewrites the base weights, so the adapter does not apply to the original base model",
                );
            }
        }
        for &(field, reason) in MUST_BE_OFF {
            if let Some(value) = self.other.get(field)
                && !is_off(value)
            {
                return unsupported(field, value.to_string(), reason);
            }
        }
        TargetMatcher::new(self.target_modules.as_ref(), path)
    }
}

/// Null, false, or an empty string, list or object: PEFT's "feature not used" values.
fn is_off(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        Value::Number(_) => false,
    }
}

/// `target_modules` compiled to PEFT's matching rules (`check_target_module_exists`).
#[derive(Debug)]
enum TargetMatcher {
    Names(Vec<String>),
    Regex(regex::Regex, String),
    AllLinear,
}

impl TargetMatcher {
    fn new(targets: Option<&TargetModules>, path: &Path) -> Result<Self, PeftError> {
        match targets {
            None => Err(PeftError::UnsupportedConfig {
                path: path.to_owned(),
                field: "target_modules".to_owned(),
                value: "null".to_owned(),
                reason: "the targeted modules must be listed (PEFT saves its resolved defaults)",
            }),
            Some(TargetModules::List(names)) => Ok(Self::Names(names.clone())),
            Some(TargetModules::Pattern(pattern)) if pattern == "all-linear" => Ok(Self::AllLinear),
            Some(TargetModules::Pattern(pattern)) => {
                // Python's re.fullmatch: the whole module name must match.
                regex::Regex::new(&format!("^(?:{pattern})$"))
                    .map(|re| Self::Regex(re, pattern.clone()))
                    .map_err(|source| PeftError::TargetRegex {
                        path: path.to_owned(),
                        pattern: pattern.clone(),
                        source: Box::new(source),
                    })
            }
        }
    }

    fn matches(&self, module: &str) -> bool {
        match self {
            Self::Names(names) => names
                .iter()
                .any(|name| module == name || module.ends_with(&format!(".{name}"))),
            Self::Regex(re, _) => re.is_match(module),
            // PEFT's all-linear targets every nn.Linear except the output layer.
            Self::AllLinear => module != "lm_head" && !module.ends_with(".lm_head"),
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::Names(names) => format!("{names:?}"),
            Self::Regex(_, pattern) => format!("{pattern:?}"),
            Self::AllLinear => "\"all-linear\"".to_owned(),
        }
    }

    /// PEFT refuses a list entry that matches nothing; so do we, in both directions.
    fn check_covers(
        &self,
        modules: &BTreeMap<String, LoraPair>,
        path: &Path,
    ) -> Result<(), PeftError> {
        for module in modules.keys() {
            if !self.matches(module) {
                return Err(PeftError::NotTargeted {
                    path: path.to_owned(),
                    module: module.clone(),
                    targets: self.describe(),
                });
            }
        }
        if let Self::Names(names) = self {
            for name in names {
                let single = Self::Names(vec![name.clone()]);
                if !modules.keys().any(|module| single.matches(module)) {
                    return Err(PeftError::TargetWithoutModule {
                        path: path.to_owned(),
                        target: name.clone(),
                    });
                }
            }
        }
        Ok(())
    }
}

/// The two LoRA variables of one adapted module (shallow clones sharing the VarStore's storage).
#[derive(Debug)]
struct LoraPair {
    a: Tensor,
    b: Tensor,
}

impl LoraPair {
    fn rank(&self) -> i64 {
        self.a.size()[0]
    }
}

fn variable_name(module: &str, which: &str) -> String {
    format!("{module}.{which}.weight")
}

fn peft_key(module: &str, which: &str) -> String {
    format!("{PEFT_KEY_PREFIX}{module}.{which}.weight")
}

/// The VarStore's adapted modules, with the A/B pairing and shapes checked.
fn lora_modules(vs: &VarStore) -> Result<BTreeMap<String, LoraPair>, PeftError> {
    let variables = vs.variables();
    let a_suffix = format!(".{LORA_A}.weight");
    let b_suffix = format!(".{LORA_B}.weight");
    let mut modules = BTreeMap::new();
    for (name, a) in &variables {
        if let Some(module) = name.strip_suffix(&b_suffix)
            && !variables.contains_key(&variable_name(module, LORA_A))
        {
            return Err(PeftError::IncompletePair {
                present: name.clone(),
                absent: variable_name(module, LORA_A),
            });
        }
        let Some(module) = name.strip_suffix(&a_suffix) else {
            continue;
        };
        let b_name = variable_name(module, LORA_B);
        let Some(b) = variables.get(&b_name) else {
            return Err(PeftError::IncompletePair {
                present: name.clone(),
                absent: b_name,
            });
        };
        let (a_shape, b_shape) = (a.size(), b.size());
        if a_shape.len() != 2 || b_shape.len() != 2 || a_shape[0] != b_shape[1] {
            return Err(PeftError::InconsistentShapes {
                module: module.to_owned(),
                lora_a: a_shape,
                lora_b: b_shape,
                base: None,
            });
        }
        let pair = LoraPair {
            a: a.shallow_clone(),
            b: b.shallow_clone(),
        };
        modules.insert(module.to_owned(), pair);
    }
    if modules.is_empty() {
        return Err(PeftError::NoLoraVariables);
    }
    Ok(modules)
}

/// Every adapted module is targeted by the config, every list target is used, and the rank is `r`.
fn check_modules_against_config(
    modules: &BTreeMap<String, LoraPair>,
    config: &AdapterConfig,
    matcher: &TargetMatcher,
    path: &Path,
) -> Result<(), PeftError> {
    matcher.check_covers(modules, path)?;
    for (module, pair) in modules {
        if pair.rank() != config.r {
            return Err(PeftError::RankMismatch {
                path: path.to_owned(),
                tensor: format!("the model's {}", variable_name(module, LORA_A)),
                found: pair.rank(),
                expected: config.r,
            });
        }
    }
    Ok(())
}

/// Writes `dir/adapter_config.json` and `dir/adapter_model.safetensors` in the LoRA variables'
/// own dtype. See [`save_adapter_as`].
pub fn save_adapter(vs: &VarStore, config: &AdapterConfig, dir: &Path) -> Result<(), PeftError> {
    save_adapter_as(vs, config, dir, SaveDtype::AsVariables)
}

/// Writes every `<module>.lora_{A,B}.weight` variable as `base_model.model.<module>.lora_{A,B}.weight`
/// (safetensors metadata `{"format": "pt"}`, as PEFT writes) and the config with
/// `inference_mode = true` (as PEFT's `save_pretrained` does). The config must agree with the
/// VarStore: same rank, `target_modules` selecting every adapted module, and (for a list) every
/// entry matching at least one, as PEFT itself requires.
pub fn save_adapter_as(
    vs: &VarStore,
    config: &AdapterConfig,
    dir: &Path,
    dtype: SaveDtype,
) -> Result<(), PeftError> {
    let config_path = dir.join(ADAPTER_CONFIG_FILE);
    let matcher = config.validate(&config_path)?;
    let modules = lora_modules(vs)?;
    check_modules_against_config(&modules, config, &matcher, &config_path)?;
    fs::create_dir_all(dir).map_err(|source| PeftError::Io {
        path: dir.to_owned(),
        source,
    })?;
    let mut views = Vec::with_capacity(2 * modules.len());
    for (module, pair) in &modules {
        for (which, tensor) in [(LORA_A, &pair.a), (LORA_B, &pair.b)] {
            let kind = match dtype {
                SaveDtype::AsVariables => tensor.kind(),
                SaveDtype::F32 => Kind::Float,
                SaveDtype::Bf16 => Kind::BFloat16,
            };
            views.push((
                peft_key(module, which),
                OwnedView::from_tensor(tensor, kind, &variable_name(module, which))?,
            ));
        }
    }
    write_safetensors(&dir.join(ADAPTER_WEIGHTS_FILE), views)?;
    let mut saved = config.clone();
    saved.inference_mode = true;
    saved.write(dir)
}

/// Splits a PEFT key into (module, lora_A|lora_B), accepting an adapter name before `.weight`
/// (`…q_proj.lora_A.default.weight`) as some tools save it.
fn parse_peft_key(key: &str) -> Option<(&str, &'static str)> {
    let rest = key.strip_prefix(PEFT_KEY_PREFIX)?.strip_suffix(".weight")?;
    let (head, last) = rest.rsplit_once('.')?;
    let which_of = |segment: &str| match segment {
        LORA_A => Some(LORA_A),
        LORA_B => Some(LORA_B),
        _ => None,
    };
    let (module, which) = match which_of(last) {
        Some(which) => (head, which),
        None => {
            let (module, segment) = head.rsplit_once('.')?;
            (module, which_of(segment)?)
        }
    };
    (!module.is_empty()).then_some((module, which))
}

/// Reads `dir/adapter_config.json` and `dir/adapter_model.safetensors` into the VarStore's
/// existing LoRA variables and returns the config (for its scaling). Nothing is written into the
/// VarStore unless every check passes: every key is a LoRA weight of a module the model adapts,
/// targeted by the config, of rank `r` and the variable's shape; and every LoRA variable of the
/// model has a tensor. Values are converted to the variables' dtype and device.
pub fn load_adapter(vs: &VarStore, dir: &Path) -> Result<AdapterConfig, PeftError> {
    let config = AdapterConfig::read(dir)?;
    let config_path = dir.join(ADAPTER_CONFIG_FILE);
    let matcher = config.validate(&config_path)?;
    let modules = lora_modules(vs)?;
    check_modules_against_config(&modules, &config, &matcher, &config_path)?;

    let path = dir.join(ADAPTER_WEIGHTS_FILE);
    let bytes = fs::read(&path).map_err(|source| PeftError::Io {
        path: path.clone(),
        source,
    })?;
    let file = SafeTensors::deserialize(&bytes).map_err(|source| PeftError::SafeTensors {
        path: path.clone(),
        source,
    })?;

    // variable name → (key it came from, value): validated fully before anything is copied.
    let mut loaded: BTreeMap<String, (String, Tensor)> = BTreeMap::new();
    let mut keys: Vec<&String> = file.names();
    keys.sort();
    for key in keys {
        let unexpected = || PeftError::UnexpectedKey {
            path: path.clone(),
            key: key.clone(),
        };
        let (module, which) = parse_peft_key(key).ok_or_else(unexpected)?;
        let variable = variable_name(module, which);
        let Some(pair) = modules.get(module) else {
            return Err(PeftError::UnknownModule {
                path: path.clone(),
                key: key.clone(),
                variable,
            });
        };
        let view = file.tensor(key).map_err(|source| PeftError::SafeTensors {
            path: path.clone(),
            source,
        })?;
        let file_shape: Vec<i64> = view.shape().iter().map(|&d| d as i64).collect();
        let rank_axis = if which == LORA_A { 0 } else { 1 };
        if file_shape.len() == 2 && file_shape[rank_axis] != config.r {
            return Err(PeftError::RankMismatch {
                path: path.clone(),
                tensor: key.clone(),
                found: file_shape[rank_axis],
                expected: config.r,
            });
        }
        let target = if which == LORA_A { &pair.a } else { &pair.b };
        if file_shape != target.size() {
            return Err(PeftError::ShapeMismatch {
                path: path.clone(),
                key: key.clone(),
                variable,
                file_shape,
                model_shape: target.size(),
            });
        }
        let kind = float_kind(view.dtype()).ok_or_else(|| PeftError::UnsupportedDtype {
            path: path.clone(),
            key: key.clone(),
            dtype: format!("{:?}", view.dtype()),
        })?;
        let tensor =
            Tensor::f_from_data_size(view.data(), &file_shape, kind).map_err(|source| {
                PeftError::Torch {
                    name: key.clone(),
                    source,
                }
            })?;
        if let Some((first, _)) = loaded.insert(variable.clone(), (key.clone(), tensor)) {
            return Err(PeftError::DuplicateKey {
                path: path.clone(),
                first,
                second: key.clone(),
                variable,
            });
        }
    }
    for module in modules.keys() {
        for which in [LORA_A, LORA_B] {
            let variable = variable_name(module, which);
            if !loaded.contains_key(&variable) {
                return Err(PeftError::MissingTensor {
                    path: path.clone(),
                    key: peft_key(module, which),
                    variable,
                });
            }
        }
    }

    tch::no_grad(|| {
        for (module, pair) in &modules {
            for (which, target) in [(LORA_A, &pair.a), (LORA_B, &pair.b)] {
                let variable = variable_name(module, which);
                if let Some((key, value)) = loaded.get(&variable) {
                    let mut target = target.shallow_clone();
                    target.f_copy_(value).map_err(|source| PeftError::Torch {
                        name: key.clone(),
                        source,
                    })?;
                }
            }
        }
        Ok(())
    })?;
    Ok(config)
}

fn float_kind(dtype: Dtype) -> Option<Kind> {
    match dtype {
        Dtype::F64 => Some(Kind::Double),
        Dtype::F32 => Some(Kind::Float),
        Dtype::F16 => Some(Kind::Half),
        Dtype::BF16 => Some(Kind::BFloat16),
        _ => None,
    }
}

/// One adapted module ready to merge: its base weight and LoRA pair, shapes checked.
struct MergeTarget {
    module: String,
    weight: Tensor,
    pair: LoraPair,
}

/// Pairs every adapted module with its base weight `[out, in]`, checking shapes and the config.
fn merge_targets(vs: &VarStore, config: &AdapterConfig) -> Result<Vec<MergeTarget>, PeftError> {
    let config_path = Path::new("adapter config");
    let matcher = config.validate(config_path)?;
    let modules = lora_modules(vs)?;
    check_modules_against_config(&modules, config, &matcher, config_path)?;
    let variables = vs.variables();
    let mut targets = Vec::with_capacity(modules.len());
    for (module, pair) in modules {
        let Some(weight) = variables.get(&format!("{module}.weight")) else {
            return Err(PeftError::MissingBaseWeight { module });
        };
        let base = weight.size();
        let (a, b) = (pair.a.size(), pair.b.size());
        if base.len() != 2 || base[0] != b[0] || base[1] != a[1] {
            return Err(PeftError::InconsistentShapes {
                module,
                lora_a: a,
                lora_b: b,
                base: Some(base),
            });
        }
        targets.push(MergeTarget {
            module,
            weight: weight.shallow_clone(),
            pair,
        });
    }
    Ok(targets)
}

/// `W + sign · scaling · B @ A`, computed in f32 and rounded once to W's dtype.
fn merged_weight(target: &MergeTarget, scaling: f64, sign: f64) -> Result<Tensor, PeftError> {
    let torch_error = |source| PeftError::Torch {
        name: format!("{}.weight", target.module),
        source,
    };
    let b = target.pair.b.to_kind(Kind::Float);
    let a = target.pair.a.to_device(b.device()).to_kind(Kind::Float);
    let delta = b.f_matmul(&a).map_err(torch_error)? * (sign * scaling);
    let weight = target.weight.to_kind(Kind::Float);
    let sum = weight
        .f_add(&delta.to_device(weight.device()))
        .map_err(torch_error)?;
    Ok(sum.to_kind(target.weight.kind()))
}

fn apply_merge(vs: &VarStore, config: &AdapterConfig, sign: f64) -> Result<usize, PeftError> {
    let targets = merge_targets(vs, config)?;
    let scaling = config.scaling();
    tch::no_grad(|| {
        for target in &targets {
            let merged = merged_weight(target, scaling, sign)?;
            let mut weight = target.weight.shallow_clone();
            weight.f_copy_(&merged).map_err(|source| PeftError::Torch {
                name: format!("{}.weight", target.module),
                source,
            })?;
        }
        Ok(targets.len())
    })
}

/// Adds `scaling · B @ A` to every adapted module's base weight in place (scaling from the
/// config: `alpha / r`, or `alpha / √r` with rsLoRA) and returns how many modules were merged.
/// The product is computed in f32 and the sum rounded once to the weight's dtype.
///
/// The LoRA variables are left as they are, so a forward pass that still adds the LoRA branch
/// would count it twice: merge for export or for LoRA-free inference, and [`unmerge_adapters`]
/// to get the reference policy back.
pub fn merge_adapters(vs: &VarStore, config: &AdapterConfig) -> Result<usize, PeftError> {
    apply_merge(vs, config, 1.0)
}

/// Subtracts what [`merge_adapters`] added (with the same, unchanged LoRA values). Exact up to
/// one rounding of the weight's dtype per call: within ~1e-7 relative in f32, but in bf16 each
/// merge/unmerge cycle may move a weight by one bf16 ulp, so a bit-exact reference policy in
/// bf16 needs the weights reloaded from the checkpoint (or [`save_merged_checkpoint`], which
/// merges on the fly and never touches the VarStore).
pub fn unmerge_adapters(vs: &VarStore, config: &AdapterConfig) -> Result<usize, PeftError> {
    apply_merge(vs, config, -1.0)
}

/// Writes the base weights with the adapters merged in as a Hugging Face checkpoint that vLLM
/// (or transformers) loads without PEFT: every non-LoRA variable under its own name (which the
/// convention makes the checkpoint name), `model.safetensors`, or shards
/// `model-0000i-of-0000n.safetensors` plus `model.safetensors.index.json` when the weights exceed
/// `max_shard_bytes`; then every other file of `source_dir` (config.json, generation config,
/// tokenizer files) is copied. Merging happens per tensor while writing, so the VarStore is not
/// modified; extra device memory is one weight in f32, extra host memory one shard's bytes.
/// `out_dir` must be absent or empty.
pub fn save_merged_checkpoint(
    vs: &VarStore,
    config: &AdapterConfig,
    source_dir: &Path,
    out_dir: &Path,
    max_shard_bytes: u64,
) -> Result<(), PeftError> {
    write_checkpoint(vs, Some(config), source_dir, out_dir, max_shard_bytes)
}

/// Writes the base weights as they are (a model without adapters, e.g. after full fine-tuning) as
/// a Hugging Face checkpoint, like [`save_merged_checkpoint`] does with adapters merged in.
pub fn save_checkpoint(
    vs: &VarStore,
    source_dir: &Path,
    out_dir: &Path,
    max_shard_bytes: u64,
) -> Result<(), PeftError> {
    write_checkpoint(vs, None, source_dir, out_dir, max_shard_bytes)
}

fn write_checkpoint(
    vs: &VarStore,
    adapters: Option<&AdapterConfig>,
    source_dir: &Path,
    out_dir: &Path,
    max_shard_bytes: u64,
) -> Result<(), PeftError> {
    let model_config = source_dir.join("config.json");
    if !model_config.is_file() {
        return Err(PeftError::MissingModelConfig { path: model_config });
    }
    let targets = match adapters {
        Some(config) => merge_targets(vs, config)?,
        None => Vec::new(),
    };
    let targets: HashMap<String, &MergeTarget> = targets
        .iter()
        .map(|target| (format!("{}.weight", target.module), target))
        .collect();
    let scaling = adapters.map_or(1.0, AdapterConfig::scaling);

    prepare_empty_dir(out_dir)?;
    let lora_suffixes = [format!(".{LORA_A}.weight"), format!(".{LORA_B}.weight")];
    let mut base: Vec<(String, Tensor)> = vs
        .variables()
        .into_iter()
        .filter(|(name, _)| !lora_suffixes.iter().any(|s| name.ends_with(s.as_str())))
        .collect();
    base.sort_by_key(|(name, _)| natural_order(name));

    // Plan shards by byte size first: file names carry the shard count.
    let mut shards: Vec<Vec<usize>> = vec![Vec::new()];
    let mut shard_bytes = 0u64;
    let mut total_bytes = 0u64;
    let mut total_parameters = 0u64;
    for (index, (_, tensor)) in base.iter().enumerate() {
        let bytes = (tensor.numel() * tensor.kind().elt_size_in_bytes()) as u64;
        if shard_bytes > 0 && shard_bytes + bytes > max_shard_bytes {
            shards.push(Vec::new());
            shard_bytes = 0;
        }
        if let Some(shard) = shards.last_mut() {
            shard.push(index);
        }
        shard_bytes += bytes;
        total_bytes += bytes;
        total_parameters += tensor.numel() as u64;
    }

    let count = shards.len();
    let mut weight_map = BTreeMap::new();
    for (shard_index, shard) in shards.iter().enumerate() {
        let file_name = if count == 1 {
            MERGED_WEIGHTS_FILE.to_owned()
        } else {
            format!("model-{:05}-of-{count:05}.safetensors", shard_index + 1)
        };
        let mut views = Vec::with_capacity(shard.len());
        for &index in shard {
            let (name, tensor) = &base[index];
            let view = tch::no_grad(|| match targets.get(name) {
                Some(target) => {
                    let merged = merged_weight(target, scaling, 1.0)?;
                    OwnedView::from_tensor(&merged, merged.kind(), name)
                }
                None => OwnedView::from_tensor(tensor, tensor.kind(), name),
            })?;
            views.push((name.clone(), view));
            weight_map.insert(name.clone(), Value::String(file_name.clone()));
        }
        write_safetensors(&out_dir.join(&file_name), views)?;
    }
    if count > 1 {
        let index = serde_json::json!({
            // What transformers 5 writes: bytes (read by loaders) and the parameter count.
            "metadata": { "total_size": total_bytes, "total_parameters": total_parameters },
            "weight_map": weight_map,
        });
        let path = out_dir.join(MERGED_INDEX_FILE);
        let text =
            serde_json::to_string_pretty(&index).map_err(|source| PeftError::ConfigJson {
                path: path.clone(),
                source,
            })?;
        write_file(&path, text.as_bytes())?;
    }
    copy_non_weight_files(source_dir, out_dir)
}

/// Orders `model.layers.10` after `model.layers.9` (digit runs compare as numbers).
fn natural_order(name: &str) -> Vec<(u64, String)> {
    name.split('.')
        .map(|part| match part.parse::<u64>() {
            Ok(n) => (n, String::new()),
            Err(_) => (u64::MAX, part.to_owned()),
        })
        .collect()
}

fn prepare_empty_dir(dir: &Path) -> Result<(), PeftError> {
    let io_error = |source| PeftError::Io {
        path: dir.to_owned(),
        source,
    };
    fs::create_dir_all(dir).map_err(io_error)?;
    if fs::read_dir(dir).map_err(io_error)?.next().is_some() {
        return Err(PeftError::DestinationNotEmpty {
            path: dir.to_owned(),
        });
    }
    Ok(())
}

/// Weight formats and adapter files that must not travel into a merged checkpoint (stale base
/// weights next to the merged ones would be ambiguous to loaders).
fn is_weight_file(name: &str) -> bool {
    const SUFFIXES: &[&str] = &[
        ".safetensors",
        ".safetensors.index.json",
        ".bin",
        ".bin.index.json",
        ".pt",
        ".pth",
        ".ckpt",
        ".h5",
        ".msgpack",
        ".gguf",
    ];
    name == ADAPTER_CONFIG_FILE || SUFFIXES.iter().any(|suffix| name.ends_with(suffix))
}

fn copy_non_weight_files(source_dir: &Path, out_dir: &Path) -> Result<(), PeftError> {
    let entries = fs::read_dir(source_dir).map_err(|source| PeftError::Io {
        path: source_dir.to_owned(),
        source,
    })?;
    for entry in entries {
        let entry = entry.map_err(|source| PeftError::Io {
            path: source_dir.to_owned(),
            source,
        })?;
        let from = entry.path();
        let name = entry.file_name();
        if !from.is_file() || is_weight_file(&name.to_string_lossy()) {
            continue;
        }
        fs::copy(&from, out_dir.join(&name)).map_err(|source| PeftError::Io {
            path: from.clone(),
            source,
        })?;
    }
    Ok(())
}

/// A tensor's bytes on the CPU, ready for safetensors (which wants a `View`).
#[derive(Debug)]
struct OwnedView {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl OwnedView {
    fn from_tensor(tensor: &Tensor, kind: Kind, name: &str) -> Result<Self, PeftError> {
        let torch_error = |source| PeftError::Torch {
            name: name.to_owned(),
            source,
        };
        let dtype = Dtype::try_from(kind).map_err(torch_error)?;
        let cpu = tensor
            .f_to_device(Device::Cpu)
            .and_then(|t| t.f_to_kind(kind))
            .map_err(torch_error)?
            .contiguous();
        let numel = cpu.numel();
        let mut data = vec![0u8; numel * kind.elt_size_in_bytes()];
        cpu.f_copy_data_u8(&mut data, numel).map_err(torch_error)?;
        let shape = cpu.size().iter().map(|&d| d as usize).collect();
        Ok(Self { dtype, shape, data })
    }
}

impl View for OwnedView {
    fn dtype(&self) -> Dtype {
        self.dtype
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.data)
    }

    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// Writes a safetensors file with PEFT/transformers' metadata `{"format": "pt"}` (transformers
/// refuses files without it), streamed into a temporary file renamed into place so a crash never
/// leaves a truncated file under the real name.
fn write_safetensors(path: &Path, views: Vec<(String, OwnedView)>) -> Result<(), PeftError> {
    let metadata = Some(HashMap::from([("format".to_owned(), "pt".to_owned())]));
    let partial = partial_path(path);
    safetensors::tensor::serialize_to_file(views, &metadata, &partial).map_err(|source| {
        PeftError::SafeTensors {
            path: path.to_owned(),
            source,
        }
    })?;
    fs::rename(&partial, path).map_err(|source| PeftError::Io {
        path: path.to_owned(),
        source,
    })
}

fn partial_path(path: &Path) -> PathBuf {
    let mut partial = path.as_os_str().to_owned();
    partial.push(".partial");
    PathBuf::from(partial)
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), PeftError> {
    let io_error = |source| PeftError::Io {
        path: path.to_owned(),
        source,
    };
    let partial = partial_path(path);
    fs::write(&partial, bytes).map_err(io_error)?;
    fs::rename(&partial, path).map_err(io_error)
}

/// Reads a safetensors file's `__metadata__` (for checks that the format marker is present).
pub fn read_safetensors_metadata(path: &Path) -> Result<BTreeMap<String, String>, PeftError> {
    let bytes = fs::read(path).map_err(|source| PeftError::Io {
        path: path.to_owned(),
        source,
    })?;
    let (_, metadata) =
        SafeTensors::read_metadata(&bytes).map_err(|source| PeftError::SafeTensors {
            path: path.to_owned(),
            source,
        })?;
    Ok(metadata
        .metadata()
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect())
}

/// The modules that carry LoRA variables (`<module>` of `<module>.lora_A.weight`), sorted.
pub fn adapted_modules(vs: &VarStore) -> Result<BTreeSet<String>, PeftError> {
    Ok(lora_modules(vs)?.into_keys().collect())
}

#[cfg(test)]
mod tests {
    use tch::nn::Init;

    use super::*;

    const PROJECTIONS: [(&str, &str, i64, i64); 7] = [
        ("self_attn", "q_proj", 8, 8),
        ("self_attn", "k_proj", 4, 8),
        ("self_attn", "v_proj", 4, 8),
        ("self_attn", "o_proj", 8, 8),
        ("mlp", "gate_proj", 12, 8),
        ("mlp", "up_proj", 12, 8),
        ("mlp", "down_proj", 8, 12),
    ];
    use crate::model::LORA_TARGETS as ALL_TARGETS;

    /// Normal values at a trained model's scale (base weights ~0.02, adapters ~0.1), so a merge
    /// moves weights by ~1e-2 and f32 rounding stays far below the 1e-6 unmerge tolerance.
    fn random_scaled(stdev: f64) -> Init {
        Init::Randn { mean: 0.0, stdev }
    }

    fn random() -> Init {
        random_scaled(0.1)
    }

    /// Two layers of a Qwen2-shaped model with LoRA of rank `r` on all seven projections.
    fn synthetic_store(r: i64, kind: Kind) -> VarStore {
        let mut vs = VarStore::new(Device::Cpu);
        let root = vs.root();
        let embed = &root / "model" / "embed_tokens";
        let _ = embed.var("weight", &[16, 8], random_scaled(0.02));
        for layer in 0..2 {
            let layer_path = &root / "model" / "layers" / layer;
            for (block, projection, out_features, in_features) in PROJECTIONS {
                let module = &layer_path / block / projection;
                let _ = module.var("weight", &[out_features, in_features], random_scaled(0.02));
                if projection != "o_proj" && block == "self_attn" {
                    let _ = module.var("bias", &[out_features], random());
                }
                let _ = (&module / "lora_A").var("weight", &[r, in_features], random());
                let _ = (&module / "lora_B").var("weight", &[out_features, r], random());
            }
        }
        vs.set_kind(kind);
        vs
    }

    fn config(r: i64) -> AdapterConfig {
        AdapterConfig::new(r, 2.0 * r as f64, &ALL_TARGETS)
    }

    fn lora_values(vs: &VarStore) -> BTreeMap<String, Tensor> {
        vs.variables()
            .into_iter()
            .filter(|(name, _)| name.contains(".lora_"))
            .map(|(name, tensor)| (name, tensor.copy()))
            .collect()
    }

    fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
        (a.to_kind(Kind::Double) - b.to_kind(Kind::Double))
            .abs()
            .max()
            .double_value(&[])
    }

    fn save_tensors(path: &Path, tensors: &[(String, Tensor)]) {
        let views = tensors
            .iter()
            .map(|(name, t)| {
                (
                    name.clone(),
                    OwnedView::from_tensor(t, t.kind(), name).unwrap(),
                )
            })
            .collect();
        write_safetensors(path, views).unwrap();
    }

    /// The adapter of `vs` saved into a fresh directory.
    fn saved_adapter(vs: &VarStore, config: &AdapterConfig) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        save_adapter(vs, config, dir.path()).unwrap();
        dir
    }

    #[test]
    fn save_then_load_restores_every_lora_tensor_exactly() {
        let source = synthetic_store(4, Kind::Float);
        let dir = saved_adapter(&source, &config(4));

        let weights = dir.path().join(ADAPTER_WEIGHTS_FILE);
        let keys: BTreeSet<String> = Tensor::read_safetensors(&weights)
            .unwrap()
            .into_iter()
            .map(|(key, _)| key)
            .collect();
        assert_eq!(keys.len(), 2 * 7 * 2);
        assert!(keys.contains("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"));
        assert!(keys.iter().all(|key| key.starts_with(PEFT_KEY_PREFIX)));
        assert_eq!(
            read_safetensors_metadata(&weights).unwrap().get("format"),
            Some(&"pt".to_owned())
        );

        let target = synthetic_store(4, Kind::Float);
        let before = lora_values(&target);
        let loaded = load_adapter(&target, dir.path()).unwrap();
        assert_eq!(loaded.r, 4);
        assert!(loaded.inference_mode, "saved configs say inference_mode");
        assert_eq!(
            loaded.other.get("peft_version"),
            Some(&Value::from(PEFT_VERSION))
        );
        let expected = lora_values(&source);
        let after = lora_values(&target);
        assert_eq!(expected.len(), after.len());
        for (name, value) in &expected {
            assert_eq!(max_abs_diff(value, &after[name]), 0.0, "{name}");
            assert!(
                max_abs_diff(&before[name], &after[name]) > 0.0,
                "{name} unchanged"
            );
        }
    }

    #[test]
    fn bf16_save_rounds_and_loads_into_f32_variables() {
        let source = synthetic_store(2, Kind::Float);
        let dir = tempfile::tempdir().unwrap();
        save_adapter_as(&source, &config(2), dir.path(), SaveDtype::Bf16).unwrap();
        let stored = Tensor::read_safetensors(dir.path().join(ADAPTER_WEIGHTS_FILE)).unwrap();
        assert!(stored.iter().all(|(_, t)| t.kind() == Kind::BFloat16));

        let target = synthetic_store(2, Kind::Float);
        load_adapter(&target, dir.path()).unwrap();
        for (name, value) in lora_values(&source) {
            let rounded = value.to_kind(Kind::BFloat16).to_kind(Kind::Float);
            let loaded = &target.variables()[&name];
            assert_eq!(loaded.kind(), Kind::Float);
            assert_eq!(max_abs_diff(&rounded, loaded), 0.0, "{name}");
        }
    }

    #[test]
    fn keys_carrying_the_adapter_name_load() {
        let source = synthetic_store(2, Kind::Float);
        let dir = saved_adapter(&source, &config(2));
        let weights = dir.path().join(ADAPTER_WEIGHTS_FILE);
        let renamed: Vec<(String, Tensor)> = Tensor::read_safetensors(&weights)
            .unwrap()
            .into_iter()
            .map(|(key, t)| (key.replace(".weight", ".default.weight"), t))
            .collect();
        save_tensors(&weights, &renamed);

        let target = synthetic_store(2, Kind::Float);
        load_adapter(&target, dir.path()).unwrap();
        for (name, value) in lora_values(&source) {
            assert_eq!(
                max_abs_diff(&value, &target.variables()[&name]),
                0.0,
                "{name}"
            );
        }
    }

    #[test]
    fn key_parsing_follows_peft_names() {
        let parse = parse_peft_key;
        assert_eq!(
            parse("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"),
            Some(("model.layers.0.self_attn.q_proj", LORA_A))
        );
        assert_eq!(
            parse("base_model.model.model.layers.0.mlp.up_proj.lora_B.default.weight"),
            Some(("model.layers.0.mlp.up_proj", LORA_B))
        );
        assert_eq!(parse("model.layers.0.mlp.up_proj.lora_B.weight"), None);
        assert_eq!(
            parse("base_model.model.model.layers.0.mlp.up_proj.weight"),
            None
        );
        assert_eq!(parse("base_model.model.lora_A.weight"), None);
        assert_eq!(
            parse("base_model.model.model.layers.0.mlp.up_proj.lora_magnitude_vector"),
            None
        );
    }

    /// Rewrites the saved adapter's tensors with `edit` and returns the load error.
    fn load_error_after(edit: impl FnOnce(&mut Vec<(String, Tensor)>)) -> String {
        let source = synthetic_store(2, Kind::Float);
        let dir = saved_adapter(&source, &config(2));
        let weights = dir.path().join(ADAPTER_WEIGHTS_FILE);
        let mut tensors = Tensor::read_safetensors(&weights).unwrap();
        edit(&mut tensors);
        save_tensors(&weights, &tensors);
        let target = synthetic_store(2, Kind::Float);
        let before = lora_values(&target);
        let error = load_adapter(&target, dir.path()).unwrap_err().to_string();
        for (name, value) in before {
            let after = &target.variables()[&name];
            assert_eq!(
                max_abs_diff(&value, after),
                0.0,
                "{name} written despite {error}"
            );
        }
        assert!(error.contains(ADAPTER_WEIGHTS_FILE), "{error}");
        error
    }

    #[test]
    fn load_rejects_a_shape_mismatch_naming_file_key_and_both_shapes() {
        let key = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight";
        let error = load_error_after(|tensors| {
            for (name, t) in tensors.iter_mut() {
                if name == key {
                    *t = Tensor::zeros([9, 2], (Kind::Float, Device::Cpu));
                }
            }
        });
        assert!(error.contains(key), "{error}");
        assert!(
            error.contains("[9, 2]") && error.contains("[8, 2]"),
            "{error}"
        );
    }

    #[test]
    fn load_rejects_a_rank_other_than_the_configs() {
        let key = "base_model.model.model.layers.1.mlp.up_proj.lora_A.weight";
        let error = load_error_after(|tensors| {
            for (name, t) in tensors.iter_mut() {
                if name == key {
                    *t = Tensor::zeros([3, 8], (Kind::Float, Device::Cpu));
                }
            }
        });
        assert!(
            error.contains(key) && error.contains("rank 3") && error.contains("r = 2"),
            "{error}"
        );
    }

    #[test]
    fn load_rejects_a_module_the_model_does_not_adapt() {
        let error = load_error_after(|tensors| {
            tensors.push((
                "base_model.model.model.layers.7.self_attn.q_proj.lora_A.weight".to_owned(),
                Tensor::zeros([2, 8], (Kind::Float, Device::Cpu)),
            ));
        });
        assert!(
            error.contains("model.layers.7.self_attn.q_proj.lora_A.weight"),
            "{error}"
        );
        assert!(error.contains("no LoRA variable"), "{error}");
    }

    #[test]
    fn load_rejects_a_missing_tensor() {
        let key = "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight";
        let error = load_error_after(|tensors| tensors.retain(|(name, _)| name != key));
        assert!(
            error.contains(key) && error.contains("no tensor"),
            "{error}"
        );
    }

    #[test]
    fn load_rejects_keys_that_are_not_lora_weights() {
        let error = load_error_after(|tensors| {
            tensors.push((
                "base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector".to_owned(),
                Tensor::zeros([8], (Kind::Float, Device::Cpu)),
            ));
        });
        assert!(
            error.contains("lora_magnitude_vector") && error.contains("not a LoRA weight"),
            "{error}"
        );
    }

    #[test]
    fn load_rejects_the_same_tensor_twice() {
        let error = load_error_after(|tensors| {
            let (key, t) = (tensors[0].0.clone(), tensors[0].1.copy());
            tensors.push((key.replace(".weight", ".default.weight"), t));
        });
        assert!(error.contains("both hold"), "{error}");
    }

    #[test]
    fn load_rejects_integer_tensors() {
        let key = "base_model.model.model.layers.0.mlp.up_proj.lora_A.weight";
        let error = load_error_after(|tensors| {
            for (name, t) in tensors.iter_mut() {
                if name == key {
                    *t = Tensor::zeros([2, 8], (Kind::Int64, Device::Cpu));
                }
            }
        });
        assert!(
            error.contains(key) && error.contains("unsupported dtype"),
            "{error}"
        );
    }

    /// Saves a valid adapter, rewrites one config field, and returns the load error.
    fn config_error_after(edit: impl FnOnce(&mut serde_json::Map<String, Value>)) -> String {
        let source = synthetic_store(2, Kind::Float);
        let dir = saved_adapter(&source, &config(2));
        let path = dir.path().join(ADAPTER_CONFIG_FILE);
        let mut json: serde_json::Map<String, Value> =
            serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
        edit(&mut json);
        fs::write(&path, serde_json::to_string(&json).unwrap()).unwrap();
        let error = load_adapter(&synthetic_store(2, Kind::Float), dir.path())
            .unwrap_err()
            .to_string();
        assert!(error.contains(ADAPTER_CONFIG_FILE), "{error}");
        error
    }

    #[test]
    fn load_rejects_a_config_rank_other_than_the_models() {
        let error = config_error_after(|json| {
            json.insert("r".into(), Value::from(8));
        });
        assert!(
            error.contains("rank 2") && error.contains("r = 8"),
            "{error}"
        );
    }

    #[test]
    fn load_rejects_targets_that_miss_an_adapted_module() {
        let error = config_error_after(|json| {
            json.insert(
                "target_modules".into(),
                serde_json::json!(["q_proj", "v_proj"]),
            );
        });
        assert!(error.contains("does not select"), "{error}");
    }

    #[test]
    fn load_rejects_a_target_that_matches_no_module() {
        let error = config_error_after(|json| {
            let mut targets: Vec<&str> = ALL_TARGETS.to_vec();
            targets.push("lm_head");
            json.insert("target_modules".into(), serde_json::json!(targets));
        });
        assert!(
            error.contains("\"lm_head\"") && error.contains("matches no module"),
            "{error}"
        );
    }

    #[test]
    fn load_rejects_lora_variants_it_does_not_compute() {
        for (field, value) in [
            ("use_dora", Value::Bool(true)),
            ("rank_pattern", serde_json::json!({"q_proj": 8})),
            ("layers_to_transform", serde_json::json!([0])),
            ("bias", Value::from("all")),
            ("peft_type", Value::from("IA3")),
            ("init_lora_weights", Value::from("pissa")),
            ("target_modules", Value::Null),
            ("modules_to_save", serde_json::json!(["lm_head"])),
        ] {
            let error = config_error_after(|json| {
                json.insert(field.into(), value.clone());
            });
            assert!(error.contains(&format!("`{field}`")), "{field}: {error}");
        }
    }

    #[test]
    fn load_rejects_malformed_json_naming_the_file() {
        let error = config_error_after(|json| {
            json.remove("r");
        });
        assert!(error.contains("missing field `r`"), "{error}");
    }

    #[test]
    fn load_keeps_unknown_config_fields_and_accepts_regex_targets() {
        let source = synthetic_store(2, Kind::Float);
        let dir = saved_adapter(&source, &config(2));
        let path = dir.path().join(ADAPTER_CONFIG_FILE);
        let mut json: serde_json::Map<String, Value> =
            serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
        json.insert("field_from_peft_0_99".into(), Value::from(42));
        json.insert(
            "target_modules".into(),
            Value::from(r"model\.layers\.\d+\.(self_attn|mlp)\.\w+_proj"),
        );
        fs::write(&path, serde_json::to_string(&json).unwrap()).unwrap();
        let config = load_adapter(&synthetic_store(2, Kind::Float), dir.path()).unwrap();
        assert_eq!(
            config.other.get("field_from_peft_0_99"),
            Some(&Value::from(42))
        );

        // A regex must match the whole name, as Python's re.fullmatch does.
        json.insert(
            "target_modules".into(),
            Value::from(r"layers\.\d+\.mlp\.\w+"),
        );
        fs::write(&path, serde_json::to_string(&json).unwrap()).unwrap();
        let error = load_adapter(&synthetic_store(2, Kind::Float), dir.path()).unwrap_err();
        assert!(error.to_string().contains("does not select"), "{error}");

        json.insert("target_modules".into(), Value::from(r"(?!lm_head).*_proj"));
        fs::write(&path, serde_json::to_string(&json).unwrap()).unwrap();
        let error = load_adapter(&synthetic_store(2, Kind::Float), dir.path()).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("cannot interpret target_modules regex"),
            "{error}"
        );

        json.insert("target_modules".into(), Value::from("all-linear"));
        fs::write(&path, serde_json::to_string(&json).unwrap()).unwrap();
        load_adapter(&synthetic_store(2, Kind::Float), dir.path()).unwrap();
    }

    #[test]
    fn load_reports_missing_and_corrupt_files() {
        let source = synthetic_store(2, Kind::Float);
        let dir = saved_adapter(&source, &config(2));
        let weights = dir.path().join(ADAPTER_WEIGHTS_FILE);
        fs::write(&weights, b"not a safetensors file").unwrap();
        let error = load_adapter(&source, dir.path()).unwrap_err().to_string();
        assert!(
            error.contains(ADAPTER_WEIGHTS_FILE) && error.contains("safetensors"),
            "{error}"
        );
        fs::remove_file(&weights).unwrap();
        let error = load_adapter(&source, dir.path()).unwrap_err().to_string();
        assert!(error.contains(ADAPTER_WEIGHTS_FILE), "{error}");
    }

    #[test]
    fn save_checks_the_config_against_the_store() {
        let source = synthetic_store(2, Kind::Float);
        let dir = tempfile::tempdir().unwrap();
        let error = save_adapter(&source, &config(4), dir.path()).unwrap_err();
        assert!(
            matches!(
                error,
                PeftError::RankMismatch {
                    found: 2,
                    expected: 4,
                    ..
                }
            ),
            "{error}"
        );
        let narrow = AdapterConfig::new(2, 4.0, &["q_proj"]);
        let error = save_adapter(&source, &narrow, dir.path()).unwrap_err();
        assert!(matches!(error, PeftError::NotTargeted { .. }), "{error}");
        let empty = VarStore::new(Device::Cpu);
        let error = save_adapter(&empty, &config(2), dir.path()).unwrap_err();
        assert!(matches!(error, PeftError::NoLoraVariables), "{error}");

        let lonely = VarStore::new(Device::Cpu);
        let _ = (&lonely.root() / "x" / "lora_A").var("weight", &[2, 3], random());
        let error = save_adapter(&lonely, &config(2), dir.path()).unwrap_err();
        assert!(error.to_string().contains("x.lora_B.weight"), "{error}");
    }

    /// W + s · B · A computed directly, element by element from the definition.
    fn expected_merge(vs: &VarStore, module: &str, scaling: f64) -> Tensor {
        let variables = vs.variables();
        let w = variables[&format!("{module}.weight")].to_kind(Kind::Double);
        let a = variables[&format!("{module}.lora_A.weight")].to_kind(Kind::Double);
        let b = variables[&format!("{module}.lora_B.weight")].to_kind(Kind::Double);
        let (out, inp) = (w.size()[0], w.size()[1]);
        let r = a.size()[0];
        let mut merged = Vec::with_capacity((out * inp) as usize);
        for o in 0..out {
            for i in 0..inp {
                let dot: f64 = (0..r)
                    .map(|k| b.double_value(&[o, k]) * a.double_value(&[k, i]))
                    .sum();
                merged.push(w.double_value(&[o, i]) + scaling * dot);
            }
        }
        Tensor::from_slice(&merged).reshape([out, inp])
    }

    #[test]
    fn merge_adds_scaled_b_times_a_and_unmerge_restores() {
        for use_rslora in [false, true] {
            let vs = synthetic_store(4, Kind::Float);
            let mut config = config(4);
            config.use_rslora = use_rslora;
            let scaling = if use_rslora { 8.0 / 2.0 } else { 8.0 / 4.0 };
            assert_eq!(config.scaling(), scaling);
            let original: BTreeMap<String, Tensor> = vs
                .variables()
                .into_iter()
                .map(|(name, t)| (name, t.copy()))
                .collect();
            let modules = adapted_modules(&vs).unwrap();
            let expected: BTreeMap<&String, Tensor> = modules
                .iter()
                .map(|module| (module, expected_merge(&vs, module, scaling)))
                .collect();

            assert_eq!(merge_adapters(&vs, &config).unwrap(), 14);
            let variables = vs.variables();
            for (module, want) in &expected {
                let got = &variables[&format!("{module}.weight")];
                assert!(
                    max_abs_diff(want, got) < 1e-5,
                    "{module}: {}",
                    max_abs_diff(want, got)
                );
            }
            // Untouched: biases, embeddings, the adapters themselves.
            for (name, value) in &original {
                if !name.ends_with("_proj.weight") {
                    assert_eq!(max_abs_diff(value, &variables[name]), 0.0, "{name}");
                }
            }

            assert_eq!(unmerge_adapters(&vs, &config).unwrap(), 14);
            for (name, value) in &original {
                let diff = max_abs_diff(value, &vs.variables()[name]);
                assert!(diff < 1e-6, "{name}: {diff}");
            }
        }
    }

    #[test]
    fn merge_keeps_bf16_weights_in_bf16() {
        let vs = synthetic_store(2, Kind::BFloat16);
        merge_adapters(&vs, &config(2)).unwrap();
        assert!(vs.variables().values().all(|t| t.kind() == Kind::BFloat16));
    }

    #[test]
    fn merge_needs_a_base_weight_of_matching_shape() {
        let vs = VarStore::new(Device::Cpu);
        let module = &vs.root() / "model" / "layers" / 0 / "mlp" / "up_proj";
        let _ = (&module / "lora_A").var("weight", &[2, 8], random());
        let _ = (&module / "lora_B").var("weight", &[12, 2], random());
        let config = AdapterConfig::new(2, 4.0, &["up_proj"]);
        let error = merge_adapters(&vs, &config).unwrap_err();
        assert!(
            matches!(error, PeftError::MissingBaseWeight { .. }),
            "{error}"
        );
        let _ = module.var("weight", &[12, 9], random());
        let error = merge_adapters(&vs, &config).unwrap_err().to_string();
        assert!(
            error.contains("[12, 9]") && error.contains("model.layers.0.mlp.up_proj"),
            "{error}"
        );
    }

    fn write_source_checkpoint(dir: &Path) {
        fs::write(dir.join("config.json"), br#"{"model_type": "qwen2"}"#).unwrap();
        fs::write(dir.join("tokenizer.json"), b"{}").unwrap();
        fs::write(dir.join("model.safetensors"), b"stale base weights").unwrap();
    }

    #[test]
    fn merged_checkpoint_holds_merged_base_weights_and_copies_configs() {
        let vs = synthetic_store(2, Kind::Float);
        let config = config(2);
        let source = tempfile::tempdir().unwrap();
        write_source_checkpoint(source.path());
        let out = tempfile::tempdir().unwrap();
        let before = lora_values(&vs);
        save_merged_checkpoint(
            &vs,
            &config,
            source.path(),
            out.path(),
            DEFAULT_MAX_SHARD_BYTES,
        )
        .unwrap();

        let mut names: Vec<String> = fs::read_dir(out.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(
            names,
            ["config.json", "model.safetensors", "tokenizer.json"]
        );
        let written: BTreeMap<String, Tensor> =
            Tensor::read_safetensors(out.path().join(MERGED_WEIGHTS_FILE))
                .unwrap()
                .into_iter()
                .collect();
        assert!(written.keys().all(|name| !name.contains("lora_")));
        assert!(written.contains_key("model.layers.0.self_attn.q_proj.bias"));
        assert!(written.contains_key("model.embed_tokens.weight"));

        merge_adapters(&vs, &config).unwrap();
        let merged = vs.variables();
        assert_eq!(written.len(), merged.len() - before.len());
        for (name, tensor) in &written {
            assert_eq!(max_abs_diff(tensor, &merged[name]), 0.0, "{name}");
        }
        // The VarStore itself was not modified by the export (merge above did that).
        for (name, value) in before {
            assert_eq!(max_abs_diff(&value, &merged[&name]), 0.0, "{name}");
        }
    }

    #[test]
    fn merged_checkpoint_shards_with_an_index() {
        let vs = synthetic_store(2, Kind::Float);
        let source = tempfile::tempdir().unwrap();
        write_source_checkpoint(source.path());
        let out = tempfile::tempdir().unwrap();
        // 400 bytes: several tensors per shard but many shards.
        save_merged_checkpoint(&vs, &config(2), source.path(), out.path(), 400).unwrap();
        let index: Value =
            serde_json::from_str(&fs::read_to_string(out.path().join(MERGED_INDEX_FILE)).unwrap())
                .unwrap();
        let weight_map = index["weight_map"].as_object().unwrap();
        let mut total = 0;
        let mut files = BTreeSet::new();
        for (name, file) in weight_map {
            let file = file.as_str().unwrap();
            files.insert(file.to_owned());
            let tensors: BTreeMap<String, Tensor> = Tensor::read_safetensors(out.path().join(file))
                .unwrap()
                .into_iter()
                .collect();
            let tensor = &tensors[name];
            total += tensor.numel() * 4;
        }
        assert!(files.len() > 2, "{files:?}");
        assert!(files.contains(&format!("model-00001-of-{:05}.safetensors", files.len())));
        assert_eq!(index["metadata"]["total_size"], Value::from(total));
        assert_eq!(
            index["metadata"]["total_parameters"],
            Value::from(total / 4)
        );
        assert!(!out.path().join(MERGED_WEIGHTS_FILE).exists());
    }

    #[test]
    fn merged_checkpoint_refuses_a_non_empty_destination_or_a_source_without_config() {
        let vs = synthetic_store(2, Kind::Float);
        let source = tempfile::tempdir().unwrap();
        let out = tempfile::tempdir().unwrap();
        let error = save_merged_checkpoint(&vs, &config(2), source.path(), out.path(), 1 << 20)
            .unwrap_err();
        assert!(
            matches!(error, PeftError::MissingModelConfig { .. }),
            "{error}"
        );
        write_source_checkpoint(source.path());
        let error = save_merged_checkpoint(&vs, &config(2), source.path(), source.path(), 1 << 20)
            .unwrap_err();
        assert!(
            matches!(error, PeftError::DestinationNotEmpty { .. }),
            "{error}"
        );
    }
}
