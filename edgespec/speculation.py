"""The round loop: draft -> verify -> commit, over any drafter and verifier.

Transport-free: the ports are whatever the caller wires in (gRPC clients in the
coordinator service, in-process engines in tests, modelled links in the
simulator). Rollback needs no step of its own: the next draft call carries the
newly committed tokens and the drafter resets to them.
"""
from __future__ import annotations

import time
from typing import AsyncIterator, Protocol, Sequence

from edgespec.sampling import SamplingParams, SparseDist
from edgespec.session import SessionLog
from edgespec.verification import Verdict
from edgespec.window import WindowPolicy


class DrafterPort(Protocol):
    async def open(self, session_id: str, tokens: Sequence[int], params: SamplingParams) -> None: ...
    async def draft(self, session_id: str, base_position: int, append: Sequence[int],
                    k: int) -> tuple[list[int], list[SparseDist] | None]: ...
    async def close(self, session_id: str) -> None: ...


class VerifierPort(Protocol):
    async def open(self, session_id: str, tokens: Sequence[int], params: SamplingParams) -> None: ...
    async def verify(self, session_id: str, window_seq: int, base_position: int, draft: Sequence[int],
                     q: Sequence[SparseDist], params_fingerprint: int) -> Verdict: ...
    async def close(self, session_id: str) -> None: ...


async def speculate(log: SessionLog, session_id: str, drafter: DrafterPort, verifier: VerifierPort,
                    policy: WindowPolicy, params: SamplingParams = SamplingParams()) -> AsyncIterator[list[int]]:
    """Run rounds until EOS or the budget; yield each round's committed tokens.

    The policy picks each round's window; k = 0 is a target-only step (no drafter).
    The caller opens the sessions on both sides (with ``params``) and closes them.
    """
    fingerprint = params.fingerprint()
    drafter_synced = log.position   # committed tokens the drafter has seen
    window_seq = 0
    while log.finish_reason is None:
        k = log.clamp_window(policy.choose())
        base = log.position
        draft: list[int] = []
        q: list[SparseDist] | None = None
        draft_seconds = 0.0
        if k > 0:
            started = time.perf_counter()
            draft, q = await drafter.draft(session_id, base, log.committed[drafter_synced:], k)
            draft_seconds = time.perf_counter() - started
            drafter_synced = base
        started = time.perf_counter()
        verdict = await verifier.verify(session_id, window_seq, base, draft, q or (), fingerprint)
        verify_seconds = time.perf_counter() - started
        window_seq += 1
        log.stats.draft_seconds += draft_seconds
        log.stats.verify_seconds += verify_seconds
        policy.observe(k, verdict.accepted, draft_seconds, verify_seconds)
        yield log.commit(draft, verdict)
