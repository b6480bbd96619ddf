#!/usr/bin/env python3
"""The table of experiments/pipeline-experiment.sh: `arc-rec bench pipeline` reports over model
seeds (the RL runs' training seeds) and traffic seeds, averaged, with paired bootstrap intervals.

    pipeline_table.py PIPELINE_DIR [--window last_quarter|cold_start] [--json]
        [--against OTHER_DIR]

Reads PIPELINE_DIR/s{seed}-t{traffic}.json (`bench pipeline --json`). For every arm, the mean over
(model seed, traffic seed) cells of its true acceptance in the window; each comparison with the
heuristics-only bandit "(a) heuristics" or random order is paired on the same cells. Intervals:
a cluster bootstrap (10,000 resamples) that draws model seeds with replacement, then each drawn
seed's traffic seeds with replacement, so both the spread between trained models and between
traffic draws count; 2.5% and 97.5% percentiles. Seeded, so reproducible.

Each bandit arm's row also says why its last-quarter model picks were picked (reports from
`bench pipeline` with `model_picks_by_reason`; older reports have none): for each reason — the
posterior mean ranked the pick first, the draw explored, ε's uniform order — the mean picks per
cell, their acceptance (pick-weighted) and that acceptance minus what they displaced, paired per
cell with the same bootstrap. And each arm with a model's candidates, against (a) round by
round (reports with `against_heuristics_arm`): the rounds its top-1 was a model idea and those
it was a heuristic, the mean gain over (a)'s top-1 in the same rounds, and each part's share of
the arm's gain over (a) (the two parts add up to it). And how well the model's priced ideas'
priors told their worth (reports with `prior_quality`): over the cells, the mean prior and true
acceptance of the priced ideas on the menus, their correlation, the share of same-round pairs
the priors order right (0.5: no ranking power), and the true acceptance of the prior's first
idea against the best idea's.

--against OTHER_DIR compares two rankers on the same menus and traffic instead (e.g. two
binaries' `bench pipeline` runs on one pipeline-experiment's candidate files): for every arm in
both (the bandit arms: random order and the oracles do not depend on the ranker), its
acceptance in PIPELINE_DIR minus in OTHER_DIR, and the same for its model picks' and
heuristic picks' acceptance and its model share, paired on the cells both hold. (The picks' and
the share are the last quarter's whatever the window, as in the main table: the reports hold
them for the last quarter only.)
"""
import argparse
import json
import random
import re
import sys
from pathlib import Path

RESAMPLES = 10_000
SEED = 20261126
BASE = "(a) heuristics"
RANDOM = "random heuristic order"


def load(directory):
    """{(model seed, traffic seed): report} from the directory's s{m}-t{t}.json files."""
    cells = {}
    for path in sorted(Path(directory).glob("s*-t*.json")):
        match = re.fullmatch(r"s(\d+)-t(\d+)\.json", path.name)
        if match:
            cells[(int(match[1]), int(match[2]))] = json.loads(path.read_text())
    return cells


def grid(cells, arm, field):
    """{model seed: [value per traffic seed]} of one arm's field (cells lacking the arm skipped)."""
    out = {}
    for (m, _t), report in sorted(cells.items()):
        for a in report["arms"]:
            if a["arm"] == arm and a.get(field) is not None:
                out.setdefault(m, []).append(a[field])
    return out


def mean(values):
    values = list(values)
    return sum(values) / len(values) if values else float("nan")


def grid_mean(g):
    return mean(v for vs in g.values() for v in vs)


def bootstrap(statistic, seeds, rng):
    """Percentile interval of statistic(draw) over cluster resamples of the model seeds (a draw is
    a list of (seed, traffic indices))."""
    values = []
    for _ in range(RESAMPLES):
        draw = [rng.choice(seeds) for _ in seeds]
        values.append(statistic(draw))
    values.sort()
    return values[int(0.025 * RESAMPLES)], values[int(0.975 * RESAMPLES) - 1]


def paired(first, second, rng):
    """Mean of first − second over the shared cells, with its cluster-bootstrap interval."""
    seeds = sorted(set(first) & set(second))
    diffs = {s: [a - b for a, b in zip(first[s], second[s])] for s in seeds}
    if not seeds:
        return float("nan"), float("nan"), float("nan")

    def statistic(draw):
        picks = []
        for s in draw:
            d = diffs[s]
            picks.extend(d[rng.randrange(len(d))] for _ in d)
        return mean(picks)

    lo, hi = bootstrap(statistic, seeds, rng)
    return grid_mean(diffs), lo, hi


def against_zero(g, rng):
    """paired(g, 0): the mean of a grid of differences with its cluster-bootstrap interval."""
    return paired(g, {m: [0.0] * len(v) for m, v in g.items()}, rng)


REASONS = ("mean", "draw", "uniform")


