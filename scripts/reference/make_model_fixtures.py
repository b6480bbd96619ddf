#!/usr/bin/env python3
"""Writes the tiny reference checkpoints the tch model is tested against.

Run from the repository root with the project's virtualenv (transformers 5.23.0, torch 2.11.0):

    .venv/bin/python scripts/reference/make_model_fixtures.py

It creates two random float32 checkpoints under trainer/tests/fixtures/:

* tiny-qwen2/  Qwen2 (q/k/v bias, GQA 4q/2kv, tied embeddings, rope_theta 1e6), saved SHARDED
               (model-0000x-of-0000y.safetensors + model.safetensors.index.json); its config.json is
               rewritten in the classic layout (top-level rope_theta, no rope_parameters), as the
               published Qwen2.5 checkpoints have it.
* tiny-llama/  Llama (llama3 RoPE scaling, GQA 4q/1kv, head_dim 32 != hidden/heads, untied lm_head),
               saved as one model.safetensors with transformers 5's rope_parameters layout.

Next to each, reference.json holds fixed prompts, transformers' full fp32 logits for each prompt run
alone (unpadded), and the 32-token greedy continuation of each prompt (eos disabled so all 32 run).
Weights use initializer_range 0.2 and randomised biases and norm weights so that a wrong bias, norm
or rotary layout shows up as a large logit error rather than hiding under near-zero weights.
"""

import json
import pathlib

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "trainer" / "tests" / "fixtures"
NEW_TOKENS = 32


def randomise_extras(model: torch.nn.Module, generator: torch.Generator) -> None:
    """Biases start at zero and norm weights at one; make both non-trivial."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.copy_(torch.randn(param.shape, generator=generator) * 0.2)
            elif name.endswith("norm.weight"):
                param.copy_(1.0 + torch.randn(param.shape, generator=generator) * 0.2)


def reference(model: torch.nn.Module, prompts: list[list[int]]) -> dict:
    """Unpadded logits and greedy continuations, one prompt at a time."""
    model.eval()
    # No eos: every continuation runs the full NEW_TOKENS.
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    logits, greedy = [], []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt], dtype=torch.long)
            out = model(input_ids=ids).logits[0].to(torch.float32)
            logits.append([[float(v) for v in row] for row in out])
            generated = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=NEW_TOKENS,
            )
            continuation = generated[0, len(prompt) :].tolist()
            assert len(continuation) == NEW_TOKENS, continuation
            greedy.append(continuation)
    return {"prompts": prompts, "logits": logits, "greedy": greedy, "new_tokens": NEW_TOKENS}


def write_reference(directory: pathlib.Path, data: dict) -> None:
    with open(directory / "reference.json", "w") as handle:
        json.dump(data, handle, separators=(",", ":"))
        handle.write("\n")


def prompts_for(vocab: int, generator: torch.Generator) -> list[list[int]]:
    return [
        torch.randint(0, vocab, (7,), generator=generator).tolist(),
        torch.randint(0, vocab, (12,), generator=generator).tolist(),
    ]


def make_qwen2() -> None:
    torch.manual_seed(1234)
    generator = torch.Generator().manual_seed(1234)
    config = Qwen2Config(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        initializer_range=0.2,
        bos_token_id=1,
        eos_token_id=2,
        torch_dtype="float32",
    )
    model = Qwen2ForCausalLM(config).to(torch.float32)
    randomise_extras(model, generator)
    directory = FIXTURES / "tiny-qwen2"
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.safetensors*"):
        old.unlink()
    model.save_pretrained(directory, max_shard_size="200KB")
    shards = sorted(directory.glob("model-*-of-*.safetensors"))
    assert len(shards) >= 2, f"expected a sharded save, got {shards}"
    # Classic layout, as Qwen2.5's published config.json: top-level rope_theta, rope_scaling null.
    config_path = directory / "config.json"
    saved = json.loads(config_path.read_text())
    rope = saved.pop("rope_parameters", None) or {}
    saved["rope_theta"] = rope.get("rope_theta", 1_000_000.0)
    saved["rope_scaling"] = None
    config_path.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")
    (directory / "generation_config.json").unlink(missing_ok=True)
    write_reference(directory, reference(model, prompts_for(config.vocab_size, generator)))


def make_llama() -> None:
    torch.manual_seed(5678)
    generator = torch.Generator().manual_seed(5678)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        # Short original context so the three llama3 bands (kept, smoothed, scaled) all occur
        # among head_dim 32's 16 frequencies.
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500_000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        tie_word_embeddings=False,
        attention_bias=False,
        initializer_range=0.2,
        bos_token_id=1,
        eos_token_id=[2, 3],
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    randomise_extras(model, generator)
    directory = FIXTURES / "tiny-llama"
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.safetensors*"):
        old.unlink()
    model.save_pretrained(directory)
    assert (directory / "model.safetensors").exists()
    (directory / "generation_config.json").unlink(missing_ok=True)
    write_reference(directory, reference(model, prompts_for(config.vocab_size, generator)))


if __name__ == "__main__":
    make_qwen2()
    make_llama()
