# shellcheck shell=bash
# Shared by the experiments' scripts (source it): one world's simulated history in its own
# embedded database, exported once.
#
#   enter_world    needs $arc_rec, $out, $WORLD_SEED and $WORLD_OUTCOMES; moves into
#                  $out/world$WORLD_SEED, exports ARC_REC_DATA_DIR there, sets the array `world`
#                  (train's and eval's --world-seed/--world-outcomes) and writes examples.jsonl
#                  unless it is there.
enter_world() {
  work="$out/world$WORLD_SEED"
  mkdir -p "$work"
  cd "$work"
  export ARC_REC_DATA_DIR="$work/db"
  world=(--world-seed "$WORLD_SEED" --world-outcomes "$WORLD_OUTCOMES")
  if [ ! -s examples.jsonl ]; then
    "$arc_rec" simulate --seed "$WORLD_SEED" --outcomes "$WORLD_OUTCOMES"
    "$arc_rec" export --out examples.jsonl.tmp
    mv examples.jsonl.tmp examples.jsonl
  fi
}
