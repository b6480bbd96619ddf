#!/usr/bin/env bash
# A soak of mixed traffic (issue: reliability): `arc-rec serve` on its own embedded cluster, with
# its default rate limits, takes RATE requests/s for SECONDS (`arc-rec bench load --mix`,
# open loop): by default 60 % recommendations, 25 % feedback on earlier answers, 14.8 %
# trajectories and one analytics query in 500 (1/s at 500/s; acceptance queries read the counts
# kept as decisions and answers are written, sql/0015). SOAK_MIX sets another mix (`bench load --mix`'s
# syntax). The server's RSS is sampled every 5 s. Prints the figures per endpoint and PASS when there were no errors and memory was
# flat: the RSS at the end at most 10 % above the RSS a quarter of the way in (after warm-up).
# Trajectory bodies are whole simulation runs of a second world (first stored, then re-posted
# unchanged).
#
#     scripts/soak.sh [RATE] [SECONDS]      (default 500 requests/s for 600 s)
#
# Environment: ARC_REC (binary; default target/release/arc-rec). Figures go to $SOAK_OUT (a
# directory; default: a temporary one, removed) as load.json and rss.csv.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
rate="${1:-500}"
seconds="${2:-600}"
# shellcheck source=scripts/server-lib.sh
source "$root/scripts/server-lib.sh"
work_dir arc-rec-soak
out="${SOAK_OUT:-$work}"
mkdir -p "$out"

small_world
# Trajectories of another world, as the platform would post them: its users, scenarios and
# configurations ingested first, then one body per simulation run (the simulation, its outcomes
# and their failure patterns, stored together), re-posted round-robin; each body holds what it
# refers to, so bodies in flight at once never wait on each other.
"$arc_rec" simulate --seed 8 --outcomes 400 --orgs acme --out "$work/world8.jsonl" \
  > /dev/null 2>> "$work/setup.log"
python3 - "$work/world8.jsonl" "$work/base.jsonl" "$work/trajectories.jsonl" <<'PY'
import json, sys
base, runs, run_of = open(sys.argv[2], "w"), {}, {}
for line in open(sys.argv[1]):
    record = json.loads(line)
    kind, data = record["kind"], record["data"]
    if kind == "simulation":
        runs[data["simulation_id"]] = [record]
    elif kind == "outcome":
        runs[data["simulation_id"]].append(record)
        run_of[data["outcome_id"]] = data["simulation_id"]
    elif kind == "failure_pattern":
        runs[run_of[data["outcome_id"]]].append(record)
    else:
        base.write(line)
with open(sys.argv[3], "w") as out:
    for records in runs.values():
        out.write(json.dumps(records) + "\n")
PY
"$arc_rec" ingest "$work/base.jsonl" > /dev/null 2>> "$work/setup.log"
platform="$("$arc_rec" keys create --org acme --role platform --label soak 2>> "$work/setup.log")"
analyst="$("$arc_rec" keys create --org acme --role analyst --label soak 2>> "$work/setup.log")"

mix="${SOAK_MIX:-recommendations=300,feedback=125,trajectories=74,analytics=1}"
start_server
echo "== soak: $rate requests/s for $seconds s against port $port"
(
  # RssAnon is the heap (and stacks); RssFile the binary's pages touched so far, which grow
  # as code paths are first run and are not a leak.
  echo "seconds,rss_mb,anon_mb,file_mb"
  t0=$(date +%s)
  while kill -0 "$server" 2> /dev/null; do
    rss=$(awk '/^VmRSS/ {r = int($2 / 1024)} /^RssAnon/ {a = int($2 / 1024)}
      /^RssFile/ {f = int($2 / 1024)} END {if (r != "") print r "," a "," f}' \
      "/proc/$server/status" 2> /dev/null || true)
    [ -n "$rss" ] && echo "$(($(date +%s) - t0)),$rss"
    sleep 5
  done
) > "$out/rss.csv" &
sampler=$!
ARC_REC_LOAD_KEY="$platform" ARC_REC_LOAD_ANALYTICS_KEY="$analyst" "$arc_rec" bench load \
  --url "http://127.0.0.1:$port" --mix "$mix" \
  --bodies "$work/bodies.jsonl" --trajectory-bodies "$work/trajectories.jsonl" \
  --rate "$rate" --duration "$seconds" > "$out/load.json"
kill "$sampler" 2> /dev/null || true
python3 - "$out/load.json" "$out/rss.csv" "$seconds" <<'PY'
import csv, json, sys
load = json.load(open(sys.argv[1]))
samples = list(csv.DictReader(open(sys.argv[2])))
rss = [(int(r["seconds"]), int(r["rss_mb"])) for r in samples]
seconds = int(sys.argv[3])
print(f"   sent {load['sent']}, ok {load['ok']}, errors {load['errors']}, "
      f"achieved {load['achieved_rate']:.1f}/s, p99 {load['p99_ms']:.1f} ms overall")
print(f"   {'endpoint':<16}{'sent':>8}{'errors':>8}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}")
for name, e in load["endpoints"].items():
    fmt = lambda v: f"{v:9.1f}" if v is not None else f"{'-':>9}"
    print(f"   {name:<16}{e['sent']:>8}{e['errors']:>8}{fmt(e['p50_ms'])}{fmt(e['p99_ms'])}{fmt(e['max_ms'])}")
if load.get("errors_by_kind"):
    kinds = ", ".join(f"{kind}: {n}" for kind, n in load["errors_by_kind"].items())
    print(f"   errors by kind (HTTP status, or why no answer came): {kinds}")
start = rss[0][1]
quarter = next(mb for s, mb in rss if s >= seconds // 4)
end = rss[-1][1]
peak = max(mb for _, mb in rss)
print(f"   server RSS: {start} MB at start, {quarter} MB a quarter in, {end} MB at the end, peak {peak} MB")
first, last = samples[0], samples[-1]
print(f"   of which anonymous (heap): {first['anon_mb']} -> {last['anon_mb']} MB, "
      f"file-backed (binary pages): {first['file_mb']} -> {last['file_mb']} MB")
flat = end <= 1.10 * quarter
verdict = "PASS" if load["errors"] == 0 and flat else "FAIL"
print(f"soak {verdict}  errors {load['errors']} of {load['sent']}; RSS end/quarter {end / quarter:.2f} (bound 1.10)")
sys.exit(0 if verdict == "PASS" else 1)
PY
