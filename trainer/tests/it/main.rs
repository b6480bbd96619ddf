//! The trainer's integration tests, one binary (each binary links libtorch: one link and one
//! build instead of twelve): model loading against the reference fixtures, generation, LoRA and
//! PEFT round trips, gradient checkpointing, shared-prompt scoring, the grammar, the tiny preset, the bench harnesses.

mod common;
mod generate_sampling;
mod generate_throughput;
mod gradient_checkpointing;
mod grammar;
mod lora_bench_model;
mod lora_peft_logits;
mod lora_training;
mod model_loading;
mod model_reference;
mod peft_bench_reference;
mod peft_reference;
mod preset_tiny;
mod shared_prompt;
