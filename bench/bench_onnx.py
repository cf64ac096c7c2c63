"""Drafting speed and agreement: torch vs ONNX Runtime, float32 vs int8, on the real draft model.

    edgespec bench onnx [--threads 2] [--new-tokens 64] [--json out.json]

Exports the draft to ONNX (float32 and int8) under the model cache on first use,
then for each variant: prefill a ~100-token prompt and draft --new-tokens tokens
greedily, one token per forward (what a drafter does), reporting ms/token
(median and best over the prompts: on a shared machine the best is the cleanest).
Agreement: each variant's greedy choice, teacher-forced on ORT float32's
continuation, against that continuation's next token, step by step; and, on
400-token slices of this repository's own code and prose, against ORT float32's
greedy choice at every position. One model is loaded at a time.
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from pathlib import Path

import torch

from edgespec.backends.assets import cache_root
from edgespec.backends.onnx_lm import OnnxCausalLM
from edgespec.backends.registry import load_lm
from edgespec.backends.tokenizer import load_tokenizer
from edgespec.ops.export_onnx import MANIFEST, export, quantize_export
from bench.report import progress

# Prompts of about 100 tokens once in the chat template: two code, one QA, one chat.
PROMPTS = [
    "Here is a helper from our codebase:\n\ndef parse_pairs(text):\n    out = {}\n    for line in text.splitlines():\n"
    "        if not line.strip() or line.startswith('#'):\n            continue\n        key, _, value = line.partition('=')\n"
    "        out[key.strip()] = value.strip()\n    return out\n\nAdd type hints and a docstring, and make it reject lines without '='.",
    "Write a Python class LRUCache with get(key) and put(key, value) methods, both O(1), using an OrderedDict. "
    "The capacity is given to the constructor. When the cache is full, put evicts the least recently used entry. "
    "Include a short usage example at the end.",
    "Explain, for a student who knows basic algebra, why the seasons on Earth happen. Mention the tilt of the axis, "
    "why the distance to the Sun matters much less, and why the southern hemisphere has summer in December. "
    "Keep it to three short paragraphs.",
    "I am planning a weekend trip to a city I have never visited, with two friends who like museums and one who "
    "prefers hiking. Suggest a plan for Saturday and Sunday that keeps everyone happy, with rough times.",
]


TEXTS = ["edgespec/engines/drafter.py", "README.md", "edgespec/verify/sampling.py"]   # code and prose, for text agreement
TEXT_TOKENS = 400


def onnx_dirs() -> tuple[Path, Path]:
    """The float32 and int8 exports of the draft, made on first use."""
    root = cache_root() / "onnx"
    fp32, int8 = root / "draft-fp32", root / "draft-int8"
    if not (fp32 / MANIFEST).exists():
        export("draft", fp32)
    if not (int8 / MANIFEST).exists():
        quantize_export(fp32, int8)
    return fp32, int8


def time_drafting(lm, prompt: list[int], new_tokens: int) -> tuple[list[int], float, float]:
    """(greedy continuation, prefill seconds, ms per drafted token)."""
    state = lm.new_state()
    started = time.perf_counter()
    lm.prefill(state, prompt)
    prefilled = time.perf_counter()
    tokens = lm.greedy_draft(state, prompt, new_tokens)
    return tokens, prefilled - started, (time.perf_counter() - prefilled) * 1000 / new_tokens


def agreement(lm, prompt: list[int], reference: list[int]) -> tuple[int, int]:
    """(steps where lm's greedy choice equals the reference's next token, steps): teacher-forced."""
    state = lm.new_state()
    choices = lm.next_tokens(state, prompt + reference[:-1], len(reference))
    return sum(a == b for a, b in zip(choices, reference)), len(reference)


def text_choices(lm, texts: list[list[int]]) -> list[list[int]]:
    """Greedy choice after every position of each text, all fed at once."""
    return [lm.next_tokens(lm.new_state(), text, len(text)) for text in texts]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="edgespec bench onnx", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2, help="torch threads and ORT intra-op threads (default %(default)s)")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens drafted per prompt (default %(default)s)")
    parser.add_argument("--variants", default="ort-fp32,ort-int8,torch-fp32,torch-int8",
                        help="comma-separated subset to run; ort-fp32 always runs first, as the reference (default %(default)s)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer("draft")
    prompts = [tokenizer.encode(p, chat=True) for p in PROMPTS]
    root = Path(__file__).resolve().parents[1]
    texts = [tokenizer.encode((root / name).read_text(), chat=False)[:TEXT_TOKENS] for name in TEXTS]
    print(f"prompts: {[len(p) for p in prompts]} tokens; drafting {args.new_tokens} tokens; {args.threads} threads")
    fp32_dir, int8_dir = onnx_dirs()
    variants = {
        "ort-fp32": lambda: OnnxCausalLM(fp32_dir, threads=args.threads),   # first: its drafts are the reference
        "ort-int8": lambda: OnnxCausalLM(int8_dir, threads=args.threads),
        "torch-fp32": lambda: load_lm("draft"),
        "torch-int8": lambda: load_lm("draft", quantize="int8"),
    }
    unknown = set(args.variants.split(",")) - set(variants)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; choose from {sorted(variants)}")
    variants = {name: load for name, load in variants.items() if name == "ort-fp32" or name in args.variants.split(",")}
    reference: list[list[int]] = []
    text_reference: list[list[int]] = []
    results = {}
    with progress(len(variants) * len(prompts), "bench-onnx", unit="prompt") as bar:
        for name, load in variants.items():
            lm = load()
            time_drafting(lm, prompts[0][:16], 4)   # warm-up: allocators, thread pools, lazy kernels
            prefill_s, ms, agree, steps = [], [], 0, 0
            for i, prompt in enumerate(prompts):
                tokens, prefill, per_token = time_drafting(lm, prompt, args.new_tokens)
                prefill_s.append(prefill)
                ms.append(per_token)
                if not reference[i:i + 1]:
                    reference.append(tokens)
                hits, n = agreement(lm, prompt, reference[i])
                agree, steps = agree + hits, steps + n
                bar.update(1)
            choices = text_choices(lm, texts)
            text_reference = text_reference or choices
            text_agree = sum(a == b for mine, ref in zip(choices, text_reference) for a, b in zip(mine, ref))
            text_steps = sum(map(len, choices))
            results[name] = {"ms_per_token": statistics.median(ms), "ms_per_token_best": min(ms),
                             "ms_per_token_each": [round(x, 1) for x in ms],
                             "prefill_seconds": statistics.median(prefill_s), "agreement_with_ort_fp32": agree / steps,
                             "text_agreement_with_ort_fp32": text_agree / text_steps}
            print(f"{name:11} {results[name]['ms_per_token']:6.1f} ms/token median, {min(ms):6.1f} best "
                  f"(each prompt: {results[name]['ms_per_token_each']}), "
                  f"prefill {results[name]['prefill_seconds'] * 1000:.0f} ms, "
                  f"agrees with ort-fp32 on {agree}/{steps} = {agree / steps:.1%} teacher-forced steps, "
                  f"on {text_agree}/{text_steps} = {text_agree / text_steps:.1%} positions of repo text", flush=True)
            del lm
            gc.collect()
    if args.json:
        args.json.write_text(json.dumps({"threads": args.threads, "new_tokens": args.new_tokens,
                                         "prompt_tokens": [len(p) for p in prompts], "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
