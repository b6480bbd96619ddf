#!/usr/bin/env python3
"""The tables of experiments/rft-experiment.sh: held-out figures of warm-up only, + pass@k RL and
+ mean RL against the logged heuristic and the menu oracle, with paired bootstrap intervals over
(seed, prompt), from one world's work directory.

    rft_experiment_table.py WORK_DIR [--seeds 1 2 3 4 5] [--rewards sampled expected] [--k 4]
                            [--ablations NAME ...] [--drift]

Reads WORK_DIR/w{seed}.eval.json (the warm-up model; before it existed, the pass@k run's file
held it as its base), WORK_DIR/s{seed}-{reward}-pass.eval.json and -mean.eval.json (the RL
models): `arc-rec eval --json` reports with per-prompt figures (`models[].per_prompt`) and, with
the world grader, the baselines (`baselines.per_prompt`).

Every figure is a mean over (seed, prompt) pairs, the same held-out prompts for every seed. Its
95% interval comes from a hierarchical (cluster) bootstrap: each of the 10,000 resamples draws
the seeds with replacement, then for every drawn seed its prompts with replacement (so both the
spread between training seeds and the spread between prompts count), and takes the 2.5% and
97.5% percentiles of the resampled means. A comparison of two models is paired: both are
resampled on the same (seed, prompt) draws, over the seeds both finished and the prompts every
one of those seeds has. The generator is seeded (--bootstrap-seed), so the intervals are
reproducible. Uses numpy when it is importable, else pure Python (same estimator, slower).

With --ablations, one more table: each NAME's pass@k run (s{seed}-{reward}-pass-NAME, the
defaults plus that lever's flags, same warm-up and seed) against the defaults' pass@k run, paired
over (seed, prompt), with what its training did (from the run directory: rollbacks, minutes of
steps, KL per token at the end); a run without summary.json did not finish (gave up or stopped).

With --drift, every finished run (pass@k, mean and the levers) by how far it moved from its
warm-up (KL per token at the end) and what it gained on best-of-k, with their rank correlation.
"""
import argparse
import functools
import json
import math
import random
import sys
from array import array
from pathlib import Path

try:
    import numpy
except ImportError:  # pragma: no cover - depends on the interpreter
    numpy = None

RESAMPLES = 10_000
BOOTSTRAP_SEED = 20261125

WARMUP = "warm-up only"
LOGGED = "logged heuristic"
RANDOM = "random from menu"
ORACLE = "menu oracle"


# --- the bootstrap ---------------------------------------------------------------------------


def _percentile(sorted_values, q):
    """The q-quantile (0 ≤ q ≤ 1) of sorted values, linearly interpolated (numpy's default)."""
    if not sorted_values:
        return math.nan
    position = q * (len(sorted_values) - 1)
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def _interval(values):
    """The 95% percentile interval of bootstrap statistics, ignoring undefined (NaN) ones."""
    finite = sorted(v for v in values if not math.isnan(v))
    return (_percentile(finite, 0.025), _percentile(finite, 0.975))


@functools.lru_cache(maxsize=8)
def _draws(seeds, prompts, resamples, seed, use_numpy):
    """The bootstrap's draws for an S × P grid, as flat cell indices (seed · P + prompt):
    `resamples` rows of S·P cells, each row S seeds drawn with replacement and, for each, P of its
    prompts drawn with replacement. Cached: every grid of one shape is resampled on the same
    draws, which is what pairs two models' figures."""
    if use_numpy:
        rng = numpy.random.default_rng(seed)
        seed_draws = rng.integers(0, seeds, size=(resamples, seeds, 1))
        prompt_draws = rng.integers(0, prompts, size=(resamples, seeds, prompts))
        return (seed_draws * prompts + prompt_draws).reshape(resamples, seeds * prompts)
    rng = random.Random(seed)
    draws = array("i")
    for _ in range(resamples):
        for _ in range(seeds):
            base = rng.randrange(seeds) * prompts
            draws.extend(base + rng.randrange(prompts) for _ in range(prompts))
    return draws


