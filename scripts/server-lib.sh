# Shared by the scripts that run `arc-rec serve` on a throwaway embedded cluster
# (fault-tests.sh, schemathesis.sh). Source it after setting `root` (the repository): it sets
# `arc_rec` to $ARC_REC or target/release/arc-rec and exits 2 unless that binary is built.
#
#     work_dir PREFIX       a temporary directory in $work for the cluster (ARC_REC_DATA_DIR)
#                           and logs, removed with the cluster on exit
#     small_world           a clustered world of 2,000 outcomes for `acme` (seed 7) with the
#                           cluster held running, its export in $work/examples.jsonl and
#                           recommendation requests from it in $work/bodies.jsonl
#     $mounted              a mount point to unmount on exit (a script's tmpfs), if set
#     hold_cluster          keeps the embedded cluster running between commands (each command
#                           stops it on exit when no other arc-rec process uses it) by holding
#                           the users' lock as a running command does, until exit
#     start_server ARGS...  `arc-rec serve --listen 127.0.0.1:0 ARGS...` in the background,
#                           logging to $work/serve.log (or $server_log); sets $server (its pid)
#                           and $port once it listens (waiting up to $server_start_timeout s,
#                           default 60), exits if it fails; every server started is stopped on
#                           exit

arc_rec="${ARC_REC:-$root/target/release/arc-rec}"
[ -x "$arc_rec" ] || {
  echo "$(basename "$0"): build $arc_rec first (cargo build --release)" >&2
  exit 2
}
server=""
work=""

work_dir() {
  work="$(mktemp -d "/tmp/$1.XXXXXX")"
  # Reachable by the postgres user, so that as root the cluster's files stay in it (not under
  # /var/lib/arc-rec/clusters, where removing $work would leave them behind).
  chmod 755 "$work"
  export ARC_REC_DATA_DIR="$work/db"
  trap stop_all EXIT
}

servers=()

stop_all() {
  # Under `set -e` a server or holder dying of the signal must not end the clean-up early.
  for pid in "${servers[@]}"; do
    { kill "$pid" && wait "$pid"; } 2> /dev/null || true
  done
  if [ -n "${mounted:-}" ]; then
    umount "$mounted" 2> /dev/null || true
  fi
  "$arc_rec" db stop > /dev/null 2>&1 || true
  if [ "${KEEP_WORK:-0}" = 1 ]; then
    echo "kept the work directory (KEEP_WORK=1): $work" >&2
  else
    rm -rf "$work"
  fi
}

hold_cluster() {
  "$arc_rec" migrate > /dev/null
  # The lock is held on fd 9 by the sleep itself, so killing it (stop_all) releases the lock.
  (
    exec 9>> "$ARC_REC_DATA_DIR/users.lock"
    flock -s 9
    exec sleep infinity
  ) &
  servers+=("$!")
  "$arc_rec" migrate > /dev/null
}

small_world() {
  "$arc_rec" simulate --seed 7 --outcomes 2000 --orgs acme > /dev/null 2> "$work/setup.log"
  hold_cluster
  "$arc_rec" cluster > /dev/null 2>> "$work/setup.log"
  "$arc_rec" export --out "$work/examples.jsonl" > /dev/null 2>> "$work/setup.log"
  python3 "$root/scripts/request_bodies.py" "$work/examples.jsonl" > "$work/bodies.jsonl"
}

start_server() {
  local log="${server_log:-$work/serve.log}"
  "$arc_rec" serve --listen 127.0.0.1:0 "$@" 2> "$log" &
  server=$!
  servers+=("$server")
  port=""
  for _ in $(seq 1 $((${server_start_timeout:-60} * 2))); do
    port="$(grep -o '(port [0-9]*)' "$log" | grep -o '[0-9]*' || true)"
    [ -n "$port" ] && return 0
    kill -0 "$server" 2> /dev/null || break
    sleep 0.5
  done
  cat "$log" >&2
  echo "$(basename "$0"): the server did not start" >&2
  exit 1
}
