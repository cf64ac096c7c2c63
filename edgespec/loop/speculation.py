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
from edgespec.loop.rounds import (TARGET_STEPS, Chunk, DrafterPort, FreeDraftSession, RoundSink, Rounds,
                                  VerifierPort, draft_window, now)
from edgespec.loop.session import SessionLog
from edgespec.verify.sampling import SamplingParams
from edgespec.verify.window import Window

__all__ = ["Chunk", "DrafterPort", "FreeDraftSession", "RoundSink", "VerifierPort", "Window", "speculate"]

log = logging.getLogger(__name__)


async def speculate(session: SessionLog, session_id: str, drafter: DrafterPort, verifier: VerifierPort,
                    policy: WindowPolicy, params: SamplingParams = SamplingParams(), pipeline: bool = False,
                    on_verifier_loss: str = "fail", max_unverified: int = 256,
                    telemetry: Telemetry | None = None, metrics: RoundSink | None = None,
                    max_draft: int = 16, tree_depth: int = 0, cloud_draft: str = "off",
                    free: FreeDraftSession | None = None, target_steps: int = TARGET_STEPS) -> AsyncIterator[Chunk]:
    """Run rounds until EOS or the budget; yield each round's committed tokens.

    The policy picks each round's window; k = 0 is a target-only step (no drafter).
    The caller opens the verifier session (with ``params``); the drafter session
    is opened on the first draft. The caller closes both.
    on_verifier_loss: "fail" (raise Unavailable) or "draft-only" (see module doc),
    with at most ``max_unverified`` unverified tokens ahead of the verified ones.
    telemetry: where each round is recorded; a policy that reads telemetry (goodput, AWC) must be given
    this same object (None: a fresh one).
    metrics: where each committed round's sample is counted (None: nowhere). Spans go to the global tracer.
    max_draft: the most tokens one draft call may ask for (the drafter's max_window); the pipelined
    look-ahead asks for its bonus guess and the next window in one call, so it drafts at most max_draft - 1.
    tree_depth: lossless sessions (greedy or sampled) in blocking rounds draft token trees
    (edgespec.verify.tree): the window's chain plus a runner-up at each of its first tree_depth positions, all
    verified in one target pass, where both the drafter and the verifier can (else chains). 0 = chains.
    cloud_draft: blocking rounds of lossless sessions: "on" = the verifier drafts every window itself
    (Progressive Tree Drafting, edgespec.engines.self_draft; the edge drafter is not used), "fallback" = it
    does while the edge drafter is down, "off" = target-only rounds then. A verifier that cannot refuses the
    first such window and the session goes on without.
    free: blocking rounds of lossless sessions: a drafter in this process that costs nothing
    (edgespec.backends.suffix), asked every round before the policy; its proposal is sent where it pays by the
    measured costs, and the policy's round (the drafter's window, or target-only) runs where it does not.
    None = the policy's rounds only.
    target_steps: blocking rounds: a target-only window commits up to this many of the target's own tokens in one
    round trip (Rounds.steps_now; 1 = a token a round trip). The verifier decodes them one at a time, so the
    output is what single steps give.
    """
    rounds = Rounds(session, session_id, drafter, verifier, policy, params, telemetry, metrics, max_draft,
                    0 if pipeline else tree_depth, "off" if pipeline else cloud_draft, None if pipeline else free,
                    1 if pipeline else target_steps)
    loop = pipelined if pipeline else _blocking
    while session.finish_reason is None:
        try:
            async for chunk in loop(rounds):
                yield chunk
        except Unavailable as error:   # the verifier port gave up (drafter faults never get here)
            if on_verifier_loss != "draft-only":
                raise
            log.warning("session %s: %s; streaming unverified drafter tokens", session_id, error)
            session.stats.degraded += 1
            async for chunk in rounds.degraded(max_unverified):
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
