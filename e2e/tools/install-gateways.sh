#!/usr/bin/env bash
# Installs the gateways the end-to-end tests drive (e2e/tests/gateway_*.rs):
# nginx and HAProxy from Debian. Idempotent: does nothing when both exist.
# The tests run them as plain processes with configs in a temp dir; the
# system services the packages may start are stopped again right away.
set -euo pipefail

have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ]; }

if have nginx && have haproxy; then
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# nginx-light is the small flavour (Debian <= 12); newer releases ship only `nginx`.
if apt-cache show nginx-light >/dev/null 2>&1; then
  $SUDO apt-get install -y -qq --no-install-recommends nginx-light haproxy
else
  $SUDO apt-get install -y -qq --no-install-recommends nginx haproxy
fi

# Packages may start system services (ports 80 / the default haproxy config);
# the tests do not use them.
for svc in nginx haproxy; do
  if command -v service >/dev/null 2>&1; then
    $SUDO service "$svc" stop >/dev/null 2>&1 || true
  fi
done

have nginx || { echo "install.sh: nginx still missing after apt-get" >&2; exit 1; }
have haproxy || { echo "install.sh: haproxy still missing after apt-get" >&2; exit 1; }
