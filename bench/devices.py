"""Emulated edge devices for the benches that serve many users from one verifier (load, capacity, regimes).

Each device runs the shipped round loop, edgespec.loop.speculate (blocking or pipelined), against a real
verifier process over gRPC (the coordinator's own client, GrpcVerifier). Only the drafter is emulated: a
ReplayDrafter port proposes tokens given by the bench for each generated position (the draft model's recorded
choices along the target's output, or that output with some tokens replaced) and answers after the draft time
of the tokens it proposes. So the numbers these benches report are the loop's, not a copy's.
"""
from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from edgespec.control.sample import RoundSample
from edgespec.control.telemetry import Telemetry
from edgespec.control.window import WindowPolicy
from edgespec.errors import EdgespecError
from edgespec.loop.config import SpeculationConfig
from edgespec.loop.session import RoundStats, SessionLog
from edgespec.loop.speculation import speculate
from edgespec.verify.greedy import Verdict
from edgespec.verify.sampling import SamplingParams
from edgespec.verify.window import Window
from services.coordinator.clients import GrpcVerifier

GREEDY = SamplingParams()
MAX_DRAFT = 16   # the most tokens one draft call may ask for: the drafter service's default --max-window
Propose = Callable[[int, int], list[int]]   # (generated position, k) -> up to k draft tokens


class ReplayDrafter:
    """A DrafterPort that proposes ``propose(position, k)``, the tokens for the generated position the draft call
    starts at, after sleeping k times ``seconds_per_token``. Once the session's committed output departs from
    ``reference`` it proposes nothing: the proposals are known along the reference only, and ones no drafter
    would make would be rejected and make the session straggle (target-only rounds from there)."""

    def __init__(self, session: SessionLog, propose: Propose, seconds_per_token: float,
                 reference: Sequence[int] | None = None):
        self.session, self.propose, self.seconds_per_token = session, propose, seconds_per_token
        self.reference = reference
        self._checked = 0   # generated tokens already found equal to the reference

    def departed(self) -> bool:
        generated, reference = self.session.generated, self.reference
        if reference is None:
            return False
        while self._checked < len(generated):
            if self._checked >= len(reference) or generated[self._checked] != reference[self._checked]:
                return True
            self._checked += 1
        return False

    async def open(self, session_id: str, tokens: Sequence[int], params: SamplingParams) -> None:
        pass

    async def draft(self, session_id: str, base_position: int, append: Sequence[int], k: int):
        if self.departed():
            return [], None
        tokens = self.propose(base_position - len(self.session.prompt), k)[:k]
        if tokens and self.seconds_per_token:
            await asyncio.sleep(len(tokens) * self.seconds_per_token)
        return tokens, None

    async def close(self, session_id: str) -> None:
        pass

    def observe(self, draft: Sequence[int], sample: RoundSample) -> None:
        pass


class ObservedVerifier:
    """A VerifierPort over another that notes every forward a verdict reports, (windows, tokens, seconds), and,
    when ``blind``, hides the batch reports from the session: the load-unaware policy of `auto-blind`."""

    def __init__(self, inner, blind: bool = False):
        self.inner, self.blind = inner, blind
        self.forwards: set[tuple[int, int, float]] = set()

    async def open(self, session_id: str, tokens: Sequence[int], params: SamplingParams) -> None:
        await self.inner.open(session_id, tokens, params)

    async def verify(self, session_id: str, window: Window) -> Verdict | None:
        verdict = await self.inner.verify(session_id, window)
        if verdict is None:
            return None
        if verdict.batch_windows:
            self.forwards.add((verdict.batch_windows, verdict.batch_tokens, verdict.verify_compute_seconds))
        return dataclasses.replace(verdict, batch_windows=0, batch_tokens=0) if self.blind else verdict

    async def close(self, session_id: str) -> None:
        await self.inner.close(session_id)


@dataclass(slots=True)
class DeviceRun:
    """What one device saw while decoding: its output, its committed rounds and the loop's counts of them."""
    generated: list[int]
    seconds: float                                 # first round begun to last verdict
    samples: list[RoundSample]                     # the committed rounds, in order
    stats: RoundStats = field(default_factory=RoundStats)   # the session's counts (acceptance, look-aheads, ...)
    forwards: set = field(default_factory=set)     # (windows, tokens, seconds) of each forward its windows rode in


class Device:
    """One emulated edge device: a verifier session of its own (its own channel, as a coordinator's), decoded
    by edgespec.loop.speculate."""

    def __init__(self, address: str, session_id: str, prompt: Sequence[int], length: int, eos: frozenset[int],
                 deadline_seconds: float):
        self.session_id = session_id
        self.port = GrpcVerifier(address, deadline_seconds)
        self.session = SessionLog(list(prompt), length, eos)

    async def open(self) -> float:
        """Open (prefill) the session on the verifier; the seconds it took."""
        began = time.perf_counter()
        await self.port.open(self.session_id, self.session.prompt, GREEDY)
        return time.perf_counter() - began

    async def decode(self, propose: Propose, seconds_per_token: float, policy: WindowPolicy, *,
                     reference: Sequence[int] | None = None, telemetry: Telemetry | None = None,
                     pipeline: bool = False, blind: bool = False) -> DeviceRun:
        """Rounds until the budget or EOS: the shipped loop with this device's drafter and the real verifier.
        One target token per target-only round (the benches' autoregressive serving)."""
        rounds: list[RoundSample] = []
        sink = _Samples(rounds)
        verifier = ObservedVerifier(self.port, blind)
        drafter = ReplayDrafter(self.session, propose, seconds_per_token, reference)
        began = time.perf_counter()
        try:
            async for _ in speculate(self.session, self.session_id, drafter, verifier, policy, GREEDY,
                                     SpeculationConfig(pipeline=pipeline, max_window=MAX_DRAFT, target_steps=1),
                                     telemetry=telemetry, metrics=sink):
                pass
        finally:
            # End the verify stream now, as a coordinator's finished generation does: the verifier waits for the
            # windows of sessions whose streams are open, and this one sends no more (measured: left open until
            # every device was done, it cost the others ~25 ms a round).
            self.port.forget(self.session_id)
        return DeviceRun(list(self.session.generated), time.perf_counter() - began, rounds, self.session.stats,
                         verifier.forwards)

    async def close(self) -> None:
        try:
            await self.port.close(self.session_id)
        finally:
            await self.port.aclose()


@dataclass(slots=True)
class _Samples:
    """A RoundSink keeping the committed rounds."""
    samples: list[RoundSample]

    def round(self, sample: RoundSample) -> None:
        self.samples.append(sample)


# What makes one run of N devices fail (reported as the run's error, not a crash): a timeout, or an error from the
# verifier (edgespec.errors, as the coordinator's client raises them).
RUN_FAILURES = (asyncio.TimeoutError, EdgespecError, RuntimeError)


def failure(error: BaseException, timeout: float) -> str:
    """One line saying why a run failed."""
    return f"timed out after {timeout:g}s" if isinstance(error, asyncio.TimeoutError) else str(error)


async def verifier_info(address: str):
    """The verifier's Info (its EOS ids, vocabulary size, ...)."""
    port = GrpcVerifier(address, 60.0)
    try:
        return await port.info()
    finally:
        await port.aclose()