def resampled_means(grids, resamples=RESAMPLES, seed=BOOTSTRAP_SEED, use_numpy=None):
    """Hierarchical bootstrap means of several aligned grids.

    `grids` maps a name to a grid: a list over seeds of lists over prompts, all grids of the same
    shape (S seeds × P prompts, the same (seed, prompt) in the same cell), so that every grid is
    resampled on the same draws (a paired bootstrap). Returns name → list of `resamples` means:
    each resample draws S seeds with replacement, then for each drawn seed P of its prompts with
    replacement, and averages the drawn cells.
    """
    names = list(grids)
    if not names:
        return {}
    first = grids[names[0]]
    seeds, prompts = len(first), len(first[0]) if first else 0
    for name in names:
        grid = grids[name]
        if len(grid) != seeds or any(len(row) != prompts for row in grid):
            raise ValueError(f"grid {name!r} is not {seeds} seeds × {prompts} prompts")
    if seeds == 0 or prompts == 0:
        raise ValueError("nothing to resample: no seed or no prompt")
    if use_numpy is None:
        use_numpy = numpy is not None
    draws = _draws(seeds, prompts, resamples, seed, use_numpy)
    cells = seeds * prompts
    out = {}
    for name in names:
        flat = [v for row in grids[name] for v in row]
        if use_numpy:
            out[name] = numpy.asarray(flat, dtype=float)[draws].mean(axis=1).tolist()
        else:
            out[name] = [
                sum(map(flat.__getitem__, draws[b * cells : (b + 1) * cells])) / cells
                for b in range(resamples)
            ]
    return out


def mean_of(grid):
    return sum(sum(row) for row in grid) / sum(len(row) for row in grid)


def paired_difference(first, second, **options):
    """Mean of first − second over the grids' cells and its bootstrap 95% interval."""
    means = resampled_means({"a": first, "b": second}, **options)
    diffs = [a - b for a, b in zip(means["a"], means["b"])]
    return (mean_of(first) - mean_of(second), *_interval(diffs))


def gap_closed(model, reference, oracle, **options):
    """(model − reference) / (oracle − reference) of the grids' means, and its interval (ratio of
    resampled means on the same draws; a resample with no gap left is undefined and skipped)."""

    def ratio(m, r, o):
        return (m - r) / (o - r) if o - r > 1e-9 else math.nan

    means = resampled_means({"m": model, "r": reference, "o": oracle}, **options)
    point = ratio(mean_of(model), mean_of(reference), mean_of(oracle))
    resampled = [ratio(m, r, o) for m, r, o in zip(means["m"], means["r"], means["o"])]
    return (point, *_interval(resampled))


# --- the reports -----------------------------------------------------------------------------


def load(path):
    """`arc-rec eval --json` report at path, or None when it is missing or lacks per-prompt
    figures (written before eval reported them: rerun the evaluation)."""
    try:
        report = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as error:
        sys.exit(f"{path}: not an `arc-rec eval --json` report ({error})")
    models = report.get("models")
    if not isinstance(models, list):
        sys.exit(f"{path}: not an `arc-rec eval --json` report (no models)")
    if not all(m.get("per_prompt") for m in models):
        print(f"{path}: no per-prompt figures (an older eval); rerun it", file=sys.stderr)
        return None
    return report


def model_series(model, k):
    """Per-prompt figures of one evaluated model: id → {figure: value}."""
    n = len(model["pass_at"])
    out = {}
    for p in model["per_prompt"]:
        figures = {"valid": p["format_validity"]}
        if n >= k:
            figures[f"pass@{k}"] = p["pass_at"][k - 1]
        if n >= 16:
            figures["pass@16"] = p["pass_at"][15]
        if p.get("best_of") is not None and n >= k:
            figures[f"best-of-{k} P(acc)"] = p["best_of"][k - 1]
        if p.get("greedy_acceptance_probability") is not None:
            figures["greedy P(acc)"] = p["greedy_acceptance_probability"]
        out[p["id"]] = figures
    return out


