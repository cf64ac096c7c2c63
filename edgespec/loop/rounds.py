"""What every round loop shares: windows, chunks, the two ports, and per-session round state.

Rounds keeps what the drafter has seen, numbers windows, opens the drafter
lazily and reopens it after a fault (target-only rounds meanwhile), commits
verdicts into the session log and the window policy, and runs the degraded
draft-only stream. The loops themselves live in edgespec.loop.speculation (blocking)
and edgespec.loop.pipelining.

Tracing: each window's round is a span, "round", with "draft", "verify" and
"commit" children. The loops make a round's span current (trace.use_span) around
the steps of that round and never across a yield; they start it explicitly rather
than nesting `with` blocks because pipelined rounds overlap. The spans and the
metrics go through the OpenTelemetry API only, a no-op until a service installs
the SDK (edgespec.observe.exporters) — the core stays free of exporters and I/O.
"""
from __future__ import annotations

import asyncio
import logging
import random
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import AsyncIterator, Iterator, Protocol, Sequence

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind

from edgespec.errors import Aborted, NotFound, ResourceExhausted, Unavailable
from edgespec.observe.metrics import CoordinatorMetrics
from edgespec.verify.sampling import SamplingParams, SparseDist
from edgespec.loop.session import SessionLog
from edgespec.control.telemetry import RoundSample, Telemetry
from edgespec.observe.tracing import SESSION_ID, tracer
from edgespec.verify.greedy import Verdict
from edgespec.control.window import WindowPolicy

log = logging.getLogger(__name__)

DRAFTER_BACKOFF_SECONDS = 1.0   # target-only rounds after a drafter fault before trying it again
DRAFTER_MAX_REFUSED_BACKOFF_SECONDS = 30.0   # cap of the backoff that doubles while the drafter refuses the session
# What makes a session fall back to target-only rounds: the drafter down, its session lost or out of step,
# or the session refused (RESOURCE_EXHAUSTED). None of them fails the generation: the verifier alone suffices.
DRAFTER_FAULTS = (Unavailable, NotFound, Aborted, ResourceExhausted)


@dataclass(frozen=True, slots=True)
class Window:
    seq: int                       # caller's window number, echoed in the verdict
    base_position: int             # committed position the draft starts at
    draft: tuple[int, ...]         # proposed tokens (empty = one target-only step)
    q: tuple[SparseDist, ...] = () # sampling drafters: the distribution of each draft token
    params_fingerprint: int = 0    # SamplingParams.fingerprint() the draft was made with
    parent: int | None = None      # optimistic: the assumed token at base_position - 1


@dataclass(frozen=True, slots=True)
class Chunk:
    tokens: list[int]              # token ids, in order
    position: int                  # index of tokens[0] among the generated tokens
    unverified: bool = False       # drafter output no verifier checked (degraded mode)


class DrafterPort(Protocol):
    async def open(self, session_id: str, tokens: Sequence[int], params: SamplingParams) -> None: ...
    async def draft(self, session_id: str, base_position: int, append: Sequence[int],
                    k: int) -> tuple[list[int], list[SparseDist] | None]: ...
    async def close(self, session_id: str) -> None: ...


class VerifierPort(Protocol):
    async def open(self, session_id: str, tokens: Sequence[int], params: SamplingParams) -> None: ...
    async def verify(self, session_id: str, window: Window) -> Verdict | None:
        """The verdict; None when an optimistic window's assumption did not hold."""
    async def close(self, session_id: str) -> None: ...


