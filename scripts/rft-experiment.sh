#!/usr/bin/env bash
# Issue 10's measurement: on the synthetic world (tiny preset, CPU), does warm-up + pass@k RL
# beat warm-up only and warm-up + mean RL at equal steps on held-out true best-of-k acceptance?
#
#   scripts/rft-experiment.sh [OUT_DIR]          (default out/rft-experiment)
#
# For every seed in $SEEDS: one warm-up run (w$SEED: $SFT_STEPS full fine-tuning steps, no RL),
# then from its warm-up model two RL runs of $RL_STEPS steps, objective pass@k and mean, with
# each reward in $REWARDS (sampled: the plan's ±1 draw; expected: 2p − 1), each evaluated on the
# held-out prompts with `arc-rec eval --n $EVAL_N` (eval seed 1 for every model, so they answer
# the same draws). Prints the table of scripts/rft_experiment_table.py at the end. Resumable:
# finished runs and evaluations are kept, unfinished ones redone. Needs a built
# target/release/arc-rec (scripts/quickstart.sh builds it); uses its own embedded cluster in
# OUT_DIR/db.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
arc_rec="$root/target/release/arc-rec"
out="${1:-$root/out/rft-experiment}"
SEEDS="${SEEDS:-1 2 3}"
REWARDS="${REWARDS:-sampled}"
SFT_STEPS="${SFT_STEPS:-300}"
RL_STEPS="${RL_STEPS:-200}"
EVAL_N="${EVAL_N:-16}"
[ -x "$arc_rec" ] || { echo "rft-experiment: build $arc_rec first (cargo build --release)" >&2; exit 2; }
mkdir -p "$out"
cd "$out"
export ARC_REC_DATA_DIR="$out/db"

if [ ! -s examples.jsonl ]; then
  "$arc_rec" simulate --seed 1
  "$arc_rec" export --out examples.jsonl
fi
[ -f tiny/config.json ] || "$arc_rec" model init --preset tiny --out tiny

# train RUN_DIR LOG ARGS...: a run, kept when it finished (summary.json), redone otherwise. A run
# that gives up (e.g. a KL blow-up past --max-rollbacks) is reported and left out of the table,
# not the end of the experiment.
train() {
  local dir=$1 log=$2
  shift 2
  if [ ! -f "$dir/summary.json" ]; then
    rm -rf "$dir"
    echo "== $dir"
    "$arc_rec" train --data examples.jsonl --out "$dir" --no-record --seed "$seed" "$@" > "$log" 2>&1 ||
      echo "rft-experiment: $dir failed: $(tail -n 1 "$log")" >&2
  fi
}

for seed in $SEEDS; do
  train "w$seed" "w$seed.log" --model tiny --sft-steps "$SFT_STEPS" --steps 0
  for reward in $REWARDS; do
    models=base,rl
    for objective in pass@k mean; do
      run="s$seed-$reward-${objective%@k}"
      train "$run" "$run.log" --model "w$seed/warmup-model" --sft-steps 0 --steps "$RL_STEPS" \
        --objective "$objective" --world-reward "$reward"
      # The pass@k run's base is the warm-up model: evaluated once, with that run (so a pass@k
      # run that failed leaves that seed's warm-up model out too).
      if [ -f "$run/summary.json" ] && [ ! -s "$run.eval.json" ]; then
        "$arc_rec" eval --run "$run" --n "$EVAL_N" --models "$models" --json > "$run.eval.json.tmp" 2> "$run.eval.log"
        mv "$run.eval.json.tmp" "$run.eval.json"
      fi
      models=rl
    done
  done
done
# shellcheck disable=SC2086
python3 "$root/scripts/rft_experiment_table.py" "$out" --seeds $SEEDS --rewards $REWARDS