def baseline_series(report, k):
    """Per-prompt figures of the baselines, one pick each (so the same value stands for the
    greedy answer and for the best of k): name → id → {figure: value}."""
    baselines = report.get("baselines")
    if not baselines:
        return {}
    out = {LOGGED: {}, RANDOM: {}, ORACLE: {}}
    for p in baselines["per_prompt"]:
        for name, value in (
            (LOGGED, p.get("logged_heuristic")),
            (RANDOM, p["random_from_menu"]),
            (ORACLE, p["menu_oracle"]),
        ):
            if value is not None:
                out[name][p["id"]] = {"greedy P(acc)": value, f"best-of-{k} P(acc)": value}
    return out


def collect(work, seeds, reward, k):
    """name → seed → prompt id → figures, for the three models and the baselines."""
    rl = f"+ pass@{k} RL"
    rows = {WARMUP: {}, rl: {}, "+ mean RL": {}, LOGGED: {}, RANDOM: {}, ORACLE: {}}
    for seed in seeds:
        warmup = load(work / f"w{seed}.eval.json")
        passk = load(work / f"s{seed}-{reward}-pass.eval.json")
        mean = load(work / f"s{seed}-{reward}-mean.eval.json")
        by_model = lambda report: {m["model"]: m for m in report["models"]} if report else {}
        if "warmup" in by_model(warmup):
            rows[WARMUP][seed] = model_series(by_model(warmup)["warmup"], k)
        elif "base" in by_model(passk):
            rows[WARMUP][seed] = model_series(by_model(passk)["base"], k)
        if "rl" in by_model(passk):
            rows[rl][seed] = model_series(by_model(passk)["rl"], k)
        if "rl" in by_model(mean):
            rows["+ mean RL"][seed] = model_series(by_model(mean)["rl"], k)
        for report in (warmup, passk, mean):
            if report and report.get("baselines"):
                for name, series in baseline_series(report, k).items():
                    rows[name][seed] = series
                break
    return rows


def training_facts(run_dir):
    """What one run's training did, from its directory: (finished, rollbacks, minutes, the last
    step's moving-average KL per token); None where the run directory is missing. Minutes are
    the wall time from the run's start (run_id, written once) to its summary.json, so steps
    redone after a rollback count; for an unfinished run, the kept steps' own seconds."""
    if not run_dir.is_dir():
        return None
    finished, rollbacks = False, 0
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
        finished, rollbacks = True, int(summary.get("rollbacks", 0))
    except (FileNotFoundError, json.JSONDecodeError, ValueError, TypeError):
        pass
    seconds, kl = 0.0, math.nan
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        lines = []
    for line in lines:
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a kill
        if event.get("event") == "step" and event.get("phase") == "rl":
            seconds += float(event.get("step_seconds") or 0.0)
            if event.get("kl_average") is not None:
                kl = float(event["kl_average"])
    if finished and (run_dir / "run_id").is_file():
        started = (run_dir / "run_id").stat().st_mtime
        seconds = max(0.0, (run_dir / "summary.json").stat().st_mtime - started)
    return finished, rollbacks, seconds / 60.0, kl


