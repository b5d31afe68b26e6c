#!/usr/bin/env bash
# Renders the krew manifest of the kubectl plugin `discovery` from the template
# deploy/krew/discovery.yaml for one release:
#   deploy/krew/render.sh VERSION REPOSITORY CHECKSUMS > kubectl-discovery.yaml
# VERSION     the release version without the v (0.1.0)
# REPOSITORY  owner/name on GitHub (the release's download URLs)
# CHECKSUMS   the release's `sha256sum` output; it must list
#             kubectl-discovery_VERSION_{linux,darwin}_{amd64,arm64}.tar.gz
# Fails, printing nothing, when an archive's checksum is missing or malformed.
# Run by .github/workflows/release.yaml; tested in e2e/tests/chart/release_workflows.rs.
set -euo pipefail
if [[ $# -ne 3 ]]; then
  echo "usage: $0 VERSION OWNER/REPO CHECKSUMS_FILE" >&2
  exit 2
fi
version="$1" repository="$2" checksums="$3"
template="$(dirname "${BASH_SOURCE[0]}")/discovery.yaml"
if [[ ! "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.-]+)?$ ]]; then
  echo "render.sh: '$version' is not a version like 1.2.3" >&2
  exit 2
fi
if [[ ! "$repository" =~ ^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$ ]]; then
  echo "render.sh: '$repository' is not OWNER/REPO" >&2
  exit 2
fi
if [[ ! -r "$checksums" ]]; then
  echo "render.sh: cannot read the checksum file '$checksums'" >&2
  exit 2
fi

args=(-e "s|@VERSION@|$version|g" -e "s|@REPOSITORY@|$repository|g")
for platform in linux_amd64 linux_arm64 darwin_amd64 darwin_arm64; do
  archive="kubectl-discovery_${version}_${platform}.tar.gz"
  # sha256sum lines: "<64 hex>  <name>" (also "./<name>" or "*<name>").
  sum="$(awk -v a="$archive" '{ f = $2; sub(/^\*/, "", f); sub(/^\.\//, "", f) } f == a { print $1 }' "$checksums")"
  if [[ ! "$sum" =~ ^[0-9a-f]{64}$ ]]; then
    echo "render.sh: no single sha256 for $archive in $checksums (got '${sum//$'\n'/ }')" >&2
    exit 1
  fi
  args+=(-e "s|@SHA256_${platform^^}@|$sum|g")
done
# The template's leading comment is about the template; the result says what it is.
args+=(-e '1,/^apiVersion:/{/^#/d}')
out="# kubectl-discovery v$version, rendered from deploy/krew/discovery.yaml by deploy/krew/render.sh
$(sed "${args[@]}" "$template")"
if grep -q '@[A-Z0-9_]*@' <<<"$out"; then
  echo "render.sh: placeholders left in the manifest: $(grep -o '@[A-Z0-9_]*@' <<<"$out" | sort -u | tr '\n' ' ')" >&2
  exit 1
fi
printf '%s\n' "$out"
