"""Loads ``arc-rec export --format verl`` rows with verl's own ``RLHFDataset`` and a model's
tokenizer, as verl's trainer does, and checks that no row is dropped or changed:

    .venv-verl/bin/python integrations/verl/tests/check_dataset.py --rows ROWS.jsonl --model DIR

Prints one JSON line (rows, longest prompt in tokens). tests/it/verl.rs runs it on the tiny
model when .venv-verl exists.
"""

import argparse
import json
import sys
import tempfile


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", required=True)
    parser.add_argument("--model", required=True, help="checkpoint directory with the tokenizer")
    parser.add_argument("--max-prompt-length", type=int, default=4096)
    args = parser.parse_args()

    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset

    with open(args.rows, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    with tempfile.TemporaryDirectory() as cache:
        config = OmegaConf.create(
            {
                "cache_dir": cache,
                "max_prompt_length": args.max_prompt_length,
                "filter_overlong_prompts": True,
                "filter_overlong_prompts_workers": 1,
            }
        )
        dataset = RLHFDataset(args.rows, tokenizer, config)
        problems = []
        if len(dataset) != len(rows):
            problems.append(f"RLHFDataset kept {len(dataset)} of {len(rows)} rows")
        longest = 0
        for position in range(min(len(dataset), len(rows))):
            item, row = dataset[position], rows[position]
            if item["raw_prompt"] != row["prompt"]:
                problems.append(f"row {position}: raw_prompt {item['raw_prompt']!r} != {row['prompt']!r}")
            for key in ("prompt_id", "organization", "configuration_id", "current_configuration"):
                if item["extra_info"].get(key) != row["extra_info"][key]:
                    problems.append(f"row {position}: extra_info.{key} changed")
            if item["data_source"] != "arc-rec" or item["reward_model"] != row["reward_model"]:
                problems.append(f"row {position}: data_source or reward_model changed")
            ids = tokenizer.apply_chat_template(item["raw_prompt"], add_generation_prompt=True, tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "keys"):
                ids = ids["input_ids"]
            longest = max(longest, len(ids))
    for problem in problems[:20]:
        print(problem, file=sys.stderr)
    print(json.dumps({"rows": len(rows), "loaded": len(dataset), "longest_prompt_tokens": longest}))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
