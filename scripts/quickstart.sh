#!/usr/bin/env bash
# The main job (README quick start): installs what it needs, builds arc-rec, generates the
# synthetic Arc-Eval platform history into the embedded Postgres (./.arc-rec), and exports
# Configuration→Outcome training examples to ./out/. Idempotent: a second run adds nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
# shellcheck source=scripts/env.sh
source scripts/env.sh
cargo build --release --locked --bin arc-rec

arc_rec=target/release/arc-rec
mkdir -p out
$arc_rec simulate --seed 1
$arc_rec export --out out/examples.jsonl
$arc_rec export --format chat --out out/examples.chat.jsonl
echo "training examples: out/examples.jsonl (arc-rec format), out/examples.chat.jsonl (chat SFT format)"
