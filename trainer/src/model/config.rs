//! The decoder's hyper-parameters, read from a Hugging Face `config.json` (Qwen2 and Llama).

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Which decoder family a checkpoint belongs to; they differ only in which projections carry a bias.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// `Qwen2ForCausalLM`: q/k/v projections always have a bias, o_proj never.
    Qwen2,
    /// `LlamaForCausalLM`: biases on all four attention projections only when `attention_bias`.
    Llama,
}

impl Architecture {
    fn from_model_type(model_type: &str) -> Option<Self> {
        match model_type {
            "qwen2" => Some(Self::Qwen2),
            "llama" => Some(Self::Llama),
            _ => None,
        }
    }

    /// The `architectures` entry transformers writes for the causal-LM head of this family.
    pub fn causal_lm_class(self) -> &'static str {
        match self {
            Self::Qwen2 => "Qwen2ForCausalLM",
            Self::Llama => "LlamaForCausalLM",
        }
    }
}

/// How rotary frequencies are derived from `rope_theta`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE: `inv_freq[i] = theta^(-2i/head_dim)`.
    Default,
    /// Llama 3.1's frequency-band rescaling for long contexts.
    Llama3 {
        /// Divisor applied to the low-frequency band.
        factor: f64,
        /// Wavelengths above `original / low_freq_factor` are fully scaled.
        low_freq_factor: f64,
        /// Wavelengths below `original / high_freq_factor` are kept.
        high_freq_factor: f64,
        /// The context length the model was pre-trained with.
        original_max_position_embeddings: f64,
    },
}

/// Rotary position embedding parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rope {
    /// The RoPE base (`rope_theta`).
    pub theta: f64,
    /// Frequency rescaling, if any.
    pub scaling: RopeScaling,
}

/// The hyper-parameters of a Qwen2 or Llama decoder.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Model family.
    pub architecture: Architecture,
    /// Rows of the embedding and of the LM head.
    pub vocab_size: i64,
    /// Width of the residual stream.
    pub hidden_size: i64,
    /// Width of the SwiGLU MLP.
    pub intermediate_size: i64,
    /// Number of decoder layers.
    pub num_hidden_layers: i64,
    /// Query heads.
    pub num_attention_heads: i64,
    /// Key/value heads (grouped-query attention when fewer than query heads).
    pub num_key_value_heads: i64,
    /// Width of one attention head.
    pub head_dim: i64,
    /// Epsilon of every RMSNorm.
    pub rms_norm_eps: f64,
    /// Longest context the checkpoint declares.
    pub max_position_embeddings: i64,
    /// The LM head reuses `model.embed_tokens.weight` (no `lm_head.weight` tensor).
    pub tie_word_embeddings: bool,
    /// q/k/v projections carry a bias (always for Qwen2; `attention_bias` for Llama).
    pub qkv_bias: bool,
    /// o_proj carries a bias (Llama with `attention_bias` only).
    pub o_proj_bias: bool,
    /// gate/up/down projections carry a bias (Llama's `mlp_bias`).
    pub mlp_bias: bool,
    /// Rotary embedding.
    pub rope: Rope,
    /// Beginning-of-sequence token, when the checkpoint names one.
    pub bos_token_id: Option<i64>,
    /// Every token id that ends generation (`eos_token_id` may be one id or a list).
    pub eos_token_ids: Vec<i64>,
    /// The checkpoint's stored dtype (`torch_dtype` or transformers 5's `dtype`); informational only,
    /// since weights are converted to the runtime kind on load.
    pub stored_dtype: Option<String>,
}

