"""Earlier outputs for free drafts: what this coordinator's finished generations produced, per tenant.

SuffixDecoding (arXiv 2411.04975) drafts from the request's own text and from a global tree over earlier
outputs: agent loops, repeated questions and templated answers write what earlier requests wrote. This is
the second part. A finished generation's verified output goes in under its tenant (the end user, or the
calling identity); a session looks up the suffix of its text there when its own text matches less of it. A
tenant only ever drafts from its own outputs (a draft changes no text, but how fast an answer comes would
say what another tenant's outputs were).

Bounded by tokens: past ``max_tokens`` in all, the outputs least recently matched are dropped. Each token
indexes the n-grams (``min_ngram``..``max_ngram`` tokens) that end at it: about 2 KB per token kept (measured
with 256-token outputs of random tokens; repetitive text shares n-grams and takes less).
Pure: no I/O, no models.
"""
from __future__ import annotations

from collections import Counter
from typing import Sequence

RECENT_OCCURRENCES = 64   # occurrences of an n-gram counted for its continuation, the most recently added
_POSITION_BITS = 32       # an occurrence is packed in one int: output id << _POSITION_BITS | position (half the memory)


class OutputStore:
    """Tokens of earlier outputs by tenant, indexed by n-gram; least recently matched dropped first."""

    def __init__(self, max_tokens: int, max_ngram: int = 8, min_ngram: int = 3):
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram} and {max_ngram}")
        self.max_tokens = max_tokens   # tokens kept, all tenants together
        self.max_ngram = max_ngram     # longest n-gram indexed
        self.min_ngram = min_ngram     # shortest: a match of one or two tokens in another text is chance
        self.tokens = 0                # tokens kept now
        self._outputs: dict[int, tuple[str, tuple[int, ...]]] = {}   # id -> (tenant, tokens)
        self._used: dict[int, int] = {}        # id -> the tick it was last added or matched at
        self._ids: dict[tuple[str, tuple[int, ...]], int] = {}   # (tenant, tokens) -> id: one copy of a repeat
        # (tenant, n-gram) -> its occurrences, each packed as (output id, the position right after it), in order
        self._follows: dict[tuple[str, tuple[int, ...]], list[int]] = {}
        self._next = 0                         # the next id, and the clock of _used

    def __len__(self) -> int:
        return len(self._outputs)

    def add(self, tenant: str, output: Sequence[int]) -> None:
        """Keep ``output`` under ``tenant`` (a repeat of one kept is only marked as used), dropping the least
        recently matched outputs past the budget. One longer than the whole budget is kept by its last part."""
        tokens = tuple(output[-self.max_tokens:])
        if len(tokens) <= self.min_ngram:
            return
        known = self._ids.get((tenant, tokens))
        if known is not None:
            self._touch(known)
            return
        while self.tokens + len(tokens) > self.max_tokens:
            self._drop(min(self._used, key=self._used.__getitem__))
        key = self._touch(None)
        self._outputs[key] = (tenant, tokens)
        self._ids[(tenant, tokens)] = key
        self.tokens += len(tokens)
        for gram, end in self._grams(tokens):
            self._follows.setdefault((tenant, gram), []).append(key << _POSITION_BITS | end)

    def follower(self, tenant: str, gram: tuple[int, ...]) -> tuple[int, float] | None:
        """The token that most often followed ``gram`` in ``tenant``'s outputs and the share of the occurrences it
        followed (ties: the most recently added output's); None if ``gram`` never occurred with a follower.
        The output it came from counts as used."""
        where = self._follows.get((tenant, gram))
        if not where:
            return None
        mask = (1 << _POSITION_BITS) - 1
        seen: list[tuple[int, int]] = []   # (output id, follower), the latest occurrence first
        for packed in reversed(where):
            key, end = packed >> _POSITION_BITS, packed & mask
            tokens = self._outputs[key][1]
            if end < len(tokens):
                seen.append((key, tokens[end]))
                if len(seen) == RECENT_OCCURRENCES:
                    break
        if not seen:
            return None
        counts = Counter(token for _, token in seen)
        best = max(counts.values())
        key, token = next((k, t) for k, t in seen if counts[t] == best)
        self._touch(key)
        return token, best / len(seen)

    def _touch(self, key: int | None) -> int:
        """Mark ``key`` (None: a new id) used now; returns it."""
        tick, self._next = self._next, self._next + 1
        key = tick if key is None else key
        self._used[key] = tick
        return key

    def _drop(self, key: int) -> None:
        tenant, tokens = self._outputs.pop(key)
        del self._used[key]
        del self._ids[(tenant, tokens)]
        self.tokens -= len(tokens)
        for gram, _ in self._grams(tokens):
            where = self._follows.get((tenant, gram))
            if where is not None:
                where[:] = [p for p in where if p >> _POSITION_BITS != key]
                if not where:
                    del self._follows[(tenant, gram)]

    def _grams(self, tokens: tuple[int, ...]):
        """(n-gram, the position right after it) for every indexed n-gram of ``tokens``."""
        for end in range(self.min_ngram, len(tokens) + 1):
            for n in range(self.min_ngram, min(self.max_ngram, end) + 1):
                yield tokens[end - n:end], end