def ablation_table(work, seeds, reward, k, names, resamples=RESAMPLES, seed=BOOTSTRAP_SEED):
    """The ablation's lines: each lever's pass@k run against the defaults' pass@k run, and each
    run against its warm-up."""
    defaults = f"pass@{k} RL (defaults)"
    runs = {defaults: f"s{{seed}}-{reward}-pass"}
    runs.update({f"+ {name}": f"s{{seed}}-{reward}-pass-{name}" for name in names})
    rows = {label: {} for label in runs}
    rows[WARMUP] = collect(work, seeds, reward, k)[WARMUP]
    facts = {label: {} for label in runs}
    for s in seeds:
        for label, pattern in runs.items():
            run = pattern.format(seed=s)
            report = load(work / f"{run}.eval.json")
            models = {m["model"]: m for m in report["models"]} if report else {}
            if "rl" in models:
                rows[label][s] = model_series(models["rl"], k)
            got = training_facts(work / run)
            if got is not None:
                facts[label][s] = got
    best, greedy, passk = f"best-of-{k} P(acc)", "greedy P(acc)", f"pass@{k}"
    options = {"resamples": resamples, "seed": seed}
    compared = [best, greedy, passk]
    lines = [
        f"Ablation, reward {reward}: each lever added to the defaults, pass@{k} RL, same warm-ups and"
        " seeds; levels and paired differences (lever − defaults; last, run − its warm-up), mean [95% interval]:",
        "",
        f"| run | seeds | valid | {best} | "
        + " | ".join(f"Δ {f}" for f in compared)
        + f" | Δ {best} vs warm-up | finished | rollbacks | minutes (mean) | KL/token at end (mean) |",
        "|---" * (len(compared) + 9) + "|",
    ]
    for label in runs:
        cells, used = [], None
        for figure in ("valid", best):
            aligned = grids(rows, [label], figure)
            if aligned is None:
                cells.append("-")
                continue
            s_used, _, (grid,) = aligned
            used = used or s_used
            means = resampled_means({"x": grid}, **options)["x"]
            cells.append(level((mean_of(grid), *_interval(means))))
        for figure in compared:
            aligned = None if label == defaults else grids(rows, [label, defaults], figure)
            if aligned is None:
                cells.append("-")
                continue
            _, _, (a, b) = aligned
            cells.append(cell(paired_difference(a, b, **options)))
        # Against the warm-up it started from: did this run learn at all (e.g. a learned grader's
        # run, whose defaults-relative figure says only how it compares with the world's)?
        aligned = grids(rows, [label, WARMUP], best)
        if aligned is None:
            cells.append("-")
        else:
            _, _, (a, b) = aligned
            cells.append(cell(paired_difference(a, b, **options)))
        ran = [facts[label][s] for s in seeds if s in facts[label]]
        finished = sum(1 for f in ran if f[0])
        cells.append(f"{finished}/{len(ran)}" if ran else "-")
        cells.append(str(sum(f[1] for f in ran)) if ran else "-")
        done = [f for f in ran if f[0]]
        cells.append(f"{sum(f[2] for f in done) / len(done):.1f}" if done else "-")
        kls = [f[3] for f in done if not math.isnan(f[3])]
        cells.append(f"{sum(kls) / len(kls):.3f}" if kls else "-")
        seeds_text = ",".join(map(str, used)) if used else "none"
        lines.append(f"| {label} | {seeds_text} | " + " | ".join(cells) + " |")
    return lines


