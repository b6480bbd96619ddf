//! The recommender language model and its RL fine-tuning; the only crate that links libtorch.
//!
//! This first slice proves the link: [`device::Runtime`] chooses the device and dtype once (bf16 on
//! CUDA, f32 on CPU) and reports what libtorch sees. The model, LoRA, sampling, graders and the
//! pass@k-aware RL loop build on it.

pub mod chat_template;
pub mod device;
pub mod generation_config;
pub mod preset;
pub mod tokenizer;
