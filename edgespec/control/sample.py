"""One round, measured once: the record every consumer of a round reads (docs/architecture.md §2, §4).

The round loop (edgespec.loop.rounds.Rounds.commit) builds exactly one RoundSample per committed round;
the session's stats, the telemetry, the metrics, the round's span, the window policy and the drafter
port all consume that same object. The simulator's rounds go through the same loop. Pure: no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class RoundSample:
    k: int                               # tokens drafted on the window's chain (window size); 0 = target-only round
    accepted: int                        # n, draft tokens the verifier accepted (0 <= n <= k)
    draft_seconds: float                 # drafter time for the whole window
    verify_wall_seconds: float           # coordinator-measured verify round trip (wire + queue + forward)
    verify_compute_seconds: float = 0.0  # verifier-reported forward time for this window (0 = not reported)
    queue_depth: int = 0                 # verifier-reported windows waiting when this one was scored
    link: str = ""                       # verifier address the window went to ("" = not known)
    committed: int = -1                  # tokens committed this round; -1 = accepted + 1
    round_seconds: float = -1.0          # round wall time; -1 = draft + verify wall
    target_logprob: float = 0.0          # verifier-reported sum of log p (T=1) over the committed tokens
    batch_windows: int = 0               # verifier-reported windows in the forward that scored this one (0 = unknown)
    batch_tokens: int = 0                # verifier-reported tokens that forward fed, all windows (0 = unknown)
    siblings: int = 0                    # a token tree: runner-up nodes drafted beside the chain (0 = a chain)
    took_sibling: bool = False           # the accepted path went through one of them (its last node)
    self_drafted: int = 0                # cloud drafting: tokens the verifier drafted and scored itself (k is 0)
    draft_catchup: int = 0               # tokens the drafter computed before drafting (committed while it was idle)
    free: bool = False                   # the chain was a free draft (the coordinator's suffix drafter), not the drafter's
    steps: int = 1                       # target passes the round made: a target-only window of steps makes one per
                                         # token it commits, in one round trip (k is 0)
    verifier_seconds: float = 0.0        # verifier-reported time from the window's arrival to its verdict (0 = not
                                         # reported): its wait behind other sessions' work, its forwards, verification
    after_prompt: bool = False           # the session's first round: a verifier may take its first row from the
                                         # prompt's prefill (llama.cpp keeps it), so its forward time is no window's cost

    @property
    def tokens(self) -> int:
        return self.accepted + 1 if self.committed < 0 else self.committed

    @property
    def wall(self) -> float:
        return self.draft_seconds + self.verify_wall_seconds if self.round_seconds < 0 else self.round_seconds

    @property
    def rtt(self) -> float:
        """The link's share of the verify round trip: wall minus the window's time in the verifier (its wait
        there included), or minus its forward where the verifier reports only that (all of it if neither)."""
        inside = self.verifier_seconds if self.verifier_seconds > 0 else self.verify_compute_seconds
        return max(0.0, self.verify_wall_seconds - inside)

    @property
    def verifier_wait(self) -> float:
        """Seconds the window spent in the verifier besides its forward: waiting behind other sessions' work
        (0 where the verifier does not report its time)."""
        return max(0.0, self.verifier_seconds - self.verify_compute_seconds) if self.verifier_seconds > 0 else 0.0
