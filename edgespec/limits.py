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
