//! The decoder-only causal LM (Qwen2 / Llama): embeddings, decoder layers, final norm, LM head, with
//! one forward serving training (all positions, gradients into LoRA) and cached generation.

use std::path::Path;

use tch::nn::VarStore;
use tch::{Device, Kind, TchError, Tensor};

use super::blocks::{AttentionMask, DecoderLayer, RmsNorm};
use super::cache::KvCache;
use super::checkpoint::{LoadError, LoadReport, load_variables};
use super::config::{Config, ConfigError};
use super::linear::{AdapterSwitch, Linear, LoraConfig, frozen, validate_lora};
use super::rope::RotaryEmbedding;
use crate::device::Runtime;

mod shared_prompt;
pub use shared_prompt::{PromptGroup, prompt_groups};

/// Why a model could not be built, loaded or run.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// config.json is missing, unreadable or unsupported.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The weights could not be loaded.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// libtorch failed.
    #[error("libtorch: {0}")]
    Torch(#[from] TchError),
    /// A forward argument has the wrong shape, kind or values.
    #[error("invalid model input: {0}")]
    Input(String),
    /// A cached forward would write past the cache's capacity.
    #[error("KV cache full: holds {len} of {capacity} positions, this call adds {adding}")]
    CacheFull {
        /// Positions already cached.
        len: i64,
        /// The cache's capacity.
        capacity: i64,
        /// Positions this call would add.
        adding: i64,
    },
    /// The LoRA configuration is unusable or adapters are already attached.
    #[error("LoRA: {0}")]
    Lora(String),
}

/// Which positions' logits a forward returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// `[b, t, vocab]`: every position (training, scoring).
    All,
    /// `[b, vocab]`: only the last column, i.e. the next-token distribution of every row when the
    /// batch is left-padded; avoids the `[b, t, vocab]` product on prefill.
    Last,
}

/// A Qwen2 or Llama causal LM whose parameters live in its own `VarStore` under the checkpoint's
/// tensor names (`model.layers.0.self_attn.q_proj.weight`, …). Base weights are frozen; LoRA
/// adapters, once attached, are the store's only trainable variables.
#[derive(Debug)]
pub struct CausalLm {
    var_store: VarStore,
    config: Config,
    runtime: Runtime,
    embed_tokens: Tensor,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Linear,
    rotary: RotaryEmbedding,
    adapters: AdapterSwitch,
    has_adapters: bool,
}

impl CausalLm {
    /// Declares every parameter (zero-filled, frozen) on `runtime`'s device and kind.
    pub fn new(config: Config, runtime: Runtime) -> Result<Self, ModelError> {
        let mut var_store = VarStore::new(runtime.device);
        var_store.set_kind(runtime.kind);
        let (embed_tokens, layers, norm, lm_head) = {
            let root = var_store.root();
            let model = &root / "model";
            let embed_tokens = frozen(
                &(&model / "embed_tokens"),
                "weight",
                &[config.vocab_size, config.hidden_size],
            )?;
            let layers = (0..config.num_hidden_layers)
                .map(|index| DecoderLayer::new(&model / "layers" / index, &config))
                .collect::<Result<Vec<_>, _>>()?;
            let norm = RmsNorm::new(&model / "norm", config.hidden_size, config.rms_norm_eps)?;
            let lm_head = if config.tie_word_embeddings {
                Linear::from_weight(embed_tokens.shallow_clone())
            } else {
                Linear::new(
                    &root / "lm_head",
                    config.hidden_size,
                    config.vocab_size,
                    false,
                )?
            };
            (embed_tokens, layers, norm, lm_head)
        };
        let rotary = RotaryEmbedding::new(&config.rope, config.head_dim, runtime.device);
        Ok(Self {
            var_store,
            config,
            runtime,
            embed_tokens,
            layers,
            norm,
            lm_head,
            rotary,
            adapters: AdapterSwitch::default(),
            has_adapters: false,
        })
    }

