#!/usr/bin/env bash
# Used by ./test.sh: makes the real control plane available for the e2e tests,
# or explains why it cannot. Exit codes:
#   0  the binaries (control plane and kwok) are in .tools/controlplane/...
#      (built now or before)
#   3  Go or the Go module proxy is missing; a message says what and how to
#      get it (./test.sh then fails under CI=true, and otherwise runs the
#      kube-sim tier only, saying so loudly)
#   *  the build failed (always a failure)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

if [[ -f "$CONTROLPLANE_BIN/.stamp" ]]; then
  exec bash "$cp_dir/build.sh"   # fast path: reuses the binaries if the pins match
fi
missing=()
if ! command -v go >/dev/null 2>&1; then
  missing+=("Go: not on PATH. Install Go >= 1.26 (https://go.dev/dl/, or your distribution's golang package) and put it on PATH.")
else
  # The newest go line of the tool modules (kwok's needs the newest Go).
  need="$(sed -nE 's/^go ([0-9.]+).*/\1/p' "$cp_dir"/{kubernetes,etcd,kwok}/go.mod | sort -V | tail -1)"
  have="$(go env GOVERSION | sed 's/^go//')"
  if [[ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -1)" != "$need" ]]; then
    missing+=("Go: $have is older than $need (e2e/controlplane/*/go.mod). Install a newer Go (https://go.dev/dl/).")
  fi
fi
if ! curl -fsS --max-time 20 -o /dev/null "$GOPROXY/k8s.io/kubernetes/@v/$KUBERNETES_VERSION.info" 2>/dev/null; then
  missing+=("the Go module proxy $GOPROXY does not answer (set GOPROXY to a reachable proxy, e.g. your company's mirror).")
fi
if ((${#missing[@]})); then
  echo "controlplane: cannot build the real control plane (kube-apiserver/kube-controller-manager/kube-scheduler $KUBERNETES_VERSION, etcd $ETCD_VERSION, kwok $KWOK_VERSION):" >&2
  for m in "${missing[@]}"; do echo "  - $m" >&2; done
  exit 3
fi
exec bash "$cp_dir/build.sh"
