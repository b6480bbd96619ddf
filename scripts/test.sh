#!/usr/bin/env bash
# The test command (README quick start, and what .ci/run calls): installs what it needs, then
# checks formatting and lints (also of the service without libtorch), runs every test of the
# workspace with cargo-nextest against a throwaway Postgres cluster, then the Python checks.
# Prints each stage's wall time at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each stage's wall time, printed as a table when the run ends (pass or fail).
stage_names=()
stage_secs=()
stage_started=$(date +%s)
stage_current=""
stage() {
    local now
    now=$(date +%s)
    if [ -n "$stage_current" ]; then
        stage_names+=("$stage_current")
        stage_secs+=($((now - stage_started)))
    fi
    stage_current="$1"
    stage_started=$now
    [ -n "$1" ] && echo "== $1"
    return 0
}
stage_table() {
    stage ""
    local total=0 i
    echo "== stage wall times (s)"
    for i in "${!stage_names[@]}"; do
        printf '%6d  %s\n' "${stage_secs[$i]}" "${stage_names[$i]}"
        total=$((total + stage_secs[i]))
    done
    printf '%6d  total\n' "$total"
    for i in "${!beside_names[@]}"; do
        printf '%6s  beside the stages (its own wall time): %s\n' "${beside_secs[$i]:-?}" "${beside_names[$i]}"
    done
}
# Work begun beside the stages (`beside NAME COMMAND…`) and waited for where a stage needs it
# (`await NAME`): installs that wait on the network and the disk run while the build has the
# cores. Each one's log is target/beside-NAME.log (printed when it is awaited), its wall time a
# line under the stage table.
mkdir -p target
beside_names=()
beside_pids=()
beside_started=()
beside_secs=()
beside() {
    local name=$1
    shift
    rm -f "target/beside-$name.end"
    # The job notes when it ends, so its own wall time is known however late it is awaited.
    ( ("$@") > "target/beside-$name.log" 2>&1; status=$?; date +%s > "target/beside-$name.end"; exit $status ) &
    beside_names+=("$name")
    beside_pids+=($!)
    beside_started+=("$(date +%s)")
}
stop_beside() {
    local pid
    for pid in "${beside_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
}
await() {
    local i status=0
    for i in "${!beside_names[@]}"; do
        if [ "${beside_names[$i]}" = "$1" ]; then
            wait "${beside_pids[$i]}" || status=$?
            beside_secs[i]=$(($(cat "target/beside-$1.end" 2>/dev/null || date +%s) - beside_started[i]))
            cat "target/beside-$1.log"
            if [ "$status" -ne 0 ]; then
                echo "test: $1 (beside the stages) failed with exit $status; its output is above" >&2
                exit "$status"
            fi
            return 0
        fi
    done
    echo "test: nothing named $1 was begun" >&2
    exit 1
}
trap 'stop_beside; stage_table' EXIT

stage "setup (.venv with torch; beside the stages: Debian's PostgreSQL and Chromium, then the Python peers and .venv-verl)"
# Debian's packages (PostgreSQL and Chromium; a fresh machine has neither): apt waits on its
# downloads while the virtualenv and the build have the cores.
beside debian-packages env ARC_REC_WITH_BROWSER=1 ARC_REC_SKIP_TORCH=1 scripts/setup.sh
# torch first and alone: the build needs its libtorch.
ARC_REC_SKIP_SYSTEM=1 ARC_REC_PYTHON_PEERS=0 scripts/setup.sh
# The tests' Python peers (transformers, peft, Vowpal Wabbit, MABWiser) into .venv, then verl and
# the integration into .venv-verl, whose torch is .venv's hard-linked (scripts/verl/share_torch.py):
# one after the other (the second reads what the first may still change), both beside the build.
beside python-envs bash -c 'ARC_REC_SKIP_SYSTEM=1 scripts/setup.sh && scripts/verl/setup.sh'
if ! cargo nextest --version >/dev/null 2>&1; then
    echo "test: installing cargo-nextest (crates.io), the test runner"
    cargo install --locked cargo-nextest
fi
# shellcheck source=scripts/env.sh
source scripts/env.sh

# One embedded cluster for the whole run (each test gets its own database in it); stopped and
# removed at the end so every run starts clean.
export ARC_REC_TEST_PG_DIR="${ARC_REC_TEST_PG_DIR:-$PWD/target/test-pg}"
cleanup() {
    if [ -x target/debug/arc-rec ]; then
        target/debug/arc-rec --data-dir "$ARC_REC_TEST_PG_DIR" db stop >/dev/null 2>&1 || true
    fi
    rm -rf "$ARC_REC_TEST_PG_DIR"
}
trap 'stop_beside; cleanup; stage_table' EXIT
cleanup

