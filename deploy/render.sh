#!/usr/bin/env bash
# Renders deploy/kube-discovery.yaml, the static install manifest
# (`kubectl apply --server-side -f deploy/`), from the Helm chart:
#   the Namespace (rbac/namespace.yaml), then
#   helm template kube-discovery charts/kube-discovery --namespace kube-discovery \
#     --set http.authTokenSecret.name=kube-discovery-api-token
# i.e. the chart's defaults (CRD, RBAC, ConfigMap, Deployment, Service, PDB)
# except the generated API token: a static file cannot carry a secret, so the
# dump and nodes APIs require the token of the Secret kube-discovery-api-token,
# which the user creates (the pods start once it exists; see the README's
# "Without Helm"). e2e/tests/chart/deploy_manifest.rs fails when the file
# differs from this rendering.
#   deploy/render.sh          rewrite deploy/kube-discovery.yaml
#   deploy/render.sh --check  only compare; exit 1 on a difference
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
helm="${HELM:-$root/.tools/bin/helm}"
out="$root/deploy/kube-discovery.yaml"

render() {
  cat <<'HEADER'
# kube-discovery: the static install manifest, rendered from the Helm chart by
# deploy/render.sh (do not edit; a test keeps it equal to `helm template`).
#   kubectl apply --server-side -f deploy/
# The chart's defaults, except that the dump and nodes APIs' token is not
# generated here: create it (the pods start once it exists):
#   kubectl -n kube-discovery create secret generic kube-discovery-api-token \
#     --from-literal=token="$(head -c 24 /dev/urandom | base64)"
---
HEADER
  cat "$root/rbac/namespace.yaml"
  "$helm" template kube-discovery "$root/charts/kube-discovery" --namespace kube-discovery \
    --set http.authTokenSecret.name=kube-discovery-api-token
}

if [[ "${1:-}" == "--check" ]]; then
  if diff -u "$out" <(render) >/dev/null; then
    echo "deploy/render.sh: deploy/kube-discovery.yaml is up to date"
  else
    echo "deploy/render.sh: deploy/kube-discovery.yaml differs from the chart; run deploy/render.sh" >&2
    exit 1
  fi
else
  render >"$out.tmp"
  mv "$out.tmp" "$out"
  echo "deploy/render.sh: wrote $out"
fi
