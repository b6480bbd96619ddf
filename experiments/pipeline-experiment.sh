#!/usr/bin/env bash
# The platform plan's headline on the synthetic world (issue 20): `arc-rec bench pipeline` with
# heuristic candidates alone, + the warm-up model's candidates, + the world-graded RL model's and
# + the learned-grader RL model's, beside random order of the heuristic candidates and the menu
# oracles, over model seeds and traffic seeds; then the table (experiments/pipeline_table.py).
#
#     experiments/pipeline-experiment.sh OUT
#
# OUT is experiments/rft-experiment.sh's output directory: its OUT/world$WORLD_SEED holds the runs
# w$SEED (warm-up), s$SEED-sampled-pass (world-graded pass@k RL) and, when present,
# s$SEED-sampled-pass-$LEARNED (the learned-grader run, e.g. ABLATIONS="learned=--grader
# learned"). Everything goes to OUT/world$WORLD_SEED/pipeline/: a clustered database of the same
# world (db/), each model's candidates (`arc-rec candidates --out`, priced by the learned grader),
# one report per (model seed, traffic seed) (s$SEED-t$TRAFFIC.json) and a PNG of the first.
# Every bandit arm starts from the world's logged decisions, as serving's warm start does
# (`bench pipeline`'s default; run it with --no-warm-start on the same files for the figures
# without).
# Idempotent: what exists is kept.
#
# Environment: SEEDS ("1 2 3 4 5"), TRAFFIC_SEEDS ("1 2 3"), ROUNDS (10000), WORLD_SEED (1),
# WORLD_OUTCOMES (20000), LEARNED (learned), K (8, candidates per context), ARC_REC (binary).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
arc_rec="${ARC_REC:-$root/target/release/arc-rec}"
out="${1:?usage: pipeline-experiment.sh OUT, the output directory of experiments/rft-experiment.sh}"
SEEDS="${SEEDS:-1 2 3 4 5}"
TRAFFIC_SEEDS="${TRAFFIC_SEEDS:-1 2 3}"
ROUNDS="${ROUNDS:-10000}"
WORLD_SEED="${WORLD_SEED:-1}"
WORLD_OUTCOMES="${WORLD_OUTCOMES:-20000}"
LEARNED="${LEARNED:-learned}"
K="${K:-8}"
[ -x "$arc_rec" ] || { echo "pipeline-experiment: build $arc_rec first (cargo build --release)" >&2; exit 2; }
python=python3
[ -x "$root/.venv/bin/python" ] && python="$root/.venv/bin/python"
work="$(cd "$out/world$WORLD_SEED" && pwd)"
pipe="$work/pipeline"
mkdir -p "$pipe"
export ARC_REC_DATA_DIR="$pipe/db"
if [ ! -f "$pipe/db.ready" ]; then
  "$arc_rec" simulate --seed "$WORLD_SEED" --outcomes "$WORLD_OUTCOMES"
  "$arc_rec" cluster
  touch "$pipe/db.ready"
fi

# The runs' data paths are relative to the work directory.
cd "$work"
candidates() {
  local file=$1
  shift
  [ -s "$file" ] || "$arc_rec" candidates --k "$K" --out "$file" "$@" > "${file%.jsonl}.log" 2>&1 ||
    echo "pipeline-experiment: candidates $* failed: $(tail -n 1 "${file%.jsonl}.log")" >&2
}
for seed in $SEEDS; do
  [ -f "w$seed/summary.json" ] || { echo "pipeline-experiment: no warm-up run w$seed, skipping seed $seed" >&2; continue; }
  candidates "$pipe/warmup-s$seed.jsonl" --run "w$seed" --model warmup
  [ -f "s$seed-sampled-pass/summary.json" ] && candidates "$pipe/rlworld-s$seed.jsonl" --run "s$seed-sampled-pass"
  [ -f "s$seed-sampled-pass-$LEARNED/summary.json" ] &&
    candidates "$pipe/rllearned-s$seed.jsonl" --run "s$seed-sampled-pass-$LEARNED"
  arms=()
  for arm in warmup rlworld rllearned; do
    [ -s "$pipe/$arm-s$seed.jsonl" ] && arms+=(--arm "$arm=$pipe/$arm-s$seed.jsonl")
  done
  first=1
  for traffic in $TRAFFIC_SEEDS; do
    report="$pipe/s$seed-t$traffic.json"
    plot=()
    [ "$first" = 1 ] && plot=(--plot "$pipe/s$seed-t$traffic.png")
    first=0
    [ -s "$report" ] && continue
    echo "== bench pipeline: model seed $seed, traffic seed $traffic"
    "$arc_rec" bench pipeline --world-seed "$WORLD_SEED" --world-outcomes "$WORLD_OUTCOMES" \
      --rounds "$ROUNDS" --seed "$traffic" "${arms[@]}" "${plot[@]}" --json > "$report.tmp"
    mv "$report.tmp" "$report"
  done
done
"$python" "$root/experiments/pipeline_table.py" "$pipe"
"$python" "$root/experiments/pipeline_table.py" "$pipe" --window cold_start
