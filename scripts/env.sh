# shellcheck shell=bash
# Environment for building arc-rec against the project-local PyTorch. Source it:
#   source scripts/env.sh
# tch's build script finds libtorch by asking the virtualenv's python (LIBTORCH_USE_PYTORCH=1);
# the binaries carry an rpath to that libtorch, so running them needs nothing from here.
ARC_REC_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export VIRTUAL_ENV="$ARC_REC_ROOT/.venv"
export PATH="$VIRTUAL_ENV/bin:$PATH"
export LIBTORCH_USE_PYTORCH=1
