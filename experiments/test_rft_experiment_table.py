#!/usr/bin/env python3
"""Tests of experiments/rft_experiment_table.py: the paired hierarchical bootstrap and the tables on
a hand-made work directory.

    python3 experiments/test_rft_experiment_table.py          (pure Python; numpy too when importable)
    .venv/bin/python -m pytest experiments/test_rft_experiment_table.py
"""
import json
import math
import os
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import rft_experiment_table as table  # noqa: E402

# Small resample counts keep the pure-Python path quick; the estimator is the same.
RESAMPLES = 2000


def engines():
    return [False] + ([True] if table.numpy is not None else [])


def noisy_grid(rng, seeds=5, prompts=40, seed_spread=0.05):
    """Acceptance-like figures with a per-seed level and per-prompt noise."""
    return [
        [
            min(1.0, max(0.0, level + rng.gauss(0.0, 0.15)))
            for _ in range(prompts)
        ]
        for level in (0.5 + rng.gauss(0.0, seed_spread) for _ in range(seeds))
    ]


def test_no_difference_gives_an_interval_around_zero():
    rng = random.Random(1)
    first = noisy_grid(rng)
    # The second model answers the same prompts equally well on average: each difference and its
    # negative, so the true mean difference is exactly 0.
    second = [[v + (0.1 if (i + j) % 2 else -0.1) for j, v in enumerate(row)] for i, row in enumerate(first)]
    for use_numpy in engines():
        point, low, high = table.paired_difference(
            first, second, resamples=RESAMPLES, use_numpy=use_numpy
        )
        assert abs(point) < 1e-12, point
        assert low < 0.0 < high, (low, high)
        assert high - low < 0.1, (low, high)


def test_a_constant_shift_gives_a_tight_interval_around_it():
    rng = random.Random(2)
    first = noisy_grid(rng)
    second = [[v - 0.07 for v in row] for row in first]
    for use_numpy in engines():
        point, low, high = table.paired_difference(
            first, second, resamples=RESAMPLES, use_numpy=use_numpy
        )
        assert abs(point - 0.07) < 1e-12
        assert abs(low - 0.07) < 1e-9 and abs(high - 0.07) < 1e-9, (low, high)


def test_a_paired_interval_is_narrower_than_the_levels_spread():
    # Two models share the prompts' difficulty: the difference's interval is much narrower than
    # either model's own, which is what pairing buys.
    rng = random.Random(3)
    first = noisy_grid(rng)
    second = [[v + 0.02 + rng.gauss(0.0, 0.01) for v in row] for row in first]
    means = table.resampled_means({"x": first}, resamples=RESAMPLES)
    own_low, own_high = table._interval(means["x"])
    _, low, high = table.paired_difference(second, first, resamples=RESAMPLES)
    assert 0.0 < low < 0.02 < high
    assert high - low < (own_high - own_low) / 5


def test_seeds_are_resampled_as_clusters():
    # No spread within a seed, a large one between seeds: a bootstrap of prompts alone would give a
    # zero-width interval; resampling seeds first shows the seeds' disagreement.
    shifts = [0.0, 0.1, 0.2, -0.1, 0.3]
    first = [[0.5 + shift] * 30 for shift in shifts]
    second = [[0.5] * 30 for _ in shifts]
    for use_numpy in engines():
        point, low, high = table.paired_difference(
            first, second, resamples=RESAMPLES, use_numpy=use_numpy
        )
        assert abs(point - 0.1) < 1e-12
        assert low < 0.05 and high > 0.15, (low, high)


def test_the_gap_closed_is_the_ratio_of_mean_differences():
    reference = [[0.4] * 10 for _ in range(3)]
    oracle = [[0.8] * 10 for _ in range(3)]
    model = [[0.6] * 10 for _ in range(3)]
    point, low, high = table.gap_closed(model, reference, oracle, resamples=200)
    assert abs(point - 0.5) < 1e-12 and abs(low - 0.5) < 1e-9 and abs(high - 0.5) < 1e-9
    # No gap to close: undefined, not a division by zero.
    point, low, high = table.gap_closed(model, oracle, oracle, resamples=200)
    assert all(v != v for v in (point, low, high))


def test_the_draws_are_reproducible():
    rng = random.Random(4)
    grid = noisy_grid(rng, seeds=3, prompts=7)
    for use_numpy in engines():
        table._draws.cache_clear()
        a = table.resampled_means({"x": grid}, resamples=50, use_numpy=use_numpy)
        table._draws.cache_clear()
        b = table.resampled_means({"x": grid}, resamples=50, use_numpy=use_numpy)
        assert a == b


