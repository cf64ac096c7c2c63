"""Which verifier a session should use: health, bans with exponential backoff, load.

Pure bookkeeping with an injected clock; the coordinator feeds it health-watch
updates and call failures, the simulator can feed it modelled ones.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from edgespec.backoff import backoff_seconds


@dataclass(slots=True)
class Endpoint:
    address: str
    serving: bool = True        # last health-watch status (assumed serving until told otherwise)
    failures: int = 0           # consecutive failed calls; resets on a success
    banned_until: float = 0.0   # clock time before which the endpoint is not picked
    sessions: int = 0           # sessions pinned here now


class VerifierPool:
    def __init__(self, addresses: Sequence[str], base_backoff_seconds: float = 0.5,
                 max_backoff_seconds: float = 30.0, clock: Callable[[], float] = time.monotonic):
        if not addresses:
            raise ValueError("a verifier pool needs at least one address")
        if len(set(addresses)) != len(addresses):
            raise ValueError(f"duplicate verifier addresses: {list(addresses)}")
        self.endpoints = {address: Endpoint(address) for address in addresses}
        self.base_backoff = base_backoff_seconds
        self.max_backoff = max_backoff_seconds
        self.clock = clock

    def available(self, exclude: Iterable[str] = ()) -> list[str]:
        """Addresses not banned: serving ones first, then least loaded (ties: configured order).

        Health orders, bans gate: a broken health watch says the watch is gone, not that
        the verifier is (seen after connection resets), so a not-serving endpoint is still
        tried when nothing better is left; a failed call bans it.
        """
        now, skip = self.clock(), set(exclude)
        ready = [e for e in self.endpoints.values() if e.banned_until <= now and e.address not in skip]
        return [e.address for e in sorted(ready, key=lambda e: (not e.serving, e.sessions))]

    def pick(self, exclude: Iterable[str] = ()) -> str | None:
        ready = self.available(exclude)
        return ready[0] if ready else None

    def ban(self, address: str) -> float:
        """Record a failure; ban for base * 2^(failures-1), capped. Returns the ban length, seconds.

        A failure reported while the endpoint is still banned is the same outage seen by another
        session (a shared stream's deadline fails every waiting window at once): it does not lengthen
        the ban. Counted per session, 16 sessions escalated one timeout to the 30 s cap, and with one
        verifier every session then gave up before the ban ended.
        """
        endpoint = self.endpoints[address]
        now = self.clock()
        if endpoint.banned_until > now:
            return endpoint.banned_until - now
        endpoint.failures += 1
        seconds = backoff_seconds(endpoint.failures, self.base_backoff, self.max_backoff)
        endpoint.banned_until = now + seconds
        return seconds

    def succeeded(self, address: str) -> None:
        endpoint = self.endpoints[address]
        endpoint.failures = 0
        endpoint.banned_until = 0.0

    def set_serving(self, address: str, serving: bool) -> None:
        """A health-watch update. Coming back to SERVING (a restart, a healed link) lifts the ban:
        the health check is fresher evidence than the backoff's guess."""
        endpoint = self.endpoints[address]
        if serving and not endpoint.serving:
            endpoint.banned_until = 0.0
        endpoint.serving = serving

    def seconds_until_available(self) -> float:
        """How long until some endpoint's ban ends (0 = one is available now)."""
        now = self.clock()
        return min(max(0.0, e.banned_until - now) for e in self.endpoints.values())

    def pin(self, address: str) -> None:
        self.endpoints[address].sessions += 1

    def unpin(self, address: str) -> None:
        self.endpoints[address].sessions -= 1
