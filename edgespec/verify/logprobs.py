"""The target's log-probabilities at committed tokens (the OpenAI API's ``logprobs``) — pure, no I/O, no torch.

Each is the log-softmax of the target's logits at temperature 1, from the forward pass that verified the token:
the target's own probability of what it committed, before any warping (temperature, top-k, top-p) or masking
(min_tokens), as vLLM reports by default ("raw" log-probabilities). A token accepted from a draft and one the
target emitted itself have the same kind of value: speculation does not show in them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

MAX_LOGPROBS = 20   # most likely tokens reported per position (OpenAI's top_logprobs limit, vLLM's default)


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token: int                                # the committed token
    logprob: float                            # its log-probability, nats
    top: tuple[tuple[int, float], ...] = ()   # (token, log-probability) of the most likely ones, most likely first


def token_logprobs(logits: np.ndarray, tokens: Sequence[int], top: int = 0) -> tuple[TokenLogprob, ...]:
    """logits: [n, V] the target's rows, row i scoring tokens[i]; tokens: [n]; top: most likely tokens per row
    (ties: the lower id first)."""
    rows = np.asarray(logits[: len(tokens)], dtype=np.float32)
    if not len(tokens):
        return ()
    # Each row's log-sum-exp (float32 terms, float64 sums): no full log-softmax of a large vocabulary per row.
    peak = rows.max(axis=-1)
    lse = peak.astype(np.float64) + np.log(np.exp(rows - peak[:, None]).sum(axis=-1, dtype=np.float64))
    out = []
    for row, norm, token in zip(rows, lse, tokens):
        best: tuple[tuple[int, float], ...] = ()
        if top > 0:
            candidates = np.argpartition(-row, top - 1)[:top] if top < row.shape[-1] else np.arange(row.shape[-1])
            order = candidates[np.lexsort((candidates, -row[candidates]))]
            best = tuple((int(i), float(row[i] - norm)) for i in order)
        out.append(TokenLogprob(int(token), float(row[token] - norm), best))
    return tuple(out)
