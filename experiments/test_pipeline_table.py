#!/usr/bin/env python3
"""Tests of experiments/pipeline_table.py on hand-made `bench pipeline --json` reports.

    python3 experiments/test_pipeline_table.py
"""
import json
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pipeline_table as table  # noqa: E402

table.RESAMPLES = 2000


def arm(name, last, share=0.0, model=None, heuristic=None):
    kind = "random" if name.startswith("random") else "thompson"
    return {"arm": name, "kind": kind, "last_quarter": last, "cold_start": last / 2, "errors": 0,
            "model_share_last_quarter": share, "model_pick_acceptance": model,
            "heuristic_pick_acceptance": heuristic}


def write_reports(directory, rng, gain=0.05):
    """Five model seeds × three traffic seeds; the model arm is (a) + gain + noise."""
    for m in range(1, 6):
        level = rng.gauss(0.0, 0.01)
        for t in range(1, 4):
            base = 0.5 + rng.gauss(0.0, 0.01)
            report = {"arms": [
                arm("random heuristic order", 0.25),
                arm("(a) heuristics", base, heuristic=base),
                arm("+ rl", base + gain + level + rng.gauss(0.0, 0.005), 0.5, 0.6, 0.5),
            ]}
            (Path(directory) / f"s{m}-t{t}.json").write_text(json.dumps(report))


def test_means_ratios_and_paired_intervals():
    with tempfile.TemporaryDirectory() as d:
        write_reports(d, random.Random(1))
        (Path(d) / "notes.json").write_text("{}")  # not a report: ignored
        rows = {r["arm"]: r for r in table.table(table.load(d), "last_quarter")}
        rl = rows["+ rl"]
        assert rl["cells"] == 15 and rl["seeds"] == 5
        point, lo, hi = rl["vs_a"]
        assert abs(point - 0.05) < 0.015 and lo < point < hi, rl["vs_a"]
        assert lo > 0.0
        assert abs(rows["random heuristic order"]["x_random"] - 1.0) < 1e-12
        assert abs(rl["x_random"] - rl["acceptance"] / 0.25) < 1e-12
        diff, lo, hi = rl["model_minus_heuristic_picks"]
        assert abs(diff - 0.1) < 1e-9 and lo <= diff <= hi
        assert rows["(a) heuristics"]["vs_a"] is None
        assert rows["(a) heuristics"]["model_minus_heuristic_picks"] is None


def test_no_gain_gives_an_interval_around_zero():
    with tempfile.TemporaryDirectory() as d:
        write_reports(d, random.Random(2), gain=0.0)
        rl = {r["arm"]: r for r in table.table(table.load(d), "last_quarter")}["+ rl"]
        _, lo, hi = rl["vs_a"]
        assert lo < 0.0 < hi, rl["vs_a"]


def test_against_pairs_the_same_arm_over_the_shared_cells():
    with tempfile.TemporaryDirectory() as first, tempfile.TemporaryDirectory() as second:
        # The same traffic (seeded alike), a ranker that gains 0.03 more on the model arm.
        write_reports(first, random.Random(3), gain=0.08)
        write_reports(second, random.Random(3), gain=0.05)
        (Path(second) / "s1-t1.json").unlink()  # a cell only one side has: left out
        rows = {r["arm"]: r for r in table.against(table.load(first), table.load(second),
                                                   "last_quarter")}
        assert "random heuristic order" not in rows  # does not depend on the ranker
        assert rows["+ rl"]["cells"] == 14
        point, lo, hi = rows["+ rl"]["acceptance"]
        assert abs(point - 0.03) < 1e-9 and lo <= point <= hi, rows["+ rl"]["acceptance"]
        assert rows["(a) heuristics"]["acceptance"][0] == 0.0
        assert rows["(a) heuristics"]["model_picks"] is None


