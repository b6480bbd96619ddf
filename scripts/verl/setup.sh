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
# No byte-compiling at install (as scripts/setup.sh): Python compiles what a run imports.
PIP_INSTALL=("$VENV/bin/pip" install --quiet --progress-bar off --no-compile)

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
echo "verl setup: installing $REQUIREMENTS into $VENV"
python3 -m venv "$VENV"
# The same torch pin as .venv (scripts/setup.sh): when .venv has it, its files are hard-linked
# here with everything torch needs (~4.7 GB with CUDA's libraries), instead of a second download,
# unpack and byte-compile (measured: the install took 227 s of a clean test run that way, ~80 s
# this way). pip then finds the pin satisfied.
torch_pin=$(sed -n 's/^torch==//p' "$REQUIREMENTS")
if .venv/bin/python -c "import sys; from importlib.metadata import version; sys.exit(version('torch').split('+')[0] != '$torch_pin')" 2>/dev/null; then
    .venv/bin/python scripts/verl/share_torch.py "$VENV"
fi
"${PIP_INSTALL[@]}" -r "$REQUIREMENTS"
"${PIP_INSTALL[@]}" --no-deps -e integrations/verl
satisfied || { echo "verl setup: the pins are not satisfied after installing" >&2; exit 1; }
echo "verl setup: ok in $(( $(date +%s) - started )) s"
