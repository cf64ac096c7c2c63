"""End of sequence under speculation: which tokens end a generation, and min_tokens as a mask on the target's logits.

vLLM's two sampling parameters, kept exact:

- ``ignore_eos``: an EOS token does not end the generation. The verifier then accepts an EOS draft token like any
  other, and the coordinator does not stop at one: the output is the target's own continuation, to the budget.
- ``min_tokens``: vLLM sets the EOS logits to -inf while fewer than min_tokens tokens have been generated. The
  verifier applies the same mask to every row of the target's logits it verifies against, by the session
  position the row scores (``SamplingParams.min_length`` = prompt tokens + min_tokens), before any rule (greedy
  argmax, warping, the coupled sampler, token trees). What it commits is then exactly the target's own masked
  output whatever the drafter proposed: an EOS draft token there has p = 0 and is never accepted.

Log-probabilities reported to clients stay the target's own, from the unmasked logits (vLLM's default "raw"
log-probabilities).
"""
from __future__ import annotations

from typing import Collection, Iterable

import numpy as np

from edgespec.verify.sampling import SamplingParams


def ending_ids(params: SamplingParams, eos_ids: Collection[int]) -> frozenset[int]:
    """The tokens that end a generation under ``params``: the EOS ids, or none with ignore_eos."""
    return frozenset() if params.ignore_eos else frozenset(eos_ids)


def mask_eos(rows: np.ndarray, positions: Iterable[int], eos_ids: Collection[int], min_length: int) -> np.ndarray:
    """The target's logits as the verification rules see them under min_tokens.

    rows:      [R, V] logits, row r scoring the token at session position positions[r]
    positions: [R] session positions (prompt and generated tokens before the scored one)
    Returns ``rows`` itself when no row scores a position below ``min_length``; else a copy with the EOS logits
    of those rows at -inf.
    """
    masked = [r for r, position in enumerate(positions) if position < min_length]
    ids = sorted(token for token in eos_ids if 0 <= token < rows.shape[-1])
    if not masked or not ids:
        return rows
    out = np.array(rows, copy=True)
    out[np.ix_(masked, ids)] = -np.inf
    return out
