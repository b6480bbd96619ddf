#!/usr/bin/env bash
# Fault tests at load, with counts anyone can rerun (issue: reliability). Each check prints
# PASS or FAIL with its figures; the exit status is 0 when every check passed.
#
#     scripts/fault-tests.sh [RATE] [SECONDS]       (default 300 requests/s for 40 s)
#
# database-restart: `arc-rec serve` on its own embedded cluster takes RATE recommendation
#   requests/s (`arc-rec bench load`, open loop); a third of the way in Postgres is stopped
#   (`arc-rec db stop`), 5 s later started again (`arc-rec migrate` starts it). Passes when every
#   request the client saw answered 200 has its decision in the database afterwards (rows counted
#   by event id), the failures during the outage were 503s answered within the bound (3 s pool
#   acquire timeout + 2 s), and the service answered 200 again after the restart without being
#   restarted itself.
#
# Environment: ARC_REC (binary; default target/release/arc-rec).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
rate="${1:-300}"
seconds="${2:-40}"
# shellcheck source=scripts/server-lib.sh
source "$root/scripts/server-lib.sh"
work_dir arc-rec-faults
failed=0
report() { # NAME PASS|FAIL DETAILS
  printf '%-18s %s  %s\n' "$1" "$2" "$3"
  [ "$2" = PASS ] || failed=1
}

# A small clustered world, a platform key and request bodies from its own contexts.
"$arc_rec" simulate --seed 7 --outcomes 2000 --orgs acme > /dev/null 2> "$work/setup.log"
"$arc_rec" cluster > /dev/null 2>> "$work/setup.log"
"$arc_rec" export --out "$work/examples.jsonl" > /dev/null 2>> "$work/setup.log"
key="$("$arc_rec" keys create --org acme --role platform --label fault-tests 2>> "$work/setup.log")"
python3 - "$work/examples.jsonl" > "$work/bodies.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    context = json.loads(line)["context"]
    if not context["failures"]:
        continue
    failures = [{"failure_category": f["failure_category"], "error_message": f["example"]}
                for f in context["failures"][:3]]
    print(json.dumps({"failure_context": {"failures": failures},
                      "current_config": context["current_config"], "k": 3}))
PY

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
server=""

exit "$failed"
