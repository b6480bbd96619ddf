#!/usr/bin/env bash
# Installs the verl integration's Python dependencies (integrations/verl/requirements.txt: verl,
# its pinned transformers and tensordict, the same torch as arc-rec) into a separate virtualenv,
# .venv-verl, with the integration itself (integrations/verl, editable). Idempotent: does nothing
# when the pins are already satisfied. Not part of the quick start; the test command runs the
# through-verl checks only when .venv-verl exists (docs/SCALE-OUT.md).
set -euo pipefail
cd "$(dirname "$0")/../.."

VENV=.venv-verl
REQUIREMENTS=integrations/verl/requirements.txt
# One download cache for both virtualenvs (.venv and .venv-verl pin the same torch, about 3 GB with
# its CUDA libraries): the second install reads the wheels from here. Under target/, so
# `cargo clean` removes it.
PIP_CACHE="${PIP_CACHE_DIR:-$PWD/target/pip-cache}"

satisfied() {
    [ -x "$VENV/bin/python" ] || return 1
    "$VENV/bin/python" - "$REQUIREMENTS" <<'PY' >/dev/null 2>&1
import sys
from importlib.metadata import version
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if line:
        name, pin = line.split("==")
        if version(name).split("+")[0] != pin:
            sys.exit(1)
import arc_rec_verl  # the integration, installed editable
PY
}

if satisfied; then
    echo "verl setup: ok ($VENV already has $(tr '\n' ' ' < <(grep -v '^#' "$REQUIREMENTS")))"
    exit 0
fi
started=$(date +%s)
echo "verl setup: installing $REQUIREMENTS into $VENV (torch with its CUDA libraries is about 3 GB)"
python3 -m venv "$VENV"
"$VENV/bin/pip" install --quiet --progress-bar off --cache-dir "$PIP_CACHE" -r "$REQUIREMENTS"
"$VENV/bin/pip" install --quiet --progress-bar off --cache-dir "$PIP_CACHE" --no-deps -e integrations/verl
satisfied || { echo "verl setup: the pins are not satisfied after installing" >&2; exit 1; }
echo "verl setup: ok in $(( $(date +%s) - started )) s"
