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
        rows = {"warm-up only": {}, f"+ pass@{args.k} RL": {}, "+ mean RL": {}}
        for seed in args.seeds:
            passk = load(args.out / f"s{seed}-{reward}-pass.eval.json")
            mean = load(args.out / f"s{seed}-{reward}-mean.eval.json")
            if passk is None or mean is None:
                continue
            rows["warm-up only"][seed] = passk["base"]
            rows[f"+ pass@{args.k} RL"][seed] = passk["rl"]
            rows["+ mean RL"][seed] = mean["rl"]
        seeds = sorted(rows["warm-up only"])
        if not seeds:
            print(f"reward {reward}: no finished seed in {args.out}")
            continue
        print(f"\nreward {reward}, seeds {seeds} (mean ± sd over seeds)\n")
        print("| model | " + " | ".join(name for name, _ in cols) + " |")
        print("|---" * (len(cols) + 1) + "|")
        for name, per_seed in rows.items():
            cells = []
            for _, figure in cols:
                values = [figure(per_seed[s]) for s in seeds]
                spread = statistics.stdev(values) if len(values) > 1 else 0.0
                cells.append(f"{statistics.mean(values):.3f} ± {spread:.3f}")
            print(f"| {name} | " + " | ".join(cells) + " |")
        best = cols[6]
        print(f"\n{best[0]} per seed (warm-up / pass@{args.k} / mean):")
        for s in seeds:
            print(f"  seed {s}: " + " / ".join(f"{best[1](rows[n][s]):.3f}" for n in rows))


if __name__ == "__main__":
    main()