class Rounds:
    """State shared by the loops: what the drafter has seen, window numbers, drafter health."""

    def __init__(self, log: SessionLog, session_id: str, drafter: DrafterPort, verifier: VerifierPort,
                 policy: WindowPolicy, params: SamplingParams, telemetry: Telemetry | None = None,
                 metrics: CoordinatorMetrics | None = None, max_draft: int = 16):
        self.log, self.session_id, self.drafter, self.verifier = log, session_id, drafter, verifier
        self.policy, self.params = policy, params
        self.max_draft = max_draft                  # most tokens one draft call may ask for (the drafter's max_window)
        self.telemetry = telemetry or Telemetry()   # per-round measurements; policies may read it (AWC)
        self.metrics = metrics                      # where committed rounds are counted; None = nowhere
        self.fingerprint = params.fingerprint()
        self.drafter_synced = log.position   # the drafter's first drafter_synced tokens are committed ones
        # None while the drafter holds the session; else when to (re)open it there
        # (0 at the start: opened on the first draft, so a down drafter only costs speed).
        self.drafter_down_until: float | None = 0.0
        self.drafter_refusals = 0   # RESOURCE_EXHAUSTED answers from the drafter in a row (the backoff grows)
        self.next_seq = 0

    def window(self, base: int, draft: Sequence[int], q: Sequence[SparseDist] | None,
               parent: int | None = None) -> Window:
        self.next_seq += 1
        return Window(self.next_seq - 1, base, tuple(draft), tuple(q or ()), self.fingerprint, parent)

    def start_round(self, optimistic: bool = False) -> Span:
        """The span of one window's round, child of the current span (the generation); not made current."""
        return tracer().start_span("round", attributes={SESSION_ID: self.session_id, "edgespec.optimistic": optimistic})

    async def verify(self, window: Window) -> Verdict | None:
        """Send ``window`` to the verifier port, in a "verify" span (the port carries its context to the verifier)."""
        with tracer().start_as_current_span("verify", kind=SpanKind.CLIENT,
                                            attributes={"edgespec.window_seq": window.seq}) as span:
            verdict = await self.verifier.verify(self.session_id, window)
            if verdict is None:
                span.set_attribute("edgespec.discarded", True)
            else:
                span.set_attributes({"edgespec.accepted": verdict.accepted,
                                     "edgespec.verify_compute_seconds": verdict.compute_seconds,
                                     "edgespec.queue_depth": verdict.queue_depth})
            return verdict

    async def draft(self, k: int, speculative: Sequence[int] = ()) -> tuple[list[int], list[SparseDist] | None] | None:
        """k tokens after the committed prefix + ``speculative``; None if the drafter is down.

        In a "draft" span, which covers (re)opening the drafter session when that comes first."""
        with tracer().start_as_current_span("draft", kind=SpanKind.CLIENT, attributes={"edgespec.k": k}) as span:
            if not await self._drafter_ready():
                span.set_attribute("edgespec.drafter_down", True)
                return None
            log_ = self.log
            append = log_.committed[self.drafter_synced:] + list(speculative)
            try:
                result = await self.drafter.draft(self.session_id, log_.position + len(speculative), append, k)
            except DRAFTER_FAULTS as error:
                self._drafter_fault(error)
                span.set_attribute("edgespec.drafter_down", True)
                return None
            self.drafter_synced = log_.position
            return result

    def _drafter_fault(self, error: Exception) -> None:
        if isinstance(error, ResourceExhausted):
            # Refused (its session quota, a rate limit), not broken: target-only rounds, and ask again after
            # its hint or a backoff that grows while the refusals go on (jittered: refused sessions spread out).
            self.drafter_refusals += 1
            seconds = max(error.retry_after_seconds or 0.0, min(
                DRAFTER_MAX_REFUSED_BACKOFF_SECONDS, DRAFTER_BACKOFF_SECONDS * 2 ** (self.drafter_refusals - 1)))
            seconds *= 1 + 0.25 * random.random()
            log.info("session %s: the drafter refused (%s); target-only rounds for %.1fs",
                     self.session_id, error, seconds)
        else:
            seconds = DRAFTER_BACKOFF_SECONDS
            log.warning("session %s: drafter unavailable (%s); target-only rounds for %.1fs",
                        self.session_id, error, seconds)
        self.drafter_down_until = time.monotonic() + seconds

    async def _drafter_ready(self) -> bool:
        if self.drafter_down_until is None:
            return True
        if time.monotonic() < self.drafter_down_until:
            return False
        try:
            await self.drafter.open(self.session_id, self.log.committed, self.params)
        except DRAFTER_FAULTS as error:
            self._drafter_fault(error)
            return False
        log.info("session %s: drafter opened at position %d", self.session_id, self.log.position)
        self.drafter_down_until = None
        self.drafter_refusals = 0
        self.drafter_synced = self.log.position
        return True

    def commit(self, window: Window, verdict: Verdict, draft_seconds: float, verify_seconds: float) -> Chunk:
        """Record the round and commit its tokens; call it with the round's span current."""
        log_ = self.log
        position = len(log_.generated)
        log_.stats.draft_seconds += draft_seconds
        log_.stats.verify_seconds += verify_seconds
        address_of = getattr(self.verifier, "address_of", None)   # the failover port knows the link
        sample = RoundSample(
            len(window.draft), verdict.accepted, draft_seconds, verify_seconds, verdict.compute_seconds,
            verdict.queue_depth, (address_of(self.session_id) if address_of else None) or "",
            round_seconds=draft_seconds + verify_seconds)
        trace.get_current_span().set_attributes({
            "edgespec.k": sample.k, "edgespec.accepted": sample.accepted,
            "edgespec.base_position": window.base_position, "edgespec.rtt_seconds": sample.rtt,
            "edgespec.queue_depth": sample.queue_depth, "edgespec.verifier": sample.link})
        with tracer().start_as_current_span("commit"):
            self.telemetry.record(sample)
            if self.metrics is not None:
                self.metrics.round(sample)
            self.policy.observe(len(window.draft), verdict.accepted, draft_seconds, verify_seconds)
            observe = getattr(self.drafter, "observe", None)   # a routed drafter learns from its verdicts
            if observe is not None and window.draft:
                observe(window.draft, verdict.accepted, draft_seconds)
            return Chunk(log_.commit(list(window.draft), verdict), position)

    async def degraded(self, max_unverified: int) -> AsyncIterator[Chunk]:
        """No verifier: stream drafter tokens flagged unverified while looking for one.

        A background probe keeps trying to re-open the session (each try waits up
        to the verifier port's recovery deadline). The unverified run stops at
        ``max_unverified`` tokens, a draft EOS or the budget; then we wait for
        the probe once more. Verified output resumes as soon as a probe succeeds;
        if none does, the generation ends "unverified".
        """
        log_ = self.log
        provisional: list[int] = []
        probe = asyncio.ensure_future(self._reopen())
        try:
            while (len(provisional) < max_unverified and not (provisional and provisional[-1] in log_.eos_ids)
                   and len(log_.generated) + len(provisional) < log_.max_new_tokens):
                if probe.done():
                    if probe.result():
                        return
                    probe = asyncio.ensure_future(self._reopen())
                k = min(4, log_.max_new_tokens - len(log_.generated) - len(provisional))
                drafted = await self.draft(k, provisional)
                if drafted is None:
                    raise Unavailable("no verifier reachable and the drafter is down")
                tokens = drafted[0]
                if any(t in log_.eos_ids for t in tokens):
                    tokens = tokens[:next(i for i, t in enumerate(tokens) if t in log_.eos_ids) + 1]
                yield Chunk(tokens, len(log_.generated) + len(provisional), unverified=True)
                provisional += tokens
            for _ in range(2):    # the probe in flight, then one full wait after the run ended
                if await probe:
                    return
                probe = asyncio.ensure_future(self._reopen())
        finally:
            probe.cancel()
        log_.unverified = len(provisional)
        log_.finish_reason = "unverified"

    async def _reopen(self) -> bool:
        """Re-open the session on a verifier with the committed prefix; False if none took it."""
        try:
            await self.verifier.open(self.session_id, self.log.committed, self.params)
        except Unavailable:
            return False
        log.info("session %s: a verifier is back; verified output resumes at position %d",
                 self.session_id, self.log.position)
        return True


async def draft_window(rounds: Rounds, k: int) -> tuple[Window, float]:
    """Draft a window of up to k tokens at the committed position (none if k = 0 or the drafter is down)."""
    started = time.perf_counter()
    drafted = await rounds.draft(k) if k > 0 else None
    draft, q = drafted if drafted is not None else ([], None)
    return rounds.window(rounds.log.position, draft, q), (time.perf_counter() - started) if draft else 0.0


@contextmanager
def in_round(span: Span) -> Iterator[None]:
    """Make a round's span current for one step of the round; an exception out of the step ends the round."""
    try:
        with trace.use_span(span):
            yield
    except BaseException:
        span.end()
        raise


def end_round(span: Span, reason: str) -> None:
    """End a round whose window will not be committed (an optimistic window that missed, or was never sent)."""
    span.set_attribute("edgespec.dropped", reason)
    span.end()
