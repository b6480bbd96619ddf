#!/usr/bin/env python3
"""Tables of experiments/selection-study.sh: each world-free checkpoint criterion's selection
regret against the world's own choice of checkpoint, and against keeping the last one.

    python3 experiments/selection_table.py OUT_DIR/worldN [--seeds 1 2 3]

For every seed directory sN: the selection points of sN/run/metrics.jsonl (each held-out logged
answer's log-probability under the checkpoint) and the world's figures of each checkpoint on the
test split (sN/points/step-STEP.eval.json). Criteria, each computed from the logged answers only:

- menu: per validation context with both verdicts, the policy's self-normalised acceptance over
  its logged answers (what `train --select-by menu-acceptance` uses);
- pairs: the share of (accepted, rejected) pairs ordered right (`--select-by pair-accuracy`);
- margin: over every validation answer, the mean change of log-probability since the warm-up on
  accepted answers minus that on rejected ones (`--select-by logprob-margin`, the default).

Rules: "argmax" keeps the checkpoint with the best figure; "gated" keeps it only when its gain
over the warm-up exceeds one standard error (else the warm-up), as `train` did before
2026-12-07; "gated-m" only when it exceeds z_m standard errors, z_m = Φ⁻¹(1 − α/m) for the best
of m RL points, α = 1 − Φ(1) (one standard error for one point), as `train` does now.
The truth of a checkpoint is its best-of-4 true acceptance on the test split (greedy beside it).
"""

import argparse
import json
import math
import random
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def selection_points(run):
    points = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        if record.get("event") == "selection":
            points.append(record)
    # A rollback rescored some points: the last line of each step wins.
    by_step = {p["step"]: p for p in points}
    return [by_step[s] for s in sorted(by_step)]


def mixed_contexts(point):
    contexts = defaultdict(list)
    for answer, logprob in zip(point["scored"]["answers"], point["scored"]["logprobs"]):
        contexts[answer["context"]].append((logprob, answer["accepted"]))
    return [c for _, c in sorted(contexts.items())
            if any(ok for _, ok in c) and not all(ok for _, ok in c)]


def menu_acceptance(judged):
    top = max(lp for lp, _ in judged)
    weights = [(math.exp(lp - top), ok) for lp, ok in judged]
    return sum(w for w, ok in weights if ok) / sum(w for w, _ in weights)


def pair_accuracy(judged):
    right, pairs = 0.0, 0
    for good, ok in judged:
        if not ok:
            continue
        for bad, ok2 in judged:
            if ok2:
                continue
            pairs += 1
            right += 1.0 if good > bad else 0.5 if good == bad else 0.0
    return right / pairs if pairs else 0.5


def per_context(point, figure):
    return [figure(judged) for judged in mixed_contexts(point)]


def mean(values):
    return sum(values) / len(values) if values else 0.0


def se(values):
    if len(values) < 2:
        return 0.0
    return statistics.stdev(values) / math.sqrt(len(values))


def paired_gain(point, warmup, figure):
    gains = [a - b for a, b in zip(per_context(point, figure), per_context(warmup, figure))]
    return mean(gains), se(gains)


def margin_gain(point, warmup):
    """Mean Δ log-prob since the warm-up on accepted answers minus that on rejected ones."""
    deltas = {True: [], False: []}
    for answer, now, then in zip(point["scored"]["answers"], point["scored"]["logprobs"],
                                 warmup["scored"]["logprobs"]):
        deltas[answer["accepted"]].append(now - then)
    gain = mean(deltas[True]) - mean(deltas[False])
    noise = math.sqrt(se(deltas[True]) ** 2 + se(deltas[False]) ** 2)
    return gain, noise


CRITERIA = {
    "menu": lambda p, w: paired_gain(p, w, menu_acceptance),
    "pairs": lambda p, w: paired_gain(p, w, pair_accuracy),
    "margin": margin_gain,
}


def truth(eval_path):
    report = json.loads(eval_path.read_text())
    model = report["models"][0]
    best_of = model["best_of"]
    return {
        "best4": best_of[min(4, len(best_of)) - 1],
        "greedy": model["greedy"]["acceptance_probability"],
        "valid": model["format_validity"],
        "logged": (report.get("baselines") or {}).get("logged_heuristic"),
    }


def seed_rows(seed_dir):
    points = selection_points(seed_dir / "run")
    figures = {}
    for point in points:
        path = seed_dir / "points" / f"step-{point['step']}.eval.json"
        if path.exists():
            figures[point["step"]] = truth(path)
    points = [p for p in points if p["step"] in figures]
    if not points or points[0]["rl_step"] != 0:
        return None
    return points, figures


