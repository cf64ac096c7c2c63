"""The coordinator's record of one generation: committed tokens and round stats.

Pure bookkeeping; the round loop (edgespec/loop/rounds.py) commits each verdict's tokens here and
counts the round from its RoundSample.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Iterable, Mapping, Sequence

from edgespec.control.sample import RoundSample
from edgespec.verify.greedy import Verdict


@dataclass(slots=True)
class RoundStats:
    rounds: int = 0            # windows verified
    drafted: int = 0           # draft tokens proposed
    accepted: int = 0          # draft tokens accepted
    draft_seconds: float = 0.0   # waiting on the drafter, seconds
    verify_wall_seconds: float = 0.0  # waiting on the verifier (wire, queue and forward), seconds
    optimistic_windows: int = 0  # pipelining: windows drafted ahead and sent before the previous verdict
    optimistic_hits: int = 0     # of those, the ones whose assumption held (verified, not discarded)
    degraded: int = 0            # times no verifier was reachable and unverified drafting began
    free_rounds: int = 0         # rounds whose window was a free draft (the coordinator's suffix drafter)
    free_drafted: int = 0        # ... their draft tokens (counted in drafted too)
    free_accepted: int = 0       # ... of those, accepted (counted in accepted too)
    free_declined: int = 0       # rounds whose free draft was found but not sent: it could not pay by the costs
    target_logprob: float = 0.0  # sum of the target's T=1 log-probabilities of the verified tokens (nats)
    # Acceptance by depth: [d - 1] = rounds whose window offered a token at depth d (an edge window: its chain of
    # k; a self-drafted one: unknown to the coordinator, not counted), and rounds whose accepted path reached it.
    offered_at_depth: list[int] = field(default_factory=list)
    accepted_at_depth: list[int] = field(default_factory=list)

    def record(self, sample: RoundSample) -> None:
        """Count one committed round: a target pass each (a target-only window of steps is one pass per token)."""
        self.rounds += sample.steps
        self.drafted += sample.k + sample.siblings + sample.self_drafted   # runner-ups and the verifier's own too
        self.accepted += sample.accepted
        if sample.free:
            self.free_rounds += 1
            self.free_drafted += sample.k
            self.free_accepted += sample.accepted
        self.draft_seconds += sample.draft_seconds
        self.verify_wall_seconds += sample.verify_wall_seconds
        self.target_logprob += sample.target_logprob
        _count_to(self.offered_at_depth, sample.k)
        _count_to(self.accepted_at_depth, sample.accepted)

    @classmethod
    def merged(cls, many: Iterable["RoundStats"]) -> "RoundStats":
        """The counts of several generations together (their derived values then hold over all of them)."""
        total = cls()
        for stats in many:
            for name in (f.name for f in fields(cls)):
                mine, theirs = getattr(total, name), getattr(stats, name)
                if isinstance(mine, list):
                    mine.extend([0] * (len(theirs) - len(mine)))
                    for d, count in enumerate(theirs):
                        mine[d] += count
                else:
                    setattr(total, name, mine + theirs)
        return total

    def reported(self) -> dict[str, Any]:
        """These counts under GenerationStats' names (REPORTED), with the derived values defined here."""
        values = {theirs: _copied(getattr(self, mine)) for mine, theirs in REPORTED.items()}
        return values | {"acceptance_rate": self.acceptance_rate, "mean_accepted_length": self.mean_accepted_length}

    @classmethod
    def of(cls, reported: Any) -> "RoundStats":
        """The counts a GenerationStats reports (the library's, protobuf's, or a bench row of its fields: a
        mapping) back as a RoundStats, so that generations seen from a client pool and derive as sessions do.
        A count the report lacks is 0."""
        if isinstance(reported, Mapping):
            values = {mine: reported.get(theirs) for mine, theirs in REPORTED.items()}
        else:
            values = {mine: getattr(reported, theirs, None) for mine, theirs in REPORTED.items()}
        return cls(**{mine: _copied(value) for mine, value in values.items() if value is not None})

    @property
    def acceptance_rate(self) -> float:
        return acceptance(self.accepted, self.drafted)

    @property
    def acceptance_by_depth(self) -> list[float]:
        """[d - 1]: of the rounds whose window offered a token at depth d, the share whose accepted path reached
        it; where no window's depths are known (the verifier's own drafts), of all rounds."""
        if self.offered_at_depth:
            return [acceptance(a, o) for a, o in zip(self.accepted_at_depth, self.offered_at_depth)]
        return [acceptance(a, self.rounds) for a in self.accepted_at_depth]

    @property
    def mean_accepted_length(self) -> float:
        """Tokens committed per round (accepted + the target's one)."""
        return (self.accepted + self.rounds) / self.rounds if self.rounds else 0.0


