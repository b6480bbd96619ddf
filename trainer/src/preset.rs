//! Preset checkpoints: `tiny`, a random-initialised Qwen2-architecture model in the exact Hugging
//! Face layout (config.json, model.safetensors, tokenizer files, generation_config.json), with a
//! byte-level BPE trained on the caller's corpus. Tests and CPU demos load it like a real Qwen2.5
//! checkpoint; transformers loads it too (scripts/reference/check_preset.py).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};
use safetensors::tensor::{Dtype, TensorView};
use serde_json::json;

use crate::generation_config::GENERATION_CONFIG_FILE;
use crate::tokenizer::{
    MODEL_CONFIG_FILE, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, TokenizerError, train_byte_level_bpe,
};

/// The weights file.
pub const WEIGHTS_FILE: &str = "model.safetensors";

/// Qwen2's padding/document separator; id 0 in the trained vocabulary.
pub const END_OF_TEXT: &str = "<|endoftext|>";
/// ChatML turn opener; id 1.
pub const IM_START: &str = "<|im_start|>";
/// ChatML turn closer and the eos of chat generation; id 2.
pub const IM_END: &str = "<|im_end|>";

/// ChatML as Qwen2.5 writes it (without Qwen's default system prompt and tool calling: the
/// recommender always sends its own system prompt). Unknown roles are rejected, not rendered.
pub const CHATML_TEMPLATE: &str = "{%- for message in messages %}
    {%- if message.role not in ['system', 'user', 'assistant'] %}
        {{- raise_exception('Only system, user and assistant messages are supported, got role ' + message.role) }}
    {%- endif %}
    {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
";

/// Initialisation scale of every linear and embedding weight (transformers' `initializer_range`).
const INIT_STD: f32 = 0.02;

/// The shape of a preset model (the Qwen2 config fields that decide tensor shapes).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PresetArchitecture {
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub intermediate_size: usize,
    pub max_position_embeddings: usize,
    pub rope_theta: f64,
    pub rms_norm_eps: f64,
    /// Tokens the BPE trainer aims for (special tokens included); a small corpus may give fewer.
    pub target_vocab_size: usize,
}

/// `tiny`: about a million parameters; a forward pass over a batch is milliseconds on a CPU,
/// yet it has everything a Qwen2.5 checkpoint has (GQA with 2 query heads per kv head, q/k/v
/// biases, SwiGLU MLP, RMSNorm, RoPE with θ = 1e6, tied embeddings).
pub const TINY: PresetArchitecture = PresetArchitecture {
    hidden_size: 128,
    num_hidden_layers: 4,
    num_attention_heads: 4,
    num_key_value_heads: 2,
    intermediate_size: 384,
    max_position_embeddings: 2048,
    rope_theta: 1_000_000.0,
    rms_norm_eps: 1e-6,
    target_vocab_size: 1024,
};

impl PresetArchitecture {
    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }

    /// Every tensor of the checkpoint, Hugging Face name and shape, in the order they are
    /// initialised (embedding, then layer by layer, then the final norm). No `lm_head.weight`:
    /// the embeddings are tied.
    pub fn tensor_shapes(&self, vocab_size: usize) -> Vec<(String, Vec<usize>)> {
        let hidden = self.hidden_size;
        let kv_width = self.num_key_value_heads * self.head_dim();
        let mut shapes = vec![(
            "model.embed_tokens.weight".to_owned(),
            vec![vocab_size, hidden],
        )];
        for layer in 0..self.num_hidden_layers {
            let prefix = format!("model.layers.{layer}");
            let attention = format!("{prefix}.self_attn");
            let mlp = format!("{prefix}.mlp");
            shapes.extend([
                (format!("{prefix}.input_layernorm.weight"), vec![hidden]),
                (format!("{attention}.q_proj.weight"), vec![hidden, hidden]),
                (format!("{attention}.q_proj.bias"), vec![hidden]),
                (format!("{attention}.k_proj.weight"), vec![kv_width, hidden]),
                (format!("{attention}.k_proj.bias"), vec![kv_width]),
                (format!("{attention}.v_proj.weight"), vec![kv_width, hidden]),
                (format!("{attention}.v_proj.bias"), vec![kv_width]),
                (format!("{attention}.o_proj.weight"), vec![hidden, hidden]),
                (
                    format!("{prefix}.post_attention_layernorm.weight"),
                    vec![hidden],
                ),
                (
                    format!("{mlp}.gate_proj.weight"),
                    vec![self.intermediate_size, hidden],
                ),
                (
                    format!("{mlp}.up_proj.weight"),
                    vec![self.intermediate_size, hidden],
                ),
                (
                    format!("{mlp}.down_proj.weight"),
                    vec![hidden, self.intermediate_size],
                ),
            ]);
        }
        shapes.push(("model.norm.weight".to_owned(), vec![hidden]));
        shapes
    }

    /// transformers' `config.json` for this architecture (Qwen2, classic top-level `rope_theta`).
    pub fn config_json(&self, vocab_size: usize, bos_id: u32, eos_id: u32) -> serde_json::Value {
        json!({
            "architectures": ["Qwen2ForCausalLM"],
            "attention_dropout": 0.0,
            "bos_token_id": bos_id,
            "eos_token_id": eos_id,
            "hidden_act": "silu",
            "hidden_size": self.hidden_size,
            "initializer_range": INIT_STD,
            "intermediate_size": self.intermediate_size,
            "max_position_embeddings": self.max_position_embeddings,
            "max_window_layers": self.num_hidden_layers,
            "model_type": "qwen2",
            "num_attention_heads": self.num_attention_heads,
            "num_hidden_layers": self.num_hidden_layers,
            "num_key_value_heads": self.num_key_value_heads,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_scaling": null,
            "rope_theta": self.rope_theta,
            "sliding_window": null,
            "tie_word_embeddings": true,
            "torch_dtype": "float32",
            "use_cache": true,
            "use_sliding_window": false,
            "vocab_size": vocab_size,
        })
    }
}

