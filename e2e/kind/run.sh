#!/usr/bin/env bash
# kube-discovery end to end on a real Kubernetes cluster (kind). NEEDS DOCKER.
#
#   e2e/kind/run.sh
#
# Steps (each prints "== step"; any failure prints "FAIL: ..." and exits 1):
#   1. create a kind cluster (or reuse one: KIND_REUSE=1)
#   2. build the image from ./Dockerfile and load it into kind
#   3. helm install charts/kube-discovery (2 replicas, leader election)
#   4. deploy a backend: 3 replicas + a Service
#   5. assert: DiscoveredService nodes == the ready pod IPs (and the HTTP API agrees)
#   6. scale to 5, to 0, back to 3; assert after each
#   7. delete the Service; assert its DiscoveredService is gone
#   8. helm uninstall; assert the release's objects are gone (the CRD stays: resource-policy keep)
#
# Environment:
#   CLUSTER_NAME      kind cluster name (default kube-discovery-e2e)
#   KIND_NODE_IMAGE   kind node image (default: kind's default)
#   KIND_REUSE=1      reuse an existing cluster of that name
#   KEEP_CLUSTER=1    do not delete the cluster at the end
#   IMAGE             image name to build/load (default kube-discovery:e2e)
#   SKIP_BUILD=1      do not build; IMAGE must already exist locally
#   BACKEND_IMAGE     backend image (default registry.k8s.io/e2e-test-images/agnhost:2.53)
#   TIMEOUT           seconds to wait for each convergence (default 120)
# Tools: docker, kind, kubectl, helm on PATH (helm/kubectl are also taken from
# .tools/bin when present).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export PATH="$root/.tools/bin:$PATH"

CLUSTER_NAME="${CLUSTER_NAME:-kube-discovery-e2e}"
IMAGE="${IMAGE:-kube-discovery:e2e}"
BACKEND_IMAGE="${BACKEND_IMAGE:-registry.k8s.io/e2e-test-images/agnhost:2.53}"
TIMEOUT="${TIMEOUT:-120}"
RELEASE=kube-discovery
RELEASE_NS=kube-discovery
APP_NS=kd-e2e
BACKEND=backend
CTX="kind-$CLUSTER_NAME"

step() { printf '\n== %s\n' "$*"; }
info() { printf '   %s\n' "$*"; }
fail() {
  printf '\nFAIL: %s\n' "$*" >&2
  exit 1
}
k() { kubectl --context "$CTX" "$@"; }

created_cluster=0
on_exit() {
  local rc=$?
  if [[ $rc -ne 0 ]]; then
    printf '\n== diagnostics (exit %s)\n' "$rc" >&2
    k get pods -A -o wide >&2 2>/dev/null || true
    k get discoveredservices -A >&2 2>/dev/null || true
    k -n "$RELEASE_NS" logs "deployment/$RELEASE" --tail=100 >&2 2>/dev/null || true
  fi
  if [[ $created_cluster -eq 1 && "${KEEP_CLUSTER:-0}" != 1 ]]; then
    printf '\n== deleting kind cluster %s\n' "$CLUSTER_NAME"
    kind delete cluster --name "$CLUSTER_NAME" >/dev/null 2>&1 || true
  fi
  if [[ $rc -eq 0 ]]; then
    printf '\nPASS: kube-discovery kind e2e\n'
  fi
  exit "$rc"
}
trap on_exit EXIT

for tool in docker kind kubectl helm; do
  command -v "$tool" >/dev/null 2>&1 || fail "$tool not found on PATH (this e2e needs Docker, kind, kubectl and helm)"
done
docker info >/dev/null 2>&1 || fail "docker is installed but the daemon is not reachable (this e2e needs a running Docker)"

# Sorted, newline-separated IPs of the backend pods that are Ready and not being deleted.
ready_pod_ips() {
  k -n "$APP_NS" get pods -l "app=$BACKEND" -o \
    jsonpath='{range .items[*]}{.metadata.deletionTimestamp}{"|"}{.status.podIP}{"|"}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' |
    awk -F'|' '$1 == "" && $2 != "" && $3 == "True" { print $2 }' | sort || true
}

