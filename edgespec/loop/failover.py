"""A verifier port over a pool of verifiers: one home per session, re-homed on failure.

Each session is pinned to one verifier. When a call to it fails, the session is
re-opened with its committed prefix — on another verifier if this one is
unreachable (it is banned with exponential backoff), on the same one if it only
lost the session (NOT_FOUND: restarted or evicted) or disagrees about the
committed position (ABORTED) — and the window is sent again. An overloaded
verifier (RESOURCE_EXHAUSTED with a retry hint) keeps the session: the window
is resent there after the hint, and re-homed only if the overload outlasts
the recovery deadline. A verifier that refuses to open a session
(RESOURCE_EXHAUSTED: a session quota, its KV budget) is asked again after its
hint or a growing backoff, until the deadline, and never banned. Windows are
idempotent by (session_id, base_position) and uniforms come from (seed,
position), so a resent window gets the verdict the lost one would have had:
no committed token is lost, repeated or changed.

Transport-free: endpoints are any objects with the EndpointPort methods (gRPC
clients in the coordinator, in-process engines in tests, modelled links and
verifiers in the simulator). Every verdict leaves with the address of the
verifier that gave it (Verdict.verifier). Time is the event loop's clock.
"""
from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass, field, replace
from typing import Mapping, Protocol, Sequence

from edgespec.backoff import backoff_seconds
from edgespec.errors import Aborted, NotFound, ResourceExhausted, Unavailable
from edgespec.loop.pool import VerifierPool
from edgespec.loop.rounds import now
from edgespec.observe.metrics import CoordinatorMetrics
from edgespec.observe.tracing import SESSION_ID, tracer
from edgespec.verify.greedy import Verdict
from edgespec.verify.sampling import SamplingParams
from edgespec.verify.window import Window

log = logging.getLogger(__name__)

POLL_SECONDS = 0.1   # how often to look for a usable verifier while none is
MAX_OVERLOAD_WAIT_SECONDS = 2.0   # longest single back-off on an overloaded verifier's retry hint


class EndpointPort(Protocol):
    address: str

    async def open(self, session_id: str, tokens: Sequence[int], params: SamplingParams) -> None: ...
    async def verify(self, session_id: str, window: Window) -> Verdict | None: ...
    async def close(self, session_id: str) -> None: ...
    def forget(self, session_id: str) -> None:
        """Drop local per-session state (streams) without calling the peer."""
    async def discard(self, session_id: str) -> None:
        """Ask the peer to drop the session, leaving local state alone (best effort)."""


@dataclass(slots=True)
class FailoverStats:
    failovers: int = 0             # re-opens of a session (on another verifier or the same one)
    recovery_seconds: float = 0.0  # time spent re-opening, seconds
    overload_waits: int = 0        # windows resent after a RESOURCE_EXHAUSTED retry hint


@dataclass(slots=True)
class _Pinned:
    committed: list[int]           # the session's committed tokens, as verdicts arrived
    params: SamplingParams
    address: str | None = None     # its verifier now
    epoch: int = 0                 # bumped on every (re)open: concurrent failures recover once
    closed: bool = False           # closed by the caller: never (re)open it again
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    stats: FailoverStats = field(default_factory=FailoverStats)


