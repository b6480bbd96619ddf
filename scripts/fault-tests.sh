#!/usr/bin/env bash
# Fault tests at load, with counts anyone can rerun (issue: reliability). Each check prints
# PASS or FAIL with its figures; the exit status is 0 when every check passed.
#
#     scripts/fault-tests.sh [RATE] [SECONDS]       (default 300 requests/s for 40 s)
#
# FAULT_CHECKS picks the checks (default: all five, in this order):
#
# database-restart: `arc-rec serve` on its own embedded cluster takes RATE recommendation
#   requests/s (`arc-rec bench load`, open loop); a third of the way in Postgres is stopped
#   (`arc-rec db stop`), 5 s later started again (`arc-rec migrate` starts it). Passes when every
#   request the client saw answered 200 has its decision in the database afterwards (rows counted
#   by event id), the failures during the outage were 503s answered within the bound (3 s pool
#   acquire timeout + 2 s), and the service answered 200 again after the restart without being
#   restarted itself.
# replica: two `arc-rec serve` processes on one database. An answer sent to one changes the
#   other's mean scores within 3 s (its feedback poll, 1 s, and a learner batch), in each of 5
#   trials; a key revoked with `arc-rec keys revoke` is refused (401) by both within the auth
#   cache's 30 s.
# startup-at-scale: STARTUP_DECISIONS (default 1,000,000) logged decisions, each with one answer
#   (copies of a few thousand real ones, spread over the past hours). A first start replays the
#   whole log and stores the learners' snapshots when stopped; a second start restores them and
#   replays only what came after. Passes when the second start listens within 60 s and both
#   stops stored snapshots that count every answer exactly once, and `GET /dashboard` (every
#   query of the page) answers within 1 s. Also prints how long `arc-rec analytics acceptance`
#   takes per grouping on that log.
# kill-during-checkpoint: a tiny `arc-rec train` run is SIGKILLed in the middle of writing its
#   step-4 checkpoint; `--resume` continues from step 2 and ends with the same metrics, line for
#   line but timings, as a run never killed.
# full-disk: a tmpfs that fills (root only; skipped otherwise) under `export` (64 kB), a
#   training run (filled when its first RL checkpoint is written) and `candidates --out` (full):
#   each fails with "No space left on device" and leaves no partial output (no file, no
#   temporary file, no half-written checkpoint; the earlier checkpoint resumes elsewhere).
#
# Environment: ARC_REC (binary; default target/release/arc-rec), FAULT_CHECKS, STARTUP_DECISIONS,
# KEEP_WORK=1 (keep the work directory, its database included, and print where).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
rate="${1:-300}"
seconds="${2:-40}"
# shellcheck source=scripts/server-lib.sh
source "$root/scripts/server-lib.sh"
work_dir arc-rec-faults
checks="${FAULT_CHECKS:-database-restart replica startup-at-scale kill-during-checkpoint full-disk}"
wants() { [[ " $checks " == *" $1 "* ]]; }
failed=0
report() { # NAME PASS|FAIL DETAILS
  printf '%-18s %s  %s\n' "$1" "$2" "$3"
  [ "$2" = PASS ] || failed=1
}

# A small clustered world, a platform key and request bodies from its own contexts.
small_world
key="$("$arc_rec" keys create --org acme --role platform --label fault-tests 2>> "$work/setup.log")"

if wants database-restart; then
echo "== database-restart: $rate requests/s for $seconds s, Postgres stopped for 5 s a third of the way in"
start_server --rate-limit platform=off
url="http://127.0.0.1:$port/v1/recommendations"
(
  sleep "$((seconds / 3 + 1))"
  "$arc_rec" db stop > /dev/null 2>> "$work/setup.log"
  date +%s.%N > "$work/stopped_at"
  sleep 5
  "$arc_rec" migrate > /dev/null 2>> "$work/setup.log"
  date +%s.%N > "$work/started_at"
) &
outage=$!
ARC_REC_LOAD_KEY="$key" "$arc_rec" bench load --url "$url" --bodies "$work/bodies.jsonl" \
  --rate "$rate" --duration "$seconds" --latency-log "$work/answers.csv" > "$work/load.json"
