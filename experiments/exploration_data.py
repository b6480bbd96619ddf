#!/usr/bin/env python3
"""Exploration data for the learned grader (issue 20): the logged decisions a platform collects by
showing a recommender model's own ideas, simulated on the synthetic world for
experiments/exploration-round.sh.

    exploration_data.py flip DATA OUT
    exploration_data.py augment DATA SAMPLES OUT TAG

`flip` writes DATA (an `arc-rec export --format arc` file) with its train and test splits swapped,
so that `arc-rec eval` on a run pointed at it (eval reports on test) samples the *train* prompts
(the held-out ones stay unseen: validation stays validation, test becomes train). `augment`
writes DATA plus one logged decision per well-formed sampled
completion of SAMPLES (`arc-rec eval --grader world --samples-out` on such a run: each sample's
`accepted` is the world's answer to it in its context): a copy of the prompt's first example line
with the sample's recommendation and the world's verdict, id `<first id>~TAG-<line>` (after every
original id of the context, so the prompt keeps its split and id). Prompt ids follow
`rft::dataset`: `org/config_id/n`, n counting the distinct user turns of one configuration in
order of first appearance (a user turn is the failure summary, the configuration and the user's
role and domain). Every sample must name a train prompt of DATA; anything else is an error.
"""
import copy
import json
import sys


def prompt_key(example):
    """What `RftDataset` groups examples by, up to formatting: (org, config, user turn's parts)."""
    context = example["context"]
    user = context.get("user_context") or {}
    if not isinstance(user, dict):
        user = {}
    return (
        example["org"],
        example["config_id"],
        context["failure_summary"],
        json.dumps(context["current_config"], sort_keys=True),
        bool(user),
        user.get("user_role"),
        user.get("domain"),
    )


def first_examples(lines):
    """Prompt id → the example line with the smallest id of that prompt (it sets the split)."""
    ids, first, per_config = {}, {}, {}
    for example in lines:
        key = prompt_key(example)
        if key not in ids:
            config = (example["org"], example["config_id"])
            per_config[config] = per_config.get(config, 0) + 1
            ids[key] = f"{example['org']}/{example['config_id']}/{per_config[config]}"
            first[ids[key]] = example
        elif example["id"] < first[ids[key]]["id"]:
            first[ids[key]] = example
    return first


def read_lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def write_lines(path, lines):
    with open(path, "w") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")


def flip(data, out):
    lines = read_lines(data)
    for line in lines:
        line["split"] = {"train": "test", "test": "train", "validation": "validation"}[line["split"]]
    write_lines(out, lines)
    return len(lines)


def augment(lines, samples, tag):
    """The decisions SAMPLES add to LINES, and what was skipped."""
    first = first_examples(lines)
    added, skipped = [], 0
    for number, sample in enumerate(samples, start=1):
        if sample.get("greedy") or not sample.get("format_valid"):
            skipped += 1
            continue
        source = first.get(sample["prompt_id"])
        if source is None:
            raise SystemExit(f"samples line {number}: prompt {sample['prompt_id']!r} is not in the data")
        if source["split"] != "train":
            raise SystemExit(
                f"samples line {number}: prompt {sample['prompt_id']!r} is a {source['split']} prompt; "
                "sample the train prompts (eval on a flipped copy of the data)"
            )
        recommendation = json.loads(sample["completion"])
        line = copy.deepcopy(source)
        line["id"] = f"{source['id']}~{tag}-{number}"
        line["diff_id"] = f"{source['diff_id']}~{tag}-{number}"
        line["recommendation"] = {
            "type": recommendation["type"],
            "diff": recommendation["diff"],
            "rationale": recommendation.get("rationale", ""),
            "llm_generated": True,
        }
        accepted = bool(sample["accepted"])
        line["outcome"]["approval_status"] = "approved" if accepted else "rejected"
        binary = 1.0 if accepted else -1.0
        line["reward"].update({"binary": binary, "acceptance": binary, "total": binary + 0.1})
        added.append(line)
    return added, skipped


def main(argv):
    if len(argv) == 3 and argv[0] == "flip":
        n = flip(argv[1], argv[2])
        print(f"{argv[2]}: {n} lines, splits swapped")
    elif len(argv) == 5 and argv[0] == "augment":
        data, samples, out, tag = argv[1:]
        lines = read_lines(data)
        added, skipped = augment(lines, read_lines(samples), tag)
        write_lines(out, lines + added)
        approved = sum(1 for line in added if line["outcome"]["approval_status"] == "approved")
        print(
            f"{out}: {len(lines)} lines of {data} and {len(added)} decisions on sampled ideas "
            f"({approved} approved, {len(added) - approved} rejected; {skipped} greedy or malformed "
            "samples skipped)"
        )
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
