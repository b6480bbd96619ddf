#!/usr/bin/env bash
# Fuzzes what reads untrusted input with cargo-fuzz (libFuzzer with AddressSanitizer, on the
# nightly toolchain it needs): the ingest line parser, the recommendation and feedback request
# decoders (as their handlers run them, OpenAPI schema check included) and the recommender
# model's output parser. Targets: fuzz/fuzz_targets/; seed inputs: fuzz/seeds/TARGET/ (copied
# into the working corpus fuzz/corpus/TARGET/, which grows and is kept between runs); a crash
# leaves its input in fuzz/artifacts/TARGET/ (replay: cargo +nightly fuzz run TARGET FILE).
#
#     scripts/fuzz.sh [SECONDS] [TARGET...]      (default 300 s each, every target)
#
# Prints, per target, the runs libFuzzer made and its verdict; exit status 0 when none crashed.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
seconds="${1:-300}"
shift || true
targets=("$@")
[ "${#targets[@]}" -gt 0 ] || targets=(ingest_line recommendation_request feedback_request model_recommendation)

rustup toolchain list | grep -q '^nightly' || {
  echo "fuzz.sh: cargo-fuzz needs the nightly toolchain: rustup toolchain install nightly" >&2
  exit 2
}
command -v cargo-fuzz > /dev/null || cargo install cargo-fuzz --locked

cd "$root/fuzz"
status=0
for target in "${targets[@]}"; do
  mkdir -p "corpus/$target"
  cp -n "seeds/$target/"* "corpus/$target/" 2> /dev/null || true
  log="$(mktemp)"
  echo "== $target: $seconds s"
  if cargo +nightly fuzz run "$target" "corpus/$target" -- -max_total_time="$seconds" \
    -rss_limit_mb=4096 -print_final_stats=1 > "$log" 2>&1; then
    runs="$(grep -o 'Done [0-9]* runs in [0-9]* second' "$log" | tail -n 1)"
    echo "   no crash: ${runs:-?} ($(ls "corpus/$target" | wc -l) inputs in the corpus)"
  else
    status=1
    tail -n 40 "$log"
    echo "   CRASH: input in fuzz/artifacts/$target/"
  fi
  rm -f "$log"
done
exit "$status"
