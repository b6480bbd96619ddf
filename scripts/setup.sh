#!/usr/bin/env bash
# Installs what arc-rec needs to build, test and run, and nothing twice (idempotent):
#   - PostgreSQL server binaries (Debian's `postgresql`) when no initdb/pg_ctl can be found;
#   - a project-local virtualenv `.venv` with torch==2.11.0 from PyPI (libtorch for tch 0.24),
#     plus transformers==5.23.0 and peft==0.21.2 (the PEFT cross-check test and bench/), and
#     vowpalwabbit==9.11.9 and mabwiser==2.7.4 (the peers of `bench bandit --peers`).
#   - with ARC_REC_WITH_BROWSER=1 (the test command), Debian's `chromium` for the dashboard's
#     headless-browser test.
# Set ARC_REC_SKIP_TORCH=1 to skip the virtualenv (for `--no-default-features` builds),
# ARC_REC_SKIP_SYSTEM=1 to skip the Debian packages (the test command installs those beside the
# virtualenv and the build), ARC_REC_PYTHON_PEERS=0 to skip transformers, peft, vowpalwabbit and
# mabwiser (the quick start does not run the benchmarks or tests that need them).
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION=2.11.0
TRANSFORMERS_VERSION=5.23.0
PEFT_VERSION=0.21.2
VOWPALWABBIT_VERSION=9.11.9
MABWISER_VERSION=2.7.4
# No byte-compiling at install: pip would compile every module of torch and its CUDA packages on
# one core (~80 s of a fresh setup); Python compiles the few a run imports on first use.
PIP_INSTALL=(.venv/bin/pip install --quiet --progress-bar off --no-compile)

have_postgres() {
    command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1 && return 0
    compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null
}

as_root() {
    if [ "$(id -u)" -ne 0 ]; then sudo "$@"; else "$@"; fi
}

apt_install() {
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# PostgreSQL (server and psql) and, for the test command, Chromium.
system_packages() {
    if ! have_postgres; then
        echo "setup: installing PostgreSQL (Debian package postgresql)"
        apt_install postgresql
        # The package starts a system cluster; arc-rec runs its own, so stop the system one.
        as_root service postgresql stop >/dev/null 2>&1 || true
    fi
    if ! command -v psql >/dev/null 2>&1 && ! compgen -G "/usr/lib/postgresql/*/bin/psql" >/dev/null; then
        echo "setup: installing the psql client (Debian package postgresql-client)"
        apt_install postgresql-client
    fi
    if [ "${ARC_REC_WITH_BROWSER:-0}" = "1" ] && ! command -v chromium >/dev/null 2>&1; then
        echo "setup: installing headless Chromium (Debian packages chromium, fonts-dejavu-core) for the dashboard's browser test"
        apt_install --no-install-recommends chromium fonts-dejavu-core
    fi
}

# .venv with torch (libtorch for tch).
torch_venv() {
    if ! .venv/bin/python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" >/dev/null 2>&1; then
        echo "setup: installing torch==$TORCH_VERSION into .venv (from PyPI; about 4.7 GB with its CUDA libraries)"
        python3 -m venv .venv
        "${PIP_INSTALL[@]}" "torch==$TORCH_VERSION"
    fi
}

# The Python peers of the tests and benchmarks, installed after torch and checked separately, so
# a venv from before they were added gets them without reinstalling torch (pip keeps the
# satisfied torch pin).
python_peers() {
    if ! .venv/bin/python -c "
import sys
from importlib.metadata import version
sys.exit(version('transformers') != '$TRANSFORMERS_VERSION' or version('peft') != '$PEFT_VERSION')
" >/dev/null 2>&1; then
        echo "setup: installing transformers==$TRANSFORMERS_VERSION and peft==$PEFT_VERSION into .venv"
        "${PIP_INSTALL[@]}" "torch==$TORCH_VERSION" \
            "transformers==$TRANSFORMERS_VERSION" "peft==$PEFT_VERSION"
    fi
    if ! .venv/bin/python -c "
import sys
from importlib.metadata import version
sys.exit(version('vowpalwabbit') != '$VOWPALWABBIT_VERSION' or version('mabwiser') != '$MABWISER_VERSION')
" >/dev/null 2>&1; then
        echo "setup: installing vowpalwabbit==$VOWPALWABBIT_VERSION and mabwiser==$MABWISER_VERSION into .venv"
        "${PIP_INSTALL[@]}" "torch==$TORCH_VERSION" \
            "transformers==$TRANSFORMERS_VERSION" "peft==$PEFT_VERSION" \
            "vowpalwabbit==$VOWPALWABBIT_VERSION" "mabwiser==$MABWISER_VERSION"
    fi
}

if [ "${ARC_REC_SKIP_SYSTEM:-0}" != "1" ]; then
    system_packages
fi
if [ "${ARC_REC_SKIP_TORCH:-0}" != "1" ]; then
    torch_venv
    if [ "${ARC_REC_PYTHON_PEERS:-1}" != "0" ]; then
        python_peers
    fi
fi
echo "setup: ok"