# No incremental caches for the workspace's own crates: a clean build (CI's) compiles them ~20%
# faster without writing them (measured: 302 → 236 s for the members' test build,
# docs/experiments/test-command-stages.md). CARGO_INCREMENTAL=1 keeps them when iterating.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

stage "cargo fmt --check"
cargo fmt --all --check
# Clippy lints the workspace's own crates while the tests build: `cargo clippy` is `cargo check`
# with clippy-driver wrapping rustc for workspace members (RUSTC_WORKSPACE_WRAPPER, its arguments
# in CLIPPY_ARGS); wrapping the test build the same way runs the same lints, with warnings as
# errors, and compiles the dependencies once instead of once to check and again to build.
RUSTC_WORKSPACE_WRAPPER="$(rustc --print sysroot)/bin/clippy-driver"
CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
export RUSTC_WORKSPACE_WRAPPER CLIPPY_ARGS
stage "build and lint every test binary (clippy, warnings are errors)"
cargo nextest run --workspace --locked --no-run
# The one target no test binary covers: bandit's criterion bench (`cargo clippy --all-targets`).
# `--workspace`, as the build above: with `-p bandit` alone cargo resolves the dependencies'
# features for bandit only and compiled ~40 of them again (62 s; this way 9 s).
cargo test --locked --workspace --benches --no-run
stage "wait for what began beside the stages (Debian's packages, the Python peers, .venv-verl)"
await debian-packages
await python-envs
stage "arc-rec's unit tests in one process (cargo test --lib)"
# Its ~230 unit tests are short, and each of nextest's processes first loads libtorch: one
# process ran them in 39 s, nextest's one per test in 73 s (docs/experiments/test-command-stages.md).
# None of them seeds libtorch's process-wide generator, which is what would make a shared process
# matter; the trainer's unit tests do, and stay in nextest.
# The binary the build stage made, run as it is: `cargo test -p arc-rec` would resolve the
# dependencies' features for arc-rec alone and compile ~10 of them again (~30 s).
arc_rec_unit_tests=$(cargo test --workspace --locked --lib --no-run --message-format=json |
    python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "arc_rec" \
            and m["profile"]["test"] and m.get("executable"):
        print(m["executable"])')
[ -x "$arc_rec_unit_tests" ] || { echo "test: no arc-rec unit test binary found" >&2; exit 1; }
OMP_NUM_THREADS=1 "$arc_rec_unit_tests"
stage "cargo nextest run (every other test of the workspace; slow tests named)"
# nextest runs a test per core at once; each that trains starts libtorch, whose OpenMP pool would
# take a thread per core and spin-wait, so two such tests on two cores fight for four spinning
# threads (measured: the learned-grader and model-candidates tests took 4 min 46 s together, 2 min
# 27 s with one thread each). A run alone, like the quick start's, keeps libtorch's default.
OMP_NUM_THREADS=1 cargo nextest run --workspace --locked -E 'not (package(arc-rec) & kind(lib))'
# The Python checks and the service without libtorch, side by side: that build is mostly one
# crate's compile on one core, the Python checks mostly one interpreter on the other.
python_checks() {
    set -e
    echo "== experiments/ harnesses' Python tests (the tables' bootstraps, the exploration data)"
    .venv/bin/python experiments/test_rft_experiment_table.py
    .venv/bin/python experiments/test_pipeline_table.py
    .venv/bin/python experiments/test_exploration_data.py
    .venv/bin/python experiments/test_selection_table.py
    echo "== bench bandit's peers (Vowpal Wabbit, MABWiser) learn and see every candidate"
    .venv/bin/python bench/test_peers.py
    echo "== the verl integration's Python tests (arc-rec's estimators against the Rust figures)"
    (cd integrations/verl && ../../.venv/bin/python -m unittest discover -s tests -t .)
    echo "== the same through verl's own registry (.venv-verl)"
    (cd integrations/verl && ../../.venv-verl/bin/python -m unittest discover -s tests -t .)
}
stage "the Python checks, beside: build and lint the service without libtorch (--no-default-features)"
beside python-checks python_checks
# The dependencies' features are unified (Cargo.toml), so only arc-rec compiles.
cargo build --locked -p arc-rec --no-default-features --bin arc-rec
await python-checks