wait "$outage"
# Every acknowledged decision is in the database.
python3 - "$work/answers.csv" > "$work/acknowledged.txt" <<'PY'
import csv, sys
for row in csv.DictReader(open(sys.argv[1])):
    if row["status"] == "200" and row["event_id"]:
        print(row["event_id"])
PY
acknowledged=$(wc -l < "$work/acknowledged.txt")
found=$(psql "$("$arc_rec" db url 2>> "$work/setup.log")" -At -v ON_ERROR_STOP=1 -c "
  CREATE TEMP TABLE acked (event_id uuid);
  COPY acked FROM STDIN;" -c "SELECT count(*) FROM decision_log d JOIN acked a USING (event_id);" \
  < "$work/acknowledged.txt" | tail -n 1)
figures=$(python3 - "$work/answers.csv" "$work/load.json" <<'PY'
import csv, json, sys
rows = list(csv.DictReader(open(sys.argv[1])))
load = json.load(open(sys.argv[2]))
by_status = {}
for row in rows:
    by_status[row["status"]] = by_status.get(row["status"], 0) + 1
failed = [r for r in rows if r["status"] != "200"]
by_status[""] = by_status.pop("", 0)  # no answer at all
if not by_status[""]:
    del by_status[""]
slowest_failure = max((float(r["latency_ms"]) for r in failed if r["latency_ms"]), default=0.0)
ok_after = sum(1 for r in rows[-100:] if r["status"] == "200")
print(json.dumps({"sent": load["sent"], "by_status": by_status,
                  "slowest_failure_ms": round(slowest_failure, 1),
                  "ok_in_last_100": ok_after}))
PY
)
echo "   $figures"
verdict=PASS
[ "$found" -eq "$acknowledged" ] || verdict=FAIL
python3 - "$figures" <<'PY' || verdict=FAIL
import json, sys
f = json.loads(sys.argv[1])
others = {s: n for s, n in f["by_status"].items() if s not in ("200", "503")}
assert not others, f"statuses other than 200 and 503: {others}"
assert f["slowest_failure_ms"] <= 5000, "a failure took longer than 5 s"
assert f["ok_in_last_100"] == 100, "not all of the last 100 requests answered 200"
PY
report database-restart "$verdict" "200s counted by the client: $acknowledged, their decisions found: $found"
kill "$server" 2>/dev/null && wait "$server" 2>/dev/null || true
fi

db_url="$("$arc_rec" db url 2>> "$work/setup.log")"
sql() { psql "$db_url" -At -v ON_ERROR_STOP=1 "$@"; }

if wants replica; then
  echo "== replica: two servers on one database; answers sent to one, mean scores read from the other; a key revoked"
  server_log="$work/serve-a.log" start_server --rate-limit platform=off
  server_a=$server url_a="http://127.0.0.1:$port"
  server_log="$work/serve-b.log" start_server --rate-limit platform=off
  server_b=$server url_b="http://127.0.0.1:$port"
  learning=$(python3 "$root/scripts/fault_checks.py" replica "$url_a" "$url_b" "$key" "$work/bodies.jsonl" 5)
  echo "   feedback: $learning"
  verdict=PASS
  python3 -c 'import json,sys; d=json.loads(sys.argv[1])["delays_s"]; assert all(x is not None and x <= 3 for x in d), d' "$learning" || verdict=FAIL
  report replica-feedback "$verdict" "answer to A seen in B's mean scores after: $(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["delays_s"])' "$learning") s (bound 3 s)"
  doomed="$("$arc_rec" keys create --org acme --role platform --label doomed 2>> "$work/setup.log")"
  doomed_id="$(cut -d_ -f2 <<< "$doomed")" # arc_<key id>_<secret>
  coproc revocation { python3 "$root/scripts/fault_checks.py" revocation "$url_a" "$url_b" "$doomed" "$work/bodies.jsonl"; }
  read -r ready <&"${revocation[0]}"
  [ "$ready" = ready ] || { echo "revocation check did not start" >&2; exit 1; }
  "$arc_rec" keys revoke --org acme --key-id "$doomed_id" > /dev/null 2>> "$work/setup.log"
  echo revoked >&"${revocation[1]}"
  read -r revoked <&"${revocation[0]}"
  wait "$revocation_PID" 2> /dev/null || true
  echo "   revocation: $revoked"
  verdict=PASS
  python3 -c 'import json,sys; d=json.loads(sys.argv[1])["delays_s"]; assert set(d) == {"a","b"} and max(d.values()) <= 31, d' "$revoked" || verdict=FAIL
  report replica-revocation "$verdict" "revoked key refused by A and B after: $revoked (bound 30 s)"
  kill "$server_a" "$server_b" 2> /dev/null; wait "$server_a" "$server_b" 2> /dev/null || true
fi

if wants startup-at-scale; then
  decisions="${STARTUP_DECISIONS:-1000000}"
  echo "== startup-at-scale: $decisions logged decisions with one answer each"
  # A few thousand real decisions, answered, to copy.
  start_server --rate-limit platform=off
  ARC_REC_LOAD_KEY="$key" "$arc_rec" bench load --url "http://127.0.0.1:$port/v1/recommendations" \
    --bodies "$work/bodies.jsonl" --rate 200 --duration 10 > /dev/null
  kill "$server" && wait "$server" 2> /dev/null || true
  started=$(date +%s)
  sql -c "DELETE FROM bandit_state" -c "DELETE FROM feedback" > /dev/null
  seeds=$(sql -c "SELECT count(*) FROM decision_log")
  copies=$(( (decisions + seeds - 1) / seeds ))
  # Each round gives the seeds new event ids, an hour-spread earlier time and an answer to one
  # shown item (accepted with probability 0.3), and inserts them.
  sql > /dev/null <<SQL
SET synchronous_commit = off;
CREATE TEMP TABLE seed_log AS SELECT * FROM decision_log;
CREATE TEMP TABLE seed_items AS SELECT * FROM decision_items;
CREATE TEMP TABLE seed_ids (old_id uuid PRIMARY KEY, new_id uuid);
INSERT INTO seed_ids SELECT event_id, event_id FROM seed_log;
DO \$\$
BEGIN
  FOR round IN 1..$copies LOOP
    UPDATE seed_ids SET old_id = new_id, new_id = gen_random_uuid();
    UPDATE seed_log l SET event_id = i.new_id, created_at = l.created_at - interval '6 seconds'
      FROM seed_ids i WHERE l.event_id = i.old_id;
    UPDATE seed_items t SET event_id = i.new_id FROM seed_ids i WHERE t.event_id = i.old_id;
    INSERT INTO decision_log SELECT * FROM seed_log;
    INSERT INTO decision_items SELECT * FROM seed_items;
    INSERT INTO feedback (org_id, event_id, recommendation_id, outcome, received_at)
      SELECT t.org_id, t.event_id, t.recommendation_id,
             CASE WHEN random() < 0.3 THEN 'accepted' ELSE 'rejected' END,
             l.created_at + interval '2 seconds'
      FROM seed_items t JOIN seed_log l USING (org_id, event_id)
      WHERE t.position = (abs(hashtext(t.event_id::text)) % 3);
    COMMIT;
  END LOOP;
END
\$\$;
SELECT arc_rec_recount_acceptance();
ANALYZE;
SQL
  logged=$(sql -c "SELECT count(*) FROM decision_log")
  answers=$(sql -c "SELECT count(*) FROM feedback")
  echo "   fixture: $logged decisions, $answers answers, $(($(date +%s) - started)) s to write"
  # What an analyst waits for on this log: `arc-rec analytics acceptance` per grouping, the whole
  # process (connecting and the schema check included), the API's query and numbers.
  timings=""
  for group in cluster type provider source policy day; do
    t0=$(date +%s.%N)
    "$arc_rec" analytics acceptance --group-by "$group" > /dev/null 2>> "$work/setup.log"
    timings="$timings $group $(python3 -c "import time; print(round(time.time() - $t0, 2))") s,"
  done
  echo "   acceptance on this log (arc-rec analytics acceptance, whole process):${timings%,}"
  # First start: the whole log.
  t0=$(date +%s.%N)
  server_log="$work/serve-full.log" server_start_timeout=3600 start_server --rate-limit platform=off
  t_listen_full=$(python3 -c "import time; print(round(time.time() - $t0, 1))")
  kill -TERM "$server"; wait "$server" 2> /dev/null || true
  t_full=$(python3 -c "import time; print(round(time.time() - $t0, 1))")
  count_full=$(sql -c "SELECT coalesce(sum(feedback_count), 0) FROM bandit_state")
  # Second start: the snapshots and the tail.
  t0=$(date +%s.%N)
  server_log="$work/serve-snapshot.log" start_server --rate-limit platform=off
  t_listen_snapshot=$(python3 -c "import time; print(round(time.time() - $t0, 1))")
  rss_snapshot=$(awk '/VmHWM/ {print int($2 / 1024)}' "/proc/$server/status")
  # What an analyst waits for in a browser on this log: GET /dashboard (all its queries), cold
  # then warm.
  analyst="$("$arc_rec" keys create --org acme --role analyst --label fault-tests-dashboard 2>> "$work/setup.log")"
  dashboard_s=$(python3 - "$port" "$analyst" <<'PY'
import sys, time, urllib.request
port, key = sys.argv[1:3]
times = []
for _ in range(4):
    request = urllib.request.Request(f"http://127.0.0.1:{port}/dashboard",
                                     headers={"Authorization": f"Bearer {key}"})
    started = time.time()
    with urllib.request.urlopen(request, timeout=120) as response:
        response.read()
    times.append(time.time() - started)
print(" ".join(f"{t:.3f}" for t in times))
PY
)
  kill -TERM "$server"; wait "$server" 2> /dev/null || true
  count_snapshot=$(sql -c "SELECT coalesce(sum(feedback_count), 0) FROM bandit_state")
  loaded() { # the server's own account of its start
    grep 'serving state loaded' "$1" | python3 -c '
import json, sys
line = sys.stdin.readline()
try:
    d = json.loads(line)
    # (no quotes inside the f-string: Python before 3.12 refuses them)
    restored, replayed, seconds = d["restored"], d["replayed"], d["seconds"]
    print(f"{restored} organizations restored, {replayed} rows replayed in {seconds:.1f} s")
except ValueError:
    print(line.strip())'
  }
  echo "   whole log: listening after $t_listen_full s ($(loaded "$work/serve-full.log")), every answer learned and stopped after $t_full s"
  echo "   snapshots: listening after $t_listen_snapshot s ($(loaded "$work/serve-snapshot.log")), peak RSS $rss_snapshot MB"
  echo "   GET /dashboard on this log, whole page, cold then warm: $dashboard_s s"
  verdict=PASS
  [ "$count_full" -eq "$answers" ] && [ "$count_snapshot" -eq "$answers" ] || verdict=FAIL
  python3 -c "assert $t_listen_snapshot <= 60" || verdict=FAIL
  python3 -c "assert max(map(float, '$dashboard_s'.split())) < 1.0" || verdict=FAIL
  report startup-at-scale "$verdict" "answers: $answers, learned by the snapshots: $count_full then $count_snapshot; listening after $t_listen_full s (whole log) vs $t_listen_snapshot s (snapshots, bound 60 s); dashboard $dashboard_s s (bound 1 s)"
fi

# A tiny run: 4 warm-up steps, 6 RL steps, checkpoints every 2 (as tests/it/train.rs, graded by
# the logged decisions).
train_args=(train --data "$work/examples.jsonl" --model "$work/tiny" --grader logged
  --sft-steps 4 --sft-batch 4 --steps 6 --k 2 --n 4 --prompts-per-step 2 --max-new-tokens 24
  --checkpoint-every 2 --lr-warmup-steps 1 --device cpu --seed 7 --objective pass@k
  --keep-zero-advantage-groups --kl-coef 0.1 --no-record)
if wants kill-during-checkpoint || wants full-disk; then
  "$arc_rec" model init --preset tiny --corpus-outcomes 300 --out "$work/tiny" > /dev/null 2>> "$work/setup.log"
  "$arc_rec" "${train_args[@]}" --out "$work/run-whole" > "$work/train-whole.log" 2>&1
fi

if wants kill-during-checkpoint; then
  echo "== kill-during-checkpoint: SIGKILL while step 4's checkpoint is written, then --resume"
  set +e
  ARC_REC_TEST_KILL_IN_CHECKPOINT=4 "$arc_rec" "${train_args[@]}" --out "$work/run-killed" > "$work/train-killed.log" 2>&1
  status=$?
  set -e
  left="$(ls "$work/run-killed/checkpoints" | tr '\n' ' ')"
  verdict=PASS
  [ "$status" -eq 137 ] || verdict=FAIL
  "$arc_rec" train --resume "$work/run-killed" --no-record > "$work/train-resumed.log" 2>&1 || verdict=FAIL
  lines=$(python3 "$root/scripts/fault_checks.py" same-metrics "$work/run-whole" "$work/run-killed") || verdict=FAIL
  report kill-during-checkpoint "$verdict" "exit status $status; checkpoints after the kill: $left; resumed run's metrics equal the unkilled run's: ${lines:-no} lines"
fi

if wants full-disk; then
  echo "== full-disk: export, a checkpoint and candidates --out on a tmpfs that fills"
  full="$work/full"
  mkdir -p "$full"
  if [ "$(id -u)" -ne 0 ] || ! mount -t tmpfs -o size=64k tmpfs "$full" 2> /dev/null; then
    echo "   SKIP: mounting a tmpfs needs root"
  else
    mounted="$full" # unmounted on exit
    refill() { # SIZE: a fresh, empty tmpfs of SIZE
      umount "$full"; mount -t tmpfs -o "size=$1" tmpfs "$full"
    }
    no_space() { grep -q "No space left on device" "$1"; }
    # The error as the user saw it: its "No space left" part, or its last line.
    said() { grep -o 'No space left on device' "$1" | head -1 | grep . || tail -n 1 "$1"; }
    # export: megabytes of examples into 64 kB.
    verdict=PASS
    if "$arc_rec" export --out "$full/examples.jsonl" > /dev/null 2> "$work/export-full.log"; then verdict=FAIL; fi
    no_space "$work/export-full.log" || verdict=FAIL
    [ -z "$(ls -A "$full")" ] || verdict=FAIL
    report full-disk-export "$verdict" "error: $(said "$work/export-full.log"); left behind: $(ls -A "$full" | wc -l) files"
    # A checkpoint: the disk fills (all but 64 kB, room for metrics lines) once the first RL
    # checkpoint (step 6) is written, so the next one cannot be.
    refill 64m
    verdict=PASS
    "$arc_rec" "${train_args[@]}" --out "$full/run" > "$work/train-full.log" 2>&1 &
    trainer=$!
    until [ -d "$full/run/checkpoints/step-00000006" ] || ! kill -0 "$trainer" 2> /dev/null; do sleep 0.05; done
    avail_kb=$(df -k --output=avail "$full" | tail -1)
    dd if=/dev/zero of="$full/filler" bs=1k count=$((avail_kb - 64)) 2> /dev/null || true
    if wait "$trainer"; then verdict=FAIL; fi
    no_space "$work/train-full.log" || verdict=FAIL
    left="$(ls "$full/run/checkpoints" 2> /dev/null | tr '\n' ' ')"
    case "$left" in *.tmp*) verdict=FAIL ;; esac
    [ -n "$left" ] || verdict=FAIL
    rm -f "$full/filler"
    rm -rf "$work/run-rescued" && cp -r "$full/run" "$work/run-rescued"
    "$arc_rec" train --resume "$work/run-rescued" --no-record > "$work/train-rescued.log" 2>&1 || verdict=FAIL
    report full-disk-checkpoint "$verdict" "error: $(said "$work/train-full.log"); checkpoints left: $left; resumed elsewhere from them: $([ "$verdict" = PASS ] && echo yes || echo no)"
    # candidates --out: a full tmpfs.
    refill 64k
    dd if=/dev/zero of="$full/filler" bs=4k 2> /dev/null || true
    verdict=PASS
    if "$arc_rec" candidates --run "$work/run-whole" --k 2 --max-new-tokens 160 --out "$full/candidates.jsonl" > /dev/null 2> "$work/candidates-full.log"; then verdict=FAIL; fi
    no_space "$work/candidates-full.log" || verdict=FAIL
    [ "$(ls -A "$full")" = filler ] || verdict=FAIL
    report full-disk-candidates "$verdict" "error: $(said "$work/candidates-full.log"); files besides the filler: $(ls -A "$full" | grep -vc '^filler$')"
    umount "$full"
    mounted=""
  fi
fi

exit "$failed"
