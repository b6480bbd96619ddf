#!/usr/bin/env python3
"""The table of scripts/rft-experiment.sh: held-out figures of warm-up only, + pass@k RL and
+ mean RL, mean ± sample standard deviation over seeds, from OUT_DIR/s{seed}-{reward}-*.eval.json.

    rft_experiment_table.py OUT_DIR [--seeds 1 2 3] [--rewards sampled expected] [--k 4]
"""
import argparse
import json
import statistics
import sys
from pathlib import Path


def columns(k):
    return [
        ("valid", lambda m: m["format_validity"]),
        ("pass@1", lambda m: m["pass_at"][0]),
        (f"pass@{k}", lambda m: m["pass_at"][k - 1]),
        ("pass@n", lambda m: m["pass_at"][-1]),
        (f"maj@{k}", lambda m: m["maj_at"][k - 1]),
        ("greedy P(acc)", lambda m: m["greedy"]["acceptance_probability"]),
        (f"best-of-{k} P(acc)", lambda m: m["best_of"][k - 1]),
        ("Δ reliability/sample", lambda m: m["reliability_gain"]),
    ]


def load(path):
    try:
        return {m["model"]: m for m in json.loads(path.read_text())["models"]}
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, KeyError) as error:
        sys.exit(f"{path}: not an `arc-rec eval --json` report ({error})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--rewards", nargs="+", default=["sampled"])
    parser.add_argument("--k", type=int, default=4)
    args = parser.parse_args()
    cols = columns(args.k)
    for reward in args.rewards:
        # A run that did not finish has no evaluation: its row leaves that seed out (and says so).
        rows = {"warm-up only": {}, f"+ pass@{args.k} RL": {}, "+ mean RL": {}}
        for seed in args.seeds:
            passk = load(args.out / f"s{seed}-{reward}-pass.eval.json")
            mean = load(args.out / f"s{seed}-{reward}-mean.eval.json")
            if passk is not None:
                rows["warm-up only"][seed] = passk["base"]
                rows[f"+ pass@{args.k} RL"][seed] = passk["rl"]
            if mean is not None:
                rows["+ mean RL"][seed] = mean["rl"]
        if not any(rows.values()):
            print(f"reward {reward}: no finished seed in {args.out}")
            continue
        print(f"\nreward {reward} (mean ± sd over the seeds each model finished)\n")
        print("| model | seeds | " + " | ".join(name for name, _ in cols) + " |")
        print("|---" * (len(cols) + 2) + "|")
        for name, per_seed in rows.items():
            seeds = sorted(per_seed)
            if not seeds:
                print(f"| {name} | none | " + " | ".join("-" for _ in cols) + " |")
                continue
            cells = []
            for _, figure in cols:
                values = [figure(per_seed[s]) for s in seeds]
                spread = statistics.stdev(values) if len(values) > 1 else 0.0
                cells.append(f"{statistics.mean(values):.3f} ± {spread:.3f}")
            print(f"| {name} | {','.join(map(str, seeds))} | " + " | ".join(cells) + " |")
        best = cols[6]
        print(f"\n{best[0]} per seed (warm-up / pass@{args.k} / mean; - = run did not finish):")
        for s in args.seeds:
            cells = [f"{best[1](rows[n][s]):.3f}" if s in rows[n] else "-" for n in rows]
            print(f"  seed {s}: " + " / ".join(cells))


if __name__ == "__main__":
    main()
