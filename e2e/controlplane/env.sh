# Sourced by the control-plane scripts: pinned versions and a Go environment
# that keeps every cache inside the repository's .tools/ (nothing in $HOME).
KUBERNETES_VERSION=v1.34.4
ETCD_VERSION=v3.6.4
KWOK_VERSION=v0.8.0

cp_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cp_dir="$cp_root/e2e/controlplane"
export GOPATH="$cp_root/.tools/go"
export GOMODCACHE="$GOPATH/pkg/mod"
export GOCACHE="$cp_root/.tools/go-build"
export GOTOOLCHAIN=local
export GOFLAGS="-mod=readonly -buildvcs=false"
# The module proxy is reachable here, sum.golang.org is not; go.sum (committed)
# pins every module's hash, so the checksum database is not needed to verify.
export GOSUMDB=off
export GOPROXY="${GOPROXY:-https://proxy.golang.org}"
export CGO_ENABLED=0
# The binaries of one pinned set live in one folder; a changed pin builds anew.
# KD_CONTROLPLANE_BIN overrides it (the Rust harness reads the same variable).
CONTROLPLANE_BIN="${KD_CONTROLPLANE_BIN:-$cp_root/.tools/controlplane/kubernetes-$KUBERNETES_VERSION-etcd-$ETCD_VERSION}"
# kwok (fake Nodes and Pods) has a folder and a stamp of its own, so a new
# kwok pin does not rebuild the control plane. KD_KWOK_BIN overrides it.
KWOK_BIN="${KD_KWOK_BIN:-$cp_root/.tools/controlplane/kwok-$KWOK_VERSION/kwok}"
