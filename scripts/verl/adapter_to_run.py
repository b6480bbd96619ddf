#!/usr/bin/env python3
"""Brings a PEFT adapter trained by verl back into arc-rec: checks it, then writes a run directory
that `arc-rec eval` and `arc-rec candidates` read like one `arc-rec train` wrote.

    scripts/verl/adapter_to_run.py --run WARMUP_RUN --adapter MERGED/lora_adapter --out NEW_RUN

WARMUP_RUN is the arc-rec run whose warm-up model verl trained on (its config.json gives the
data, the grader and the LoRA shape); MERGED/lora_adapter is what
`python -m verl.model_merger merge --backend fsdp --local_dir CKPT/global_step_N/actor
--target_dir MERGED` wrote. Refused, naming the field: `lora_alpha` 0 (verl's merger writes 0
without lora_train_meta.json, and vLLM would then silently cancel the adapter), a rank or alpha
other than the run's (arc-rec would scale the adapter differently from how it was trained),
target modules short of arc-rec's seven projections, DoRA/rsLoRA/modules_to_save, and any
weight whose key is not PEFT's `base_model.model.model.layers.N.(self_attn|mlp).X_proj.lora_A|B.weight`
(a wrong prefix loads in vLLM as a silent no-op). Standard library only.
"""

import argparse
import json
import os
import re
import shutil
import struct
import sys

ARC_REC_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
KEY = re.compile(
    r"^base_model\.model\.model\.layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)"
    r"\.lora_(A|B)\.weight$"
)
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"


class Refused(Exception):
    pass


def safetensors_keys(path):
    """The tensor names of a safetensors file (its JSON header), with their shapes."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        if length > 100 << 20:
            raise Refused(f"{path}: not a safetensors file (header of {length} bytes)")
        header = json.loads(f.read(length))
    return {name: meta["shape"] for name, meta in header.items() if name != "__metadata__"}


def check(adapter, run_config):
    config_path = os.path.join(adapter, CONFIG_FILE)
    weights_path = os.path.join(adapter, WEIGHTS_FILE)
    for path in (config_path, weights_path):
        if not os.path.isfile(path):
            raise Refused(f"--adapter {adapter}: no {os.path.basename(path)}")
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    r, alpha = config.get("r"), config.get("lora_alpha")
    if not alpha:
        raise Refused(
            f"{config_path}: lora_alpha is {alpha!r}; verl's model merger writes 0 when "
            "lora_train_meta.json is missing, and vLLM would serve the adapter as a no-op. "
            f"Set it to the value verl trained with (actor_rollout_ref.model.lora_alpha; arc-rec's run: {run_config['lora_alpha']})"
        )
    if r != run_config["lora_r"]:
        raise Refused(f"{config_path}: r is {r}, the run's --lora-r is {run_config['lora_r']}")
    if float(alpha) != float(run_config["lora_alpha"]):
        raise Refused(f"{config_path}: lora_alpha is {alpha}, the run's --lora-alpha is {run_config['lora_alpha']}")
    for field, bad in (("use_dora", True), ("use_rslora", True)):
        if config.get(field) is bad:
            raise Refused(f"{config_path}: {field} is true; arc-rec and vLLM take plain LoRA")
    if config.get("modules_to_save"):
        raise Refused(f"{config_path}: modules_to_save {config['modules_to_save']!r}; vLLM rejects it")
    targets = config.get("target_modules")
    if targets != "all-linear":
        names = [targets] if isinstance(targets, str) else list(targets or [])
        missing = [t for t in ARC_REC_TARGETS if t not in names]
        if missing:
            raise Refused(f"{config_path}: target_modules {targets!r} lacks {missing}")
    keys = safetensors_keys(weights_path)
    if not keys:
        raise Refused(f"{weights_path}: no tensors")
    for key, shape in sorted(keys.items()):
        if not KEY.match(key):
            raise Refused(f"{weights_path}: key {key!r} is not PEFT's name for a Qwen2/Llama projection")
        rank_axis = 0 if ".lora_A." in key else 1
        if len(shape) != 2 or shape[rank_axis] != r:
            raise Refused(f"{weights_path}: {key} has shape {shape}, not rank {r}")
    return len(keys)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="the arc-rec run whose warm-up model verl trained")
    parser.add_argument("--adapter", required=True, help="verl's merged PEFT adapter directory")
    parser.add_argument("--out", required=True, help="the run directory to write (must not exist)")
    args = parser.parse_args()
    try:
        with open(os.path.join(args.run, "config.json"), encoding="utf-8") as f:
            run_config = json.load(f)
    except (OSError, ValueError) as error:
        print(f"--run {args.run}: not a run directory of `arc-rec train` ({error})", file=sys.stderr)
        return 2
    try:
        tensors = check(args.adapter, run_config)
    except (Refused, OSError, ValueError) as error:
        print(f"refused: {error}", file=sys.stderr)
        return 1
    if os.path.exists(args.out):
        print(f"--out {args.out}: exists; choose a new directory", file=sys.stderr)
        return 2
    os.makedirs(args.out)
    for name in ("config.json", "grader.json"):
        if os.path.isfile(os.path.join(args.run, name)):
            shutil.copy2(os.path.join(args.run, name), os.path.join(args.out, name))
    warmup = os.path.join(args.run, "warmup-model")
    if os.path.isdir(warmup):
        os.symlink(os.path.abspath(warmup), os.path.join(args.out, "warmup-model"))
    os.makedirs(os.path.join(args.out, "adapter"))
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        shutil.copy2(os.path.join(args.adapter, name), os.path.join(args.out, "adapter", name))
    with open(os.path.join(args.out, "verl-adapter.json"), "w", encoding="utf-8") as f:
        json.dump({"adapter": os.path.abspath(args.adapter), "warmup_run": os.path.abspath(args.run)}, f, indent=2)
    print(
        f"{args.out}: the run of {args.run} with verl's adapter ({tensors} tensors); next: "
        f"arc-rec eval --run {args.out} --models warmup,rl; arc-rec candidates --run {args.out} ..."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