# Sorted hosts of port "http" in the backend's DiscoveredService ("<absent>" if there is none).
dsvc_hosts() {
  local out
  if ! out="$(k -n "$APP_NS" get discoveredservices "$BACKEND" -o jsonpath='{range .spec.ports.http[*]}{.host}{"\n"}{end}' 2>/dev/null)"; then
    echo "<absent>"
    return 0
  fi
  printf '%s' "$out" | sed '/^$/d' | sort
}

# Sorted hosts the HTTP API returns for default naming "<ns>/<name>:http", read
# through the API server's service proxy (no port-forward needed). The proxy
# does not pass a bearer token of ours on, so this install turns the chart's
# default API token off (http.authTokenSecret.create=false; the token is
# tested in e2e/tests/chart/sim.rs and chart/config.rs).
api_hosts() {
  k get --raw "/api/v1/namespaces/$RELEASE_NS/services/$RELEASE:http/proxy/v1/discovery/kubernetes/nodes?service=$APP_NS/$BACKEND:http" 2>/dev/null |
    grep -o '"host":"[^"]*"' | sed 's/"host":"\([^"]*\)"/\1/' | sort || true
}

# Waits until the DiscoveredService (and the HTTP API) list exactly the ready
# pod IPs and there are $1 of them.
assert_nodes() {
  local want_count=$1 deadline=$((SECONDS + TIMEOUT)) ips hosts api
  while :; do
    ips="$(ready_pod_ips)"
    hosts="$(dsvc_hosts)"
    api="$(api_hosts)"
    # With no ready pod, "no object" and "an object without nodes" both mean
    # "no nodes" to a gateway; accept either.
    if [[ "$want_count" -eq 0 && "$hosts" == "<absent>" ]]; then
      hosts=""
    fi
    local n=0
    [[ -n "$ips" ]] && n="$(printf '%s\n' "$ips" | wc -l)"
    if [[ "$n" -eq "$want_count" && "$hosts" == "$ips" && "$api" == "$ips" ]]; then
      info "ok: $want_count ready pod(s); DiscoveredService and HTTP API list exactly: $(printf '%s' "$ips" | tr '\n' ' ')"
      return 0
    fi
    if ((SECONDS >= deadline)); then
      info "ready pod IPs ($n, want $want_count): $(printf '%s' "$ips" | tr '\n' ' ')"
      info "DiscoveredService hosts:   $(printf '%s' "$hosts" | tr '\n' ' ')"
      info "HTTP API hosts:            $(printf '%s' "$api" | tr '\n' ' ')"
      fail "nodes did not converge to $want_count ready pod IP(s) within ${TIMEOUT}s"
    fi
    sleep 2
  done
}

scale_backend() {
  local replicas=$1
  step "scale $BACKEND to $replicas"
  k -n "$APP_NS" scale deployment "$BACKEND" --replicas="$replicas" >/dev/null
  if [[ "$replicas" -gt 0 ]]; then
    k -n "$APP_NS" rollout status deployment "$BACKEND" --timeout="${TIMEOUT}s" >/dev/null ||
      fail "backend did not reach $replicas ready replicas"
  else
    k -n "$APP_NS" wait --for=delete pod -l "app=$BACKEND" --timeout="${TIMEOUT}s" >/dev/null 2>&1 || true
  fi
  assert_nodes "$replicas"
}

# ---------------------------------------------------------------------------
step "kind cluster $CLUSTER_NAME"
if kind get clusters 2>/dev/null | grep -qx "$CLUSTER_NAME"; then
  [[ "${KIND_REUSE:-0}" == 1 ]] || fail "kind cluster $CLUSTER_NAME exists; delete it or set KIND_REUSE=1"
  info "reusing the existing cluster"
else
  kind_args=(create cluster --name "$CLUSTER_NAME" --wait 120s)
  [[ -n "${KIND_NODE_IMAGE:-}" ]] && kind_args+=(--image "$KIND_NODE_IMAGE")
  kind "${kind_args[@]}"
  created_cluster=1
fi
k cluster-info >/dev/null || fail "cannot reach the kind cluster"
info "server version: $(k version -o json 2>/dev/null | grep -m1 '"gitVersion"' | sed 's/.*: "\(.*\)".*/\1/')"