/// Why a `config.json` could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The config file.
        path: PathBuf,
        /// The I/O failure.
        source: std::io::Error,
    },
    /// The file is not valid JSON or a field has the wrong type.
    #[error("cannot parse {path}: {source}")]
    Parse {
        /// The config file.
        path: PathBuf,
        /// The parse failure, with line and column.
        source: serde_json::Error,
    },
    /// The model family or head is not one this crate implements.
    #[error(
        "{path}: unsupported architecture: field `{field}` is {value:?}; supported are Qwen2ForCausalLM (model_type \"qwen2\") and LlamaForCausalLM (model_type \"llama\")"
    )]
    UnsupportedArchitecture {
        /// The config file.
        path: PathBuf,
        /// `model_type` or `architectures`.
        field: &'static str,
        /// What the file says.
        value: String,
    },
    /// A RoPE variant this crate does not implement.
    #[error(
        "{path}: unsupported RoPE type {value:?} in field `{field}`; supported are \"default\" and \"llama3\""
    )]
    UnsupportedRope {
        /// The config file.
        path: PathBuf,
        /// The field that names the rope type.
        field: String,
        /// What the file says.
        value: String,
    },
    /// A required field is absent.
    #[error("{path}: missing required field `{field}`")]
    Missing {
        /// The config file.
        path: PathBuf,
        /// The field's name (dotted for nested fields).
        field: String,
    },
    /// A field is present but its value cannot work.
    #[error("{path}: field `{field}` {reason}")]
    Invalid {
        /// The config file.
        path: PathBuf,
        /// The field's name (dotted for nested fields).
        field: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// One id or a list of ids, as `eos_token_id` may be either.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum TokenIds {
    One(i64),
    Many(Vec<i64>),
}

/// The RoPE object in either layout: classic `rope_scaling` (theta at top level) or transformers 5's
/// `rope_parameters` (theta inside). `type` is the legacy spelling of `rope_type`; both may appear.
#[derive(Debug, Deserialize)]
struct RawRope {
    rope_type: Option<String>,
    #[serde(rename = "type")]
    legacy_type: Option<String>,
    rope_theta: Option<f64>,
    factor: Option<f64>,
    low_freq_factor: Option<f64>,
    high_freq_factor: Option<f64>,
    original_max_position_embeddings: Option<f64>,
}

#[derive(Debug, Deserialize)]
struct RawConfig {
    model_type: Option<String>,
    architectures: Option<Vec<String>>,
    vocab_size: Option<i64>,
    hidden_size: Option<i64>,
    intermediate_size: Option<i64>,
    num_hidden_layers: Option<i64>,
    num_attention_heads: Option<i64>,
    num_key_value_heads: Option<i64>,
    head_dim: Option<i64>,
    rms_norm_eps: Option<f64>,
    max_position_embeddings: Option<i64>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
    hidden_act: Option<String>,
    use_sliding_window: Option<bool>,
    rope_theta: Option<f64>,
    rope_scaling: Option<RawRope>,
    rope_parameters: Option<RawRope>,
    bos_token_id: Option<i64>,
    eos_token_id: Option<TokenIds>,
    torch_dtype: Option<String>,
    dtype: Option<String>,
}

/// transformers' default RoPE base when a config names none.
const DEFAULT_ROPE_THETA: f64 = 10_000.0;

impl Config {
    /// Reads and validates `config.json` at `path`.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_json(&text, path)
    }

    /// Parses config text; `path` is only used to name the file in errors.
    pub fn from_json(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let raw: RawConfig = serde_json::from_str(text).map_err(|source| ConfigError::Parse {
            path: path.to_owned(),
            source,
        })?;
        raw.validate(path)
    }
}

impl RawConfig {
    fn validate(self, path: &Path) -> Result<Config, ConfigError> {
        let missing = |field: &str| ConfigError::Missing {
            path: path.to_owned(),
            field: field.to_owned(),
        };
        let invalid = |field: &str, reason: String| ConfigError::Invalid {
            path: path.to_owned(),
            field: field.to_owned(),
            reason,
        };
        let unsupported_architecture =
            |field: &'static str, value: String| ConfigError::UnsupportedArchitecture {
                path: path.to_owned(),
                field,
                value,
            };

