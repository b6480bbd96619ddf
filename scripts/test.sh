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
    if [ -n "${packages_secs:-}" ]; then
        printf '%6d  Debian packages in the background, from setup until the test run waited for them\n' "$packages_secs"
    fi
}
# Debian's packages (PostgreSQL and Chromium; a fresh machine has neither) install in the
# background from setup until the test run needs them: apt waits on its downloads while the
# virtualenv and the build have the cores. Log: target/debian-packages.log.
mkdir -p target
packages_pid=""
stop_packages() {
    if [ -n "$packages_pid" ]; then kill "$packages_pid" 2>/dev/null || true; fi
}
trap 'stop_packages; stage_table' EXIT

stage "setup (.venv with torch and the Python peers; beside it, Debian's PostgreSQL and Chromium)"
packages_started=$(date +%s)
ARC_REC_WITH_BROWSER=1 ARC_REC_SKIP_TORCH=1 scripts/setup.sh > target/debian-packages.log 2>&1 &
packages_pid=$!
ARC_REC_SKIP_SYSTEM=1 scripts/setup.sh
if ! cargo nextest --version >/dev/null 2>&1; then
    echo "test: installing cargo-nextest (crates.io), the test runner"
    cargo install --locked cargo-nextest
fi
stage "verl setup (.venv-verl)"
# verl and the integration in their own virtualenv (.venv-verl), for the through-verl checks
# (registry, RLHFDataset) at the end; after .venv, whose torch wheel it reads from the pip cache.
# Not beside the build: unpacking and byte-compiling ~3 GB of wheels takes a core, and there the
# build took 892 s instead of 577 (the install itself 416 s instead of 193).
scripts/verl/setup.sh
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
trap 'stop_packages; cleanup; stage_table' EXIT
cleanup

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
cargo test --locked -p bandit --benches --no-run
stage "wait for Debian's PostgreSQL and Chromium, begun beside setup"
packages_status=0
wait "$packages_pid" || packages_status=$?
packages_pid=""
cat target/debian-packages.log
if [ "$packages_status" -ne 0 ]; then
    echo "test: installing Debian's packages failed (exit $packages_status); the output is above" >&2
    exit "$packages_status"
fi
packages_secs=$(($(date +%s) - packages_started))
stage "cargo nextest run (every test of the workspace; slow tests named)"
# nextest runs a test per core at once; each that trains starts libtorch, whose OpenMP pool would
# take a thread per core and spin-wait, so two such tests on two cores fight for four spinning
# threads (measured: the learned-grader and model-candidates tests took 4 min 46 s together, 2 min
# 27 s with one thread each). A run alone, like the quick start's, keeps libtorch's default.
OMP_NUM_THREADS=1 cargo nextest run --workspace --locked
stage "experiments/ harnesses' Python tests (the tables' bootstraps, the exploration data)"
.venv/bin/python experiments/test_rft_experiment_table.py
.venv/bin/python experiments/test_pipeline_table.py
.venv/bin/python experiments/test_exploration_data.py
stage "bench bandit's peers (Vowpal Wabbit, MABWiser) learn and see every candidate"
.venv/bin/python bench/test_peers.py
stage "the verl integration's Python tests (arc-rec's estimators against the Rust figures)"
(cd integrations/verl && ../../.venv/bin/python -m unittest discover -s tests -t .)
stage "the same through verl's own registry (.venv-verl)"
(cd integrations/verl && ../../.venv-verl/bin/python -m unittest discover -s tests -t .)
# Last: it replaces target/debug/arc-rec, which the integration tests run, with the service built
# without libtorch. The dependencies' features are unified (Cargo.toml), so only arc-rec compiles.
stage "build and lint the service without libtorch (--no-default-features)"
cargo build --locked -p arc-rec --no-default-features --bin arc-rec
