#!/usr/bin/env bash
# The vLLM verifier on a GPU host, one prepared run (not run yet: no GPU was available when it was written).
#
#   bash bench/gpu_vllm.sh                       # one NVIDIA GPU, CUDA 12 driver, package registries reachable
#   LARGE_TARGET=/models/Qwen2.5-Coder-7B-Instruct bash bench/gpu_vllm.sh   # and a larger target (a local
#                                                # Hugging Face directory or a cached id: nothing is downloaded)
#
# Installs edgespec's environment and the vLLM GPU environment (VLLM_GPU=1 scripts/vllm_env.sh: the vllm wheel),
# prepares the default pair, then measures, results in docs/bench/gpu-vllm-DATE*:
#   1. bench-vllm, default pair: vLLM target-only, vLLM's own speculative decoding with the draft model
#      (n = 2, 4, 8), edgespec with the vLLM verifier (CUDA graphs) and the edge drafter on the CPU at RTT 0 and
#      50 ms (windows 0, auto, 2, 4, 8), the torch verifier beside it, and the vLLM verifier's c(n) for
#      n = 1..9 (the verify cost of k = 0..8 drafted tokens, from its start-up profile);
#   2. the same for LARGE_TARGET, if given (drafted by the default draft: it must share its tokenizer);
#   3. bench-capacity with the vLLM verifier: N = 1..32 users, RTT 0 and 50 ms, edge drafting vs
#      autoregressive serving.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v nvidia-smi >/dev/null || { echo "no nvidia-smi: this script is for a GPU host" >&2; exit 2; }
OUT=${OUT:-docs/bench}
DAY=$(date +%F)
mkdir -p "$OUT"
bash scripts/install.sh
.venv/bin/edgespec prepare-models target draft
VLLM_GPU=1 bash scripts/vllm_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu-vllm-$DAY-gpu.txt"
GPU_VERIFIER="--gpu-memory-utilization 0.8 --max-model-len 4096"
.venv/bin/edgespec bench vllm --compile --windows 2,4,8 --rtts 0,50 --spec-tokens 2,4,8 \
  --verifier-args "$GPU_VERIFIER" --json "$OUT/gpu-vllm-$DAY.json" --md "$OUT/gpu-vllm-$DAY.md"
if [ -n "${LARGE_TARGET:-}" ]; then
  .venv/bin/edgespec bench vllm --compile --target "$LARGE_TARGET" --windows 4 --rtts 0,50 --spec-tokens 4 \
    --torch-windows "" --verifier-args "$GPU_VERIFIER" \
    --json "$OUT/gpu-vllm-$DAY-large.json" --md "$OUT/gpu-vllm-$DAY-large.md"
fi
.venv/bin/edgespec bench capacity --backend vllm --model target --verifier-cpus none --sessions 1,2,4,8,16,32 \
  --rtt 0,50 --modes ar,k=2,k=4,auto --verifier-args "--dtype bfloat16 --vllm-compile --max-batch 32 $GPU_VERIFIER" \
  --json "$OUT/gpu-vllm-$DAY-capacity.json" --plot "$OUT/gpu-vllm-$DAY-capacity.png"
echo "results: $OUT/gpu-vllm-$DAY*"
