#!/usr/bin/env bash
# The tests: install, then run the whole suite (unit, rpc, system with the real pair).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
.venv/bin/lint-imports --no-cache
exec .venv/bin/python -m pytest "$@"
