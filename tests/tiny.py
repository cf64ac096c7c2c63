"""Helpers for tests on tiny random-weight models: references and in-process ports."""
from __future__ import annotations

import functools

import torch

from edgespec.backends.registry import TINY_EOS, load_lm
from harness.inprocess import InProcessDrafter, InProcessVerifier

__all__ = ["InProcessDrafter", "InProcessVerifier", "target_only_greedy", "tiny"]


@functools.lru_cache(maxsize=None)
def tiny(spec: str):
    return load_lm(spec)


def target_only_greedy(spec: str, prompt: list[int], max_new_tokens: int) -> list[int]:
    """The reference: transformers generate() on the target alone, greedy, with its KV cache."""
    model = tiny(spec).model
    out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                         eos_token_id=TINY_EOS, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@functools.lru_cache(maxsize=None)
def target_only_greedy_eos(spec: str, prompt: tuple[int, ...], max_new_tokens: int, min_tokens: int = 0,
                           ignore_eos: bool = False) -> tuple[int, ...]:
    """Greedy decoding of the target alone, one full forward per token, with vLLM's min_tokens (EOS logits at
    -inf while fewer tokens are generated) and ignore_eos (EOS does not end it) written out."""
    model, out = tiny(spec).model, []
    with torch.no_grad():
        while len(out) < max_new_tokens:
            logits = model(torch.tensor([[*prompt, *out]])).logits[0, -1]
            if len(out) < min_tokens:
                logits[TINY_EOS] = -float("inf")
            out.append(int(logits.argmax()))
            if out[-1] == TINY_EOS and not ignore_eos:
                break
    return tuple(out)


def engine_target_only(lm, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Target-only greedy decoding through a verifier engine on ``lm`` (any backend): windows of 0 tokens."""
    from edgespec.engines.verifier import VerifierEngine

    reference = VerifierEngine(lm, lm.eos_ids())
    reference.open("target-only", prompt)
    out: list[int] = []
    while len(out) < max_new_tokens:
        out += reference.verify("target-only", len(prompt) + len(out), []).verdict.committed([])
    return out[:max_new_tokens]


def target_only_coupled(spec: str, prompt: list[int], max_new_tokens: int, params) -> list[int]:
    """The coupled sampler's reference on a tiny target (bench.baselines.target_only_coupled)."""
    from bench.baselines import target_only_coupled as reference

    return reference(tiny(spec).model, prompt, max_new_tokens, [TINY_EOS], params)
