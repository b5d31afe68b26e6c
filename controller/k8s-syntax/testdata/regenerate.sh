#!/usr/bin/env bash
# Recomputes the "out" of every case in apimachinery.jsonl by running
# apimachinery's own functions (oracle/main.go), at the version that
# e2e/controlplane/kubernetes pins. To add a case, add a line with "out": null
# and run this. Needs Go; the modules come from the project's .tools/ cache.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/../../../e2e/controlplane/env.sh"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cp "$cp_dir/kubernetes/go.mod" "$cp_dir/kubernetes/go.sum" "$here/oracle/main.go" "$tmp/"
sed -i 's#^module .*#module k8s-syntax-oracle#' "$tmp/go.mod"
export GOFLAGS="-mod=mod -buildvcs=false" GOCACHE="$tmp/gocache"
(cd "$tmp" && go build -o oracle .)
"$tmp/oracle" < "$here/apimachinery.jsonl" > "$tmp/out.jsonl"
mv "$tmp/out.jsonl" "$here/apimachinery.jsonl"
echo "regenerate.sh: $(wc -l < "$here/apimachinery.jsonl") cases from $(grep -m1 'k8s.io/apimachinery v' "$cp_dir/kubernetes/go.mod" | xargs)"
