"""`vllm bench serve`'s own client code against a coordinator's OpenAI API, run where vLLM is installed:

    .venv-vllm/bin/python -m tests.vllm_bench_client http://HOST:PORT MODEL

tests/rpc/test_openai_api.py runs it. vLLM's request functions (streamed completions and chat completions, with
`ignore_eos` and `extra_body` as the benchmark sends them), its scrape of the spec-decode counters at /metrics
before and after, and its prompt alignment through /tokenize and /detokenize. Prints one JSON line.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import sys

import aiohttp

from vllm.benchmarks.datasets.datasets import SampleRequest
from vllm.benchmarks.lib.endpoint_request_func import (RequestFuncInput, async_request_openai_chat_completions,
                                                        async_request_openai_completions)
from vllm.benchmarks.serve import _align_prompts_to_server_tokenizer, fetch_spec_decode_metrics

PROMPT = "The cat"
OUTPUT_LEN = 48
WINDOW = {"temperature": 0, "edgespec": {"window": 3}}   # as `--temperature 0` sends it (the default is 1)


async def main(base_url: str, model: str) -> dict:
    async with aiohttp.ClientSession() as session:
        before = await fetch_spec_decode_metrics(base_url, session)
        text = await async_request_openai_completions(RequestFuncInput(
            PROMPT, f"{base_url}/v1/completions", len(PROMPT), OUTPUT_LEN, model, ignore_eos=True,
            extra_body=WINDOW), session)
        chat = await async_request_openai_chat_completions(RequestFuncInput(
            PROMPT, f"{base_url}/v1/chat/completions", len(PROMPT), 8, model, extra_body=WINDOW), session)
        after = await fetch_spec_decode_metrics(base_url, session)
    aligned = await _align_prompts_to_server_tokenizer(base_url, model, [SampleRequest("Speculative decoding", 5)])
    fields = ("generated_text", "success", "output_tokens", "error")
    return {"completions": {f: getattr(text, f) for f in fields}, "chat": {f: getattr(chat, f) for f in fields},
            "before": before and dataclasses.asdict(before), "after": after and dataclasses.asdict(after),
            "aligned": [(r.prompt, r.prompt_len) for r in aligned]}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2]))))
