"""A drafter port that routes one session across several drafters (edgespec.control.router decides).

Transport-free like the round loop: the ports are gRPC clients in the coordinator,
in-process engines in tests. It keeps a mirror of the tokens the session has
shown the drafters; the round loop reports each verdict (``observe``), which is
credited to the drafter that drafted that window and fed to the session's
routing; when the routing switches, the session is opened on the new drafter
with the prefix and drafting continues there.
"""
from __future__ import annotations

import logging
from typing import Sequence

from edgespec.control.router import Decision, SessionRouting
from edgespec.control.sample import RoundSample
from edgespec.loop.rounds import DrafterPort
from edgespec.verify.sampling import SamplingParams, SparseDist

log = logging.getLogger(__name__)


class RoutedDrafter:
    def __init__(self, ports: dict[str, DrafterPort], routing: SessionRouting):
        self.ports = ports
        self.routing = routing
        self.used: list[str] = [routing.current]     # drafters in the order they served
        self._opened: set[str] = set()
        self._mirror: list[int] = []
        self._params = SamplingParams()
        self._drafted: dict[tuple[int, ...], str] = {}   # recent drafts -> the drafter that made them

    @property
    def label(self) -> str:
        return ">".join(self.used)

    async def open(self, session_id: str, tokens: Sequence[int], params: SamplingParams) -> None:
        self._mirror, self._params = list(tokens), params
        await self.ports[self.routing.current].open(session_id, tokens, params)
        self._opened.add(self.routing.current)

    async def draft(self, session_id: str, base_position: int, append: Sequence[int],
                    k: int) -> tuple[list[int], list[SparseDist] | None]:
        start = base_position - len(append)
        self._mirror[start:] = append
        switch = self.routing.maybe_switch()
        if switch is not None:
            await self._switch(session_id, switch)
        name = self.routing.current
        tokens, q = await self.ports[name].draft(session_id, base_position, [] if switch else append, k)
        self._drafted[tuple(tokens)] = name
        while len(self._drafted) > 8:     # windows in flight are few; forget the oldest
            del self._drafted[next(iter(self._drafted))]
        return tokens, q

    async def close(self, session_id: str) -> None:
        self.routing.finish()
        errors = []
        for name in sorted(self._opened):
            try:
                await self.ports[name].close(session_id)
            except Exception as error:   # close every drafter; report the first failure
                errors.append(error)
        self._opened.clear()
        if errors:
            raise errors[0]

    def observe(self, draft: Sequence[int], sample: RoundSample) -> None:
        """A window's verdict (the round loop calls this): credit the drafter that drafted it, and tell it."""
        name = self._drafted.pop(tuple(draft), self.routing.current)
        self.routing.observe(name, sample.k, sample.accepted, sample.draft_seconds)
        self.ports[name].observe(draft, sample)

    async def _switch(self, session_id: str, decision: Decision) -> None:
        """Open the session on the new drafter with what the old one has seen (append included)."""
        log.info("session %s: drafter %s (%s; predicted %.2f tok/s vs %.2f)", session_id, decision.drafter,
                 decision.reason, decision.rates[decision.drafter], decision.rates[self.used[-1]])
        port = self.ports[decision.drafter]
        await port.open(session_id, self._mirror, self._params)
        self._opened.add(decision.drafter)
        self.used.append(decision.drafter)
