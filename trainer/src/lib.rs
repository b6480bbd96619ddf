//! The recommender language model and its RL fine-tuning; the only crate that links libtorch.
//!
//! - [`device`]: the device and dtype, chosen once (bf16 on CUDA, f32 on CPU).
//! - [`model`]: the Qwen2/Llama decoder read from Hugging Face checkpoints, LoRA-capable linear
//!   layers and the KV cache.
//! - [`generate`]: k samples per prompt over one prefill, with the sampled tokens' log-probs,
//!   optionally constrained by a [`grammar`].
//! - [`grammar`]: a JSON Schema compiled by llguidance into per-token masks over the checkpoint's
//!   tokenizer.
//! - [`logprobs`], [`train_step`], [`adamw`]: chunked token log-probs and the LoRA AdamW step,
//!   with optimizer state that checkpoints and resumes exactly.
//! - [`rl_loss`]: the policy-gradient loss over sampled completions (per-sequence aggregation,
//!   PPO clipping with clip-higher and k3 KL to the adapters-off reference).
//! - [`peft`]: adapters in PEFT's on-disk format, merging them into the base weights.
//! - [`chat_policy`]: a chat checkpoint (model, tokenizer, template) as the RL loop uses it, and
//!   packing prompt + completion sequences into a batch.
//! - [`tokenizer`], [`chat_template`], [`generation_config`]: a checkpoint's text side, as
//!   transformers reads it.
//! - [`preset`]: the random-initialised `tiny` checkpoint with its own trained tokenizer.
//! - [`bench_model`]: the measurements behind `arc-rec bench model`.
//!
//! The pass@k-aware RL loop builds on these; its advantages come from the `objectives` crate and
//! its graders from the root crate's `rft` module.

/// The libtorch bindings this crate is built on, for callers that handle its tensors.
pub use tch;

pub mod adamw;
pub mod bench_model;
pub mod chat_policy;
pub mod chat_template;
pub mod device;
pub mod generate;
pub mod generation_config;
pub mod grammar;
pub mod logprobs;
pub mod model;
pub mod peft;
pub mod preset;
pub mod rl_loss;
pub mod tokenizer;
pub mod train_step;
