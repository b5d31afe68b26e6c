#!/usr/bin/env bash
# Builds the Go programs of the xDS end-to-end tests and benchmark from one
# pinned Go module, e2e/tools/xds-go (go.mod + go.sum committed; grpc-go
# v1.85.0, go-control-plane envoy v1.40.0 and v0.14.0), into .tools/bin:
#   xds-grpc-client   a proxyless grpc-go client dialing an xds:/// target
#   grpc-backend      a gRPC health server naming itself in a response header
#   gcp-server        a go-control-plane ADS server fed JSON commands on stdin
# (e2e/tools/xds-go/README.md). Rebuilt only when the module's sources, go.mod,
# go.sum or the Go version change (a stamp of their hash). The Go environment
# of the control-plane build keeps every cache inside .tools/
# (e2e/controlplane/env.sh). Without Go (>= 1.26) or the module proxy: an error
# under CI (CI=true), a warning otherwise (the tests that need the programs
# then fail naming this script).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin="$root/.tools/bin"
mod="$root/e2e/tools/xds-go"
stamp="$bin/.xds-go.stamp"
programs=(xds-grpc-client grpc-backend gcp-server)
mkdir -p "$bin"

problem() {
  if [[ "${CI:-}" == true ]]; then
    echo "install-xds-go: $*" >&2
    exit 1
  fi
  echo "install-xds-go: WARNING: $* (the xDS tests will fail)" >&2
  exit 0
}

have_all=1
for p in "${programs[@]}"; do [[ -x "$bin/$p" ]] || have_all=""; done
if ! command -v go >/dev/null 2>&1; then
  if [[ -n "$have_all" && "${CI:-}" != true ]]; then
    echo "install-xds-go: WARNING: no Go on PATH: keeping ${programs[*]} in $bin unchecked against $mod" >&2
    exit 0
  fi
  problem "Go >= 1.26 is needed on PATH to build ${programs[*]} (https://go.dev/dl/)"
fi
# shellcheck source=e2e/controlplane/env.sh
source "$root/e2e/controlplane/env.sh"

# The hash of everything the build reads from the module, and the Go version.
want="$( (cd "$mod" && find . -type f \( -name '*.go' -o -name go.mod -o -name go.sum \) -print0 \
  | LC_ALL=C sort -z | xargs -0 sha256sum; go version) | sha256sum | cut -d' ' -f1)"
if [[ -n "$have_all" && "$(cat "$stamp" 2>/dev/null)" == "$want" ]]; then
  echo "install-xds-go: ${programs[*]} up to date in $bin"
  exit 0
fi

echo "install-xds-go: building ${programs[*]} from $mod"
tmp="$bin/.xds-go.tmp"
rm -rf "$tmp" && mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
if ! (cd "$mod" && go build -trimpath -o "$tmp/" ./xds-grpc-client ./grpc-backend ./gcp-server); then
  problem "building ${programs[*]} failed (Go >= 1.26 and the Go module proxy $GOPROXY are needed)"
fi
for p in "${programs[@]}"; do mv "$tmp/$p" "$bin/$p"; done
echo "$want" > "$stamp"
echo "install-xds-go: installed ${programs[*]} into $bin"
