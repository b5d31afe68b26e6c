#!/usr/bin/env bash
# Runs every test of the workspace: unit tests, kube-sim end-to-end tests
# (real kubectl v1.32/v1.34 and helm v4 against kube-sim), controller e2e.
# Installs what it needs (cargo-nextest, helm, kubectl) into project-local folders.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

if ! cargo nextest --version >/dev/null 2>&1; then
  echo "test.sh: cargo-nextest missing; installing it with cargo install"
  cargo install --locked cargo-nextest
fi
bash e2e/tools/install-tools.sh
export PATH="$PWD/.tools/bin:$PATH"

# The e2e tests run the real binaries as separate processes.
cargo build --workspace --bins --locked
cargo nextest run --workspace --locked --no-fail-fast "$@"
