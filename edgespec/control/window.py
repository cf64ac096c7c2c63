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
    nearest smaller measured one, so it gets tried.

    Until drafting has been measured (here, by earlier sessions whose costs the telemetry inherited, or by the
    drafter itself at its start: its Info's cost per token) it drafts one token; then, if the verifier's cost of a target-only round is unmeasured, it runs one.
    While target-only rounds win it probes: after ``first_probe`` of them it drafts one token to re-measure
    acceptance (one rejected window must not shut drafting off for long), then after twice as many, up to
    ``probe_every`` — or after ``rare_probe_every`` where the measured costs say that
    drafting would not gain 10% even if every token were accepted (Telemetry.drafting_cannot_pay; draft and
    target on the same cores): there a probe costs more (a round's drafting, the drafter's open or its
    catch-up on the tokens it missed) than it could find. Not while the verifier's forwards are shared:
    what a drafted token costs then moves with the load, and a probe measures the next forward size.
    Nor does it switch windows there for less than ``hold_margin``: sessions whose windows differ take
    rounds of different lengths, drift apart, and their windows stop meeting in one forward.
    """
    telemetry: Telemetry           # the session's; the round loop records every round into it
    max_k: int = 4                 # largest window considered, tokens
    probe_every: int = 16          # target-only rounds between probes (one drafted token), at most
    first_probe: int = 2           # ... and after falling back to k = 0: the gap doubles per fruitless probe
    rare_probe_every: int = 256    # the same where drafting cannot pay at any acceptance (by 10%)
    hold_margin: float = 0.05      # under shared forwards, keep the last window unless another gains this much
    _idle_rounds: int = 0          # consecutive k = 0 rounds
    _held: int | None = None       # the window goodput chose last
    _probe_gap: int = 0            # idle rounds before the next probe (0: first_probe)

    def choose(self) -> int:
        gap = self._probe_gap or self.first_probe
        if self.max_k > 0 and self._idle_rounds >= gap and (
                self._idle_rounds >= self.rare_probe_every or self.telemetry.shared_forwards()
                or not self.telemetry.drafting_cannot_pay(self.max_k)):
            self._probe_gap = min(2 * gap, max(self.probe_every, self.first_probe))
            # acceptance may have recovered; k = 0 alone would never find out. Probe the window that would pay
            # if every position accepted as the first one does (1 while drafting is unmeasured).
            return self.telemetry.probe_window(self.max_k) if self.telemetry.draft_per_token is not None else 1
        if self.telemetry.draft_per_token is None:   # drafting never measured: draft one token
            return min(1, self.max_k)
        measured = self.telemetry.verify_compute
        if measured and 0 not in measured and not self.telemetry.shared_forwards():
            return 0   # target-only rounds never measured: one round does (no smaller window to cost it by)
        best = self.telemetry.goodput_window(self.max_k, optimistic=True)
        held, rate = self._held, self.telemetry.goodput_rate
        if (held is not None and held != best and held <= self.max_k and self.telemetry.shared_forwards()
                and rate(best, True) < (1 + self.hold_margin) * rate(held, True)):
            best = held   # sessions sharing forwards keep in step: a switch for a small gain splits the batch
        self._held = best
        if best > 0:
            self._probe_gap = 0   # drafting by choice: a later fall-back probes soon again
        return best

    def observe(self, sample: RoundSample) -> None:
        self._idle_rounds = self._idle_rounds + 1 if sample.k == 0 else 0
