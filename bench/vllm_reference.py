"""vLLM's own generation, no speculation: the reference a vLLM verifier is held to, and the target-only
baseline it is measured against. Run with the vLLM environment's Python (scripts/vllm_env.sh):

    echo '{"model": DIR, "dtype": "bfloat16", "prompts": [[ids...]], "max_new": 48}' | \\
        .venv-vllm/bin/python -m bench.vllm_reference

Optional: "speculative" (vLLM's speculative_config: its own speculative decoding, e.g. {"method": "draft_model",
"model": DRAFT_DIR, "num_speculative_tokens": 4}), "in_process" (the engine core in this process, as the verifier runs it), "decode_only" (also time each prompt's prefill alone, in
"prefill_seconds", so decode speed can leave it out).

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
    if job.get("in_process"):   # the engine core in this process, as the vLLM verifier runs it (no busy loop, no IPC)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams

    started = time.perf_counter()
    llm = LLM(model=job["model"], dtype=job.get("dtype", "auto"), max_model_len=job.get("max_model_len", 2048),
              enforce_eager=job.get("enforce_eager", True), seed=0, max_num_seqs=job.get("max_num_seqs", 8),
              speculative_config=job.get("speculative"))
    start_seconds = time.perf_counter() - started
    temperature, samples = float(job.get("temperature", 0.0)), int(job.get("samples", 1))
    outputs, seconds, prefill = [], [], []
    for prompt in job["prompts"]:
        if job.get("decode_only"):   # time the prompt's prefill (one token) first, to subtract it
            started = time.perf_counter()
            llm.generate([{"prompt_token_ids": prompt}], SamplingParams(temperature=0.0, max_tokens=1),
                         use_tqdm=False)
            prefill.append(time.perf_counter() - started)
        params = [SamplingParams(temperature=temperature, top_k=int(job.get("top_k", 0)),
                                 top_p=float(job.get("top_p", 1.0)), max_tokens=job["max_new"],
                                 seed=int(job.get("seed", 0)) + i if temperature else None)
                  for i in range(samples)]
        started = time.perf_counter()
        results = llm.generate([{"prompt_token_ids": prompt}] * samples, params, use_tqdm=False)
        seconds.append(time.perf_counter() - started)
        tokens = [list(result.outputs[0].token_ids) for result in results]
        outputs.append(tokens if samples > 1 or temperature else tokens[0])
    print(json.dumps({"outputs": outputs, "seconds": seconds, "prefill_seconds": prefill,
                      "start_seconds": start_seconds}))


if __name__ == "__main__":
    main()