/// Why a preset could not be written.
#[derive(Debug, thiserror::Error)]
pub enum PresetError {
    /// The corpus had no text to train the tokenizer on.
    #[error("the tokenizer corpus is empty")]
    EmptyCorpus,
    /// The architecture does not split into whole heads.
    #[error("hidden_size {hidden} is not divisible by num_attention_heads {heads}")]
    Heads { hidden: usize, heads: usize },
    /// Training or saving the tokenizer failed.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// The trained vocabulary lacks a special token (cannot happen unless the trainer changes).
    #[error("the trained tokenizer has no {0} token")]
    MissingSpecialToken(&'static str),
    /// Serializing the weights failed.
    #[error("cannot serialize {path}: {message}")]
    Safetensors { path: PathBuf, message: String },
    /// Writing a file failed.
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// One file a preset wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenFile {
    pub name: &'static str,
    pub bytes: u64,
}

/// What [`write_checkpoint`] wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct WrittenCheckpoint {
    pub dir: PathBuf,
    pub files: Vec<WrittenFile>,
    /// Parameters in model.safetensors (tied head counted once).
    pub parameter_count: usize,
    /// Ids in the tokenizer, special tokens included (= config.json's vocab_size).
    pub vocab_size: usize,
    /// Lines of corpus the tokenizer was trained on.
    pub corpus_lines: usize,
    /// Wall time of BPE training.
    pub tokenizer_training: Duration,
}

/// Writes the `tiny` preset into `out_dir` (created if missing; existing files of the same
/// names are replaced). The tokenizer is trained on `corpus`; weights are drawn from `seed`.
/// The same seed and corpus give byte-identical files.
pub fn write_tiny_checkpoint<I, S>(
    out_dir: &Path,
    seed: u64,
    corpus: I,
) -> Result<WrittenCheckpoint, PresetError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    write_checkpoint(&TINY, out_dir, seed, corpus)
}

