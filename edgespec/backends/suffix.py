"""Free drafts: suffix matching over the session's own text (after SuffixDecoding, arXiv 2411.04975).

Outputs that copy their inputs (summaries, RAG answers, extraction, code edits, agent loops) continue
text the session already holds. To draft after the committed tokens, find the longest suffix of them
(up to ``max_ngram`` tokens) that occurred earlier, take the token that most often followed it, append
it, and repeat: a chain whose length follows the match, with a confidence per token. It costs
microseconds and no model, so it runs at the coordinator on every round; when nothing matches well
enough it proposes nothing (the round is target-only), never a filler guess.

Each token's confidence is the probability, as measured in this deployment, that the target accepts a
token drafted after a match of that length (an EMA per match-length bucket, shared by the coordinator's
sessions: SuffixDrafter holds it, each session starts from it and gives its verdicts back; while a
bucket's proposals are declined it drifts back toward its prior, so that it gets measured again), times
the share of the match's earlier occurrences that the token followed. The caller weighs those confidences
against what a window costs (edgespec.control.goodput) and sends the prefix that pays, or none.

Optionally (``store``, edgespec.backends.output_store) it also drafts from the outputs of earlier generations of
the same tenant, where they match a longer suffix than the session's own text does; those tokens have
confidence buckets of their own.

Pure: no I/O, no models. The index is synced to the committed tokens by longest common prefix, like a
KV cache, so rollback is asking with a shorter sequence.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Sequence

from edgespec.backends.output_store import OutputStore
from edgespec.verify.greedy import common_prefix_length

# Acceptance before any verdict, by match-length bucket (1, 2, 3, 4, 5-7, 8+ tokens matched): a match
# of one or two tokens is chance in most text, a long one is a copy (tuned on recorded outputs of the default
# target for 28 Spec-Bench and demo prompts: bench/bench_free_drafts.py). Measured verdicts replace them.
PRIOR_ACCEPTANCE = (0.2, 0.45, 0.6, 0.7, 0.8, 0.9)
# The same for a match in an earlier output (the store: matches of 3 tokens or more), then its buckets are
# measured apart from the session's own
PRIOR_STORED = (0.2, 0.45, 0.4, 0.5, 0.6, 0.75)
PRIORS = PRIOR_ACCEPTANCE + PRIOR_STORED   # [bucket] (see bucket())
RECENT_OCCURRENCES = 64   # occurrences of a suffix counted for its continuation: the most recent ones
# Per proposal declined (not sent: it would not pay by the estimate), its first token's bucket moves this far
# back toward its prior: an estimate that fell below what pays is never measured again otherwise, and copies
# come and go within a text (a bucket at 0.3 under a prior of 0.8 is tried again after ~35 declined proposals).
DECLINED_DRIFT = 0.02


def bucket(matched: int, stored: bool = False) -> int:
    """The confidence bucket of a match of ``matched`` tokens (>= 1), in the session's text or (``stored``) in an
    earlier output."""
    own = min(matched, 4) - 1 if matched < 5 else (4 if matched < 8 else 5)
    return own + len(PRIOR_ACCEPTANCE) if stored else own


@dataclass(frozen=True, slots=True)
class Proposal:
    """A chain of free draft tokens and, per token, what the caller needs to weigh and to learn."""
    tokens: tuple[int, ...] = ()         # [L] proposed ids, in order
    confidence: tuple[float, ...] = ()   # [L] estimated acceptance of each token given the ones before it
    matched: tuple[int, ...] = ()        # [L] suffix tokens matched when each was proposed (its bucket)
    stored: tuple[bool, ...] = ()        # [L] whether each came from an earlier output (its bucket), not the session

    def prefix(self, length: int) -> "Proposal":
        return Proposal(self.tokens[:length], self.confidence[:length], self.matched[:length], self.stored[:length])

    def bucket(self, i: int) -> int:
        return bucket(self.matched[i], self.stored[i])


@dataclass(slots=True)
class _Index:
    tokens: list[int] = field(default_factory=list)
    # n-gram -> the positions right after its occurrences, ascending (the last may be len(tokens): no follower yet)
    follows: dict[tuple[int, ...], list[int]] = field(default_factory=dict)


class SuffixDrafter:
    """The coordinator's free drafter: settings and the acceptance it measured, shared by its sessions."""

    def __init__(self, max_ngram: int = 8, smoothing: float = 0.2, store_tokens: int = 0,
                 tenant: Callable[[], str] = lambda: ""):
        if max_ngram < 1:
            raise ValueError(f"max_ngram must be >= 1, got {max_ngram}")
        if not 0 < smoothing <= 1:
            raise ValueError(f"smoothing must be in (0, 1], got {smoothing}")
        self.max_ngram = max_ngram        # longest suffix looked up, tokens
        self.smoothing = smoothing        # EMA weight of one verdict on a bucket's acceptance
        self.acceptance = list(PRIORS)   # [bucket] measured acceptance of a free draft token
        # earlier generations' outputs by tenant, up to store_tokens tokens (0: none kept)
        self.store = OutputStore(store_tokens, max_ngram) if store_tokens else None
        self.tenant = tenant              # whose generation is being served (called as a session opens)

    def session(self) -> "SuffixSession":
        return SuffixSession(self)

    def absorb(self, session: "SuffixSession", output: Sequence[int] = (), weight: float = 0.5) -> None:
        """A finished session's measured acceptance moves the shared one (buckets it judged only); its verified
        ``output`` goes to the store."""
        for b, judged in enumerate(session.judged):
            if judged:
                self.acceptance[b] = (1 - weight) * self.acceptance[b] + weight * session.acceptance[b]
        if self.store is not None and output:
            self.store.add(session.tenant, output)