SINGLE_POINT_LEVEL = 1 - statistics.NormalDist().cdf(1)


def noise_z(rl_points):
    """train's gate: the normal quantile of 1 − α/m, α = 1 − Φ(1) (src/training/selection.rs)."""
    return statistics.NormalDist().inv_cdf(1 - SINGLE_POINT_LEVEL / max(rl_points, 1))


GATES = {"argmax": None, "gated": lambda m: 1.0, "gated-m": noise_z}


def choose(points, criterion, gate):
    warmup = points[0]
    best, best_gain, best_noise = warmup, 0.0, 0.0
    for point in points[1:]:
        gain, noise = CRITERIA[criterion](point, warmup)
        if gain > best_gain:
            best, best_gain, best_noise = point, gain, noise
    z = GATES[gate]
    if z is not None and not (best_gain > z(len(points) - 1) * best_noise and best_gain > 0):
        return warmup
    return best


def interval(values, resamples=10000, seed=1):
    rng = random.Random(seed)
    n = len(values)
    if n < 2:
        return (float("nan"), float("nan"))
    means = sorted(mean([values[rng.randrange(n)] for _ in range(n)]) for _ in range(resamples))
    return means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("world_dir", type=Path)
    parser.add_argument("--seeds", nargs="*", type=int)
    args = parser.parse_args(argv)
    seeds = args.seeds or sorted(int(p.name[1:]) for p in args.world_dir.glob("s*") if p.name[1:].isdigit())
    rows = {}
    for seed in seeds:
        found = seed_rows(args.world_dir / f"s{seed}")
        if found is None:
            print(f"seed {seed}: no evaluated selection points yet", file=sys.stderr)
            continue
        rows[seed] = found
    if not rows:
        print("no seed with evaluated selection points", file=sys.stderr)
        return 1

    print("best-of-4 true acceptance on the test split per checkpoint (RL step: value); "
          "* the world's best, criteria's picks after it")
    policies = [("last", None, None), ("world's best", None, None)]
    policies += [(f"{c} {g}", c, g) for c in CRITERIA for g in GATES]
    picked = defaultdict(dict)
    for seed, (points, figures) in rows.items():
        best4 = {p["step"]: figures[p["step"]]["best4"] for p in points}
        oracle = max(points, key=lambda p: best4[p["step"]])
        picked["last"][seed] = points[-1]
        picked["world's best"][seed] = oracle
        for name, criterion, gated in policies[2:]:
            picked[name][seed] = choose(points, criterion, gated)
        cells = " ".join(f"{p['rl_step']}:{best4[p['step']]:.3f}{'*' if p is oracle else ''}" for p in points)
        picks = ", ".join(f"{name} {picked[name][seed]['rl_step']}" for name, _, _ in policies[2:])
        print(f"seed {seed}: {cells}  | {picks}")
    print()
    print("| keeps | seeds | best-of-4 | − warm-up [95%] | regret vs world's best | − last | greedy − warm-up | worst seed − warm-up | − logged [95%] | validity (min) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, _, _ in policies:
        chosen = picked[name]
        values, gains, regrets, vs_last, greedy, vs_logged, valid = [], [], [], [], [], [], []
        for seed, (points, figures) in rows.items():
            step = chosen[seed]["step"]
            f, w = figures[step], figures[points[0]["step"]]
            values.append(f["best4"])
            gains.append(f["best4"] - w["best4"])
            regrets.append(figures[picked["world's best"][seed]["step"]]["best4"] - f["best4"])
            vs_last.append(f["best4"] - figures[points[-1]["step"]]["best4"])
            greedy.append(f["greedy"] - w["greedy"])
            if f["logged"] is not None:
                vs_logged.append(f["best4"] - f["logged"])
            valid.append(f["valid"])
        low, high = interval(gains)
        logged_cell = "–"
        if len(vs_logged) == len(values):
            l_low, l_high = interval(vs_logged)
            logged_cell = f"{mean(vs_logged):+.3f} [{l_low:+.3f}, {l_high:+.3f}]"
        print(f"| {name} | {len(values)} | {mean(values):.3f} | {mean(gains):+.3f} [{low:+.3f}, {high:+.3f}] | "
              f"{mean(regrets):.3f} | {mean(vs_last):+.3f} | {mean(greedy):+.3f} | {min(gains):+.3f} | "
              f"{logged_cell} | {min(valid):.3f} |")
    logged = [figures[points[0]["step"]]["logged"] for points, figures in rows.values()]
    if all(v is not None for v in logged):
        print(f"\nlogged heuristic on the same test prompts: {mean(logged):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
