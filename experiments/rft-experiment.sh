#!/usr/bin/env bash
# Issue 10's measurement, made sound (issue 19): on the synthetic world (tiny preset, CPU), does
# warm-up + pass@k RL beat warm-up only and warm-up + mean RL at equal steps on held-out true
# best-of-k acceptance, and how much of the gap from warm-up to the menu oracle does it close?
#
#   experiments/rft-experiment.sh [OUT_DIR]          (default out/rft-experiment)
#
# Works in OUT_DIR/world$WORLD_SEED (one directory per world: its database, data, runs): simulates
# the world of seed $WORLD_SEED with $WORLD_OUTCOMES outcomes and exports it, then for every seed
# in $SEEDS (5 by default) one warm-up run (w$SEED: $SFT_STEPS full fine-tuning steps, no RL) and
# from its warm-up model two RL runs of $RL_STEPS steps, objective pass@k and mean, with each
# reward in $REWARDS (sampled: the plan's ±1 draw; expected: 2p − 1). Every model is evaluated on
# the held-out prompts with `arc-rec eval --n $EVAL_N --json` (eval seed 1 for every model, so
# they answer the same draws): w$SEED.eval.json (warm-up), s$SEED-$REWARD-pass.eval.json and
# -mean.eval.json (RL), each with every prompt's figures and the world's baselines (logged
# heuristic, random pick from the menu, menu oracle). Prints the tables of
# experiments/rft_experiment_table.py at the end: paired bootstrap intervals over (seed, prompt).
#
# The ablation: $ABLATIONS, a ';'-separated list of NAME=FLAGS (e.g. "mu=--update-epochs 2
# --minibatches 2;dynamic=--dynamic-sampling"), adds for every seed and reward one more pass@k run
# per entry, s$SEED-$REWARD-pass-NAME, from the same warm-up with the same seed and FLAGS added
# to the defaults, evaluated like the others; the table compares each with the defaults' run.
# "learned=--grader learned" is issue 20's measurement: RL rewarded by a reward model fitted on
# the logged decisions (it reads the world's database for prices), graded at eval by the world.
# $OBJECTIVES (default "pass@k mean") picks the main runs' objectives.
#
# Resumable: finished runs and evaluations are kept, unfinished ones redone (an evaluation
# written before eval reported per-prompt figures counts as unfinished). Runs of the older layout
# (world 1's files directly in OUT_DIR) are reused once moved into OUT_DIR/world1/.
# Needs a built target/release/arc-rec (scripts/quickstart.sh builds it; $ARC_REC names another
# binary); uses its own embedded cluster per world in OUT_DIR/world$WORLD_SEED/db.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
arc_rec="${ARC_REC:-$root/target/release/arc-rec}"
out="${1:-$root/out/rft-experiment}"
SEEDS="${SEEDS:-1 2 3 4 5}"
REWARDS="${REWARDS:-sampled}"
SFT_STEPS="${SFT_STEPS:-300}"
RL_STEPS="${RL_STEPS:-200}"
EVAL_N="${EVAL_N:-16}"
WORLD_SEED="${WORLD_SEED:-1}"
WORLD_OUTCOMES="${WORLD_OUTCOMES:-20000}"
ABLATIONS="${ABLATIONS:-}"
# The objectives of the main runs ("pass@k mean"; "pass@k" alone when only the ablation is wanted).
OBJECTIVES="${OBJECTIVES:-pass@k mean}"
for objective in $OBJECTIVES; do
  case "$objective" in
    pass@k|mean) ;;
    *) echo "rft-experiment: OBJECTIVES takes pass@k and mean, not '$objective'" >&2; exit 2 ;;
  esac
done
ablation_names=()
ablation_flags=()
IFS=';' read -ra ablation_specs <<< "$ABLATIONS"
for spec in "${ablation_specs[@]}"; do
  [ -n "${spec// /}" ] || continue
  name="${spec%%=*}"
  name="${name// /}"
  case "$spec" in
    *=*) ;;
    *) echo "rft-experiment: ABLATIONS entry '$spec' is not NAME=FLAGS" >&2; exit 2 ;;
  esac
  [[ "$name" =~ ^[A-Za-z0-9_.-]+$ ]] || { echo "rft-experiment: ablation name '$name' may only use letters, digits, '.', '_' and '-'" >&2; exit 2; }
  ablation_names+=("$name")
  ablation_flags+=("${spec#*=}")