class SuffixSession:
    """One generation's index and acceptance; one call at a time (the round loop's)."""

    def __init__(self, drafter: SuffixDrafter):
        self.max_ngram, self.smoothing = drafter.max_ngram, drafter.smoothing
        self.store, self.tenant = drafter.store, drafter.tenant() if drafter.store is not None else ""
        self.acceptance = list(drafter.acceptance)
        self.judged = [0] * len(self.acceptance)   # [bucket] verdicts seen in this session
        self._index = _Index()

    def propose(self, committed: Sequence[int], limit: int) -> Proposal:
        """Up to ``limit`` tokens after ``committed``: the chain the session's text continues, with a confidence
        per token; shorter (or empty) where no earlier occurrence continues it."""
        self._sync(committed)
        tokens, confidence, matched, stored = [], [], [], []
        ahead: list[int] = []   # proposed tokens: the virtual end of the text
        while len(tokens) < limit:
            found = self._continue(ahead)
            if found is None:
                break
            token, share, length, earlier = found
            tokens.append(token)
            confidence.append(share * self.acceptance[bucket(length, earlier)])
            matched.append(length)
            stored.append(earlier)
            ahead.append(token)
        return Proposal(tuple(tokens), tuple(confidence), tuple(matched), tuple(stored))

    def observe(self, proposal: Proposal, accepted: int) -> None:
        """The verdict on a window of ``proposal``'s tokens: the first ``accepted`` were accepted, the next (if
        any) rejected; tokens after it were never judged."""
        s = self.smoothing
        for i in range(min(accepted + 1, len(proposal.matched))):
            b = proposal.bucket(i)
            self.acceptance[b] = (1 - s) * self.acceptance[b] + s * (1.0 if i < accepted else 0.0)
            self.judged[b] += 1

    def declined(self, proposal: Proposal) -> None:
        """A proposal the caller did not send: its first token's bucket drifts back toward the prior."""
        if proposal.matched:
            b = proposal.bucket(0)
            self.acceptance[b] += DECLINED_DRIFT * (PRIORS[b] - self.acceptance[b])

    def _continue(self, ahead: Sequence[int]) -> tuple[int, float, int, bool] | None:
        """(the token that most often followed the longest matching suffix of the text + ``ahead``, the share of
        its occurrences it followed, the suffix's length, whether it is an earlier output's); None if no suffix
        occurred before. The session's own text wins a tie with the store."""
        tokens, follows = self._index.tokens, self._index.follows
        end = len(tokens)
        own = None
        for n in range(min(self.max_ngram, end + len(ahead)), 0, -1):
            positions = [p for p in follows.get(self._key(n, ahead), ())[-RECENT_OCCURRENCES - 1:] if p < end]
            if not positions:
                continue
            counts = Counter(tokens[p] for p in positions)
            best = max(counts.values())
            # the most frequent follower; among equals, the one that followed most recently
            token = next(tokens[p] for p in reversed(positions) if counts[tokens[p]] == best)
            own = token, best / len(positions), n, False
            break
        if self.store is not None:
            shortest = max(own[2] + 1 if own else 1, self.store.min_ngram)
            for n in range(min(self.max_ngram, end + len(ahead)), shortest - 1, -1):
                found = self.store.follower(self.tenant, self._key(n, ahead))
                if found is not None:
                    return found[0], found[1], n, True
        return own

    def _key(self, n: int, ahead: Sequence[int]) -> tuple[int, ...]:
        """The last ``n`` tokens of the text followed by ``ahead``."""
        take = max(0, n - len(ahead))
        tokens = self._index.tokens
        return tuple(tokens[len(tokens) - take:]) + tuple(ahead[len(ahead) - (n - take):]) if take else tuple(ahead[-n:])

    def _sync(self, committed: Sequence[int]) -> None:
        index = self._index
        known = len(index.tokens)
        # the round loop only appends: compare the known part in one C-level list comparison, not token by token
        if known <= len(committed) and list(committed[:known]) == index.tokens:
            keep = known
        else:
            keep = common_prefix_length(index.tokens, committed)
        while len(index.tokens) > keep:   # positions were appended in order: each is its n-grams' last entry
            end = len(index.tokens)
            for n in range(1, min(self.max_ngram, end) + 1):
                key = tuple(index.tokens[end - n:end])
                index.follows[key].pop()
                if not index.follows[key]:
                    del index.follows[key]
            index.tokens.pop()
        for token in committed[keep:]:
            index.tokens.append(token)
            end = len(index.tokens)
            for n in range(1, min(self.max_ngram, end) + 1):
                index.follows.setdefault(tuple(index.tokens[end - n:end]), []).append(end)