def test_reasons_weight_acceptance_by_picks_and_pair_what_was_displaced():
    def reasons(mean_picks, mean_acc):
        empty = {"picks": 0, "acceptance": None, "alternative_acceptance": None, "overrating": None}
        return {"mean": {"picks": mean_picks, "acceptance": mean_acc,
                         "alternative_acceptance": mean_acc - 0.1, "overrating": 0.05},
                "draw": {"picks": 10, "acceptance": 0.4, "alternative_acceptance": 0.5,
                         "overrating": 0.0},
                "uniform": empty}
    with tempfile.TemporaryDirectory() as d:
        for m, (picks, acc) in enumerate([(100, 0.6), (300, 0.5)], start=1):
            report = {"arms": [arm("random heuristic order", 0.25), arm("(a) heuristics", 0.5),
                               {**arm("+ rl", 0.5, 0.5, 0.5, 0.5),
                                "model_picks_by_reason": reasons(picks, acc)}]}
            (Path(d) / f"s{m}-t1.json").write_text(json.dumps(report))
        rows = {r["arm"]: r for r in table.table(table.load(d), "last_quarter")}
        by = rows["+ rl"]["model_picks_by_reason"]
        assert by["mean"]["picks"] == 200
        assert abs(by["mean"]["acceptance"] - (100 * 0.6 + 300 * 0.5) / 400) < 1e-12
        point, lo, hi = by["mean"]["vs_displaced"]
        assert abs(point - 0.1) < 1e-9 and abs(lo - 0.1) < 1e-9 and abs(hi - 0.1) < 1e-9
        assert abs(by["draw"]["vs_displaced"][0] + 0.1) < 1e-9
        assert by["uniform"] == {"picks": 0, "acceptance": None, "vs_displaced": None}
        # Reports from before the trace (no field): no breakdown, not an error.
        assert rows["(a) heuristics"]["model_picks_by_reason"] is None


def test_paired_rounds_split_the_gain_over_a_by_source():
    with tempfile.TemporaryDirectory() as d:
        # Cell 1: 40 model rounds at -0.05, 60 heuristic rounds at +0.01; cell 2: 20 at -0.10,
        # 80 at 0.0, both of a 100-round last quarter.
        for m, (mr, mg, hr, hg) in enumerate([(40, -0.05, 60, 0.01), (20, -0.10, 80, 0.0)], 1):
            report = {"last_quarter_rounds": 100,
                      "arms": [arm("random heuristic order", 0.25), arm("(a) heuristics", 0.5),
                               {**arm("+ rl", 0.5, 0.5, 0.5, 0.5),
                                "against_heuristics_arm": {"model_rounds": mr, "model_gain": mg,
                                                           "heuristic_rounds": hr,
                                                           "heuristic_gain": hg}}]}
            (Path(d) / f"s{m}-t1.json").write_text(json.dumps(report))
        rows = {r["arm"]: r for r in table.table(table.load(d), "last_quarter")}
        p = rows["+ rl"]["against_heuristics_arm"]
        assert p["model"]["rounds"] == 30 and p["heuristic"]["rounds"] == 70
        assert abs(p["model"]["gain"][0] - (-0.075)) < 1e-12
        # Parts: cell 1 -0.02 and +0.006, cell 2 -0.02 and 0.0.
        assert abs(p["model"]["contribution"][0] - (-0.02)) < 1e-12
        assert abs(p["heuristic"]["contribution"][0] - 0.003) < 1e-12
        # Arms without the field (reports from before it, or (a) itself): no split.
        assert rows["(a) heuristics"]["against_heuristics_arm"] is None


def test_prior_quality_is_averaged_over_the_cells_that_have_it():
    with tempfile.TemporaryDirectory() as d:
        qualities = [
            {"pairs": 10, "mean_prior": 0.4, "mean_truth": 0.3, "correlation": 0.2,
             "concordance": 0.6, "prior_first_truth": 0.35, "best_truth": 0.5},
            {"pairs": 10, "mean_prior": 0.2, "mean_truth": 0.3, "correlation": None,
             "concordance": 0.4, "prior_first_truth": 0.25, "best_truth": 0.4},
        ]
        for m, q in enumerate(qualities, 1):
            report = {"last_quarter_rounds": 100,
                      "arms": [arm("random heuristic order", 0.25), arm("(a) heuristics", 0.5),
                               {**arm("+ rl", 0.5, 0.5, 0.5, 0.5), "prior_quality": q}]}
            (Path(d) / f"s{m}-t1.json").write_text(json.dumps(report))
        rows = {r["arm"]: r for r in table.table(table.load(d), "last_quarter")}
        q = rows["+ rl"]["prior_quality"]
        assert abs(q["mean_prior"] - 0.3) < 1e-12 and abs(q["concordance"] - 0.5) < 1e-12
        # A cell without a correlation (a constant prior) does not count towards its mean.
        assert abs(q["correlation"] - 0.2) < 1e-12
        assert abs(q["prior_first_truth"] - 0.3) < 1e-12 and abs(q["best_truth"] - 0.45) < 1e-12
        assert rows["(a) heuristics"]["prior_quality"] is None


if __name__ == "__main__":
    for name, test in sorted(globals().items()):
        if name.startswith("test_") and callable(test):
            test()
            print(f"ok {name}")
