"""vLLM's own generation, no speculation: the reference a vLLM verifier is held to, and the target-only
baseline it is measured against. Run with the vLLM environment's Python (scripts/vllm_env.sh):

    echo '{"model": DIR, "dtype": "bfloat16", "prompts": [[ids...]], "max_new": 48}' | \\
        .venv-vllm/bin/python -m bench.vllm_reference

Prints one JSON object: {"outputs": [[ids...], ...], "seconds": [...], "start_seconds": s}. Each output stops
after the first EOS (kept) or at max_new tokens; with "temperature" > 0 and "samples" n, each prompt is sampled
n times with seeds seed .. seed + n - 1 ("outputs" then holds prompt-major lists). Imports nothing from edgespec:
the vLLM environment has its own pins.
"""
from __future__ import annotations

import json
import os
import sys
import time


def main() -> None:
    job = json.load(sys.stdin)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(job.get("kv_cache_gb", 1)))
    from vllm import LLM, SamplingParams

    started = time.perf_counter()
    llm = LLM(model=job["model"], dtype=job.get("dtype", "auto"), max_model_len=job.get("max_model_len", 2048),
              enforce_eager=job.get("enforce_eager", True), seed=0, max_num_seqs=job.get("max_num_seqs", 8))
    start_seconds = time.perf_counter() - started
    temperature, samples = float(job.get("temperature", 0.0)), int(job.get("samples", 1))
    outputs, seconds = [], []
    for prompt in job["prompts"]:
        params = [SamplingParams(temperature=temperature, top_k=int(job.get("top_k", 0)),
                                 top_p=float(job.get("top_p", 1.0)), max_tokens=job["max_new"],
                                 seed=int(job.get("seed", 0)) + i if temperature else None)
                  for i in range(samples)]
        started = time.perf_counter()
        results = llm.generate([{"prompt_token_ids": prompt}] * samples, params, use_tqdm=False)
        seconds.append(time.perf_counter() - started)
        tokens = [list(result.outputs[0].token_ids) for result in results]
        outputs.append(tokens if samples > 1 or temperature else tokens[0])
    print(json.dumps({"outputs": outputs, "seconds": seconds, "start_seconds": start_seconds}))


if __name__ == "__main__":
    main()
