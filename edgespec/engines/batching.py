"""Cross-session batching: windows of different sessions share one target forward.

The scheduler is continuous batching for verification. Windows queue as they
arrive; whenever the model worker is free, the scheduler takes up to
``max_batch`` queued windows of distinct sessions and verifies them in one
forward pass. Before taking a batch it may wait for more windows, but only
while fewer windows are queued than sessions have streams open (when every
open session already has a window waiting, waiting longer gains nothing).

The wait budget is a fraction of one forward (``wait_fraction`` of its moving
average), capped at ``wait_seconds``. Sessions whose windows were verified in
the last batch need a round trip to send their next ones; without a budget
that covers it they miss the next batch and sessions fall into alternating
batches of one (measured on this CPU: 2 sessions, 5 ms budget, 1.2 windows
per forward). A quarter of a forward (~150 ms here, ~5 ms on a GPU) lets
them catch up at a bounded cost. Over a WAN the round trip outlasts that
budget, and sessions fall into cohorts that alternate (measured with llama.cpp
at RTT 100 ms, 16 sessions: 6.6 windows per forward where 16 were possible).
So the scheduler also learns each session's turnaround (from its verdict to
its next window: the link's round trip plus drafting) and waits for windows
due within one forward's time when the wait costs less verifier time than the
forward of their own they would need otherwise (by its measured forward time
per tokens fed; with few sessions it does not wait: latency would grow and
nothing be saved). A session that is overdue is not waited for again until
it sends. Queueing delay is therefore bounded by the batch in progress plus
one forward; a full queue is refused at once with RESOURCE_EXHAUSTED and a
retry hint instead of growing without bound.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from edgespec.control.goodput import curve_seconds
from edgespec.errors import EdgespecError, ResourceExhausted, Unavailable
from edgespec.engines.verifier import Stepping, Usage, VerifierEngine, WindowResult
from edgespec.engines.worker import ModelWorker
from edgespec.verify.window import Window

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    max_batch: int = 16          # windows per target forward (1 = no cross-session batching)
    wait_seconds: float = 0.0    # longest wait for more windows before a forward
    max_queue: int = 64          # windows waiting; beyond this RESOURCE_EXHAUSTED
    wait_fraction: float = 0.25  # the wait is at most this fraction of one forward (moving average)

    def __post_init__(self):
        if self.max_batch < 1 or self.max_queue < 1 or self.wait_seconds < 0 or self.wait_fraction < 0:
            raise ValueError(f"need max_batch >= 1, max_queue >= 1, wait_seconds >= 0, wait_fraction >= 0; got {self}")


@dataclass(slots=True)
class Turnarounds:
    """When each session's next window is due: the time its last verdict went out plus its turnaround (EMA of
    the seconds from a verdict to that session's next window), and how many tokens its windows feed; and
    whether a forward should wait for such windows. Pure: times are passed in."""
    smoothing: float = 0.5
    slack: float = 1.2                   # a window is due until 1.2 turnarounds (+ 2 ms) after its verdict
    answered: dict[str, float] = field(default_factory=dict)   # session -> when its last verdict went out
    seconds: dict[str, float] = field(default_factory=dict)    # session -> turnaround EMA
    tokens: dict[str, int] = field(default_factory=dict)       # session -> tokens its last window fed
    seen: dict[str, float] = field(default_factory=dict)       # session -> its last verdict or window

    def verdict_sent(self, session: str, now: float) -> None:
        self.answered[session] = self.seen[session] = now

    def window_arrived(self, session: str, now: float, tokens: int = 1) -> None:
        self.tokens[session], self.seen[session] = tokens, now
        sent = self.answered.pop(session, None)
        if sent is not None:
            old = self.seconds.get(session)
            took = now - sent
            self.seconds[session] = took if old is None else (1 - self.smoothing) * old + self.smoothing * took

    def due(self, now: float, horizon: float) -> list[tuple[float, int, str]]:
        """(due time, tokens, session) of the windows due within (now, now + horizon], soonest first."""
        out = []
        for session, sent in self.answered.items():
            turnaround = self.seconds.get(session)
            if turnaround is not None:
                at = sent + self.slack * turnaround + 0.002
                if now < at <= now + horizon:
                    out.append((at, self.tokens.get(session, 1), session))
        return sorted(out)

    def wait_for(self, now: float, horizon: float, queued: list[tuple[str, int]],
                 forward: Callable[[float], float | None]) -> tuple[float, list[str]] | None:
        """The windows worth waiting for, and until when at most: (deadline, their sessions), or None.

        ``queued``: (session, tokens) of the windows waiting now. Sessions that share a forward stay in step, so
        the wait is paid once and what counts is the cycle afterwards: together, every session waits for its
        turnaround and one forward, max(turnaround) + forward(q + m); apart, two cohorts alternate, and a cycle
        takes the longer of both forwards back to back and either cohort's turnaround plus its own forward.
        Wait when together is faster (q, m: the tokens queued and due). Over a WAN with many sessions that is
        the case (measured, llama.cpp, RTT 100 ms, 16 sessions: cohorts of 6.6 windows per forward where 16
        were possible); with few sessions the verifier is idle part of a cycle anyway, and cohorts are faster.
        ``forward``: measured forward times as a lower bound (goodput.curve_seconds, low): a wait for a forward
        size never measured is tried once, and what it measured decides the next time."""
        q = sum(tokens for _, tokens in queued)
        apart_q, turn_q = forward(q), max((self.seconds.get(s, 0.0) for s, _ in queued), default=0.0)
        if apart_q is None:
            return None
        best, m, turn_m, sessions = None, 0, 0.0, []
        for at, tokens, session in self.due(now, horizon):
            m += tokens
            turn_m = max(turn_m, self.seconds[session])
            sessions.append(session)
            together, apart_m = forward(q + m), forward(m)
            if together is None or apart_m is None:
                continue
            apart = max(apart_q + apart_m, turn_q + apart_q, turn_m + apart_m)
            if max(turn_q, turn_m) + together <= apart:
                best = (at, list(sessions))
        return best

    def arrived(self, sessions: list[str]) -> bool:
        """Every one of ``sessions`` has sent its next window."""
        return not any(session in self.answered for session in sessions)

    def forget_older_than(self, cutoff: float) -> None:
        """Drop sessions not heard of since ``cutoff`` (closed or idle)."""
        for session in [s for s, at in self.seen.items() if at < cutoff]:
            for table in (self.seen, self.answered, self.seconds, self.tokens):
                table.pop(session, None)


@dataclass(slots=True)
class GatherRule:
    """How long to wait for more windows before a forward (the module's docstring): for at most ``wait_seconds``
    and ``wait_fraction`` of a forward (its EMA), and for windows due by their sessions' turnarounds when a shared
    forward makes the cycle faster (Turnarounds.wait_for, on the forward times measured per tokens fed). Pure:
    times are passed in. The scheduler runs it, and the simulator's verifier (edgespec.sim) runs the same."""
    wait_seconds: float
    wait_fraction: float
    turnarounds: Turnarounds = field(default_factory=Turnarounds)
    forward_ema: float | None = None                               # seconds of one forward
    forward_curve: dict[int, float] = field(default_factory=dict)  # tokens fed -> forward seconds EMA

    def forward_done(self, tokens: int, seconds: float) -> None:
        ema, old = self.forward_ema, self.forward_curve.get(tokens)
        self.forward_ema = seconds if ema is None else 0.8 * ema + 0.2 * seconds
        self.forward_curve[tokens] = seconds if old is None else 0.7 * old + 0.3 * seconds

    def plan(self, now: float, queued: list[tuple[str, int]]) -> tuple[float, float, list[str]]:
        """(end of the plain budget, the time to stop waiting, the sessions awaited by their turnarounds) for a
        forward that could start now, with ``queued`` (session, tokens) windows waiting."""
        forward = self.forward_ema
        if forward is None:
            end = now + self.wait_seconds
            return end, end, []
        end = now + min(self.wait_seconds, self.wait_fraction * forward)
        self.turnarounds.forget_older_than(now - max(1.0, 10 * forward))
        due = self.turnarounds.wait_for(now, min(self.wait_seconds, forward), queued,
                                        lambda tokens: curve_seconds(self.forward_curve, tokens, low=True))
        if due is not None and due[0] > end:
            return end, due[0], due[1]
        return end, end, []

    def done_waiting(self, now: float, budget_end: float, awaited: list[str]) -> bool:
        """The sessions awaited have all sent their windows and the plain budget is over."""
        return bool(awaited) and now >= budget_end and self.turnarounds.arrived(awaited)


@dataclass(frozen=True, slots=True)
class Forward:
    """One target forward of the scheduler's: windows in it, tokens it fed, seconds it took."""
    windows: int
    tokens: int
    seconds: float


@dataclass(frozen=True, slots=True)
class BatchDone:
    """What one forward did, for metrics: windows, tokens fed, seconds, windows left waiting, engine usage after."""
    windows: int
    tokens: int
    seconds: float
    waiting: int
    usage: Usage


class VerifyScheduler:
    def __init__(self, engine: VerifierEngine, worker: ModelWorker, policy: BatchPolicy = BatchPolicy(),
                 on_batch: Callable[[BatchDone], None] | None = None, on_reject: Callable[[], None] | None = None):
        self.engine = engine
        self.worker = worker
        self.policy = policy
        self.on_batch = on_batch     # after every forward (metrics)
        self.on_reject = on_reject   # a window refused: the queue was full (metrics)
        self.streams = 0        # open VerifyStream calls: sessions that may send a window soon
        self.rejected = 0       # windows refused because the queue was full
        self._queue: deque[tuple[tuple[str, Window], asyncio.Future]] = deque()   # ((session_id, window), result)
        self._arrived = asyncio.Event()
        self._runner: asyncio.Task | None = None
        self.rule = GatherRule(policy.wait_seconds, policy.wait_fraction)   # forwards measured, turnarounds

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    async def verify(self, session_id: str, window: Window) -> tuple[WindowResult, int]:
        """The window's result and the windows still waiting when its batch started."""
        if len(self._queue) >= self.policy.max_queue:
            self.rejected += 1
            if self.on_reject is not None:
                self.on_reject()
            raise ResourceExhausted(f"verifier overloaded: {len(self._queue)} windows already waiting "
                                    f"(--max-queue {self.policy.max_queue})", retry_after_seconds=self.retry_after())
        future = asyncio.get_running_loop().create_future()
        self.rule.turnarounds.window_arrived(session_id, time.monotonic(), len(window.draft) + 1)
        self._queue.append(((session_id, window), future))
        self._arrived.set()
        if self._runner is None or self._runner.done():
            self._runner = asyncio.ensure_future(self._run())
        return await future

    def retry_after(self) -> float:
        """Seconds until the queue has likely drained by one batch."""
        batches = len(self._queue) / self.policy.max_batch + 1
        return batches * (self.rule.forward_ema or 0.5)

    async def _run(self) -> None:
        # Windows of steps (target-only windows that commit several tokens) take one forward a step: the windows
        # that arrive meanwhile join the next step's forward, and a window is answered after the forward that
        # finished it, not after every step of the batch it came with. Steps run in one worker call while nothing
        # else is waiting (_verify), and come back here between steps when something is.
        going: list[tuple[Stepping, asyncio.Future, int]] = []   # windows of steps under way, their callers
        while self._queue or going:
            if not going:
                await self._gather()
            else:
                await self._catch_up()
            batch = self._take()
            if not batch and not going:
                continue
            waiting = len(self._queue)
            steppings = [stepping for stepping, _, _ in going]
            try:
                (results, after, usage, forwards), _ = await self.worker.call(
                    self._verify, [request for request, _ in batch], steppings)
            except Exception as error:   # the engine turns model failures into errors; this is a bug or shutdown
                log.exception("verify batch of %d failed", len(batch) + len(going))
                failed = Unavailable(f"verifier failed: {type(error).__name__}: {error}")
                results, after, usage, forwards = [failed] * len(batch), [], None, []
                for _, future, _ in going:
                    if not future.done():
                        future.set_exception(failed)
                going = []
            for forward in forwards:
                self.rule.forward_done(forward.tokens, forward.seconds)
            answered = time.monotonic()
            callers = {id(stepping): (future, depth) for stepping, future, depth in going}
            for (request, future), result in zip(batch, results):
                if result is None:   # a window of steps that goes on
                    continue
                self._answer(request[0], future, result, waiting, answered)
            started_now = {id(stepping): (batch[stepping.index][1], waiting) for stepping in after
                           if id(stepping) not in callers}
            callers.update(started_now)
            going = []
            for stepping in after:
                future, depth = callers[id(stepping)]
                if stepping.result is not None:
                    self._answer(stepping.session_id, future, stepping.result, depth, answered)
                else:   # its steps go on even if its caller went away: a retry replays the whole window
                    going.append((stepping, future, depth))
            if self.on_batch is not None and usage is not None:
                for i, forward in enumerate(forwards):
                    self.on_batch(BatchDone(forward.windows, forward.tokens, forward.seconds, waiting if i == 0 else 0,
                                            usage))

    def _answer(self, session_id: str, future: asyncio.Future, result: WindowResult | EdgespecError, waiting: int,
                answered: float) -> None:
        if future.done():
            return     # its stream went away; the commit stands (a retry replays it)
        self.rule.turnarounds.verdict_sent(session_id, answered)
        if isinstance(result, EdgespecError):
            future.set_exception(result)
        else:
            future.set_result((result, waiting))

    def _verify(self, requests: list[tuple[str, Window]], going: list[Stepping]
                ) -> tuple[list[WindowResult | EdgespecError | None], list[Stepping], Usage, list[Forward]]:
        """On the model worker: one forward's work (the engine's verify_step); then, while windows of steps are all
        that is under way and nothing else waits (no window queued, no other worker call), their next steps in the
        same worker call, until one of them is done; then the engine's usage (read where it cannot change
        meanwhile), and each forward's size and time.

        Handing every step back to the event loop cost a target-only session ~3% of its decode rate on a CPU
        shared by the loop and the worker (measured: window 0 at 0.97x llama.cpp alone, 1.02x with the steps in
        one call); a window that arrives meanwhile still joins the next step, and a session opening meanwhile
        gets the worker after it (both are read between steps: a deque's and an int's size, safe to read from
        this thread)."""
        forwards = []
        started = time.perf_counter()
        results, after = self.engine.verify_step(requests, going)
        forwards.append(Forward(len(requests) + len(going), sum(len(w.draft) + 1 for _, w in requests) + len(going),
                                time.perf_counter() - started))
        while after and not self._queue and not self.worker.queue_depth and \
                all(result is None for result in results) and all(s.result is None for s in after):
            started = time.perf_counter()
            _, after = self.engine.verify_step((), after)
            forwards.append(Forward(len(after), len(after), time.perf_counter() - started))
        return results, after, self.engine.usage(), forwards

    async def _catch_up(self) -> None:
        """Between the steps of windows of steps: wait for the sessions answered after the last forward whose next
        window is due (by their turnaround) within a quarter of a forward, so that they join the next step instead of
        waiting a whole one for the step after it; never longer than that, and not for sessions that are slower."""
        forward = self.rule.forward_ema
        if forward is None:
            return
        now = time.monotonic()
        due = self.rule.turnarounds.due(now, min(self.policy.wait_seconds, self.policy.wait_fraction * forward))
        if not due:
            return
        deadline, sessions = due[-1][0], [session for _, _, session in due]
        while not self.rule.turnarounds.arrived(sessions) and await self._next_arrival(deadline):
            pass

    async def _gather(self) -> None:
        """Wait while more open sessions could still add a window, as the GatherRule says."""
        queued = [(session_id, len(w.draft) + 1) for (session_id, w), _ in self._queue]
        budget_end, deadline, awaited = self.rule.plan(time.monotonic(), queued)
        while len(self._queue) < min(self.policy.max_batch, self.streams):
            if self.rule.done_waiting(time.monotonic(), budget_end, awaited) or not await self._next_arrival(deadline):
                return

    async def _next_arrival(self, deadline: float) -> bool:
        """Wait for the next window to arrive; False if ``deadline`` (monotonic clock) came first."""
        now = time.monotonic()
        if deadline <= now:
            return False
        self._arrived.clear()
        try:
            await asyncio.wait_for(self._arrived.wait(), deadline - now)
        except asyncio.TimeoutError:
            return False
        return True

    def _take(self) -> list[tuple[tuple[str, Window], asyncio.Future]]:
        """Up to max_batch queued windows of distinct sessions, oldest first; the rest keep their order."""
        batch, kept, sessions = [], deque(), set()
        while self._queue:
            request, future = self._queue.popleft()
            if future.done():
                continue          # cancelled while waiting: never verified
            if len(batch) < self.policy.max_batch and request[0] not in sessions:
                batch.append((request, future))
                sessions.add(request[0])
            else:
                kept.append((request, future))
        self._queue = kept
        return batch
