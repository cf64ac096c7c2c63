"""Baselines for `edgespec bench speed`, in their own process so the target is never loaded twice.

Target-only greedy decoding (transformers generate() with its KV cache) and HF
assisted generation (assistant_model=draft, constant window) over the prompt set;
writes JSON rows to --out.
"""
from __future__ import annotations

import argparse
import json
import logging
import time

from typing import Sequence

import torch

from edgespec.backends.registry import eos_ids, load_lm
from edgespec.backends.tokenizer import HFTokenizer
from edgespec.backends.registry import model_path
from edgespec.verify.sampling import SamplingParams, coupled_choice, warp
from bench.prompts import PROMPTS

log = logging.getLogger("edgespec.baselines")


def timed_generate(model, prompt: list[int], max_new_tokens: int, eos: list[int], do_sample_override: bool = False,
                   **kwargs) -> tuple[list[int], float]:
    ids = torch.tensor([prompt])
    started = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=do_sample_override, eos_token_id=eos, pad_token_id=eos[0], **kwargs)
    return out[0, len(prompt):].tolist(), time.perf_counter() - started


def target_only_coupled(model, prompt: list[int], max_new_tokens: int, eos: Sequence[int],
                        params: SamplingParams) -> list[int]:
    """Target-only sampling with the coupled sampler's rule: one token per forward (transformers, with its
    KV cache), each argmax(log p + g) with the position's Gumbel noise. The reference that coupled
    speculative sampling must equal token for token."""
    out: list[int] = []
    cache, feed = None, list(prompt)
    with torch.inference_mode():
        while len(out) < max_new_tokens:
            result = model(torch.tensor([feed]), cache=cache, use_cache=True)
            cache = result.past_key_values
            token = coupled_choice(warp(result.logits[0, -1].double().numpy(), params), params.seed,
                                   len(prompt) + len(out))
            out.append(token)
            if token in eos:
                break
            feed = [token]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--hf-windows", default="1,2,3", help="assisted-generation windows to try")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="also time target-only sampling at this temperature (0 = skip)")
    parser.add_argument("--limit", type=int, default=0, help="use only the first N prompts (0 = all)")
    parser.add_argument("--cost-curve", type=int, default=0,
                        help="also time one target forward feeding n = 1..N tokens after the first prompt (the "
                             "verifier's cost of a window of n - 1 or a tree of n - 1 nodes); 0 = skip")
    parser.add_argument("--coupled-seed", type=int, default=None,
                        help="also record target-only coupled sampling at --temperature with this seed "
                             "(the reference for coupled speculative sampling)")
    args = parser.parse_args()
    if args.coupled_seed is not None and args.temperature <= 0:
        parser.error("--coupled-seed needs --temperature > 0")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    tokenizer = HFTokenizer(str(model_path("draft")))
    target, draft = load_lm("target", device="cpu"), load_lm("draft", device="cpu")
    eos = eos_ids(target)
    prompts = PROMPTS[: args.limit] if args.limit else PROMPTS
    timed_generate(target.model, tokenizer.encode("warm up", True), 4, eos)  # first-call allocations
    rows = []
    for index, (category, text) in enumerate(prompts):
        prompt = tokenizer.encode(text, True)
        tokens, seconds = timed_generate(target.model, prompt, args.max_new_tokens, eos)
        rows.append(dict(system="target-only", category=category, prompt=index, window=0, new_tokens=len(tokens),
                         seconds=seconds, tokens=tokens))
        log.info("target-only   prompt %d (%s): %d tokens, %.2f tok/s", index, category, len(tokens), len(tokens) / seconds)
        for k in (int(w) for w in args.hf_windows.split(",") if w):
            draft.model.generation_config.num_assistant_tokens = k
            draft.model.generation_config.num_assistant_tokens_schedule = "constant"
            draft.model.generation_config.assistant_confidence_threshold = 0.0
            got, seconds = timed_generate(target.model, prompt, args.max_new_tokens, eos, assistant_model=draft.model)
            rows.append(dict(system="hf-assisted", category=category, prompt=index, window=k, new_tokens=len(got),
                             seconds=seconds, tokens=got))
            log.info("hf-assisted k=%d prompt %d (%s): %d tokens, %.2f tok/s, identical %s", k, index, category,
                     len(got), len(got) / seconds, got == tokens)
        if args.temperature > 0 and args.coupled_seed is None:
            torch.manual_seed(index)
            got, seconds = timed_generate(target.model, prompt, args.max_new_tokens, eos, temperature=args.temperature,
                                          top_k=0, top_p=1.0, do_sample_override=True)
            rows.append(dict(system="target-only-sampling", category=category, prompt=index, window=0,
                             new_tokens=len(got), seconds=seconds, tokens=got))
            log.info("target-only sampling T=%.2f prompt %d (%s): %.2f tok/s", args.temperature, index, category,
                     len(got) / seconds)
        if args.coupled_seed is not None:
            params = SamplingParams(temperature=args.temperature, seed=args.coupled_seed, coupled=True)
            got = target_only_coupled(target.model, prompt, args.max_new_tokens, eos, params)
            rows.append(dict(system="target-only-coupled", category=category, prompt=index, window=0,
                             new_tokens=len(got), seed=args.coupled_seed, temperature=args.temperature, tokens=got))
    curve = cost_curve(target, tokenizer.encode(prompts[0][1], True), args.cost_curve) if args.cost_curve else {}
    with open(args.out, "w") as sink:
        json.dump(dict(eos=eos, rows=rows, cost_curve=curve), sink)


def cost_curve(lm, prompt: list[int], largest: int) -> dict[int, float]:
    """Seconds of one target forward that feeds n tokens (edgespec.engines.profile, as a verifier measures it
    at start), for n = 1..largest."""
    from edgespec.engines.profile import describe, forward_profile

    curve = forward_profile(lm, largest, context=len(prompt), repeats=3)
    log.info("cost curve: %s", describe(curve))
    return curve


if __name__ == "__main__":
    main()
