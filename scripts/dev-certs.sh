#!/usr/bin/env bash
# Development certificates and bearer tokens for TLS / mutual TLS / auth (see docs/deployment.md#security).
#   bash scripts/dev-certs.sh [DIR] [extra args of `edgespec dev-certs`, e.g. --hosts verifier-a,verifier-b]
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || bash scripts/install.sh
out=${1:-certs}
shift || true
exec .venv/bin/python -m edgespec.ops.devcerts "$out" "$@"
