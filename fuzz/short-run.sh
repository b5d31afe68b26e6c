#!/usr/bin/env bash
# Short cargo-fuzz run of every target (what ./test.sh runs): builds the fuzz
# targets once and fuzzes each for FUZZ_SECONDS (default 10), starting from
# the committed seeds plus the local corpus. A crash fails the run and leaves
# the input in fuzz/artifacts/<target>/.
#
# Works with the stable toolchain: cargo-fuzz passes a few `-Z` flags to rustc,
# which RUSTC_BOOTSTRAP=1 allows on stable. No sanitizer (`-s none`): the
# crates forbid `unsafe`, so AddressSanitizer would find nothing libFuzzer's
# own panic/timeout/OOM detection does not. `--dev` keeps the build short.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
seconds="${FUZZ_SECONDS:-10}"
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz/short-run.sh: cargo-fuzz missing; installing it with cargo install"
  cargo install --locked cargo-fuzz
fi
export RUSTC_BOOTSTRAP=1
targets=(parse_config convert_endpoints convert_slices index_events lean_decode)
echo "fuzz/short-run.sh: building the fuzz targets (own target dir fuzz/target)"
cargo fuzz build --dev -s none
mkdir -p logs
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  if [ -d "seeds/$t" ]; then cp -r "seeds/$t/." "corpus/$t/"; fi
  echo "fuzz/short-run.sh: $t for ${seconds}s"
  log="logs/$t.log"
  if ! cargo fuzz run --dev -s none "$t" "corpus/$t" -- \
    -max_total_time="$seconds" -rss_limit_mb=4096 -timeout=10 -print_final_stats=1 >"$log" 2>&1; then
    tail -40 "$log" >&2
    echo "fuzz/short-run.sh: $t FAILED (input saved under fuzz/artifacts/$t/, log $PWD/$log)" >&2
    exit 1
  fi
  grep -E '^(Done|stat::number_of_executed_units|stat::peak_rss_mb)' "$log" || true
done
echo "fuzz/short-run.sh: all targets ran ${seconds}s without a crash"