        let model_type = self.model_type.ok_or_else(|| missing("model_type"))?;
        let architecture = Architecture::from_model_type(&model_type)
            .ok_or_else(|| unsupported_architecture("model_type", model_type.clone()))?;
        // A known body with another head (e.g. Qwen2ForSequenceClassification) has different tensors.
        if let Some(architectures) = &self.architectures
            && let Some(other) = architectures
                .iter()
                .find(|name| name.as_str() != architecture.causal_lm_class())
        {
            return Err(unsupported_architecture("architectures", other.clone()));
        }
        if let Some(act) = &self.hidden_act
            && act != "silu"
        {
            return Err(invalid(
                "hidden_act",
                format!("is {act:?}; only \"silu\" (SwiGLU) is implemented"),
            ));
        }
        if self.use_sliding_window == Some(true) {
            return Err(invalid(
                "use_sliding_window",
                "is true; sliding-window attention is not implemented".into(),
            ));
        }

        let positive = |value: Option<i64>, field: &'static str| -> Result<i64, ConfigError> {
            let value = value.ok_or_else(|| missing(field))?;
            if value <= 0 {
                return Err(invalid(field, format!("must be positive, found {value}")));
            }
            Ok(value)
        };
        let vocab_size = positive(self.vocab_size, "vocab_size")?;
        let hidden_size = positive(self.hidden_size, "hidden_size")?;
        let intermediate_size = positive(self.intermediate_size, "intermediate_size")?;
        let num_hidden_layers = positive(self.num_hidden_layers, "num_hidden_layers")?;
        let num_attention_heads = positive(self.num_attention_heads, "num_attention_heads")?;
        let num_key_value_heads = positive(
            Some(self.num_key_value_heads.unwrap_or(num_attention_heads)),
            "num_key_value_heads",
        )?;
        if num_attention_heads % num_key_value_heads != 0 {
            return Err(invalid(
                "num_key_value_heads",
                format!(
                    "({num_key_value_heads}) must divide num_attention_heads ({num_attention_heads})"
                ),
            ));
        }
        let head_dim = match self.head_dim {
            Some(_) => positive(self.head_dim, "head_dim")?,
            None if hidden_size % num_attention_heads == 0 => hidden_size / num_attention_heads,
            None => {
                return Err(invalid(
                    "hidden_size",
                    format!(
                        "({hidden_size}) is not a multiple of num_attention_heads ({num_attention_heads}) and head_dim is absent"
                    ),
                ));
            }
        };
        if head_dim % 2 != 0 {
            return Err(invalid(
                "head_dim",
                format!("must be even for rotary embeddings, found {head_dim}"),
            ));
        }
        let rms_norm_eps = self.rms_norm_eps.ok_or_else(|| missing("rms_norm_eps"))?;
        let max_position_embeddings =
            positive(self.max_position_embeddings, "max_position_embeddings")?;

        let rope = match (self.rope_parameters, self.rope_scaling) {
            // transformers 5 moves everything into rope_parameters; an old top-level rope_theta is a
            // fallback only.
            (Some(params), _) => {
                let theta = params
                    .rope_theta
                    .or(self.rope_theta)
                    .unwrap_or(DEFAULT_ROPE_THETA);
                params.into_rope(theta, "rope_parameters", path)?
            }
            (None, Some(scaling)) => scaling.into_rope(
                self.rope_theta.unwrap_or(DEFAULT_ROPE_THETA),
                "rope_scaling",
                path,
            )?,
            (None, None) => Rope {
                theta: self.rope_theta.unwrap_or(DEFAULT_ROPE_THETA),
                scaling: RopeScaling::Default,
            },
        };
        if !(rope.theta.is_finite() && rope.theta > 0.0) {
            return Err(invalid(
                "rope_theta",
                format!("must be positive, found {}", rope.theta),
            ));
        }

        let attention_bias = self.attention_bias.unwrap_or(false);
        let (qkv_bias, o_proj_bias) = match architecture {
            Architecture::Qwen2 => (true, false),
            Architecture::Llama => (attention_bias, attention_bias),
        };
        let eos_token_ids = match self.eos_token_id {
            None => Vec::new(),
            Some(TokenIds::One(id)) => vec![id],
            Some(TokenIds::Many(ids)) => ids,
        };
        Ok(Config {
            architecture,
            vocab_size,
            hidden_size,
            intermediate_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps,
            max_position_embeddings,
            tie_word_embeddings: self.tie_word_embeddings.unwrap_or(false),
            qkv_bias,
            o_proj_bias,
            mlp_bias: self.mlp_bias.unwrap_or(false),
            rope,
            bos_token_id: self.bos_token_id,
            eos_token_ids,
            stored_dtype: self.torch_dtype.or(self.dtype),
        })
    }
}