def eval_report(models, prompts, baselines, n=16):
    """An `arc-rec eval --json` report with per-prompt figures: models maps a model name to a
    function of (prompt index) → greedy probability, the samples' best-of-k rising from it."""
    out = []
    for name, quality in models.items():
        per_prompt = []
        for i, pid in enumerate(prompts):
            q = quality(i)
            best_of = [min(1.0, q + 0.02 * (k - 1) ** 0.5) for k in range(1, n + 1)]
            pass_at = [min(1.0, 0.3 + 0.04 * k) for k in range(1, n + 1)]
            per_prompt.append(
                {
                    "id": pid,
                    "format_validity": 0.9,
                    "pass_at": pass_at,
                    "best_of": best_of,
                    "greedy_format_valid": True,
                    "greedy_accepted": q > 0.5,
                    "greedy_acceptance_probability": q,
                }
            )
        out.append(
            {
                "model": name,
                "format_validity": 0.9,
                "pass_at": [0.0] * n,
                "per_prompt": per_prompt,
            }
        )
    return {"grader": "world", "n": n, "models": out, "baselines": baselines}


def baselines(prompts):
    return {
        "per_prompt": [
            {
                "id": pid,
                "menu_size": 20,
                "logged_proposals": 2,
                "logged_heuristic": 0.35,
                "random_from_menu": 0.3,
                "menu_oracle": 0.75,
                "oracle_answer": "{}",
            }
            for pid in prompts
        ]
    }


def test_the_tables_on_a_hand_made_work_directory():
    prompts = [f"acme/c{i}/1" for i in range(12)]
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        for seed in (1, 2, 3):
            warm = lambda i, s=seed: 0.40 + 0.01 * (i % 5) + 0.01 * s
            (work / f"w{seed}.eval.json").write_text(
                json.dumps(eval_report({"warmup": warm}, prompts, baselines(prompts)))
            )
            (work / f"s{seed}-sampled-pass.eval.json").write_text(
                json.dumps(eval_report({"rl": lambda i, w=warm: w(i) + 0.05}, prompts, baselines(prompts)))
            )
            if seed != 3:  # seed 3's mean RL run did not finish
                (work / f"s{seed}-sampled-mean.eval.json").write_text(
                    json.dumps(eval_report({"rl": lambda i, w=warm: w(i) - 0.02}, prompts, baselines(prompts)))
                )
        # An eval written before per-prompt figures is skipped, not misread.
        (work / "s4-sampled-pass.eval.json").write_text(json.dumps({"models": [{"model": "rl"}]}))
        text = "\n".join(table.tables(work, [1, 2, 3, 4], "sampled", 4, resamples=300))
    print(text)
    rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert "| 1,2,3 | +0.050 [+0.050, +0.050]" in rows["pass@4 RL − warm-up only"]
    assert "| 1,2 | -0.020 [-0.020, -0.020]" in rows["mean RL − warm-up only"]
    assert "| 1,2 | +0.070 [+0.070, +0.070]" in rows["pass@4 RL − mean RL"]
    assert rows["menu oracle"].startswith("| menu oracle | 1,2,3 | 12 | - | 0.750 [0.750, 0.750]")
    assert "warm-up only − logged heuristic" in rows and "mean RL − menu oracle" in rows
    # Gap closed of best-of-4: warm-up's mean best-of-4 is 0.40 + mean(i % 5)/100 + 0.02 + 0.02·√3.
    gap = rows["pass@4 RL"]
    assert gap.startswith("| pass@4 RL | 1,2,3 | +"), gap
    assert "seed 3: " in text and " / -" in text.split("seed 3: ")[1].splitlines()[0]