    /// Reads `dir/config.json` and loads the safetensors weights in `dir` (single or sharded),
    /// converting them to `runtime`'s kind on its device.
    pub fn from_pretrained(dir: &Path, runtime: Runtime) -> Result<(Self, LoadReport), ModelError> {
        let config = Config::from_file(&dir.join("config.json"))?;
        let tied = config.tie_word_embeddings;
        let model = Self::new(config, runtime)?;
        let report = load_variables(dir, &model.var_store.variables(), tied)?;
        Ok((model, report))
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Device and kind of every parameter.
    pub fn runtime(&self) -> Runtime {
        self.runtime
    }

    /// The store holding every parameter under its checkpoint name (and adapters under
    /// `<module>.lora_A.weight` / `<module>.lora_B.weight`); build optimizers from its trainable
    /// variables.
    pub fn var_store(&self) -> &VarStore {
        &self.var_store
    }

    /// Mutable access to the store, e.g. to load adapter weights into it.
    pub fn var_store_mut(&mut self) -> &mut VarStore {
        &mut self.var_store
    }

    /// Attaches a LoRA adapter (A kaiming-uniform, B zero, so the model is unchanged) to every
    /// projection `lora.target_modules` names, in every layer. Once per model.
    pub fn attach_lora(&mut self, lora: &LoraConfig) -> Result<(), ModelError> {
        validate_lora(lora).map_err(ModelError::Lora)?;
        if self.has_adapters {
            return Err(ModelError::Lora(
                "adapters are already attached to this model".into(),
            ));
        }
        let root = self.var_store.root();
        let layers = &root / "model" / "layers";
        for (index, layer) in self.layers.iter_mut().enumerate() {
            layer.attach_lora(&(&layers / index), lora, &self.adapters)?;
        }
        self.has_adapters = true;
        Ok(())
    }

    /// Makes every base weight trainable (`true`: full fine-tuning, the optimizer then sees them)
    /// or frozen again (`false`); LoRA adapters keep their own flag.
    pub fn set_base_trainable(&self, trainable: bool) {
        for (name, tensor) in self.var_store.variables() {
            if !(name.ends_with(".lora_A.weight") || name.ends_with(".lora_B.weight")) {
                let _ = tensor.set_requires_grad(trainable);
            }
        }
    }

    /// The switch shared by all adapters: `set_enabled(false)` makes forwards compute the frozen
    /// base model (the reference policy) until it is turned back on.
    pub fn adapters(&self) -> &AdapterSwitch {
        &self.adapters
    }

    /// An empty KV cache for `batch` rows and up to `capacity` positions, on the model's device.
    pub fn new_cache(&self, batch: i64, capacity: i64) -> Result<KvCache, ModelError> {
        Ok(KvCache::new(
            &self.config,
            batch,
            capacity,
            self.runtime.device,
            self.runtime.kind,
        )?)
    }

    /// Inference forward (adapter dropout off).
    ///
    /// * `input_ids` `[b, t]` i64: this call's tokens (the whole prompt on prefill, one token per row
    ///   when decoding).
    /// * `attention_mask` `[b, t]` (bool or 0/1 integers) for THIS call's tokens only, false on
    ///   padding; `None` means all real. Position ids count real tokens per row, so a left-padded
    ///   row yields the same logits as its unpadded prompt. Right padding also works for
    ///   [`Logits::All`].
    /// * `cache`: with one, this call attends to everything cached before it and appends its keys
    ///   and values; a cached forward always runs without autograd (the cache is for inference, and a
    ///   graph through it would grow with every step). Without a cache, a plain full forward.
    /// * `logits`: [`Logits::All`] gives `[b, t, vocab]`, [`Logits::Last`] gives `[b, vocab]`.
    ///
    /// Logits come in the runtime kind (bf16 on CUDA); upcast before a log-softmax if needed.
    pub fn forward(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        cache: Option<&mut KvCache>,
        logits: Logits,
    ) -> Result<Tensor, ModelError> {
        let hidden = match cache {
            Some(cache) => {
                tch::no_grad(|| self.hidden_states(input_ids, attention_mask, Some(cache), false))?
            }
            None => self.hidden_states(input_ids, attention_mask, None, false)?,
        };
        Ok(match logits {
            Logits::All => self.lm_head(&hidden),
            Logits::Last => {
                let last = hidden.size()[1] - 1;
                self.lm_head(&hidden.select(1, last))
            }
        })
    }

    /// Training forward: no cache, adapter dropout on, logits `[b, t, vocab]` for every position
    /// with gradients flowing into the adapters.
    pub fn forward_train(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
    ) -> Result<Tensor, ModelError> {
        let hidden = self.hidden_states(input_ids, attention_mask, None, true)?;
        Ok(self.lm_head(&hidden))
    }

    /// The final-norm hidden states `[b, t, hidden]`, for callers that apply [`Self::lm_head`]
    /// in chunks (log-probs without materialising `[b, t, vocab]`). Arguments as in
    /// [`Self::forward`]; `train` turns on adapter dropout.
    pub fn hidden_states(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        cache: Option<&mut KvCache>,
        train: bool,
    ) -> Result<Tensor, ModelError> {
        let inputs = self.prepare(input_ids, attention_mask, cache.as_deref())?;
        let seeds = self.dropout_seeds(train)?;
        let mut xs = Tensor::f_embedding(&self.embed_tokens, &inputs.ids, -1, false, false)?;
        for (index, layer) in self.layers.iter().enumerate() {
            if let Some(&seed) = seeds.get(index) {
                tch::manual_seed(seed);
            }
            let layer_cache = cache.as_deref().and_then(|cache| cache.layer(index));
            xs = layer.forward(
                &xs,
                &inputs.cos,
                &inputs.sin,
                &inputs.mask,
                layer_cache,
                train,
            );
        }
        if let Some(cache) = cache {
            cache.advance(&inputs.real);
        }
        Ok(self.norm.forward(&xs))
    }

    /// [`Self::hidden_states`] for training with gradient checkpointing of the decoder layers:
    /// the layers run without an autograd graph and only each layer's input is kept (one
    /// `[b, t, hidden]` tensor per layer instead of every activation inside it). The returned
    /// hidden states have a graph through the final norm down to a leaf standing for the last
    /// layer's output; after backpropagating into them, [`Self::backward_checkpointed`] carries
    /// the gradient on through the layers, recomputing each one's forward.
    pub fn checkpointed_hidden_states(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        train: bool,
    ) -> Result<(Tensor, CheckpointedLayers), ModelError> {
        let inputs = self.prepare(input_ids, attention_mask, None)?;
        let seeds = self.dropout_seeds(true)?;
        let mut layer_inputs = Vec::with_capacity(self.layers.len());
        let top = tch::no_grad(|| -> Result<Tensor, ModelError> {
            let mut xs = Tensor::f_embedding(&self.embed_tokens, &inputs.ids, -1, false, false)?;
            for (layer, &seed) in self.layers.iter().zip(&seeds) {
                tch::manual_seed(seed);
                let next = layer.forward(&xs, &inputs.cos, &inputs.sin, &inputs.mask, None, train);
                layer_inputs.push(xs);
                xs = next;
            }
            Ok(xs)
        })?
        .set_requires_grad(true);
        let hidden = self.norm.forward(&top);
        Ok((
            hidden,
            CheckpointedLayers {
                inputs,
                layer_inputs,
                seeds,
                top,
                train,
            },
        ))
    }

    /// Backpropagates the gradient that has reached the last layer's output (after a backward
    /// through the hidden states [`Self::checkpointed_hidden_states`] returned) through every
    /// layer and the embeddings, accumulating the parameters' gradients exactly as an ordinary
    /// backward would. A no-op when nothing reached it.
    pub fn backward_checkpointed(&self, layers: CheckpointedLayers) -> Result<(), ModelError> {
        let mut grad = layers.top.grad();
        if !grad.defined() {
            return Ok(());
        }
        let inputs = &layers.inputs;
        for ((layer, input), &seed) in self
            .layers
            .iter()
            .zip(&layers.layer_inputs)
            .zip(&layers.seeds)
            .rev()
        {
            let leaf = input.f_detach()?.set_requires_grad(true);
            tch::manual_seed(seed);
            let output = layer.forward(
                &leaf,
                &inputs.cos,
                &inputs.sin,
                &inputs.mask,
                None,
                layers.train,
            );
            (output * &grad).f_sum(Kind::Float)?.f_backward()?;
            grad = leaf.grad();
            if !grad.defined() {
                return Ok(());
            }
        }
        if self.embed_tokens.requires_grad() {
            let embedded = Tensor::f_embedding(&self.embed_tokens, &inputs.ids, -1, false, false)?;
            (embedded * &grad).f_sum(Kind::Float)?.f_backward()?;
        }
        Ok(())
    }

    /// In training, one seed per layer drawn from libtorch's generator: each layer's adapter
    /// dropout runs from its own seed, so a layer recomputed by gradient checkpointing draws the
    /// same masks, and the checkpointed and plain backward passes give the same gradients.
    fn dropout_seeds(&self, train: bool) -> Result<Vec<i64>, TchError> {
        if !train {
            return Ok(Vec::new());
        }
        (0..self.layers.len())
            .map(|_| {
                Tensor::f_randint(i64::MAX, [1], (Kind::Int64, Device::Cpu))?.f_int64_value(&[0])
            })
            .collect()
    }

    /// Ids on the device, positions' rotary tables and the attention mask of a forward.
    fn prepare(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        cache: Option<&KvCache>,
    ) -> Result<ForwardInputs, ModelError> {
        let device = self.runtime.device;
        let (batch, seq) = self.check_ids(input_ids)?;
        let input_ids = input_ids.f_to_device(device)?;
        let new_mask = match attention_mask {
            Some(mask) => {
                if mask.size() != [batch, seq] {
                    return Err(ModelError::Input(format!(
                        "attention_mask has shape {:?}, expected [{batch}, {seq}] like input_ids",
                        mask.size()
                    )));
                }
                Some(mask.f_to_device(device)?.f_to_kind(Kind::Bool)?)
            }
            None => None,
        };
        if let Some(cache) = cache {
            if cache.batch_size() != batch {
                return Err(ModelError::Input(format!(
                    "cache has {} rows, input_ids has {batch}",
                    cache.batch_size()
                )));
            }
            if !cache.fits(&self.config) {
                return Err(ModelError::Input(format!(
                    "cache was made for another model shape (layers, kv heads or head_dim differ from {} layers x {} kv heads x {})",
                    self.config.num_hidden_layers,
                    self.config.num_key_value_heads,
                    self.config.head_dim
                )));
            }
            if cache.len() + seq > cache.capacity() {
                return Err(ModelError::CacheFull {
                    len: cache.len(),
                    capacity: cache.capacity(),
                    adding: seq,
                });
            }
        }
        let past = cache.map_or(0, KvCache::len);
        let real = match &new_mask {
            Some(mask) => mask.shallow_clone(),
            None => Tensor::f_ones([batch, seq], (Kind::Bool, device))?,
        };

        // Position of a real token = real tokens before it in its row; padding gets 0 (it is
        // never attended to by real tokens, so its value does not matter).
        let start = match cache {
            Some(cache) => cache.next_positions().unsqueeze(1),
            None => Tensor::f_zeros([batch, 1], (Kind::Int64, device))?,
        };
        let positions = (start + real.f_cumsum(1, Kind::Int64)? - 1).clamp_min(0);
        let (cos, sin) = self.rotary.cos_sin(&positions, self.runtime.kind);

        let mask = if new_mask.is_none() && past == 0 {
            AttentionMask::Causal
        } else {
            let past_keys = match cache {
                Some(cache) => cache.key_mask(),
                None => Tensor::f_zeros([batch, 0], (Kind::Bool, device))?,
            };
            AttentionMask::Explicit(attention_mask_4d(&past_keys, &real, past)?)
        };

        Ok(ForwardInputs {
            ids: input_ids,
            real,
            cos,
            sin,
            mask,
        })
    }

    /// Projects hidden states `[…, hidden]` to logits `[…, vocab]`.
    pub fn lm_head(&self, hidden: &Tensor) -> Tensor {
        self.lm_head.forward(hidden, false)
    }

    /// Checks `input_ids` is `[b, t]` i64 with t ≥ 1 and every id inside the vocabulary.
    fn check_ids(&self, input_ids: &Tensor) -> Result<(i64, i64), ModelError> {
        let (batch, seq) = input_ids.size2().map_err(|_| {
            ModelError::Input(format!(
                "input_ids must be [batch, seq], got shape {:?}",
                input_ids.size()
            ))
        })?;
        if input_ids.kind() != Kind::Int64 {
            return Err(ModelError::Input(format!(
                "input_ids must be i64, got {:?}",
                input_ids.kind()
            )));
        }
        if batch == 0 || seq == 0 {
            return Err(ModelError::Input(format!(
                "input_ids is empty (shape [{batch}, {seq}])"
            )));
        }
        // One reduction (one device sync per call); the range is only computed for the message.
        let outside = input_ids
            .f_lt(0)?
            .f_logical_or(&input_ids.f_ge(self.config.vocab_size)?)?
            .f_any()?;
        if outside.int64_value(&[]) != 0 {
            let lowest = input_ids.f_min()?.int64_value(&[]);
            let highest = input_ids.f_max()?.int64_value(&[]);
            return Err(ModelError::Input(format!(
                "token ids must be in [0, {}), found range [{lowest}, {highest}]",
                self.config.vocab_size
            )));
        }
        Ok((batch, seq))
    }
}

/// What every layer of one forward reads.
#[derive(Debug)]
struct ForwardInputs {
    /// `[b, t]` on the model's device.
    ids: Tensor,
    /// `[b, t]` bool: real tokens (not padding).
    real: Tensor,
    cos: Tensor,
    sin: Tensor,
    mask: AttentionMask,
}

/// What [`CausalLm::backward_checkpointed`] needs of a checkpointed forward.
#[derive(Debug)]
pub struct CheckpointedLayers {
    inputs: ForwardInputs,
    /// Each layer's input, without a graph.
    layer_inputs: Vec<Tensor>,
    /// Each layer's dropout seed.
    seeds: Vec<i64>,
    /// The last layer's output as a leaf (its `.grad()` is where the backward continues).
    top: Tensor,
    train: bool,
}

/// `[b, 1, t, past + t]` bool: query i (absolute position past + i) may attend key j when key j is
/// a real token and j ≤ past + i. Each query may also attend to itself, so padding queries (whose
/// every earlier key is padding) get a finite softmax instead of NaN; real queries are unaffected
/// since their own key is real.
fn attention_mask_4d(past_keys: &Tensor, real: &Tensor, past: i64) -> Result<Tensor, TchError> {
    let device = real.device();
    let seq = real.size()[1];
    let keys_real = Tensor::f_cat(&[past_keys, real], 1)?;
    let total = past + seq;
    let query_at = Tensor::f_arange_start(past, total, (Kind::Int64, device))?.unsqueeze(1);
    let key_at = Tensor::f_arange(total, (Kind::Int64, device))?.unsqueeze(0);
    let causal = key_at.f_le_tensor(&query_at)?;
    let itself = key_at.f_eq_tensor(&query_at)?;
    let allowed = keys_real
        .unsqueeze(1)
        .f_logical_and(&causal.unsqueeze(0))?
        .f_logical_or(&itself.unsqueeze(0))?;
    Ok(allowed.unsqueeze(1))
}

/// Greedy decoding through the KV cache: one prefill over the (optionally left-padded) prompts,
/// then `max_new_tokens - 1` single-token steps. Returns the new tokens `[b, max_new_tokens]`; it
/// does not stop at eos (callers that need to cut at eos do so on the result).
pub fn greedy_decode(
    model: &CausalLm,
    prompt_ids: &Tensor,
    attention_mask: Option<&Tensor>,
    max_new_tokens: i64,
) -> Result<Tensor, ModelError> {
    if max_new_tokens <= 0 {
        return Err(ModelError::Input(format!(
            "max_new_tokens must be positive, got {max_new_tokens}"
        )));
    }
    tch::no_grad(|| {
        let (batch, prompt_len) = model.check_ids(prompt_ids)?;
        let mut cache = model.new_cache(batch, prompt_len + max_new_tokens)?;
        let logits = model.forward(prompt_ids, attention_mask, Some(&mut cache), Logits::Last)?;
        let mut next = logits.f_argmax(-1, false)?;
        let mut generated = vec![next.shallow_clone()];
        for _ in 1..max_new_tokens {
            let logits = model.forward(&next.unsqueeze(1), None, Some(&mut cache), Logits::Last)?;
            next = logits.f_argmax(-1, false)?;
            generated.push(next.shallow_clone());
        }
        Ok(Tensor::f_stack(&generated, 1)?.f_to_device(Device::Cpu)?)
    })
}
