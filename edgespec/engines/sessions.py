"""The sessions an engine (drafter or verifier) holds, by id, and how idle ones go.

A session unused for the idle TTL loses its KV cache (its committed tokens stay; its next call rebuilds the
cache from them, so an eviction costs a prefill, never a token); one unused for ``forget_after`` is dropped
entirely, and the coordinator re-opens it with its committed prefix when it answers NOT_FOUND. That frees what
a crashed coordinator leaves behind. 0 turns either off.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar

from edgespec.errors import NotFound
from edgespec.verify.sampling import SamplingParams


def sweep_period(idle_ttl_seconds: float, forget_after_seconds: float) -> float | None:
    """How often an engine's service looks for idle sessions: a quarter of the shortest idle limit (None: never,
    both are off)."""
    limits = [s for s in (idle_ttl_seconds, forget_after_seconds) if s]
    return min(limits) / 4 if limits else None


@dataclass(frozen=True, slots=True)
class Evictions:
    kv_dropped: list[str]    # sessions whose KV cache was freed (rebuilt on their next call)
    forgotten: list[str]     # sessions dropped entirely


@dataclass(slots=True)
class Session:
    """What both engines keep of a session; each engine's record adds its own fields."""
    committed: list[int]
    kv: Any
    params: SamplingParams
    last_used: float = 0.0   # clock time of its last open or call


S = TypeVar("S", bound=Session)


class SessionTable(dict[str, S], Generic[S]):
    """Sessions by id. ``where`` names the engine in NOT_FOUND messages ("drafter", "verifier")."""

    def __init__(self, where: str):
        super().__init__()
        self.where = where

    def find(self, session_id: str) -> S:
        try:
            return self[session_id]
        except KeyError:
            raise NotFound(f"session {session_id!r} is not open on this {self.where}; open it with its committed "
                           "prefix") from None

    def evict_idle(self, now: float, idle_ttl: float, forget_after: float, drop_kv: Callable[[S], bool],
                   release: Callable[[S], None] = lambda session: None) -> Evictions:
        """Drop the sessions idle ``forget_after`` seconds (``release`` each); free the KV caches of those idle
        ``idle_ttl`` seconds (``drop_kv``: False when it held none, so nothing is counted twice)."""
        dropped, forgotten = [], []
        for session_id, session in list(self.items()):
            idle = now - session.last_used
            if forget_after and idle >= forget_after:
                del self[session_id]
                release(session)
                forgotten.append(session_id)
            elif idle_ttl and idle >= idle_ttl and drop_kv(session):
                dropped.append(session_id)
        return Evictions(dropped, forgotten)