impl RawRope {
    /// `object` is the JSON key this came from (`rope_scaling` or `rope_parameters`), for errors.
    fn into_rope(self, theta: f64, object: &str, path: &Path) -> Result<Rope, ConfigError> {
        let (rope_type, field) = match (&self.rope_type, &self.legacy_type) {
            (Some(rope_type), _) => (rope_type.as_str(), "rope_type"),
            (None, Some(legacy)) => (legacy.as_str(), "type"),
            (None, None) => ("default", "rope_type"),
        };
        let scaling = match rope_type {
            "default" => RopeScaling::Default,
            "llama3" => {
                let required = |value: Option<f64>, name: &str| {
                    value.ok_or_else(|| ConfigError::Missing {
                        path: path.to_owned(),
                        field: format!("{object}.{name}"),
                    })
                };
                let factor = required(self.factor, "factor")?;
                let low_freq_factor = required(self.low_freq_factor, "low_freq_factor")?;
                let high_freq_factor = required(self.high_freq_factor, "high_freq_factor")?;
                let original_max_position_embeddings = required(
                    self.original_max_position_embeddings,
                    "original_max_position_embeddings",
                )?;
                // The smoothing band divides by (high - low); equal factors would make it empty.
                if high_freq_factor <= low_freq_factor || factor <= 0.0 || low_freq_factor <= 0.0 {
                    return Err(ConfigError::Invalid {
                        path: path.to_owned(),
                        field: object.to_owned(),
                        reason: format!(
                            "llama3 needs factor > 0 and 0 < low_freq_factor < high_freq_factor, found factor {factor}, low {low_freq_factor}, high {high_freq_factor}"
                        ),
                    });
                }
                RopeScaling::Llama3 {
                    factor,
                    low_freq_factor,
                    high_freq_factor,
                    original_max_position_embeddings,
                }
            }
            other => {
                return Err(ConfigError::UnsupportedRope {
                    path: path.to_owned(),
                    field: format!("{object}.{field}"),
                    value: other.to_owned(),
                });
            }
        };
        Ok(Rope { theta, scaling })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Qwen/Qwen2.5-0.5B-Instruct's published config.json (classic layout, rope_scaling absent).
    const QWEN25_05B_INSTRUCT: &str = r#"{
      "architectures": ["Qwen2ForCausalLM"],
      "attention_dropout": 0.0,
      "bos_token_id": 151643,
      "eos_token_id": 151645,
      "hidden_act": "silu",
      "hidden_size": 896,
      "initializer_range": 0.02,
      "intermediate_size": 4864,
      "max_position_embeddings": 32768,
      "max_window_layers": 21,
      "model_type": "qwen2",
      "num_attention_heads": 14,
      "num_hidden_layers": 24,
      "num_key_value_heads": 2,
      "rms_norm_eps": 1e-06,
      "rope_theta": 1000000.0,
      "sliding_window": 32768,
      "tie_word_embeddings": true,
      "torch_dtype": "bfloat16",
      "transformers_version": "4.43.1",
      "use_cache": true,
      "use_sliding_window": false,
      "vocab_size": 151936
    }"#;