done
[ -x "$arc_rec" ] || { echo "rft-experiment: build $arc_rec first (cargo build --release)" >&2; exit 2; }
# numpy makes the table's bootstrap fast; the project's virtualenv has it.
python=python3
[ -x "$root/.venv/bin/python" ] && python="$root/.venv/bin/python"
# shellcheck source=experiments/world-lib.sh
source "$root/experiments/world-lib.sh"
enter_world
# Failure clusters, after the export (its prompts stay as before): `--grader learned` places each
# context in its organization's clusters as serving places a request (0 of 911 contexts placed
# without them on world 1; AUC 0.713 -> 0.734 with them).
if [ ! -f clustered ]; then
  "$arc_rec" cluster
  touch clustered
fi
[ -f tiny/config.json ] || "$arc_rec" model init --preset tiny --out tiny

# train RUN_DIR LOG ARGS...: a run, kept when it finished (summary.json), redone otherwise (and
# then its evaluation RUN_DIR.eval.json with it). A run
# that gives up (e.g. a KL blow-up past --max-rollbacks) is reported and left out of the table,
# not the end of the experiment.
train() {
  local dir=$1 log=$2
  shift 2
  if [ ! -f "$dir/summary.json" ]; then
    # A redone run's old evaluation is stale.
    rm -rf "$dir" "$dir.eval.json"
    echo "== $dir"
    "$arc_rec" train --data examples.jsonl --out "$dir" --no-record --seed "$seed" "${world[@]}" "$@" > "$log" 2>&1 ||
      echo "rft-experiment: $dir failed: $(tail -n 1 "$log")" >&2
  fi
}

# evaluate RUN_DIR MODELS REPORT: `eval --json` of a finished run into REPORT, unless REPORT
# already holds per-prompt figures.
evaluate() {
  local dir=$1 models=$2 report=$3
  [ -f "$dir/summary.json" ] || return 0
  if [ -s "$report" ] && grep -q '"per_prompt"' "$report"; then
    return 0
  fi
  echo "== eval $dir ($models)"
  # Every model is judged by the world's truth, whatever grader its run trained with.
  if "$arc_rec" eval --run "$dir" --grader world --n "$EVAL_N" --models "$models" --json > "$report.tmp" 2> "${report%.json}.log"; then
    mv "$report.tmp" "$report"
  else
    echo "rft-experiment: eval of $dir failed: $(tail -n 1 "${report%.json}.log")" >&2
    rm -f "$report.tmp"
  fi
}

for seed in $SEEDS; do
  train "w$seed" "w$seed.log" --model tiny --sft-steps "$SFT_STEPS" --steps 0
  evaluate "w$seed" warmup "w$seed.eval.json"
  for reward in $REWARDS; do
    for objective in $OBJECTIVES; do
      run="s$seed-$reward-${objective%@k}"
      train "$run" "$run.log" --model "w$seed/warmup-model" --sft-steps 0 --steps "$RL_STEPS" \
        --objective "$objective" --world-reward "$reward"
      evaluate "$run" rl "$run.eval.json"
    done
    for i in "${!ablation_names[@]}"; do
      run="s$seed-$reward-pass-${ablation_names[$i]}"
      # shellcheck disable=SC2086  # the flags are words on purpose
      train "$run" "$run.log" --model "w$seed/warmup-model" --sft-steps 0 --steps "$RL_STEPS" \
        --objective pass@k --world-reward "$reward" ${ablation_flags[$i]}
      evaluate "$run" rl "$run.eval.json"
    done
  done
done
# shellcheck disable=SC2086
"$python" "$root/experiments/rft_experiment_table.py" "$work" --seeds $SEEDS --rewards $REWARDS \
  ${ablation_names[@]:+--ablations "${ablation_names[@]}"}
