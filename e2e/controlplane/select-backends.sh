#!/usr/bin/env bash
# Used by ./test.sh: which API servers the e2e tests run on. Reads
# KD_E2E_APISERVER (kube-sim | real | both; default both) and CI, makes the
# real control plane available when it is wanted (ensure.sh), and prints the
# final choice on stdout (kube-sim, real or both). Fails (non-zero) when
#   - KD_E2E_APISERVER has another value (exit 2);
#   - the real tier is wanted but cannot be built, under CI=true or with
#     KD_E2E_APISERVER=real (exit 1);
#   - building it failed.
# Outside CI with `both`, a machine without Go or the module proxy gets a loud
# warning, what is missing and how to get it, and `kube-sim`.
set -euo pipefail
want="${KD_E2E_APISERVER:-both}"
case "$want" in
  kube-sim|real|both) ;;
  *) echo "test.sh: KD_E2E_APISERVER must be kube-sim, real or both (got '$want')" >&2; exit 2 ;;
esac
if [[ "$want" == kube-sim ]]; then
  echo kube-sim
  exit 0
fi
rc=0
bash "$(dirname "${BASH_SOURCE[0]}")/ensure.sh" >&2 || rc=$?
if ((rc == 0)); then
  echo "$want"
elif ((rc == 3)); then
  if [[ "${CI:-}" == true ]]; then
    echo "test.sh: FAIL: CI runs the e2e tests on the real API server too, and it cannot be built here (see above)" >&2
    exit 1
  fi
  if [[ "$want" == real ]]; then
    echo "test.sh: FAIL: KD_E2E_APISERVER=real, but the real control plane cannot be built here (see above)" >&2
    exit 1
  fi
  echo "test.sh: WARNING: the e2e tests run on kube-sim ONLY; the real-API-server tier is SKIPPED (see above; KD_E2E_APISERVER=kube-sim silences this)" >&2
  echo kube-sim
else
  echo "test.sh: building the real control plane failed (exit $rc)" >&2
  exit "$rc"
fi
