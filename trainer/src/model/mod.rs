//! The recommender's decoder LM in tch: Hugging Face Qwen2/Llama config and safetensors loading,
//! the transformer blocks, a LoRA-capable linear layer and a KV cache for batched generation.
//!
//! Typical use:
//! ```ignore
//! let (mut model, _report) = CausalLm::from_pretrained(dir, runtime)?;
//! model.attach_lora(&LoraConfig::default())?;            // trainable adapters, base frozen
//! let logits = model.forward_train(&ids, Some(&mask))?;   // [b, t, vocab], grads into LoRA
//! model.adapters().set_enabled(false);                     // reference policy, same weights
//! let mut cache = model.new_cache(b, prompt_len + new_tokens)?;
//! let next = model.forward(&prompt, Some(&mask), Some(&mut cache), Logits::Last)?; // [b, vocab]
//! let cache = cache.repeat_interleave(k)?;                 // k samples share one prefill
//! ```

pub mod blocks;
pub mod cache;
mod causal_lm;
pub mod checkpoint;
pub mod config;
pub mod linear;
pub mod rope;

pub use cache::KvCache;
pub use causal_lm::{
    CausalLm, CheckpointedLayers, Logits, ModelError, PromptGroup, greedy_decode, prompt_groups,
};
pub use checkpoint::{LoadError, LoadReport};
pub use config::{Architecture, Config, ConfigError, Rope, RopeScaling};
pub use linear::{AdapterSwitch, LORA_TARGETS, Linear, LoraConfig};
