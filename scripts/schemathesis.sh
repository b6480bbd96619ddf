#!/usr/bin/env bash
# Property-based API testing with Schemathesis against a running `arc-rec serve`: every check
# (`--checks all`: no 5xx, responses as documented, schema-valid requests accepted and
# schema-violating ones refused, undeclared methods 405, ...), once with a key of each role.
#
#     scripts/schemathesis.sh [MAX_EXAMPLES]        (default 100 per operation and phase)
#
# Starts its own embedded cluster under a temporary directory with a small simulated, clustered
# world (so recommendations, placements and analytics have data), creates one key per role,
# serves with rate limits off (a throttled run would answer 429, which Schemathesis counts as
# fine, and test nothing) and runs `tests/schemathesis/schemathesis.toml`'s settings. Schemathesis
# (pinned) goes into .venv-tools/, not the project's .venv. Exit status: 0 when every run passed.
#
# Environment: ARC_REC (binary; default target/release/arc-rec), WORKERS (1: with 2, Python 3.11
# sometimes fails inside Schemathesis with "AST constructor recursion depth mismatch", its own
# runtime error, not a finding).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
max_examples="${1:-100}"
workers="${WORKERS:-1}"
# shellcheck source=scripts/server-lib.sh
source "$root/scripts/server-lib.sh"

venv="$root/.venv-tools"
if [ ! -x "$venv/bin/schemathesis" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet "schemathesis==4.32.5"
fi

work_dir arc-rec-st

"$arc_rec" simulate --seed 5 --outcomes 2000 > /dev/null 2> "$work/setup.log"
"$arc_rec" cluster > /dev/null 2>> "$work/setup.log"
keys=()
for role in platform analyst admin; do
  keys+=("$role=$("$arc_rec" keys create --org acme --role "$role" --label schemathesis 2>> "$work/setup.log")")
done

start_server --rate-limit platform=off --rate-limit analyst=off --rate-limit admin=off

status=0
for entry in "${keys[@]}"; do
  role="${entry%%=*}"
  key="${entry#*=}"
  echo "== schemathesis with the $role key"
  # From the work directory: Schemathesis keeps a cache (.schemathesis/) where it runs.
  if (cd "$work" && "$venv/bin/schemathesis" --config-file "$root/tests/schemathesis/schemathesis.toml" run \
    "http://127.0.0.1:$port/openapi.json" --checks all -H "Authorization: Bearer $key" \
    --max-examples "$max_examples" --workers "$workers") > "$work/$role.txt" 2>&1; then
    echo "   passed: $(grep -E 'generated' "$work/$role.txt" | tail -n 1 | sed 's/^ *//')"
  else
    status=1
    cat "$work/$role.txt"
  fi
done
# A 500 logs "request failed" with its error chain (api::error); actix's own errors about
# requests it could not parse (Schemathesis sends invalid headers on purpose) are not ours.
if grep -q 'panicked\|"message":"request failed"' "$work/serve.log"; then
  echo "schemathesis.sh: the server failed requests:" >&2
  grep 'panicked\|"message":"request failed"' "$work/serve.log" | head -n 20 >&2
  status=1
fi
exit "$status"
