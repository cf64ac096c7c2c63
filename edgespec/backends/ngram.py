"""A model-free drafter: prompt lookup over the session's own tokens.

To draft after ``committed``, take its last n tokens (n = max_ngram down to
min_ngram), find their most recent earlier occurrence and propose the tokens that
followed it. Code and edits repeat their context, so this costs microseconds and
often guesses long runs right; a wrong guess costs only the verifier's rejection,
never the output, which stays the target's.

Always exactly k tokens: when a continuation runs out (it reached the end of the
sequence) the lookup repeats on the sequence extended with what was proposed so
far; when nothing matches at all, the last token is repeated.

The index is synced to the requested sequence by longest common prefix, like a
KV cache: rollback is asking for a shorter sequence.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from edgespec.verify.greedy import common_prefix_length

NOT_PROPOSED = -1e9   # logit of every token but the proposal: finite, so warp() never meets inf - inf


@dataclass(slots=True)
class NgramIndex:
    """The tokens indexed, and for each n-gram the positions that followed its occurrences (ascending)."""
    tokens: list[int] = field(default_factory=list)
    follows: dict[tuple[int, ...], list[int]] = field(default_factory=dict)


class NgramDrafter:
    """The DraftModel protocol with no weights; one call at a time (callers serialize)."""

    def __init__(self, vocab_size: int, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}..{max_ngram}")
        self.vocab_size = vocab_size
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.name = f"ngram:{min_ngram}-{max_ngram}"
        self.device = "cpu"
        self.placement = "cpu n-gram"

    def new_state(self) -> NgramIndex:
        return NgramIndex()

    def prefill(self, state: NgramIndex, tokens: Sequence[int]) -> None:
        self._sync(state, tokens)

    def greedy_draft(self, state: NgramIndex, committed: Sequence[int], k: int) -> list[int]:
        """Exactly k tokens after ``committed`` (non-empty); a function of ``committed`` alone."""
        seq = list(committed)
        draft: list[int] = []
        while len(draft) < k:
            self._sync(state, seq)
            more = self._continuation(state, k - len(draft)) or [seq[-1]] * (k - len(draft))
            draft += more
            seq += more
        return draft

    def logits_rows(self, state: NgramIndex, seq: Sequence[int], last: int) -> np.ndarray:
        """float32 [last, vocab]: 0 for the token proposed after each of the last ``last``
        prefixes of ``seq``, NOT_PROPOSED elsewhere, so sampling a draft picks the proposal."""
        if not 1 <= last <= len(seq):
            raise ValueError(f"asked for {last} positions of a {len(seq)}-token sequence")
        rows = np.full((last, self.vocab_size), NOT_PROPOSED, dtype=np.float32)
        for row, end in enumerate(range(len(seq) - last + 1, len(seq) + 1)):
            rows[row, self.greedy_draft(state, seq[:end], 1)[0]] = 0.0
        return rows

    def _continuation(self, state: NgramIndex, k: int) -> list[int]:
        """Up to k tokens that followed the most recent earlier occurrence of the longest matching suffix."""
        tokens = state.tokens
        for n in range(min(self.max_ngram, len(tokens) - 1), self.min_ngram - 1, -1):
            follows = state.follows.get(tuple(tokens[-n:]), [])
            # The last entry is the suffix itself (followed by nothing yet); the one before is the match.
            if len(follows) >= 2:
                start = follows[-2]
                return tokens[start:start + k]
        return []

    def _sync(self, state: NgramIndex, seq: Sequence[int]) -> None:
        keep = common_prefix_length(state.tokens, seq)
        self._truncate(state, keep)
        for token in seq[keep:]:
            state.tokens.append(token)
            end = len(state.tokens)
            for n in range(self.min_ngram, min(self.max_ngram, end) + 1):
                state.follows.setdefault(tuple(state.tokens[end - n:end]), []).append(end)

    def _truncate(self, state: NgramIndex, length: int) -> None:
        # Positions were appended in order, so each one removed is the last entry of its n-grams' lists.
        while len(state.tokens) > length:
            end = len(state.tokens)
            for n in range(self.min_ngram, min(self.max_ngram, end) + 1):
                key = tuple(state.tokens[end - n:end])
                state.follows[key].pop()
                if not state.follows[key]:
                    del state.follows[key]
            state.tokens.pop()
