#!/usr/bin/env bash
# Issue 53's measurement: how much does each world-free checkpoint criterion of `train
# --eval-every` lose against the world's own choice of checkpoint (selection regret), and against
# keeping the last one?
#
#   experiments/selection-study.sh [OUT_DIR]          (default out/selection-study)
#
# In OUT_DIR/world$WORLD_SEED: simulates the world of seed $WORLD_SEED ($WORLD_OUTCOMES outcomes)
# into its own embedded database and exports it (train / validation / test), then for every seed
# of $SEEDS one run with `train`'s defaults (warm-up + pass@4 RL) and --keep-eval-points, so every
# scored checkpoint's adapter stays. Each of them is then evaluated by the world on the test split
# (`eval --models rl --n $EVAL_N --json` on a view of the run whose adapter is that checkpoint):
# s$SEED/points/rl-STEP.eval.json. The criteria's figures at each point are the `selection` lines
# of s$SEED/run/metrics.jsonl (every held-out logged answer's log-probability, so criteria not
# built into `train` can be computed afterwards). experiments/selection_table.py prints the
# tables. Resumable: finished runs and evaluations are kept. $TRAIN_FLAGS are added to `train`.
#
# With $ARCHIVE set, a finished seed's figures (run/metrics.jsonl, run/summary.json, the points'
# eval JSON less its per-prompt detail, and the binary's version and commit) are copied to
# $ARCHIVE/world$WORLD_SEED/s$SEED, and a seed found there is not run again: a study of many
# hours goes on across machines or checkouts that keep only the archive (docs/experiments/data/
# holds the committed ones; selection_table.py reads either directory).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
arc_rec="${ARC_REC:-$root/target/release/arc-rec}"
out="${1:-$root/out/selection-study}"
SEEDS="${SEEDS:-1 2 3 4 5}"
EVAL_N="${EVAL_N:-8}"
WORLD_SEED="${WORLD_SEED:-1}"
WORLD_OUTCOMES="${WORLD_OUTCOMES:-20000}"
TRAIN_FLAGS="${TRAIN_FLAGS:-}"
[ -x "$arc_rec" ] || { echo "selection-study: build $arc_rec first (or set ARC_REC)" >&2; exit 2; }
# shellcheck source=experiments/world-lib.sh
source "$root/experiments/world-lib.sh"
enter_world
if [ ! -d tiny ]; then
  "$arc_rec" model init --preset tiny --out tiny
fi

archive_seed() {
  local dir="$1" kept="$ARCHIVE/world$WORLD_SEED/$1"
  mkdir -p "$kept.tmp/run" "$kept.tmp/points"
  cp "$dir/run/metrics.jsonl" "$dir/run/summary.json" "$kept.tmp/run/"
  # The evaluations without their per-prompt detail (~130 kB each; the tables read the totals).
  for result in "$dir"/points/step-*.eval.json; do
    [ -s "$result" ] || continue
    python3 -c 'import json, sys
def slim(v):
    if isinstance(v, dict):
        return {k: slim(x) for k, x in v.items() if k != "per_prompt"}
    if isinstance(v, list):
        return [slim(x) for x in v]
    return v
json.dump(slim(json.load(open(sys.argv[1]))), open(sys.argv[2], "w"), indent=1)' \
      "$result" "$kept.tmp/points/${result##*/}"
  done
  # The commit the binary was built from: $BINARY_COMMIT, else this checkout's HEAD.
  { "$arc_rec" --version; echo "commit ${BINARY_COMMIT:-$(git -C "$root" rev-parse --short HEAD)}"; } \
    > "$kept.tmp/binary"
  rm -rf "$kept"
  mv "$kept.tmp" "$kept"
}
[ -z "${ARCHIVE:-}" ] || ARCHIVE="$(mkdir -p "$ARCHIVE" && cd "$ARCHIVE" && pwd)"

for seed in $SEEDS; do
  dir="s$seed"
  if [ -n "${ARCHIVE:-}" ] && [ -f "$ARCHIVE/world$WORLD_SEED/$dir/run/summary.json" ]; then
    echo "selection-study: seed $seed is in $ARCHIVE; skipped"
    continue
  fi
  mkdir -p "$dir/points"
  if [ ! -f "$dir/run/summary.json" ]; then
    if [ -f "$dir/run/config.json" ]; then
      "$arc_rec" train --resume "$dir/run" --no-record
    else
      # shellcheck disable=SC2086
      "$arc_rec" train --data examples.jsonl --model tiny --out "$dir/run" --seed "$seed" \
        "${world[@]}" --keep-eval-points --no-record $TRAIN_FLAGS
    fi
  fi
  for point in "$dir"/run/eval-point-*; do
    [ -d "$point" ] || continue   # no point scored (the glob stayed as written)
    step="${point##*eval-point-}"
    view="$dir/points/view-$step"
    result="$dir/points/step-$step.eval.json"
    [ -s "$result" ] && continue
    rm -rf "$view"
    mkdir -p "$view"
    for file in config.json run_id; do cp "$dir/run/$file" "$view/"; done
    ln -s "$(cd "$dir/run" && pwd)/warmup-model" "$view/warmup-model"
    ln -s "$(cd "$point" && pwd)" "$view/adapter"
    "$arc_rec" eval --run "$view" --models rl --n "$EVAL_N" --json > "$result.tmp"
    mv "$result.tmp" "$result"
  done
  [ -z "${ARCHIVE:-}" ] || archive_seed "$dir"
done
echo "selection-study: done; tables: python3 experiments/selection_table.py $work"
