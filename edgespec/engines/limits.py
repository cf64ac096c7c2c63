"""Request validation shared by the verifier and drafter engines. Pure."""
from __future__ import annotations

from typing import Sequence

from edgespec.errors import InvalidArgument

MAX_SESSION_ID_CHARS = 128


def check_session_id(session_id: str) -> None:
    if not session_id or len(session_id) > MAX_SESSION_ID_CHARS or not session_id.isprintable():
        raise InvalidArgument("session_id", f"must be 1..{MAX_SESSION_ID_CHARS} printable characters")


def check_token_ids(field: str, tokens: Sequence[int], vocab_size: int) -> None:
    for i, t in enumerate(tokens):
        if not 0 <= t < vocab_size:
            raise InvalidArgument(field, f"token id {t} at index {i} is outside the vocabulary [0, {vocab_size})")


def check_prefix(field: str, tokens: Sequence[int], vocab_size: int, max_tokens: int) -> None:
    if not tokens:
        raise InvalidArgument(field, "must hold at least one token")
    if len(tokens) > max_tokens:
        raise InvalidArgument(field, f"{len(tokens)} tokens exceeds the session limit of {max_tokens}")
    check_token_ids(field, tokens, vocab_size)


def check_draft_probs(q: Sequence, draft: Sequence[int], vocab_size: int, sampler: str) -> None:
    """Draft distributions: none for greedy and coupled sessions (token ids only); for the standard
    sampler none (one-hot) or one per draft token. ``sampler`` is SamplingParams.sampler."""
    if not q:
        return
    if sampler != "standard":
        raise InvalidArgument("draft_probs", f"{sampler} sessions take no draft distributions, only token ids")
    if len(q) != len(draft):
        raise InvalidArgument("draft_probs", f"{len(q)} distributions for {len(draft)} draft tokens")
    for i, (dist, token) in enumerate(zip(q, draft)):
        where = f"distribution {i}"
        if not dist.ids or len(dist.ids) != len(dist.weights):
            raise InvalidArgument("draft_probs", f"{where}: needs as many weights as ids, and at least one")
        if len(set(dist.ids)) != len(dist.ids):
            raise InvalidArgument("draft_probs", f"{where}: repeated token ids")
        check_token_ids("draft_probs", dist.ids, vocab_size)
        if not all(0.0 < w < float("inf") for w in dist.weights):
            raise InvalidArgument("draft_probs", f"{where}: weights must be positive and finite")
        if token not in dist.ids:
            raise InvalidArgument("draft_probs", f"{where}: draft token {token} has q = 0, it cannot have been sampled")
