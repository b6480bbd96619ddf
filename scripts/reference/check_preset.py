"""Checks that transformers loads a preset written by `arc-rec model init` like any Qwen2 checkpoint.

    source scripts/env.sh
    cargo run -- model init --preset tiny --out /tmp/tiny
    python scripts/reference/check_preset.py /tmp/tiny

Loads the model with AutoModelForCausalLM and the tokenizer with AutoTokenizer, renders a
conversation with apply_chat_template, checks that the fast tokenizer and the raw tokenizers
library agree on the ids, runs a forward pass and a few greedy tokens, and prints what it saw.
Exits non-zero on the first mismatch. Not part of CI (it needs the Python stack).
"""

import json
import pathlib
import sys

import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig


def main(directory: str) -> None:
    path = pathlib.Path(directory)
    config = json.loads((path / "config.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(path)
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    generation = GenerationConfig.from_pretrained(path)
    parameters = sum(p.numel() for p in model.parameters())
    print(f"model: {type(model).__name__}, {parameters} parameters, dtype {model.dtype}")
    print(f"tied embeddings: {model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()}")
    print(f"tokenizer: {type(tokenizer).__name__}, {len(tokenizer)} tokens; config vocab_size {config['vocab_size']}")
    print(f"special: eos={tokenizer.eos_token!r} ({tokenizer.eos_token_id}), pad={tokenizer.pad_token!r} ({tokenizer.pad_token_id}), bos={tokenizer.bos_token!r}")
    print(f"generation_config: eos {generation.eos_token_id}, do_sample {generation.do_sample}, temperature {generation.temperature}, top_p {generation.top_p}, top_k {generation.top_k}")
    assert len(tokenizer) == config["vocab_size"], "tokenizer and embedding sizes differ"
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"

    messages = [
        {"role": "system", "content": "You are arc-rec."},
        {"role": "user", "content": "12 of 40 runs failed (mean reliability 0.70). Recommend one change."},
    ]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    print(f"chat template renders: {prompt!r}")
    expected = (
        "<|im_start|>system\nYou are arc-rec.<|im_end|>\n"
        "<|im_start|>user\n12 of 40 runs failed (mean reliability 0.70). Recommend one change.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert prompt == expected, "chat template output differs from ChatML"

    ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]
    raw_ids = Tokenizer.from_file(str(path / "tokenizer.json")).encode(prompt).ids
    assert ids == raw_ids, f"transformers {ids} != tokenizers {raw_ids}"
    assert tokenizer.decode(ids) == prompt
    print(f"prompt: {len(ids)} tokens, first ids {ids[:12]}")

    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
        generated = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)
    assert logits.shape == (1, len(ids), config["vocab_size"])
    assert torch.isfinite(logits).all()
    print(f"logits: shape {tuple(logits.shape)}, std {logits.std().item():.4f}")
    print(f"greedy continuation (random weights): {tokenizer.decode(generated[0, len(ids):])!r}")
    print("OK")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: check_preset.py CHECKPOINT_DIR")
    main(sys.argv[1])