/// Writes a checkpoint of `architecture`; see [`write_tiny_checkpoint`].
pub fn write_checkpoint<I, S>(
    architecture: &PresetArchitecture,
    out_dir: &Path,
    seed: u64,
    corpus: I,
) -> Result<WrittenCheckpoint, PresetError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    if architecture.num_attention_heads == 0
        || !architecture
            .hidden_size
            .is_multiple_of(architecture.num_attention_heads)
    {
        return Err(PresetError::Heads {
            hidden: architecture.hidden_size,
            heads: architecture.num_attention_heads,
        });
    }
    let corpus: Vec<String> = corpus
        .into_iter()
        .map(|line| line.as_ref().to_owned())
        .filter(|line| !line.is_empty())
        .collect();
    if corpus.is_empty() {
        return Err(PresetError::EmptyCorpus);
    }
    let started = Instant::now();
    let tokenizer = train_byte_level_bpe(
        corpus.iter(),
        architecture.target_vocab_size,
        &[END_OF_TEXT, IM_START, IM_END],
    )?;
    let tokenizer_training = started.elapsed();
    let vocab_size = tokenizer.get_vocab_size(true);
    let id_of = |token: &'static str| {
        tokenizer
            .token_to_id(token)
            .ok_or(PresetError::MissingSpecialToken(token))
    };
    let end_of_text = id_of(END_OF_TEXT)?;
    let im_end = id_of(IM_END)?;

    std::fs::create_dir_all(out_dir).map_err(|source| PresetError::Write {
        path: out_dir.to_path_buf(),
        source,
    })?;
    let mut files = Vec::new();
    let mut write = |name: &'static str, bytes: &[u8]| {
        let path = out_dir.join(name);
        std::fs::write(&path, bytes).map_err(|source| PresetError::Write { path, source })?;
        files.push(WrittenFile {
            name,
            bytes: bytes.len() as u64,
        });
        Ok::<(), PresetError>(())
    };

    let config = architecture.config_json(vocab_size, end_of_text, im_end);
    write(MODEL_CONFIG_FILE, &pretty_json(&config))?;

    let (weights, parameter_count) = random_weights(architecture, vocab_size, seed, out_dir)?;
    write(WEIGHTS_FILE, &weights)?;

    let generation = json!({
        "bos_token_id": end_of_text,
        "do_sample": true,
        "eos_token_id": [im_end, end_of_text],
        "max_new_tokens": 256,
        "pad_token_id": end_of_text,
        "repetition_penalty": 1.0,
        "temperature": 0.7,
        "top_k": 20,
        "top_p": 0.8,
    });
    write(GENERATION_CONFIG_FILE, &pretty_json(&generation))?;

    let tokenizer_json = tokenizer
        .to_string(true)
        .map_err(|e| TokenizerError::Train(e.to_string()))?;
    write(TOKENIZER_FILE, tokenizer_json.as_bytes())?;

    let added_tokens_decoder: serde_json::Map<String, serde_json::Value> =
        [END_OF_TEXT, IM_START, IM_END]
            .into_iter()
            .filter_map(|token| {
                let id = tokenizer.token_to_id(token)?;
                Some((
                    id.to_string(),
                    json!({"content": token, "lstrip": false, "normalized": false,
                           "rstrip": false, "single_word": false, "special": true}),
                ))
            })
            .collect();
    let tokenizer_config = json!({
        "add_bos_token": false,
        "add_prefix_space": false,
        "added_tokens_decoder": added_tokens_decoder,
        "additional_special_tokens": [IM_START, IM_END],
        "bos_token": null,
        "chat_template": CHATML_TEMPLATE,
        "clean_up_tokenization_spaces": false,
        "eos_token": IM_END,
        "errors": "replace",
        "model_max_length": architecture.max_position_embeddings,
        "pad_token": END_OF_TEXT,
        "split_special_tokens": false,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": null,
    });
    write(TOKENIZER_CONFIG_FILE, &pretty_json(&tokenizer_config))?;

    Ok(WrittenCheckpoint {
        dir: out_dir.to_path_buf(),
        files,
        parameter_count,
        vocab_size,
        corpus_lines: corpus.len(),
        tokenizer_training,
    })
}

/// JSON as transformers writes it: sorted keys (serde_json's map is ordered), 2-space indent,
/// trailing newline.
fn pretty_json(value: &serde_json::Value) -> Vec<u8> {
    let mut text = serde_json::to_string_pretty(value).unwrap_or_default();
    text.push('\n');
    text.into_bytes()
}

/// The safetensors bytes of a freshly initialised model, and its parameter count. Linear and
/// embedding weights ~ N(0, 0.02) as transformers initialises Qwen2; RMSNorm weights = 1. Biases
/// are drawn from the same normal rather than zeroed (transformers zeroes them) so that a loader
/// that drops or misplaces the q/k/v biases changes the logits and fails its reference test.
fn random_weights(
    architecture: &PresetArchitecture,
    vocab_size: usize,
    seed: u64,
    out_dir: &Path,
) -> Result<(Vec<u8>, usize), PresetError> {
    let serialize_err = |message: String| PresetError::Safetensors {
        path: out_dir.join(WEIGHTS_FILE),
        message,
    };
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let normal = Normal::new(0.0f32, INIT_STD).map_err(|e| serialize_err(e.to_string()))?;
    let shapes = architecture.tensor_shapes(vocab_size);
    let mut buffers: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::with_capacity(shapes.len());
    let mut parameter_count = 0;
    for (name, shape) in shapes {
        let numel: usize = shape.iter().product();
        parameter_count += numel;
        let is_norm = name.ends_with("layernorm.weight") || name == "model.norm.weight";
        let mut bytes = Vec::with_capacity(numel * 4);
        for _ in 0..numel {
            let value = if is_norm {
                1.0
            } else {
                normal.sample(&mut rng)
            };
            bytes.extend_from_slice(&value.to_le_bytes());
        }
        buffers.push((name, shape, bytes));
    }
    let views = buffers
        .iter()
        .map(|(name, shape, bytes)| {
            TensorView::new(Dtype::F32, shape.clone(), bytes)
                .map(|view| (name.as_str(), view))
                .map_err(|e| serialize_err(format!("{name}: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    // transformers refuses safetensors files without format metadata.
    let metadata = HashMap::from([("format".to_owned(), "pt".to_owned())]);
    let bytes = safetensors::tensor::serialize(views, &Some(metadata))
        .map_err(|e| serialize_err(e.to_string()))?;
    Ok((bytes, parameter_count))
}
