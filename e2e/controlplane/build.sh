#!/usr/bin/env bash
# Builds the real control plane for the e2e tests from the committed tool modules:
#   .tools/controlplane/kubernetes-<v>-etcd-<v>/{kube-apiserver,kube-controller-manager,kube-scheduler,etcd}
#   .tools/controlplane/kwok-<v>/kwok   (fake Nodes and Pods: e2e/testenv/src/kwok.rs)
# Reuses the binaries while the pins (env.sh) and go.sum files are unchanged;
# a binary missing from a matching folder (kube-scheduler, added after the
# others) is built alone.
# Needs Go (>= the go lines of kubernetes/go.mod and kwok/go.mod) and the Go module proxy.
# Every Go cache (modules, build) stays in .tools/.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

stamp="$CONTROLPLANE_BIN/.stamp"
# The control plane's stamp leaves env.sh's kwok lines out: a kwok pin has
# its own stamp and does not rebuild the control plane.
want="$(cat "$cp_dir/kubernetes/go.sum" "$cp_dir/etcd/go.sum" <(grep -vi kwok "$cp_dir/env.sh") | sha256sum | cut -d' ' -f1)"
kwok_dir="$(dirname "$KWOK_BIN")"
kwok_stamp="$kwok_dir/.stamp"
kwok_want="$(cat "$cp_dir/kwok/go.sum" "$cp_dir/kwok/go.mod" | sha256sum | cut -d' ' -f1) $KWOK_VERSION"

k8s_cmds=()
build_etcd=false
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  for b in kube-apiserver kube-controller-manager kube-scheduler; do
    [[ -x "$CONTROLPLANE_BIN/$b" ]] || k8s_cmds+=("k8s.io/kubernetes/cmd/$b")
  done
  [[ -x "$CONTROLPLANE_BIN/etcd" ]] || build_etcd=true
else
  k8s_cmds=(k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler)
  build_etcd=true
fi
build_kwok=true
if [[ -f "$kwok_stamp" && "$(cat "$kwok_stamp")" == "$kwok_want" && -x "$KWOK_BIN" ]]; then
  build_kwok=false
fi
if ((${#k8s_cmds[@]} == 0)) && [[ "$build_etcd" == false && "$build_kwok" == false ]]; then
  echo "controlplane: kube-apiserver, kube-controller-manager, kube-scheduler $KUBERNETES_VERSION and etcd $ETCD_VERSION already in $CONTROLPLANE_BIN, kwok $KWOK_VERSION in $kwok_dir"
  exit 0
fi

if ! command -v go >/dev/null 2>&1; then
  echo "controlplane: Go is not installed; the real-API-server tests need Go >= 1.26 (https://go.dev/dl/) and the Go module proxy" >&2
  exit 3
fi
echo "controlplane: building with $(go version) into $CONTROLPLANE_BIN and $kwok_dir (a cold build takes ~15 min on 2 cores)"
mkdir -p "$CONTROLPLANE_BIN" "$kwok_dir"
start=$SECONDS

if ((${#k8s_cmds[@]})); then
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
  t=$SECONDS
  (cd "$cp_dir/kubernetes" && go build -trimpath -ldflags "-s -w$ldflags" -o "$CONTROLPLANE_BIN/" "${k8s_cmds[@]}")
  echo "controlplane: ${k8s_cmds[*]##*/} built in $((SECONDS - t)) s"
  "$CONTROLPLANE_BIN/kube-apiserver" --version
fi
if [[ "$build_etcd" == true ]]; then
  (cd "$cp_dir/etcd" && go build -trimpath -ldflags "-s -w" -o "$CONTROLPLANE_BIN/etcd" go.etcd.io/etcd/server/v3)
  "$CONTROLPLANE_BIN/etcd" --version | sed -n 1p   # sed reads it all: no SIGPIPE under pipefail
fi
echo "$want" > "$stamp"
if [[ "$build_kwok" == true ]]; then
  t=$SECONDS
  (cd "$cp_dir/kwok" && go build -trimpath -ldflags "-s -w" -o "$KWOK_BIN" sigs.k8s.io/kwok/cmd/kwok)
  "$KWOK_BIN" --version
  echo "$kwok_want" > "$kwok_stamp"
  echo "controlplane: kwok built in $((SECONDS - t)) s"
fi
echo "controlplane: built in $((SECONDS - start)) s; $(du -sh "$CONTROLPLANE_BIN" | cut -f1) + $(du -sh "$kwok_dir" | cut -f1) binaries, $(du -sh "$GOPATH" | cut -f1) module cache, $(du -sh "$GOCACHE" | cut -f1) build cache (removed: the binaries are kept and reused)"
# The ~3 GB build cache only helps a rebuild, which happens only when a pin changes.
go clean -cache