def test_the_ablation_table_compares_each_lever_with_the_defaults():
    prompts = [f"acme/c{i}/1" for i in range(10)]
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        for seed in (1, 2):
            warm = lambda i, s=seed: 0.40 + 0.01 * (i % 3) + 0.01 * s
            # The warm-up the runs started from; seed 2's lever run gave up (no comparison there).
            (work / f"w{seed}.eval.json").write_text(
                json.dumps(eval_report({"warmup": lambda i, w=warm: w(i) - 0.01}, prompts, baselines(prompts)))
            )
            for run, shift in (("s{}-sampled-pass", 0.0), ("s{}-sampled-pass-mu", 0.03)):
                name = run.format(seed)
                (work / f"{name}.eval.json").write_text(
                    json.dumps(eval_report({"rl": lambda i, w=warm, d=shift: w(i) + d}, prompts, baselines(prompts)))
                )
                (work / name).mkdir()
                steps = [
                    {"event": "step", "phase": "rl", "step_seconds": 3.0, "kl_average": 0.1 * (seed + 1)}
                    for _ in range(40)
                ]
                (work / name / "metrics.jsonl").write_text("\n".join(map(json.dumps, steps)) + "\n{cut")
                if not (name.endswith("mu") and seed == 2):  # seed 2's lever run gave up
                    (work / name / "summary.json").write_text(json.dumps({"rollbacks": seed - 1}))
                    if seed == 2:  # wall time from run_id to summary.json: 3 minutes
                        (work / name / "run_id").write_text("rft-x")
                        os.utime(work / name / "run_id", (1000.0, 1000.0))
                        os.utime(work / name / "summary.json", (1180.0, 1180.0))
        text = "\n".join(table.ablation_table(work, [1, 2], "sampled", 4, ["mu", "none"], resamples=300))
    print(text)
    rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert rows["+ mu"].startswith("| + mu | 1,2 | 0.900 [0.900, 0.900] |"), rows["+ mu"]
    assert "| +0.030 [+0.030, +0.030] | +0.030 [+0.030, +0.030] | +0.000 [+0.000, +0.000] |" in rows["+ mu"]
    # Two runs of the lever, one finished (seed 1: no rollback, 2 minutes, KL 0.2 at the end).
    assert rows["+ mu"].endswith("| +0.040 [+0.040, +0.040] | 1/2 | 0 | 2.0 | 0.200 |"), rows["+ mu"]
    # The defaults: 2 minutes of steps (seed 1, no run_id) and 3 of wall time (seed 2).
    assert rows["pass@4 RL (defaults)"].endswith(
        "| - | - | - | +0.010 [+0.010, +0.010] | 2/2 | 1 | 2.5 | 0.250 |"
    ), rows["pass@4 RL (defaults)"]
    assert rows["+ none"] == "| + none | none | - | - | - | - | - | - | - | - | - | - |"


def test_spearman_ranks_with_ties_against_a_hand_computed_value():
    assert table.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert table.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    # Ranks (1, 2.5, 2.5, 4) and (1, 2, 3, 4): covariance 4.5 over sqrt(4.5 · 5).
    assert abs(table.spearman([1, 5, 5, 9], [1, 2, 3, 4]) - 4.5 / (4.5 * 5) ** 0.5) < 1e-12
    assert math.isnan(table.spearman([1, 1, 1], [1, 2, 3]))
    assert math.isnan(table.spearman([1, 2], [1, 2]))


def test_the_drift_table_sets_each_run_s_kl_against_its_gain_over_its_warm_up():
    prompts = [f"acme/c{i}/1" for i in range(6)]
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        for seed in (1, 2):
            warm = lambda i, s=seed: 0.40 + 0.01 * i + 0.02 * s
            (work / f"w{seed}.eval.json").write_text(
                json.dumps(eval_report({"warmup": warm}, prompts, baselines(prompts)))
            )
            # (run, gain over the warm-up, KL at the end, finished)
            for run, gain, kl, finished in (
                ("s{}-sampled-pass", 0.10 * seed, 0.5 * seed, True),
                ("s{}-sampled-mean", 0.01, 0.02 * seed, True),
                ("s{}-sampled-pass-kl", 0.03, 0.05, seed == 1),
            ):
                name = run.format(seed)
                (work / f"{name}.eval.json").write_text(
                    json.dumps(eval_report({"rl": lambda i, w=warm, d=gain: w(i) + d}, prompts, baselines(prompts)))
                )
                (work / name).mkdir()
                steps = [{"event": "step", "phase": "rl", "step_seconds": 1.0, "kl_average": kl}]
                (work / name / "metrics.jsonl").write_text(json.dumps(steps[0]) + "\n")
                if finished:
                    (work / name / "summary.json").write_text(json.dumps({"rollbacks": seed - 1}))
        text = "\n".join(table.drift_table(work, [1, 2], "sampled", 4, ["kl"]))
    print(text)
    rows = [line for line in text.splitlines() if line.startswith("| s")]
    # Sorted by KL; seed 2's unfinished lever run left out.
    assert rows == [
        "| s1-sampled-mean | 0 | 0.020 | +0.010 |",
        "| s2-sampled-mean | 1 | 0.040 | +0.010 |",
        "| s1-sampled-pass-kl | 0 | 0.050 | +0.030 |",
        "| s1-sampled-pass | 0 | 0.500 | +0.100 |",
        "| s2-sampled-pass | 1 | 1.000 | +0.200 |",
    ], rows
    # Gains ranked (1.5, 1.5, 3, 4, 5) against KL's (1, 2, 3, 4, 5).
    assert text.endswith("5 runs; Spearman's rank correlation of KL and gain: +0.97"), text

if __name__ == "__main__":
    tests = [(name, f) for name, f in sorted(globals().items()) if name.startswith("test_")]
    for name, test in tests:
        test()
        print(f"ok {name}")
    print(f"{len(tests)} tests passed ({'numpy and ' if table.numpy else ''}pure Python)")
