#!/usr/bin/env bash
# Copies the generated CRD (crds/discoveredservices.yaml, written by
# `kube-discovery crd` / the core crate) into the Helm chart, byte for byte:
# charts/kube-discovery/files/discoveredservices.yaml, which templates/crd.yaml
# renders (with `crds.enabled`, the default) so `helm upgrade` updates the CRD.
# The chart has no crds/ folder (Helm installs that once and never upgrades it).
# The test e2e/tests/chart/render.rs fails when the two differ.
#   charts/sync-crds.sh          copy
#   charts/sync-crds.sh --check  only compare; exit 1 on a difference
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
src="$root/crds/discoveredservices.yaml"
dst="$root/charts/kube-discovery/files/discoveredservices.yaml"
if [[ ! -f "$src" ]]; then
  echo "sync-crds: $src not found" >&2
  exit 1
fi
if [[ "${1:-}" == "--check" ]]; then
  if cmp -s "$src" "$dst"; then
    echo "sync-crds: chart CRD is up to date"
  else
    echo "sync-crds: $dst differs from $src; run charts/sync-crds.sh" >&2
    exit 1
  fi
else
  cp "$src" "$dst"
  echo "sync-crds: copied $src -> $dst"
fi