@dataclass(slots=True)
class SessionLog:
    prompt: list[int]              # prompt token ids (already templated)
    max_new_tokens: int            # generation budget, tokens
    eos_ids: frozenset[int]        # tokens that end generation
    generated: list[int] = field(default_factory=list)
    stats: RoundStats = field(default_factory=RoundStats)
    finish_reason: str | None = None   # "eos" | "length" | "unverified" (degraded) once finished
    unverified: int = 0                # degraded end: drafter tokens after `generated` no verifier checked

    @property
    def committed(self) -> list[int]:
        return self.prompt + self.generated

    @property
    def position(self) -> int:
        """Committed length: prompt + generated tokens."""
        return len(self.prompt) + len(self.generated)

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - len(self.generated)

    def clamp_window(self, k: int) -> int:
        """Largest window that cannot overshoot the budget: a round commits up to k + 1."""
        return max(0, min(k, self.remaining - 1))

    def commit(self, draft: Sequence[int], verdict: Verdict) -> list[int]:
        """Commit one round's tokens; return them. (The round is counted by stats.record, from its sample.)"""
        if verdict.accepted > len(verdict.drafted or draft):
            raise ValueError(f"verdict accepts {verdict.accepted} of {len(draft)} draft tokens")
        tokens = verdict.committed(draft)
        if len(tokens) > self.remaining:
            raise ValueError(f"round commits {len(tokens)} tokens but only {self.remaining} remain")
        self.generated.extend(tokens)
        if tokens[-1] in self.eos_ids:
            self.finish_reason = "eos"
        elif self.remaining == 0:
            self.finish_reason = "length"
        return tokens


# RoundStats' counts that a generation reports (GenerationStats, protobuf's too), by the names it reports them
# under: the one mapping between the two records. (degraded and target_logprob are reported otherwise: as the
# finish reason and as a mean per token.)
REPORTED = {"rounds": "rounds", "drafted": "drafted_tokens", "accepted": "accepted_tokens",
            "draft_seconds": "draft_seconds", "verify_wall_seconds": "verify_wall_seconds",
            "optimistic_windows": "optimistic_windows", "optimistic_hits": "optimistic_hits",
            "free_rounds": "free_rounds", "free_drafted": "free_drafted_tokens", "free_accepted": "free_accepted_tokens",
            "free_declined": "free_declined",
            "offered_at_depth": "offered_at_depth", "accepted_at_depth": "accepted_at_depth"}

PERCENTILES = (50, 99)   # the latency percentiles every summary reports


def acceptance(accepted: int, drafted: int) -> float:
    """Accepted / drafted draft tokens, the one formula of acceptance (0 where nothing was drafted): a round's,
    a session's (RoundStats), or rows of generations pooled (their sums, not the mean of their rates)."""
    return accepted / drafted if drafted else 0.0


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) of ``values`` by nearest rank; 0 for no values."""
    ordered = sorted(float(v) for v in values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def latency_ms(name: str, seconds: Sequence[float]) -> dict[str, float]:
    """A latency's percentiles in milliseconds under the one spelling every summary and JSON uses:
    ``NAME_p50_ms``, ``NAME_p99_ms`` (nearest rank; 0 for no values)."""
    return {f"{name}_p{q}_ms": 1000 * percentile(seconds, q / 100) for q in PERCENTILES}


def _copied(value: Any) -> Any:
    """A count as its own value: depth counts (a list, or protobuf's repeated field) copied to a list."""
    return value if isinstance(value, (int, float)) else list(value)


def _count_to(counts: list[int], depth: int) -> None:
    """One more at each of depths 1..depth (counts[d - 1])."""
    counts.extend([0] * (depth - len(counts)))
    for d in range(depth):
        counts[d] += 1
