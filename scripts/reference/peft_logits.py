"""Logits of a base checkpoint plus a LoRA adapter, computed by Hugging Face PEFT itself.

Run by trainer/tests/it/lora_peft_logits.rs (needs transformers and peft in .venv: scripts/setup.sh).

  peft_logits.py JOBS OUT

JOBS is JSON: [{"base": DIR, "adapter": DIR, "prompts": [[token ids], ...]}, ...] (several jobs per
run, because starting Python with torch, transformers and peft costs more than the work). For each
job: loads the base with AutoModelForCausalLM (fp32, CPU), wraps it with
PeftModel.from_pretrained(adapter), and computes every prompt's logits (the prompt alone), first
with the adapter applied as PEFT applies it, then after merge_and_unload(). Writes OUT as JSON:
{"results": [{"adapter": [per prompt [len, vocab]], "merged": [same], "modules": n}, ...], versions}.

Exits non-zero when any adapter module PEFT created still has an all-zero lora_B (PEFT initialises
lora_B to zeros and only warns about keys missing from the file, so this catches an adapter file
whose tensors PEFT did not recognise), or when the adapter adapts nothing.
"""

import json
import sys
from pathlib import Path

try:
    import peft
    import torch
    import transformers
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
except ImportError as error:
    sys.exit(f"peft_logits.py: {error}; run scripts/setup.sh to install transformers and peft into .venv")


def logits_of(model, prompts):
    with torch.no_grad():
        return [model(input_ids=torch.tensor([prompt])).logits[0].float().tolist() for prompt in prompts]


def run(job):
    base = AutoModelForCausalLM.from_pretrained(job["base"], dtype=torch.float32).eval()
    model = PeftModel.from_pretrained(base, job["adapter"]).eval()
    lora_b = {name: p for name, p in model.named_parameters() if ".lora_B." in name}
    if not lora_b:
        sys.exit(f"peft_logits.py: PEFT created no LoRA modules from {job['adapter']}")
    untrained = sorted(name for name, p in lora_b.items() if not p.detach().abs().gt(0).any())
    if untrained:
        sys.exit(f"peft_logits.py: lora_B still all zeros (not loaded from {job['adapter']}?): {untrained}")
    adapted = logits_of(model, job["prompts"])
    merged = logits_of(model.merge_and_unload(), job["prompts"])
    return {"adapter": adapted, "merged": merged, "modules": len(lora_b)}


def main(argv) -> None:
    if len(argv) != 2:
        sys.exit(__doc__)
    jobs_path, out_path = (Path(a) for a in argv)
    results = [run(job) for job in json.loads(jobs_path.read_text())]
    report = {
        "results": results,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
    }
    out_path.write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1:])