def reason_rows(cells, arm, rng):
    """{reason: {picks, acceptance, vs_displaced}} of an arm's last-quarter model picks, or None."""
    out = {}
    for reason in REASONS:
        picks, weighted, diffs = [], 0.0, {}
        for (m, _t), report in sorted(cells.items()):
            for a in report["arms"]:
                by = a.get("model_picks_by_reason") if a["arm"] == arm else None
                if not by:
                    continue
                r = by[reason]
                picks.append(r["picks"])
                if r["picks"] and r["acceptance"] is not None:
                    weighted += r["picks"] * r["acceptance"]
                    if r["alternative_acceptance"] is not None:
                        diffs.setdefault(m, []).append(r["acceptance"] - r["alternative_acceptance"])
        if not picks:
            return None
        out[reason] = {
            "picks": mean(picks),
            "acceptance": weighted / sum(picks) if sum(picks) else None,
            "vs_displaced": against_zero(diffs, rng) if diffs else None,
        }
    return out


SOURCES = ("model", "heuristic")


def paired_rows(cells, arm, rng):
    """{source: {rounds, gain, contribution}} of a model arm's last quarter against (a) in the
    same rounds, split by the source of the arm's top-1 (`against_heuristics_arm`), or None.
    gain: the mean per round, paired per cell; contribution: rounds × gain / the last quarter's
    rounds, the source's part of the arm's last-quarter gain over (a) (the two add up to it)."""
    out = {}
    for source in SOURCES:
        rounds, gains, parts = [], {}, {}
        for (m, _t), report in sorted(cells.items()):
            for a in report["arms"]:
                p = a.get("against_heuristics_arm") if a["arm"] == arm else None
                if not p:
                    continue
                n, gain = p[f"{source}_rounds"], p[f"{source}_gain"]
                rounds.append(n)
                if gain is not None:
                    gains.setdefault(m, []).append(gain)
                parts.setdefault(m, []).append(n * (gain or 0.0) / report["last_quarter_rounds"])
        if not rounds:
            return None
        out[source] = {
            "rounds": mean(rounds),
            "gain": against_zero(gains, rng) if gains else None,
            "contribution": against_zero(parts, rng),
        }
    return out


PRIOR_FIELDS = ("mean_prior", "mean_truth", "correlation", "concordance", "prior_first_truth",
                "best_truth")


def prior_rows(cells, arm):
    """{field: mean over the cells} of an arm's `prior_quality` (fields a cell lacks skipped), or
    None when no cell has one."""
    found = [a["prior_quality"] for r in cells.values() for a in r["arms"]
             if a["arm"] == arm and a.get("prior_quality")]
    if not found:
        return None
    out = {}
    for field in PRIOR_FIELDS:
        values = [q[field] for q in found if q.get(field) is not None]
        out[field] = mean(values) if values else None
    return out


def table(cells, window):
    rng = random.Random(SEED)
    arms = [a["arm"] for a in next(iter(cells.values()))["arms"]]
    base = grid(cells, BASE, window)
    rand = grid(cells, RANDOM, window)
    rows = []
    for arm in arms:
        g = grid(cells, arm, window)
        share = grid_mean(grid(cells, arm, "model_share_last_quarter"))
        model_picks = grid(cells, arm, "model_pick_acceptance")
        heuristic_picks = grid(cells, arm, "heuristic_pick_acceptance")
        row = {
            "arm": arm,
            "seeds": len(g),
            "cells": sum(len(v) for v in g.values()),
            "acceptance": grid_mean(g),
            "vs_a": paired(g, base, rng) if arm != BASE else None,
            "x_random": grid_mean(g) / grid_mean(rand),
            "model_share": share,
            "model_picks": grid_mean(model_picks) if model_picks else None,
            "heuristic_picks": grid_mean(heuristic_picks) if heuristic_picks else None,
            "model_minus_heuristic_picks": (
                paired(model_picks, heuristic_picks, rng) if model_picks and heuristic_picks else None
            ),
            "errors": sum(
                a["errors"] for r in cells.values() for a in r["arms"] if a["arm"] == arm
            ),
            "model_picks_by_reason": reason_rows(cells, arm, rng),
            "against_heuristics_arm": paired_rows(cells, arm, rng),
            "prior_quality": prior_rows(cells, arm),
        }
        rows.append(row)
    return rows


def against(cells, other, window):
    """Each arm's figures in `cells` minus the same arm's in `other`, paired on shared cells."""
    rng = random.Random(SEED)
    shared = sorted(set(cells) & set(other))
    cells = {k: cells[k] for k in shared}
    other = {k: other[k] for k in shared}
    # Random order and the oracles do not depend on the ranker: only the bandit arms differ.
    arms = [a["arm"] for a in next(iter(cells.values()))["arms"] if a["kind"] == "thompson"]
    other_arms = {a["arm"] for r in other.values() for a in r["arms"]}
    rows = []
    for arm in arms:
        if arm not in other_arms:
            continue
        row = {"arm": arm, "cells": len(shared)}
        for key, field in (
            ("acceptance", window),
            ("model_picks", "model_pick_acceptance"),
            ("heuristic_picks", "heuristic_pick_acceptance"),
            ("model_share", "model_share_last_quarter"),
        ):
            first, second = grid(cells, arm, field), grid(other, arm, field)
            row[key] = paired(first, second, rng) if first and second else None
        rows.append(row)
    return rows


