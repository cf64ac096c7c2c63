"""The round loop: draft -> verify -> commit, over any drafter and verifier.

Transport-free: the ports are whatever the caller wires in (gRPC clients in the
coordinator service, in-process engines in tests, modelled links in the
simulator). Rollback needs no step of its own: the next draft call carries the
committed tokens the drafter has not seen and the drafter resets to them.

Two loops share the same steps:
- blocking: draft window w, send it, wait for its verdict, commit, repeat;
- pipelined (docs/architecture.md §2): while w is in flight, draft w+1 assuming w is
  fully accepted and its bonus token is the drafter's next guess, and send it at
  once as an *optimistic* window. If the verdict agrees, w+1 is already on its
  way (often already verified); if not, the verifier discards it and we redraft.

Faults: the drafter session is opened on the first draft; a drafter that
fails is reopened with the committed prefix after a backoff, and rounds fall
back to target-only meanwhile. Verifier faults are the
verifier port's job (edgespec.loop.failover re-homes the session); if it gives up,
the loop fails the generation or, with ``on_verifier_loss="draft-only"``,
streams unverified drafter tokens — flagged — until a verifier is back.
"""
from __future__ import annotations

import logging
from typing import AsyncIterator

from opentelemetry import trace

from edgespec.control.telemetry import Telemetry
from edgespec.control.window import WindowPolicy
from edgespec.errors import Unavailable
from edgespec.loop.pipelining import pipelined
from edgespec.loop.config import SpeculationConfig
from edgespec.loop.rounds import (Chunk, DrafterPort, FreeDraftSession, RoundSink, Rounds,
                                  VerifierPort, draft_window, now)
from edgespec.loop.session import SessionLog
from edgespec.verify.sampling import SamplingParams
from edgespec.verify.window import Window

__all__ = ["Chunk", "DrafterPort", "FreeDraftSession", "RoundSink", "VerifierPort", "Window", "speculate"]

log = logging.getLogger(__name__)


async def speculate(session: SessionLog, session_id: str, drafter: DrafterPort, verifier: VerifierPort,
                    policy: WindowPolicy, params: SamplingParams = SamplingParams(),
                    config: SpeculationConfig = SpeculationConfig(), *, telemetry: Telemetry | None = None,
                    metrics: RoundSink | None = None, free: FreeDraftSession | None = None) -> AsyncIterator[Chunk]:
    """Run rounds until EOS or the budget; yield each round's committed tokens.

    The policy picks each round's window; k = 0 is a target-only step (no drafter).
    The caller opens the verifier session (with ``params``); the drafter session
    is opened on the first draft. The caller closes both.
    config: how the session speculates (edgespec.loop.config), settled for ``params`` here (Generations settles it
    further, by what the pool can do, before the session opens): pipelined or blocking rounds, token trees, cloud
    drafting, free drafts, the steps of a target-only window, the most tokens one draft call asks for
    (``max_window``: the pipelined look-ahead asks for its bonus guess and the next window in one call, so it drafts
    at most max_window - 1), and what happens when no verifier is left (``on_verifier_loss``: "fail" raises
    Unavailable, "draft-only" streams unverified drafter tokens, at most ``max_unverified`` ahead). Its window and
    policy settings are for whoever makes ``policy``.
    telemetry: where each round is recorded; a policy that reads telemetry (goodput, AWC) must be given
    this same object (None: a fresh one).
    metrics: where each committed round's sample is counted (None: nowhere). Spans go to the global tracer.
    free: a drafter in this process that costs nothing (edgespec.backends.suffix), asked every round before the
    policy where the config has free drafts; its proposal is sent where it pays by the measured costs, and the
    policy's round (the drafter's window, or target-only) runs where it does not.
    """
    config = config.settled(params, free=free is not None)
    rounds = Rounds(session, session_id, drafter, verifier, policy, params, config, telemetry, metrics, free)
    loop = pipelined if config.pipeline else _blocking
    while session.finish_reason is None:
        try:
            async for chunk in loop(rounds):
                yield chunk
        except Unavailable as error:   # the verifier port gave up (drafter faults never get here)
            if config.on_verifier_loss != "draft-only":
                raise
            log.warning("session %s: %s; streaming unverified drafter tokens", session_id, error)
            session.stats.degraded += 1
            async for chunk in rounds.degraded(config.max_unverified):
                yield chunk


async def _blocking(rounds: Rounds) -> AsyncIterator[Chunk]:
    session = rounds.session
    while session.finish_reason is None:
        with trace.use_span(rounds.start_round(), end_on_exit=True):
            # a free draft that pays first; else the policy's window (asked only then: it counts its rounds)
            window, draft_seconds = rounds.free_window() or await draft_window(
                rounds, session.clamp_window(rounds.policy.choose()))
            started = now()
            verdict = await rounds.verify(window)
            chunk = rounds.commit(window, verdict, draft_seconds, now() - started)
        yield chunk   # outside the span: a yield would leave it current in the consumer's code