    /// meta-llama/Llama-3.1-8B's published config.json (classic layout with llama3 rope_scaling).
    const LLAMA31_8B: &str = r#"{
      "architectures": ["LlamaForCausalLM"],
      "attention_bias": false,
      "attention_dropout": 0.0,
      "bos_token_id": 128000,
      "eos_token_id": 128001,
      "hidden_act": "silu",
      "hidden_size": 4096,
      "initializer_range": 0.02,
      "intermediate_size": 14336,
      "max_position_embeddings": 131072,
      "mlp_bias": false,
      "model_type": "llama",
      "num_attention_heads": 32,
      "num_hidden_layers": 32,
      "num_key_value_heads": 8,
      "pretraining_tp": 1,
      "rms_norm_eps": 1e-05,
      "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3"
      },
      "rope_theta": 500000.0,
      "tie_word_embeddings": false,
      "torch_dtype": "bfloat16",
      "transformers_version": "4.43.0.dev0",
      "use_cache": true,
      "vocab_size": 128256
    }"#;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::from_json(text, Path::new("config.json"))
    }

    fn edited(text: &str, edit: impl FnOnce(&mut serde_json::Value)) -> String {
        let mut value: serde_json::Value = serde_json::from_str(text).unwrap();
        edit(&mut value);
        value.to_string()
    }

    #[test]
    fn qwen25_instruct_config() {
        let config = parse(QWEN25_05B_INSTRUCT).unwrap();
        assert_eq!(config.architecture, Architecture::Qwen2);
        assert_eq!(config.vocab_size, 151_936);
        assert_eq!(config.hidden_size, 896);
        assert_eq!(config.num_attention_heads, 14);
        assert_eq!(config.num_key_value_heads, 2);
        assert_eq!(config.head_dim, 64);
        assert!(config.tie_word_embeddings);
        assert!(config.qkv_bias && !config.o_proj_bias && !config.mlp_bias);
        assert_eq!(
            config.rope,
            Rope {
                theta: 1e6,
                scaling: RopeScaling::Default
            }
        );
        assert_eq!(config.eos_token_ids, vec![151_645]);
        assert_eq!(config.stored_dtype.as_deref(), Some("bfloat16"));
    }

    #[test]
    fn llama31_config_classic_rope_scaling() {
        let config = parse(LLAMA31_8B).unwrap();
        assert_eq!(config.architecture, Architecture::Llama);
        assert_eq!(config.head_dim, 128);
        assert_eq!(config.num_key_value_heads, 8);
        assert!(!config.tie_word_embeddings && !config.qkv_bias && !config.o_proj_bias);
        assert_eq!(
            config.rope,
            Rope {
                theta: 500_000.0,
                scaling: RopeScaling::Llama3 {
                    factor: 8.0,
                    low_freq_factor: 1.0,
                    high_freq_factor: 4.0,
                    original_max_position_embeddings: 8192.0
                }
            }
        );
    }

    #[test]
    fn llama31_config_in_transformers5_rope_parameters_layout_reads_the_same() {
        let text = edited(LLAMA31_8B, |value| {
            let object = value.as_object_mut().unwrap();
            let mut rope = object.remove("rope_scaling").unwrap();
            let theta = object.remove("rope_theta").unwrap();
            rope.as_object_mut()
                .unwrap()
                .insert("rope_theta".into(), theta);
            object.insert("rope_parameters".into(), rope);
            object.insert("eos_token_id".into(), serde_json::json!([128001, 128008]));
            object.insert("dtype".into(), serde_json::json!("bfloat16"));
            object.remove("torch_dtype");
        });
        let config = parse(&text).unwrap();
        assert_eq!(config.rope, parse(LLAMA31_8B).unwrap().rope);
        assert_eq!(config.eos_token_ids, vec![128_001, 128_008]);
        assert_eq!(config.stored_dtype.as_deref(), Some("bfloat16"));
    }

    #[test]
    fn legacy_type_key_and_default_rope_parameters() {
        let legacy = edited(LLAMA31_8B, |value| {
            let scaling = value["rope_scaling"].as_object_mut().unwrap();
            let kind = scaling.remove("rope_type").unwrap();
            scaling.insert("type".into(), kind);
        });
        assert!(matches!(
            parse(&legacy).unwrap().rope.scaling,
            RopeScaling::Llama3 { factor: 8.0, .. }
        ));
        let default = edited(QWEN25_05B_INSTRUCT, |value| {
            let object = value.as_object_mut().unwrap();
            object.remove("rope_theta");
            object.insert(
                "rope_parameters".into(),
                serde_json::json!({"rope_type": "default", "rope_theta": 1000000.0}),
            );
        });
        assert_eq!(
            parse(&default).unwrap().rope,
            Rope {
                theta: 1e6,
                scaling: RopeScaling::Default
            }
        );
    }

    #[test]
    fn unsupported_rope_type_names_config_and_field() {
        let yarn = edited(QWEN25_05B_INSTRUCT, |value| {
            value["rope_scaling"] = serde_json::json!({"type": "yarn", "factor": 4.0});
        });
        let message = parse(&yarn).unwrap_err().to_string();
        assert!(message.contains("config.json"), "{message}");
        assert!(message.contains("rope_scaling.type"), "{message}");
        assert!(message.contains("yarn"), "{message}");

        let dynamic = edited(QWEN25_05B_INSTRUCT, |value| {
            value["rope_parameters"] = serde_json::json!({"rope_type": "dynamic", "factor": 2.0});
        });
        let message = parse(&dynamic).unwrap_err().to_string();
        assert!(message.contains("rope_parameters.rope_type"), "{message}");
    }

    #[test]
    fn llama3_without_factor_names_the_field() {
        let text = edited(LLAMA31_8B, |value| {
            value["rope_scaling"]
                .as_object_mut()
                .unwrap()
                .remove("factor");
        });
        let message = parse(&text).unwrap_err().to_string();
        assert!(message.contains("rope_scaling.factor"), "{message}");
    }

    #[test]
    fn unknown_architecture_is_rejected() {
        let gpt2 = edited(QWEN25_05B_INSTRUCT, |value| {
            value["model_type"] = serde_json::json!("gpt2");
        });
        let message = parse(&gpt2).unwrap_err().to_string();
        assert!(
            message.contains("config.json") && message.contains("model_type"),
            "{message}"
        );
        let classifier = edited(QWEN25_05B_INSTRUCT, |value| {
            value["architectures"] = serde_json::json!(["Qwen2ForSequenceClassification"]);
        });
        let message = parse(&classifier).unwrap_err().to_string();
        assert!(
            message.contains("architectures") && message.contains("Qwen2ForSequenceClassification"),
            "{message}"
        );
    }

    #[test]
    fn defaults_and_validation() {
        let text = edited(LLAMA31_8B, |value| {
            value.as_object_mut().unwrap().remove("num_key_value_heads");
        });
        assert_eq!(parse(&text).unwrap().num_key_value_heads, 32);
        let text = edited(LLAMA31_8B, |value| {
            value["num_key_value_heads"] = serde_json::json!(5);
        });
        assert!(
            parse(&text)
                .unwrap_err()
                .to_string()
                .contains("num_key_value_heads")
        );
        let text = edited(LLAMA31_8B, |value| {
            value["attention_bias"] = serde_json::json!(true);
        });
        let config = parse(&text).unwrap();
        assert!(config.qkv_bias && config.o_proj_bias);
        let text = edited(LLAMA31_8B, |value| {
            value.as_object_mut().unwrap().remove("hidden_size");
        });
        assert!(
            parse(&text)
                .unwrap_err()
                .to_string()
                .contains("missing required field `hidden_size`")
        );
    }
}
