#!/usr/bin/env bash
# Builds the real control plane for the e2e tests from the committed tool modules:
#   .tools/controlplane/kubernetes-<v>-etcd-<v>/{kube-apiserver,kube-controller-manager,etcd}
# Reuses the binaries while the pins (env.sh) and go.sum files are unchanged.
# Needs Go (>= the go line of kubernetes/go.mod) and the Go module proxy.
# Every Go cache (modules, build) stays in .tools/.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

stamp="$CONTROLPLANE_BIN/.stamp"
want="$(cat "$cp_dir/kubernetes/go.sum" "$cp_dir/etcd/go.sum" "$cp_dir/env.sh" | sha256sum | cut -d' ' -f1)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] \
  && [[ -x "$CONTROLPLANE_BIN/kube-apiserver" && -x "$CONTROLPLANE_BIN/kube-controller-manager" && -x "$CONTROLPLANE_BIN/etcd" ]]; then
  echo "controlplane: kube-apiserver, kube-controller-manager $KUBERNETES_VERSION and etcd $ETCD_VERSION already in $CONTROLPLANE_BIN"
  exit 0
fi

if ! command -v go >/dev/null 2>&1; then
  echo "controlplane: Go is not installed; the real-API-server tests need Go >= 1.24 (https://go.dev/dl/) and the Go module proxy" >&2
  exit 3
fi
echo "controlplane: building with $(go version) into $CONTROLPLANE_BIN (a cold build takes ~15 min on 2 cores)"
mkdir -p "$CONTROLPLANE_BIN"
start=$SECONDS

# The version the binaries report (/version, --version): without these the
# API server says v0.0.0 and clients that check it (kubectl, helm) complain.
# The module proxy's .info is JSON ({"Version": ..., "Time": ...}), compact or
# pretty-printed; fall back to now when it cannot be read.
info_time="$(curl -fsS --max-time 30 "$GOPROXY/k8s.io/kubernetes/@v/$KUBERNETES_VERSION.info" 2>/dev/null \
  | tr -d '\n' | sed -nE 's/.*"Time"[[:space:]]*:[[:space:]]*"([^"]+)".*/\1/p' || true)"
ts="$(date -u -d "${info_time:-now}" +%Y-%m-%dT%H:%M:%SZ 2>/dev/null || date -u +%Y-%m-%dT%H:%M:%SZ)"
ver="$KUBERNETES_VERSION"
ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$ver -X $pkg.gitMajor=1 -X $pkg.gitMinor=$(echo "$ver" | cut -d. -f2)"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$ts"
done

(cd "$cp_dir/kubernetes" && go build -trimpath -ldflags "-s -w$ldflags" -o "$CONTROLPLANE_BIN/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager)
(cd "$cp_dir/etcd" && go build -trimpath -ldflags "-s -w" -o "$CONTROLPLANE_BIN/etcd" go.etcd.io/etcd/server/v3)

"$CONTROLPLANE_BIN/kube-apiserver" --version
"$CONTROLPLANE_BIN/etcd" --version | sed -n 1p   # sed reads it all: no SIGPIPE under pipefail
echo "$want" > "$stamp"
echo "controlplane: built in $((SECONDS - start)) s; $(du -sh "$CONTROLPLANE_BIN" | cut -f1) binaries, $(du -sh "$GOPATH" | cut -f1) module cache, $(du -sh "$GOCACHE" | cut -f1) build cache (removed: the binaries are kept and reused)"
# The ~3 GB build cache only helps a rebuild, which happens only when a pin changes.
go clean -cache