def _ranks(values):
    """Ranks from 1, ties sharing their mean rank."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for i in order[start : end + 1]:
            ranks[i] = (start + end) / 2 + 1
        start = end + 1
    return ranks


def spearman(xs, ys):
    """Spearman's rank correlation of two equally long lists (NaN below 3 pairs or with no
    spread)."""
    if len(xs) != len(ys) or len(xs) < 3:
        return math.nan
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else math.nan


def drift_table(work, seeds, reward, k, names):
    """Every finished RL run of the work directory (pass@k, mean, each ablation lever), its
    rollbacks, how far it moved from its warm-up (the moving-average KL per token at its last step) and what it
    gained (best-of-k P(acc) − its warm-up's, over the prompts both have), sorted by KL, and
    Spearman's rank correlation of the two."""
    best = f"best-of-{k} P(acc)"
    runs = [f"s{{seed}}-{reward}-pass", f"s{{seed}}-{reward}-mean"]
    runs += [f"s{{seed}}-{reward}-pass-{name}" for name in names]
    warmups = collect(work, seeds, reward, k)[WARMUP]
    found = []
    for s in seeds:
        warm = warmups.get(s)
        for pattern in runs:
            run = pattern.format(seed=s)
            report = load(work / f"{run}.eval.json")
            facts = training_facts(work / run)
            models = {m["model"]: m for m in report["models"]} if report else {}
            if not warm or "rl" not in models or not facts or not facts[0] or math.isnan(facts[3]):
                continue
            series = model_series(models["rl"], k)
            prompts = [p for p in series if best in series[p] and best in warm.get(p, {})]
            if not prompts:
                continue
            gain = sum(series[p][best] - warm[p][best] for p in prompts) / len(prompts)
            found.append((facts[3], gain, run, facts[1]))
    found.sort()
    lines = [
        f"Drift and gain, reward {reward}: each finished run's KL per token to its warm-up at the"
        f" end against its {best} gain over the warm-up:",
        "",
        f"| run | rollbacks | KL/token at end | Δ {best} vs warm-up |",
        "|---|---|---|---|",
    ]
    lines += [f"| {run} | {back} | {kl:.3f} | {gain:+.3f} |" for kl, gain, run, back in found]
    rho = spearman([f[0] for f in found], [f[1] for f in found])
    lines += ["", f"{len(found)} runs; Spearman's rank correlation of KL and gain: "
              + ("-" if math.isnan(rho) else f"{rho:+.2f}")]
    return lines


def grids(rows, names, figure):
    """Aligned grids of `figure` for `names`: the seeds every one has, the prompts every one of
    those has (in sorted id order). Returns (seeds, prompts, [grid per name]) or None."""
    seeds = sorted(set.intersection(*(set(rows[n]) for n in names)))
    if not seeds:
        return None
    prompt_sets = [
        {pid for pid, f in rows[n][s].items() if figure in f} for n in names for s in seeds
    ]
    prompts = sorted(set.intersection(*prompt_sets))
    if not prompts:
        return None
    return seeds, prompts, [[[rows[n][s][p][figure] for p in prompts] for s in seeds] for n in names]


def cell(estimate, percent=False):
    point, low, high = estimate
    if math.isnan(point):
        return "-"
    if percent:
        return f"{100 * point:+.1f}% [{100 * low:+.1f}%, {100 * high:+.1f}%]"
    return f"{point:+.3f} [{low:+.3f}, {high:+.3f}]"


def level(values):
    point, low, high = values
    return f"{point:.3f} [{low:.3f}, {high:.3f}]"


def tables(work, seeds, reward, k, resamples=RESAMPLES, seed=BOOTSTRAP_SEED):
    """The report for one reward, as lines of text."""
    rows = collect(work, seeds, reward, k)
    rl = f"+ pass@{k} RL"
    models = [WARMUP, rl, "+ mean RL"]
    if not any(rows[m] for m in models):
        return [f"reward {reward}: no finished seed with per-prompt figures in {work}"]
    best, greedy = f"best-of-{k} P(acc)", "greedy P(acc)"
    figures = ["valid", best, greedy, f"pass@{k}", "pass@16"]
    options = {"resamples": resamples, "seed": seed}
    lines = [
        f"reward {reward}: mean over (seed, prompt) [95% interval of a hierarchical bootstrap,"
        f" {resamples:,} resamples of seeds, then prompts within seed]",
        "",
        "| model | seeds | prompts | " + " | ".join(figures) + " |",
        "|---" * (len(figures) + 3) + "|",
    ]
    for name in models + [LOGGED, RANDOM, ORACLE]:
        cells, used = [], None
        for figure in figures:
            aligned = grids(rows, [name], figure)
            if aligned is None:
                cells.append("-")
                continue
            s, p, (grid,) = aligned
            used = used or (s, p)
            means = resampled_means({"x": grid}, **options)["x"]
            cells.append(level((mean_of(grid), *_interval(means))))
        seeds_text = ",".join(map(str, used[0])) if used else "none"
        prompts_text = str(len(used[1])) if used else "-"
        lines.append(f"| {name} | {seeds_text} | {prompts_text} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        f"Baselines are one pick per prompt (the same value under greedy and best-of-{k});"
        " the menu is the world's candidate fixes plus the logged diffs."
    )

    pairs = [(rl, WARMUP), ("+ mean RL", WARMUP), (rl, "+ mean RL")]
    pairs += [(m, LOGGED) for m in models] + [(m, ORACLE) for m in models]
    compared = [best, greedy, f"pass@{k}", "pass@16"]
    lines += [
        "",
        "Paired differences (first − second), mean [95% interval]:",
        "",
        "| comparison | seeds | " + " | ".join(compared) + " |",
        "|---" * (len(compared) + 2) + "|",
    ]
    for first, second in pairs:
        cells, used = [], None
        for figure in compared:
            aligned = grids(rows, [first, second], figure)
            if aligned is None:
                cells.append("-")
                continue
            s, _, (a, b) = aligned
            used = used or s
            cells.append(cell(paired_difference(a, b, **options)))
        if used is None:
            continue
        label = f"{first.lstrip('+ ')} − {second.lstrip('+ ')}"
        lines.append(f"| {label} | {','.join(map(str, used))} | " + " | ".join(cells) + " |")

    lines += [
        "",
        "Gap closed from warm-up to the menu oracle, (model − warm-up) / (oracle − warm-up):",
        "",
        f"| model | seeds | {best} | {greedy} |",
        "|---|---|---|---|",
    ]
    for name in models[1:]:
        cells, used = [], None
        for figure in (best, greedy):
            aligned = grids(rows, [name, WARMUP, ORACLE], figure)
            if aligned is None:
                cells.append("-")
                continue
            s, _, (m, w, o) = aligned
            used = used or s
            cells.append(cell(gap_closed(m, w, o, **options), percent=True))
        if used is not None:
            lines.append(f"| {name.lstrip('+ ')} | {','.join(map(str, used))} | " + " | ".join(cells) + " |")

    per_seed = ["", f"{best} per seed (warm-up / pass@{k} / mean; - = no finished run):"]
    for seed in seeds:
        values = []
        for name in models:
            series = rows[name].get(seed)
            got = [f[best] for f in series.values() if best in f] if series else []
            values.append(f"{sum(got) / len(got):.3f}" if got else "-")
        per_seed.append(f"  seed {seed}: " + " / ".join(values))
    return lines + per_seed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", type=Path, help="one world's work directory")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3, 4, 5])
    parser.add_argument("--rewards", nargs="+", default=["sampled"])
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--resamples", type=int, default=RESAMPLES)
    parser.add_argument("--bootstrap-seed", type=int, default=BOOTSTRAP_SEED)
    parser.add_argument(
        "--ablations", nargs="+", default=[], metavar="NAME", help="ablation runs to compare"
    )
    parser.add_argument(
        "--drift",
        action="store_true",
        help="also list every finished run's KL at the end against its gain over its warm-up",
    )
    args = parser.parse_args()
    if args.k < 1 or args.resamples < 1:
        parser.error("--k and --resamples must be at least 1")
    for reward in args.rewards:
        print()
        print(
            "\n".join(
                tables(args.work, args.seeds, reward, args.k, args.resamples, args.bootstrap_seed)
            )
        )
        if args.ablations:
            print()
            print(
                "\n".join(
                    ablation_table(
                        args.work,
                        args.seeds,
                        reward,
                        args.k,
                        args.ablations,
                        args.resamples,
                        args.bootstrap_seed,
                    )
                )
            )
        if args.drift:
            print()
            print("\n".join(drift_table(args.work, args.seeds, reward, args.k, args.ablations)))


if __name__ == "__main__":
    main()