class FailoverVerifier:
    def __init__(self, pool: VerifierPool, endpoints: Mapping[str, EndpointPort],
                 recovery_deadline_seconds: float = 30.0, metrics: CoordinatorMetrics | None = None):
        self.pool = pool
        self.endpoints = endpoints
        self.recovery_deadline = recovery_deadline_seconds   # give up re-homing after this, seconds
        self.metrics = metrics                               # where failovers are counted; None = nowhere
        self._sessions: dict[str, _Pinned] = {}

    def address_of(self, session_id: str) -> str | None:
        pinned = self._sessions.get(session_id)
        return pinned.address if pinned else None

    def stats(self, session_id: str) -> FailoverStats:
        return self._sessions[session_id].stats

    async def open(self, session_id: str, tokens: Sequence[int], params: SamplingParams) -> None:
        """Open the session on the best verifier (or re-open an existing one with ``tokens`` as its prefix)."""
        pinned = self._sessions.get(session_id)
        if pinned is None:
            pinned = self._sessions[session_id] = _Pinned(list(tokens), params)
        else:
            pinned.committed = list(tokens)
        async with pinned.lock:
            await self._home(session_id, pinned, prefer=None)

    async def verify(self, session_id: str, window: Window) -> Verdict | None:
        pinned = self._sessions[session_id]
        overloaded_since: float | None = None
        while True:
            address, epoch = pinned.address, pinned.epoch
            try:
                verdict = await self.endpoints[address].verify(session_id, window)
            except ResourceExhausted as error:
                # Overloaded but alive (a retry hint): the session is intact there, so back off and
                # resend rather than re-home; re-home only if it stays overloaded past the deadline.
                at = now()
                if overloaded_since is None:
                    overloaded_since = at
                if error.retry_after_seconds is None or at - overloaded_since >= self.recovery_deadline:
                    await self._recover(session_id, pinned, epoch, error, unreachable=True)
                    continue
                pinned.stats.overload_waits += 1
                delay = min(error.retry_after_seconds, MAX_OVERLOAD_WAIT_SECONDS) * random.uniform(0.5, 1.0)
                log.info("session %s: verifier %s overloaded; resending the window in %.2fs", session_id, address, delay)
                await asyncio.sleep(delay)
                continue
            except Unavailable as error:
                if pinned.closed:   # closed under the call (the generation ended): not the verifier's fault
                    raise
                await self._recover(session_id, pinned, epoch, error, unreachable=True)
                continue
            except (NotFound, Aborted) as error:
                await self._recover(session_id, pinned, epoch, error, unreachable=False)
                continue
            self.pool.succeeded(address)
            if verdict is None:
                return None
            if pinned.epoch != epoch or pinned.lock.locked():
                # The session was re-homed (or is being re-homed) while this window was in flight,
                # from a committed prefix without this verdict: committing it would put the caller
                # ahead of the new home. Treat the verdict as lost and send the window there; it
                # gets the same verdict (idempotent windows, uniforms from seed and position).
                async with pinned.lock:
                    pass
                continue
            pinned.committed.extend(verdict.committed(window.draft))
            return verdict if verdict.verifier == address else replace(verdict, verifier=address)

    async def close(self, session_id: str) -> None:
        pinned = self._sessions.pop(session_id, None)
        if pinned is None:
            return
        pinned.closed = True
        if pinned.address is None:
            return
        self.pool.unpin(pinned.address)
        await self.endpoints[pinned.address].close(session_id)

    async def _recover(self, session_id: str, pinned: _Pinned, epoch: int, error: Exception,
                       unreachable: bool) -> None:
        async with pinned.lock:
            if pinned.epoch != epoch:      # another in-flight window already recovered the session
                return
            old = pinned.address
            started = now()
            if unreachable:
                ban = self.pool.ban(old)
                log.warning("session %s: verifier %s failed (%s); banned for %.1fs, re-homing",
                            session_id, old, error, ban)
            else:
                log.warning("session %s: verifier %s lost the session (%s); re-opening", session_id, old, error)
            self.endpoints[old].forget(session_id)
            reason = "unreachable" if unreachable else "lost_session"
            with tracer().start_as_current_span("failover", attributes={
                    SESSION_ID: session_id, "edgespec.reason": reason, "edgespec.error": str(error),
                    "edgespec.from_verifier": old}) as span:
                await self._home(session_id, pinned, prefer=None if unreachable else old)
                span.set_attribute("edgespec.to_verifier", pinned.address)
            seconds = now() - started
            pinned.stats.failovers += 1
            pinned.stats.recovery_seconds += seconds
            if self.metrics is not None:
                self.metrics.failover(reason)
            log.info("session %s: re-opened on %s at position %d in %.3fs",
                     session_id, pinned.address, len(pinned.committed), seconds)
            if unreachable and old != pinned.address:
                asyncio.ensure_future(self._close_quietly(old, session_id))

    async def _home(self, session_id: str, pinned: _Pinned, prefer: str | None) -> None:
        """Open the session with its committed prefix on a usable verifier, waiting up to the deadline."""
        deadline = now() + self.recovery_deadline
        refusals = 0
        while True:
            if pinned.closed:
                raise Unavailable(f"session {session_id} was closed while re-homing")
            ready = self.pool.available()
            address = prefer if prefer in ready else (ready[0] if ready else None)
            if address is None:
                if now() >= deadline:
                    raise Unavailable(f"no verifier reachable within {self.recovery_deadline:.0f}s "
                                      f"(pool: {', '.join(self.pool.endpoints)})")
                await asyncio.sleep(POLL_SECONDS)
                continue
            try:
                await self.endpoints[address].open(session_id, pinned.committed, pinned.params)
            except ResourceExhausted as error:
                # Alive and answering, but refusing the session for now (a session quota, the KV budget): no
                # fault of the verifier, so no ban. Wait (at least its retry hint) and ask the same one again.
                refusals += 1
                delay = open_retry_delay(error.retry_after_seconds, refusals)
                if now() + delay > deadline:
                    raise ResourceExhausted(f"session {session_id}: verifier {address} kept refusing it for "
                                            f"{self.recovery_deadline:.0f}s: {error}",
                                            error.retry_after_seconds) from error
                log.info("session %s: verifier %s refused the session (%s); asking again in %.2fs",
                         session_id, address, error, delay)
                await asyncio.sleep(delay)
                prefer = address
                continue
            except Unavailable as error:
                log.warning("session %s: opening on verifier %s failed: %s", session_id, address, error)
                self.pool.ban(address)
                prefer = None
                continue
            if pinned.address is not None:
                self.pool.unpin(pinned.address)
            self.pool.pin(address)
            self.pool.succeeded(address)
            pinned.address = address
            pinned.epoch += 1
            return

    async def _close_quietly(self, address: str, session_id: str) -> None:
        """Free the session on a verifier we left (it may be alive but stalled); failures are expected."""
        try:
            await self.endpoints[address].discard(session_id)
        except Exception as error:   # noqa: BLE001 — best effort on a peer we already gave up on
            log.debug("closing session %s on abandoned verifier %s: %s", session_id, address, error)


OPEN_RETRY_FIRST_SECONDS = 0.1   # first wait after a refused open without a retry hint; doubles per refusal
OPEN_RETRY_MAX_SECONDS = 5.0     # longest wait between asks without a hint


def open_retry_delay(hint_seconds: float | None, refusals: int, rng=random.random) -> float:
    """Seconds to wait after the ``refusals``-th RESOURCE_EXHAUSTED answer to an open: the verifier's retry hint
    (never less), else exponential from 0.1 s up to 5 s; plus up to 25% jitter so refused sessions spread out."""
    return backoff_seconds(refusals, OPEN_RETRY_FIRST_SECONDS, OPEN_RETRY_MAX_SECONDS, jitter=0.25, hint=hint_seconds,
                           rng=rng)
