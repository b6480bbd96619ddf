#!/usr/bin/env bash
# One round of exploration data for the learned grader (issue 20), on the synthetic world: the
# learned-grader RL model's own ideas are shown and answered, the grader is refitted on the logged
# decisions plus those answers, and RL runs again from the same warm-up with the same recipe.
#
#     experiments/exploration-round.sh OUT
#
# OUT is experiments/rft-experiment.sh's output directory (its OUT/world$WORLD_SEED holds w$SEED, the
# warm-up, and s$SEED-sampled-pass-$LEARNED, round 1: RL with `--grader learned`), after
# experiments/pipeline-experiment.sh (OUT/world$WORLD_SEED/pipeline/ holds the world's clustered
# database). Per seed, into OUT/world$WORLD_SEED/explore/:
#   1. round 1's model samples $N ideas for each *train* prompt, each answered by the world in its
#      context (`arc-rec eval --grader world --samples-out` on a run pointed at a copy of the data
#      with the splits swapped: the held-out prompts stay unseen), samples-s$SEED.jsonl;
#   2. the data plus one logged decision per well-formed idea (experiments/exploration_data.py),
#      aug-s$SEED.jsonl: what a platform's log holds once it has shown the model's ideas;
#   3. round 2, r2-s$SEED: `arc-rec train --grader learned` on that data from the warm-up, round
#      1's recipe otherwise; held out, `arc-rec eval --grader world` (r2-s$SEED.eval.json);
#   4. round 2's candidates, priced by the grader of that data, and `arc-rec bench pipeline` on
#      traffic seeds $TRAFFIC_SEEDS (explore/pipeline/s$SEED-t$TRAFFIC.json).
# Tables: experiments/rft_experiment_table.py on a directory naming r2-s$SEED as an ablation of round
# 1 (or as the pass@k run, against the warm-ups), and experiments/pipeline_table.py OUT/world$WORLD_SEED/explore/pipeline
# [--against OUT/world$WORLD_SEED/pipeline]. Idempotent: what exists is kept.
#
# Environment: SEEDS ("1 2 3 4 5"), TRAFFIC_SEEDS ("1 2 3"), ROUNDS (10000), WORLD_SEED (1),
# WORLD_OUTCOMES (20000), LEARNED (learned), N (4, ideas per train prompt), K (8, candidates per
# context), ARC_REC (binary).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
arc_rec="${ARC_REC:-$root/target/release/arc-rec}"
out="${1:?usage: exploration-round.sh OUT, the output directory of experiments/rft-experiment.sh}"
SEEDS="${SEEDS:-1 2 3 4 5}"
TRAFFIC_SEEDS="${TRAFFIC_SEEDS:-1 2 3}"
ROUNDS="${ROUNDS:-10000}"
WORLD_SEED="${WORLD_SEED:-1}"
WORLD_OUTCOMES="${WORLD_OUTCOMES:-20000}"
LEARNED="${LEARNED:-learned}"
N="${N:-4}"
K="${K:-8}"
[ -x "$arc_rec" ] || { echo "exploration-round: build $arc_rec first (cargo build --release)" >&2; exit 2; }
python=python3
[ -x "$root/.venv/bin/python" ] && python="$root/.venv/bin/python"
work="$(cd "$out/world$WORLD_SEED" && pwd)"
[ -f "$work/pipeline/db.ready" ] || { echo "exploration-round: run experiments/pipeline-experiment.sh $out first" >&2; exit 2; }
# The runs' data paths are relative to the work directory.
cd "$work"
mkdir -p explore/pipeline
[ -s explore/flipped.jsonl ] || "$python" "$root/experiments/exploration_data.py" flip examples.jsonl explore/flipped.jsonl
for seed in $SEEDS; do
  round1="s$seed-sampled-pass-$LEARNED"
  [ -f "$round1/summary.json" ] || { echo "exploration-round: no finished run $round1, skipping seed $seed" >&2; continue; }
  # 1. Round 1's model on the train prompts: a run directory of links whose data has the splits swapped.
  probe="explore/probe-s$seed"
  mkdir -p "$probe"
  for f in "$round1"/*; do
    case "$(basename "$f")" in
      config.json | grader.json | eval.json | eval.png) ;;
      *) ln -sfn "$work/$f" "$probe/$(basename "$f")" ;;
    esac
  done
  "$python" - "$round1/config.json" "$probe/config.json" <<'PY'
import json, sys
config = json.load(open(sys.argv[1]))
config["data"], config["grader"] = "explore/flipped.jsonl", "world"
json.dump(config, open(sys.argv[2], "w"), indent=2)
PY
  export ARC_REC_DATA_DIR="$work/db"
  [ -s "explore/samples-s$seed.jsonl" ] ||
    "$arc_rec" eval --run "$probe" --grader world --n "$N" --models rl --seed 11 \
      --samples-out "explore/samples-s$seed.jsonl" --json > "explore/probe-s$seed.eval.json"
  # 2. The logged decisions plus the answered ideas.
  [ -s "explore/aug-s$seed.jsonl" ] ||
    "$python" "$root/experiments/exploration_data.py" augment examples.jsonl "explore/samples-s$seed.jsonl" \
      "explore/aug-s$seed.jsonl" "x$seed"
  # 3. Round 2: round 1's recipe (config.json) on that data, from the same warm-up.
  round2="explore/r2-s$seed"
  if [ ! -f "$round2/summary.json" ]; then
    { read -r warmup; read -r steps; } < <("$python" -c 'import json,sys; c = json.load(open(sys.argv[1])); print(c["model"]); print(c["steps"])' "$round1/config.json")
    "$arc_rec" train --data "explore/aug-s$seed.jsonl" --out "$round2" --no-record --seed "$seed" \
      --world-seed "$WORLD_SEED" --world-outcomes "$WORLD_OUTCOMES" --model "$warmup" --sft-steps 0 \
      --steps "$steps" \
      --objective pass@k --world-reward sampled --grader learned
  fi
  [ -s "$round2.eval.json" ] || "$arc_rec" eval --run "$round2" --grader world --n 16 --models rl --json > "$round2.eval.json"
  # 4. Its candidates in the pipeline, beside the heuristics.
  export ARC_REC_DATA_DIR="$work/pipeline/db"
  menu="explore/pipeline/rllearned-s$seed.jsonl"
  [ -s "$menu" ] || "$arc_rec" candidates --k "$K" --out "$menu" --run "$round2" > "${menu%.jsonl}.log"
  for traffic in $TRAFFIC_SEEDS; do
    report="explore/pipeline/s$seed-t$traffic.json"
    [ -s "$report" ] && continue
    "$arc_rec" bench pipeline --world-seed "$WORLD_SEED" --world-outcomes "$WORLD_OUTCOMES" --rounds "$ROUNDS" \
      --seed "$traffic" --arm "rllearned=$menu" --json > "$report.tmp"
    mv "$report.tmp" "$report"
  done
done
"$python" "$root/experiments/pipeline_table.py" explore/pipeline
