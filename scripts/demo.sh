#!/usr/bin/env bash
# The main job: install, then run a local cluster on loopback with the default real models.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec .venv/bin/edgespec demo "$@"