def fmt(interval):
    if interval is None:
        return "-"
    point, lo, hi = interval
    return f"{point:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory")
    parser.add_argument("--window", choices=["last_quarter", "cold_start"], default="last_quarter")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--against", metavar="OTHER_DIR")
    args = parser.parse_args(argv)
    cells = load(args.directory)
    if not cells:
        sys.exit(f"{args.directory}: no s<seed>-t<traffic>.json reports")
    if args.against:
        other = load(args.against)
        if not set(cells) & set(other):
            sys.exit(f"{args.against}: no report on the same (model seed, traffic seed) as {args.directory}")
        rows = against(cells, other, args.window)
        if args.json:
            print(json.dumps(rows))
            return
        print(f"{args.directory} − {args.against}, window {args.window}, {rows[0]['cells'] if rows else 0} shared cells")
        print(f"{'arm':<28} {'acceptance [95% CI]':>26} {'model picks (last q.)':>26} "
              f"{'heuristic picks (last q.)':>26} {'model share (last q.)':>26}")
        for r in rows:
            print(f"{r['arm']:<28} {fmt(r['acceptance']):>26} {fmt(r['model_picks']):>26} "
                  f"{fmt(r['heuristic_picks']):>26} {fmt(r['model_share']):>26}")
        return
    rows = table(cells, args.window)
    if args.json:
        print(json.dumps(rows))
        return
    seeds = sorted({m for m, _ in cells})
    traffic = sorted({t for _, t in cells})
    print(f"window: {args.window}; model seeds {seeds}, traffic seeds {traffic}; true acceptance of the shown top-1")
    print(f"{'arm':<28} {'cells':>5} {'acceptance':>10} {'vs (a) [95% CI]':>26} {'x random':>8} "
          f"{'model share':>11} {'model picks':>11} {'heur. picks':>11} {'model − heur. [95% CI]':>26} {'errors':>6}")
    for r in rows:
        opt = lambda v: "-" if v is None else f"{v:.3f}"
        print(f"{r['arm']:<28} {r['cells']:>5} {r['acceptance']:>10.3f} {fmt(r['vs_a']):>26} "
              f"{r['x_random']:>8.2f} {r['model_share']:>11.3f} {opt(r['model_picks']):>11} "
              f"{opt(r['heuristic_picks']):>11} {fmt(r['model_minus_heuristic_picks']):>26} {r['errors']:>6}")
    traced = [r for r in rows if r["model_picks_by_reason"] and r["model_share"] > 0]
    if traced:
        print("why the model's last-quarter picks were picked: picks per cell, acceptance, minus what they displaced [95% CI]")
        for r in traced:
            parts = []
            for reason in REASONS:
                x = r["model_picks_by_reason"][reason]
                acc = "-" if x["acceptance"] is None else f"{x['acceptance']:.3f}"
                parts.append(f"{reason} {x['picks']:.0f}, {acc}, {fmt(x['vs_displaced'])}")
            print(f"  {r['arm']:<26} " + "; ".join(parts))
    paired_arms = [r for r in rows if r["against_heuristics_arm"]]
    if paired_arms:
        print("last quarter against (a) in the same rounds, by the source of the arm's top-1: "
              "rounds per cell, mean gain per round, part of the gain over (a) [95% CI]")
        for r in paired_arms:
            parts = []
            for source in SOURCES:
                x = r["against_heuristics_arm"][source]
                parts.append(f"{source} {x['rounds']:.0f}, {fmt(x['gain'])}, {fmt(x['contribution'])}")
            print(f"  {r['arm']:<26} " + "; ".join(parts))
    priced = [r for r in rows if r["prior_quality"]]
    if priced:
        print("how the priced ideas' priors told their worth, every round: prior / true acceptance; "
              "correlation; same-round pairs ordered right; truth of the prior's first / of the best idea")
        for r in priced:
            q = r["prior_quality"]
            opt = lambda v, f: "-" if v is None else format(v, f)
            print(f"  {r['arm']:<26} {opt(q['mean_prior'], '.3f')} / {opt(q['mean_truth'], '.3f')}; "
                  f"r {opt(q['correlation'], '+.3f')}; {opt(q['concordance'], '.3f')}; "
                  f"{opt(q['prior_first_truth'], '.3f')} / {opt(q['best_truth'], '.3f')}")


if __name__ == "__main__":
    main()
