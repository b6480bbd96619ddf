"""Cross-checks arc-rec's PEFT adapter files against Hugging Face PEFT itself.

Run by trainer/tests/it/peft_reference.rs (needs transformers and peft in .venv: scripts/setup.sh).

  make DIR    builds a tiny random Qwen2ForCausalLM (DIR/base), wraps it with get_peft_model
              (r=4, alpha=8, all seven projections), randomises lora_B (PEFT initialises it to
              zeros, which would hide a swapped A/B), saves the adapter with save_pretrained
              (DIR/peft_adapter) and the live lora_A/B values as JSON (DIR/peft_values.json),
              independent of the safetensors reader under test.
  check DIR ADAPTER VALUES MERGED
              loads ADAPTER (written by the Rust code) with PeftModel.from_pretrained onto
              DIR/base and checks every lora_A/B parameter equals VALUES exactly; then checks the
              Rust-merged checkpoint MERGED loads with plain transformers, equals PEFT's
              merge_and_unload() weight by weight, and gives the adapted model's logits.

Exits non-zero with a message on any mismatch.
"""

import json
import sys
from pathlib import Path

try:
    import peft
    import torch
    import transformers
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM
except ImportError as error:
    sys.exit(f"peft_roundtrip.py: {error}; run scripts/setup.sh to install transformers and peft into .venv")

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
RANK = 4
ALPHA = 8
# What PEFT adds around the base model's parameter names, and the adapter name it uses in memory.
PREFIX = "base_model.model."
ADAPTER_SUFFIXES = {".lora_A.default.weight": "lora_A", ".lora_B.default.weight": "lora_B"}


def lora_parameters(model):
    """{module: {"lora_A"|"lora_B": tensor}} from a PeftModel's named parameters."""
    found = {}
    for name, parameter in model.named_parameters():
        for suffix, which in ADAPTER_SUFFIXES.items():
            if name.endswith(suffix):
                module = name[len(PREFIX) : -len(suffix)]
                found.setdefault(module, {})[which] = parameter.detach()
    return found


def make(out: Path) -> None:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    base = Qwen2ForCausalLM(config).eval()
    base.save_pretrained(out / "base")
    lora = LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=TARGETS, task_type="CAUSAL_LM")
    model = get_peft_model(base, lora)
    with torch.no_grad():
        for pair in lora_parameters(model).values():
            pair["lora_B"].copy_(torch.randn_like(pair["lora_B"]) * 0.1)
    model.save_pretrained(out / "peft_adapter")
    values = {
        module: {which: {"shape": list(t.shape), "values": t.flatten().tolist()} for which, t in pair.items()}
        for module, pair in lora_parameters(model).items()
    }
    (out / "peft_values.json").write_text(json.dumps(values))
    print(f"made with transformers {transformers.__version__}, peft {peft.__version__}: {len(values)} adapted modules")


def check(out: Path, adapter: Path, values_path: Path, merged: Path) -> None:
    failures = []
    expected = json.loads(values_path.read_text())
    base = AutoModelForCausalLM.from_pretrained(out / "base", dtype=torch.float32).eval()
    model = PeftModel.from_pretrained(base, adapter).eval()
    config = model.peft_config["default"]
    if config.r != RANK or config.lora_alpha != ALPHA or set(config.target_modules) != set(TARGETS):
        failures.append(f"config read back as r={config.r} alpha={config.lora_alpha} targets={config.target_modules}")
    loaded = lora_parameters(model)
    if set(loaded) != set(expected):
        failures.append(f"adapted modules differ: PEFT {sorted(loaded)} vs written {sorted(expected)}")
    for module in sorted(set(loaded) & set(expected)):
        for which, spec in expected[module].items():
            want = torch.tensor(spec["values"], dtype=torch.float32).reshape(spec["shape"])
            got = loaded[module][which].float()
            if got.shape != want.shape or not torch.equal(got, want):
                failures.append(f"{module}.{which}: PEFT loaded a different tensor than the Rust side wrote")

    tokens = torch.randint(0, base.config.vocab_size, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        adapted_logits = model(tokens).logits
        reference = model.merge_and_unload().state_dict()
        ours_model = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32).eval()
        ours = ours_model.state_dict()
        merged_logits = ours_model(tokens).logits
    if set(ours) != set(reference):
        failures.append(f"merged checkpoint tensors differ: {sorted(set(ours) ^ set(reference))}")
    for name in sorted(set(ours) & set(reference)):
        diff = (ours[name] - reference[name]).abs().max().item()
        if diff > 1e-5:
            failures.append(f"merged {name}: max |ours - PEFT merge_and_unload| = {diff}")
    logit_diff = (merged_logits - adapted_logits).abs().max().item()
    if logit_diff > 1e-4:
        failures.append(f"merged checkpoint logits differ from the PEFT-adapted model's by {logit_diff}")

    if failures:
        sys.exit("peft_roundtrip.py check failed:\n  " + "\n  ".join(failures))
    print(f"ok: {len(loaded)} modules equal, merged weights equal, logits within {logit_diff:.2e}")


def main(argv) -> None:
    if len(argv) == 2 and argv[0] == "make":
        make(Path(argv[1]))
    elif len(argv) == 5 and argv[0] == "check":
        check(*(Path(a) for a in argv[1:]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
