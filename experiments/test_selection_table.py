#!/usr/bin/env python3
"""Tests of experiments/selection_table.py on a hand-made study directory.

    python3 experiments/test_selection_table.py
"""
import io
import json
import math
import sys
import tempfile
from contextlib import redirect_stdout
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import selection_table as table  # noqa: E402


def point(step, rl_step, shares):
    """A selection line whose contexts each hold an accepted answer with probability share
    against one rejected answer."""
    answers, logprobs = [], []
    for context, share in enumerate(shares):
        for accepted, weight in ((True, share), (False, 1 - share)):
            answers.append({"context": context, "accepted": accepted})
            logprobs.append(math.log(max(weight, 1e-300)))
    return {"event": "selection", "step": step, "rl_step": rl_step,
            "scored": {"answers": answers, "logprobs": logprobs}}


def evaluation(best4, greedy):
    return {"split": "test", "models": [{"model": "rl", "prompts": 10, "format_validity": 1.0,
            "best_of": [best4 - 0.1, best4 - 0.05, best4 - 0.02, best4],
            "greedy": {"acceptance_probability": greedy}}],
            "baselines": {"logged_heuristic": 0.5}}


def write_seed(world, seed, points, truths):
    run = world / f"s{seed}" / "run"
    (world / f"s{seed}" / "points").mkdir(parents=True)
    run.mkdir(parents=True)
    lines = [json.dumps({"event": "step", "step": 0})] + [json.dumps(p) for p in points]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    for p, (best4, greedy) in zip(points, truths):
        path = world / f"s{seed}" / "points" / f"step-{p['step']}.eval.json"
        path.write_text(json.dumps(evaluation(best4, greedy)))


def main():
    with tempfile.TemporaryDirectory() as tmp:
        world = Path(tmp)
        # Seed 1: the criterion rises at RL step 10 (the world's best too), then falls.
        write_seed(world, 1, [point(100, 0, [0.4, 0.5, 0.6]), point(110, 10, [0.7, 0.8, 0.9]),
                              point(120, 20, [0.2, 0.3, 0.4])],
                   [(0.50, 0.40), (0.60, 0.45), (0.45, 0.30)])
        # Seed 2: the criterion only falls; the world's best is RL step 20.
        write_seed(world, 2, [point(100, 0, [0.6, 0.6]), point(110, 10, [0.5, 0.5]),
                              point(120, 20, [0.4, 0.4])],
                   [(0.50, 0.40), (0.52, 0.41), (0.58, 0.42)])
        rows = {seed: table.seed_rows(world / f"s{seed}") for seed in (1, 2)}
        points1, _ = rows[1]
        assert [p["rl_step"] for p in points1] == [0, 10, 20]
        assert table.choose(points1, "menu", "argmax")["rl_step"] == 10
        assert table.choose(points1, "menu", "gated")["rl_step"] == 10
        assert table.choose(points1, "menu", "gated-m")["rl_step"] == 10
        points2, _ = rows[2]
        assert table.choose(points2, "menu", "argmax")["rl_step"] == 0
        assert table.choose(points2, "pairs", "gated")["rl_step"] == 0
        # train's gate: one standard error for one point, more for the best of several.
        assert abs(table.noise_z(1) - 1.0) < 1e-9
        assert abs(table.noise_z(6) - 1.936) < 1e-3
        # A gain of 1.73 standard errors (per-context gains 0.3, 0, 0.3, 0) passes one standard
        # error but not the best of six points' 1.94.
        noisy = [point(100, 0, [0.5] * 4), point(110, 10, [0.8, 0.5, 0.8, 0.5])]
        noisy += [point(110 + 10 * i, 10 * i, [0.4] * 4) for i in range(2, 7)]
        assert table.choose(noisy[:2], "menu", "gated-m")["rl_step"] == 10
        assert table.choose(noisy, "menu", "gated")["rl_step"] == 10
        assert table.choose(noisy, "menu", "gated-m")["rl_step"] == 0
        # Margin: seed 1's step 10 raised accepted answers and lowered rejected ones.
        gain, noise = table.margin_gain(points1[1], points1[0])
        assert gain > 0 and noise >= 0
        out = io.StringIO()
        with redirect_stdout(out):
            assert table.main([str(world)]) == 0
        text = out.getvalue()
        # The world's best regrets nothing; the last checkpoint's regret is (0.60 − 0.45 +
        # 0.58 − 0.58) / 2; menu argmax keeps 10 and 0: regrets 0 and 0.08, mean 0.04.
        lines = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
        assert "| 0.000 |" in lines["world's best"], text
        assert "| 0.075 |" in lines["last"], text
        assert "| 0.040 |" in lines["menu argmax"], text
        assert "logged heuristic on the same test prompts: 0.500" in text
    print("selection_table: ok")


if __name__ == "__main__":
    main()
