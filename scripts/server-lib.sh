# Shared by the scripts that run `arc-rec serve` on a throwaway embedded cluster
# (fault-tests.sh, schemathesis.sh). Source it after setting `root` (the repository): it sets
# `arc_rec` to $ARC_REC or target/release/arc-rec and exits 2 unless that binary is built.
#
#     work_dir PREFIX       a temporary directory in $work for the cluster (ARC_REC_DATA_DIR)
#                           and logs, removed with the cluster on exit
#     start_server ARGS...  `arc-rec serve --listen 127.0.0.1:0 ARGS...` in the background;
#                           sets $server (its pid) and $port once it listens, exits if it fails

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

stop_all() {
  if [ -n "$server" ]; then
    kill "$server" 2> /dev/null && wait "$server" 2> /dev/null
  fi
  "$arc_rec" db stop > /dev/null 2>&1 || true
  rm -rf "$work"
}

start_server() {
  "$arc_rec" serve --listen 127.0.0.1:0 "$@" 2> "$work/serve.log" &
  server=$!
  port=""
  for _ in $(seq 1 120); do
    port="$(grep -o '(port [0-9]*)' "$work/serve.log" | grep -o '[0-9]*' || true)"
    [ -n "$port" ] && return 0
    kill -0 "$server" 2> /dev/null || break
    sleep 0.5
  done
  cat "$work/serve.log" >&2
  echo "$(basename "$0"): the server did not start" >&2
  exit 1
}
