#!/usr/bin/env bash
# Runs every test of the workspace: unit tests, kube-sim end-to-end tests
# (real kubectl v1.32/v1.34 and helm v4 against kube-sim), controller e2e,
# fault suite, chart tests, gateway e2e (real nginx + HAProxy), benchmark smoke test,
# and a short cargo-fuzz run of the fuzz targets (fuzz/short-run.sh).
# Installs what it needs: cargo-nextest, cargo-fuzz, helm + kubectl (project-local .tools/),
# nginx + HAProxy (Debian packages).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

if ! cargo nextest --version >/dev/null 2>&1; then
  echo "test.sh: cargo-nextest missing; installing it with cargo install"
  cargo install --locked cargo-nextest
fi
echo "test.sh: $(df -h . | awk 'NR==2 {print $4}') free on the build disk (a clean build needs ~4 GB)"
bash e2e/tools/install-tools.sh
bash gateways/tools/install.sh   # nginx + HAProxy from Debian, for the gateway e2e tests
export PATH="$PWD/.tools/bin:$PATH"

# The e2e tests run the real binaries as separate processes.
cargo build --workspace --bins --examples --locked
cargo nextest run --workspace --locked --no-fail-fast "$@"

# A short cargo-fuzz run of every target in fuzz/ (10 s each; FUZZ_SECONDS
# changes it). Skipped when extra arguments select a subset of the tests.
if [ "$#" -eq 0 ]; then
  bash fuzz/short-run.sh
fi
