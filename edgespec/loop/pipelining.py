"""The pipelined round loop (docs/architecture.md §2).

While window w is in flight, draft w+1 assuming w is fully accepted and its
bonus token is the drafter's next guess, and send it at once as an optimistic
window. If the verdict agrees, w+1 is already on its way (often already
verified); if not, the verifier discards it and we redraft. Only what fits in
the in-flight window's shadow is drafted ahead.

Each window's round span (edgespec.loop.rounds) lives in its _InFlight: it is made
current while the window is drafted and sent (the verify task inherits it) and
while it is committed, and ended when the window is committed or dropped.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import AsyncIterator

from opentelemetry import trace
from opentelemetry.trace import Span

from edgespec.loop.rounds import Chunk, Rounds, draft_window, end_round, in_round, now
from edgespec.verify.window import Window


@dataclass(slots=True)
class _InFlight:
    window: Window
    verdict: asyncio.Task          # resolves to Verdict | None
    sent: float                    # the loop's clock when sent (edgespec.loop.rounds.now)
    draft_seconds: float
    round: Span                    # the window's round span, ended on commit or _forget


async def pipelined(rounds: Rounds) -> AsyncIterator[Chunk]:
    session = rounds.session
    current: _InFlight | None = None  # the window whose verdict is awaited next
    ahead: _InFlight | None = None    # an optimistic window whose assumption held so far
    follow: _InFlight | None = None   # the optimistic window drafted during the current one
    stats = session.stats
    try:
        while session.finish_reason is None:
            if ahead is None:
                round_ = rounds.start_round()
                with in_round(round_):
                    window, draft_seconds = await draft_window(rounds, session.clamp_window(rounds.policy.choose()))
                    current = _InFlight(window, asyncio.ensure_future(rounds.verify(window)),
                                        now(), draft_seconds, round_)
            else:
                current, ahead = ahead, None
            follow = await _draft_ahead(rounds, current.window)
            verdict = await current.verdict
            verify_wall_seconds = now() - current.sent
            if verdict is None:       # an optimistic window that lost its assumption (e.g. after a failover)
                end_round(current.round, "discarded by the verifier")
                current = None
                if follow is not None:
                    _forget(follow, "its parent window was discarded")
                    follow = None
                continue
            committed, current = current, None
            with trace.use_span(committed.round, end_on_exit=True):
                chunk = rounds.commit(committed.window, verdict, committed.draft_seconds, verify_wall_seconds)
            yield chunk
            if follow is None:
                continue
            stats.optimistic_windows += 1
            if verdict.accepted == len(committed.window.draft) and verdict.next_token == follow.window.parent:
                stats.optimistic_hits += 1
                ahead = follow
            else:
                _forget(follow, "its assumption missed")
            follow = None
    finally:
        # Cancel every verify call still in flight, the current window's too: left running, a call
        # whose session is closed under it fails and would ban a healthy verifier.
        for pending in (current, ahead, follow):
            if pending is not None:
                _forget(pending, "the generation ended")


async def _draft_ahead(rounds: Rounds, window: Window) -> _InFlight | None:
    """Draft and send window w+1 assuming ``window`` is fully accepted; None when that cannot help."""
    session = rounds.session
    k = len(window.draft)
    after_full = session.remaining - (k + 1)           # budget left if the window is fully accepted
    if k == 0 or any(t in session.eos_ids for t in window.draft):
        return None
    # One draft call brings the bonus guess and window w+1: k_next + 1 tokens, within the drafter's limit.
    k_next = min(rounds.policy.choose(), after_full - 1, rounds.max_draft - 1)
    costs = rounds.telemetry
    if costs.draft_per_token and costs.verify_wall:
        # Draft only what fits in the in-flight window's shadow: a look-ahead still running when a
        # missed verdict arrives would delay the redraft (the drafter does one thing at a time).
        k_next = min(k_next, int(costs.verify_wall / costs.draft_per_token) - 1)
    if k_next < 1:
        return None
    started = now()
    round_ = rounds.start_round(optimistic=True)
    with in_round(round_):
        drafted = await rounds.draft(k_next + 1, window.draft)   # the bonus guess, then window w+1
        if drafted is None or not drafted[0] or drafted[0][0] in session.eos_ids:
            end_round(round_, "not sent: the drafter is down" if drafted is None else
                      "not sent: nothing drafted" if not drafted[0] else "not sent: EOS guessed")
            return None
        tokens, q, _ = drafted
        follow = rounds.window(window.base_position + k + 1, tokens[1:], q[1:] if q else None, parent=tokens[0])
        return _InFlight(follow, asyncio.ensure_future(rounds.verify(follow)), now(), now() - started, round_)


def _forget(pending: _InFlight, reason: str) -> None:
    """Drop a verify call whose outcome no longer matters (a missed optimistic window:
    the verifier discards it anyway). Cancelling also stops any recovery it began."""
    pending.verdict.cancel()
    pending.verdict.add_done_callback(lambda t: t.cancelled() or t.exception())
    end_round(pending.round, reason)
