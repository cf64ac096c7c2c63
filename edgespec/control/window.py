"""Window policies: how many tokens to draft next round. Pure; one interface.

Every policy sees the same telemetry after each round (window, accepted, draft
and verify seconds as the coordinator measured them, wire included) and may
choose k = 0: target-only decoding is a mode, not an error path.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence


def expected_tokens(alphas: Sequence[float], k: int) -> float:
    """E(k) = 1 + sum_{i<=k} prod_{j<=i} alpha_j: tokens a window of k commits, alpha_j the acceptance
    at position j given acceptance before it."""
    total, reach = 1.0, 1.0
    for j in range(k):
        reach *= alphas[j]
        total += reach
    return total


def best_window(alphas: Sequence[float], draft_per_token: float, overhead: float, verify: Callable[[int], float],
                max_k: int) -> int:
    """The k in [0, max_k] maximising E(k) / (k * t_draft + overhead + verify(k)) (docs/architecture.md §4)."""
    best_k, best_rate = 0, -1.0
    for k in range(max_k + 1):
        rate = expected_tokens(alphas, k) / max(1e-9, k * draft_per_token + overhead + verify(k))
        if rate > best_rate + 1e-12:
            best_k, best_rate = k, rate
    return best_k


class WindowPolicy(Protocol):
    def choose(self) -> int: ...
    def observe(self, k: int, accepted: int, draft_seconds: float, verify_seconds: float) -> None: ...


@dataclass(slots=True)
class FixedWindow:
    k: int   # tokens drafted every round

    def choose(self) -> int:
        return self.k

    def observe(self, k: int, accepted: int, draft_seconds: float, verify_seconds: float) -> None:
        pass


@dataclass(slots=True)
class HeuristicWindow:
    """The classic schedule (HF assisted generation's "heuristic"): +2 after a fully
    accepted window, -1 otherwise, within [min_k, max_k]. Never chooses k = 0."""
    k: int = 2       # next window, tokens
    min_k: int = 1   # smallest window, tokens
    max_k: int = 8   # largest window, tokens

    def choose(self) -> int:
        return self.k

    def observe(self, k: int, accepted: int, draft_seconds: float, verify_seconds: float) -> None:
        if k == 0:          # a budget-clamped target-only step says nothing about the draft
            return
        self.k = min(self.max_k, self.k + 2) if accepted == k else max(self.min_k, self.k - 1)


@dataclass(slots=True)
class GoodputWindow:
    """Pick the k that maximises expected tokens per second (docs/architecture.md §4):

        E(k) / (k * t_draft + t_verify(k)),   E(k) = 1 + sum_{i<=k} prod_{j<=i} alpha_j

    alpha_j is the EMA of acceptance at position j given acceptance up to j - 1;
    t_draft the EMA of drafter seconds per token; t_verify(k) the EMA of the
    round-trip verify time for a window of k (RTT and queueing included, since
    the coordinator measures it). A window size not yet measured is costed
    optimistically at the nearest smaller measured one, so it gets tried once.
    """
    max_k: int = 4                 # largest window considered, tokens
    smoothing: float = 0.3         # EMA weight of a new observation
    prior_alpha: float = 0.7       # acceptance assumed before any observation
    alpha: list[float] = field(default_factory=list)          # [max_k] conditional acceptance per position
    t_draft: float | None = None                              # seconds per drafted token
    t_verify: dict[int, float] = field(default_factory=dict)  # window k -> seconds per verify round trip
    probe_every: int = 16          # after this many target-only rounds, draft one token to re-measure
    _idle_rounds: int = 0          # consecutive k = 0 rounds

    def __post_init__(self) -> None:
        if not self.alpha:
            self.alpha = [self.prior_alpha] * self.max_k

    def expected_tokens(self, k: int) -> float:
        return expected_tokens(self.alpha, k)

    def estimated_seconds(self, k: int) -> float | None:
        known = [m for m in self.t_verify if m <= k] or list(self.t_verify)
        if not known:
            return None
        verify = self.t_verify.get(k, self.t_verify[max(known) if max(known) <= k else min(known)])
        return k * (self.t_draft or 0.0) + verify

    def choose(self) -> int:
        if self._idle_rounds >= self.probe_every and self.max_k > 0:
            return 1   # acceptance may have recovered; k = 0 alone would never find out
        best_k, best_rate = 1, -1.0
        for k in range(self.max_k + 1):
            seconds = self.estimated_seconds(k)
            if seconds is None:        # nothing measured yet: start with one drafted token
                return min(1, self.max_k)
            rate = self.expected_tokens(k) / seconds if seconds > 0 else float("inf")
            if rate > best_rate + 1e-12:
                best_k, best_rate = k, rate
        return best_k

    def observe(self, k: int, accepted: int, draft_seconds: float, verify_seconds: float) -> None:
        s = self.smoothing
        self._idle_rounds = self._idle_rounds + 1 if k == 0 else 0
        self.t_verify[k] = verify_seconds if k not in self.t_verify else (1 - s) * self.t_verify[k] + s * verify_seconds
        if k == 0:
            return
        per_token = draft_seconds / k
        self.t_draft = per_token if self.t_draft is None else (1 - s) * self.t_draft + s * per_token
        for j in range(min(accepted + 1, k)):     # positions that were actually judged
            hit = 1.0 if j < accepted else 0.0
            self.alpha[j] = (1 - s) * self.alpha[j] + s * hit
