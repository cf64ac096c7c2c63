"""A virtual-time asyncio event loop: DSD-Sim runs the library's own round loop on it.

The loop is asyncio's own (tasks, futures, timers, ``asyncio.sleep``, locks behave exactly as in the
coordinator); only its clock differs. Nothing in a simulation does I/O, so where the real loop would
block in its selector until the next timer is due, this one jumps its clock to that timer instead:
``time()`` (and with it edgespec.loop.rounds.now(), the round loop's clock) is simulated seconds from 0,
and a run takes as long as its callbacks take to execute, not as long as it simulates.
"""
from __future__ import annotations

import asyncio
from asyncio import base_events


class SimulationStalled(RuntimeError):
    """Every task waits for something and no timer is scheduled: in real time this would hang forever."""


class _Clock:
    """Stands in for the event loop's selector: waiting up to ``timeout`` means moving the clock."""

    def __init__(self, loop: "VirtualTimeLoop"):
        self._loop = loop

    def select(self, timeout: float | None) -> list:
        loop = self._loop
        if timeout is None:
            raise SimulationStalled("no task can make progress and no timer is scheduled")
        if timeout > 0:
            scheduled = loop._scheduled
            if timeout < base_events.MAXIMUM_SELECT_TIMEOUT and scheduled:
                loop._now = max(loop._now, scheduled[0]._when)   # the timer the loop waits for: exactly due
            else:
                loop._now += timeout
        return []

    def close(self) -> None:
        pass


class VirtualTimeLoop(asyncio.BaseEventLoop):
    """An asyncio event loop whose time() is simulated: it advances only to the next scheduled timer."""

    def __init__(self, start: float = 0.0):
        super().__init__()
        self._now = start
        self._selector = _Clock(self)
        self._clock_resolution = 1e-9

    def time(self) -> float:
        return self._now

    def _process_events(self, event_list: list) -> None:
        pass

    def _write_to_self(self) -> None:
        pass   # nothing blocks: no other thread needs to wake the loop
