"""Window policies: how many tokens to draft next round. Pure; one interface.

Every policy sees each committed round once, as the loop's RoundSample (window, accepted, draft and
verify seconds as the coordinator measured them, wire included), after the session's Telemetry has
recorded it; a policy that weighs costs reads that Telemetry. Any policy may choose k = 0: target-only
decoding is a mode, not an error path.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from edgespec.control.sample import RoundSample
from edgespec.control.telemetry import Telemetry


class WindowPolicy(Protocol):
    def choose(self) -> int: ...
    def observe(self, sample: RoundSample) -> None: ...


@dataclass(slots=True)
class FixedWindow:
    k: int   # tokens drafted every round

    def choose(self) -> int:
        return self.k

    def observe(self, sample: RoundSample) -> None:
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

    def observe(self, sample: RoundSample) -> None:
        if sample.k == 0:          # a budget-clamped target-only step says nothing about the draft
            return
        self.k = min(self.max_k, self.k + 2) if sample.accepted == sample.k else max(self.min_k, self.k - 1)


@dataclass(slots=True)
class GoodputWindow:
    """Pick the k that maximises expected tokens per second (docs/architecture.md §4):

        E(k) / (k * t_draft + RTT + t_verify(k)),   E(k) = 1 + sum_{i<=k} prod_{j<=i} alpha_j

    from the session's Telemetry (the one the round loop records into): alpha_j its per-position
    acceptance EMAs, t_draft its drafter seconds per token, RTT its link estimate, t_verify(k) its
    verifier forward time for a window of k — the estimate and the argmax AWC's goodput feature uses
    (Telemetry.goodput_window), except that a window not measured yet is costed optimistically, at the
    nearest smaller measured one, so it gets tried. Before any round is measured it drafts one token;
    after ``probe_every`` target-only rounds it drafts one token to re-measure acceptance.
    """
    telemetry: Telemetry           # the session's; the round loop records every round into it
    max_k: int = 4                 # largest window considered, tokens
    probe_every: int = 16          # after this many target-only rounds, draft one token to re-measure
    _idle_rounds: int = 0          # consecutive k = 0 rounds

    def choose(self) -> int:
        if self._idle_rounds >= self.probe_every and self.max_k > 0:
            return 1   # acceptance may have recovered; k = 0 alone would never find out
        if not self.telemetry.rounds:   # nothing measured yet: start with one drafted token
            return min(1, self.max_k)
        return self.telemetry.goodput_window(self.max_k, optimistic=True)

    def observe(self, sample: RoundSample) -> None:
        self._idle_rounds = self._idle_rounds + 1 if sample.k == 0 else 0