step "image $IMAGE"
if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
  docker build -t "$IMAGE" "$root"
fi
kind load docker-image "$IMAGE" --name "$CLUSTER_NAME"

step "helm install $RELEASE (chart charts/kube-discovery)"
helm --kube-context "$CTX" upgrade --install "$RELEASE" "$root/charts/kube-discovery" \
  --namespace "$RELEASE_NS" --create-namespace \
  --set image.repository="${IMAGE%:*}" --set image.tag="${IMAGE##*:}" --set image.pullPolicy=Never \
  --set controller.logLevel=info \
  --set http.authTokenSecret.create=false \
  --wait --timeout "${TIMEOUT}s"
k -n "$RELEASE_NS" rollout status "deployment/$RELEASE" --timeout="${TIMEOUT}s"
k get crd discoveredservices.kubediscovery.io >/dev/null || fail "CRD discoveredservices.kubediscovery.io not installed"

step "backend: 3 replicas + Service in $APP_NS"
k create namespace "$APP_NS" --dry-run=client -o yaml | k apply -f - >/dev/null
k -n "$APP_NS" apply -f - >/dev/null <<EOF
apiVersion: apps/v1
kind: Deployment
metadata:
  name: $BACKEND
spec:
  replicas: 3
  selector:
    matchLabels: {app: $BACKEND}
  template:
    metadata:
      labels: {app: $BACKEND}
    spec:
      terminationGracePeriodSeconds: 5
      containers:
        - name: web
          image: $BACKEND_IMAGE
          args: ["netexec", "--http-port=8080"]
          ports: [{name: http, containerPort: 8080}]
          readinessProbe:
            httpGet: {path: /healthz, port: http}
            periodSeconds: 2
---
apiVersion: v1
kind: Service
metadata:
  name: $BACKEND
spec:
  selector: {app: $BACKEND}
  ports:
    - name: http
      port: 80
      targetPort: http
EOF
k -n "$APP_NS" rollout status deployment "$BACKEND" --timeout="${TIMEOUT}s" >/dev/null ||
  fail "backend did not become ready"
assert_nodes 3
k get discoveredservices -A

scale_backend 5
scale_backend 0
scale_backend 3

step "delete Service $APP_NS/$BACKEND"
k -n "$APP_NS" delete service "$BACKEND" --wait=true >/dev/null
deadline=$((SECONDS + TIMEOUT))
until [[ "$(dsvc_hosts)" == "<absent>" ]]; do
  ((SECONDS < deadline)) || fail "DiscoveredService $APP_NS/$BACKEND still exists ${TIMEOUT}s after its Service was deleted"
  sleep 2
done
info "ok: DiscoveredService $APP_NS/$BACKEND is gone"

step "helm uninstall $RELEASE"
helm --kube-context "$CTX" uninstall "$RELEASE" --namespace "$RELEASE_NS" --wait --timeout "${TIMEOUT}s"
left="$(k -n "$RELEASE_NS" get deployment,service,configmap,serviceaccount,role,rolebinding,poddisruptionbudget \
  -l "app.kubernetes.io/instance=$RELEASE" -o name 2>/dev/null || true)"
[[ -z "$left" ]] || fail "objects left after uninstall: $left"
left="$(k get clusterrole,clusterrolebinding -l "app.kubernetes.io/instance=$RELEASE" -o name 2>/dev/null || true)"
[[ -z "$left" ]] || fail "cluster objects left after uninstall: $left"
k get crd discoveredservices.kubediscovery.io >/dev/null ||
  fail "the CRD should stay after uninstall (helm.sh/resource-policy: keep)"
info "ok: release objects removed; CRD kept (helm.sh/resource-policy: keep)"
# What the controller itself created stays, as documented in the chart README
# ("Uninstalling"): its leader-election Lease (and snapshot ConfigMaps, off here).
if k -n "$RELEASE_NS" get lease "$RELEASE" >/dev/null 2>&1; then
  info "the controller's Lease $RELEASE_NS/$RELEASE stays after uninstall (documented); deleting it"
  k -n "$RELEASE_NS" delete lease "$RELEASE" >/dev/null
fi
k delete namespace "$APP_NS" --wait=false >/dev/null
