"""What every round loop shares: windows, chunks, the two ports, and per-session round state.

Rounds keeps what the drafter has seen, numbers windows, opens the drafter
lazily and reopens it after a fault (target-only rounds meanwhile), commits
verdicts, and runs the degraded draft-only stream. The loops themselves live in
edgespec.loop.speculation (blocking) and edgespec.loop.pipelining.

One round, one record: ``Rounds.commit`` builds the round's RoundSample once and
hands that same object to every consumer — the session's stats, the telemetry,
the metrics (or any RoundSink), the round's span, the window policy and the
drafter port. The verifier's address travels in the verdict (Verdict.verifier).

Time is the event loop's clock (``now()``: asyncio's monotonic clock, or the
simulated one when DSD-Sim runs these loops on its virtual-time event loop).

Tracing: each window's round is a span, "round", with "draft", "verify" and
"commit" children. The loops make a round's span current (trace.use_span) around
the steps of that round and never across a yield; they start it explicitly rather
than nesting `with` blocks because pipelined rounds overlap. The spans and the
metrics go through the OpenTelemetry API only, a no-op until a service installs
the SDK (edgespec.observe.exporters) — the core stays free of exporters and I/O.
"""
from __future__ import annotations

import asyncio
import logging
from contextlib import contextmanager
from dataclasses import dataclass
from typing import AsyncIterator, Collection, Iterator, Protocol, Sequence

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind

from edgespec.backoff import backoff_seconds
from edgespec.control.goodput import best_window
from edgespec.control.sample import RoundSample
from edgespec.control.telemetry import Telemetry
from edgespec.control.window import FixedWindow, WindowPolicy
from edgespec.errors import Aborted, NotFound, ResourceExhausted, Unavailable
from edgespec.loop.config import SpeculationConfig
from edgespec.loop.session import SessionLog
from edgespec.observe.tracing import SESSION_ID, tracer
from edgespec.verify.greedy import Verdict
from edgespec.verify.logprobs import TokenLogprob
from edgespec.verify.sampling import SamplingParams, SparseDist
from edgespec.verify.window import Window

log = logging.getLogger(__name__)

DRAFTER_BACKOFF_SECONDS = 1.0   # target-only rounds after a drafter fault before trying it again
DRAFTER_MAX_REFUSED_BACKOFF_SECONDS = 30.0   # cap of the backoff that doubles while the drafter refuses the session
# What makes a session fall back to target-only rounds: the drafter down, its session lost or out of step,
# or the session refused (RESOURCE_EXHAUSTED). None of them fails the generation: the verifier alone suffices.
DRAFTER_FAULTS = (Unavailable, NotFound, Aborted, ResourceExhausted)
AUTO_TREE_DEPTH = 2   # --tree-depth auto: the most runner-ups a window carries
SELF_DRAFT_TOKENS = 6  # cloud drafting: the most of its own tokens the verifier may commit before its next one


@dataclass(frozen=True, slots=True)
class Chunk:
    tokens: list[int]              # token ids, in order
    position: int                  # index of tokens[0] among the generated tokens
    unverified: bool = False       # drafter output no verifier checked (degraded mode)
    logprobs: tuple[TokenLogprob, ...] = ()   # the verdict's, one per token (sessions asking for them)


def now() -> float:
    """The running event loop's clock, seconds: monotonic time, or simulated time under DSD-Sim."""
    return asyncio.get_running_loop().time()


class DrafterPort(Protocol):
    async def open(self, session_id: str, tokens: Sequence[int], params: SamplingParams) -> None: ...
    async def draft(self, session_id: str, base_position: int, append: Sequence[int],
                    k: int) -> tuple[list[int], list[SparseDist] | None]: ...
    async def close(self, session_id: str) -> None: ...
    def observe(self, draft: Sequence[int], sample: RoundSample) -> None:
        """The verdict on a window this port drafted (k > 0), as the round's sample."""


class VerifierPort(Protocol):
    async def open(self, session_id: str, tokens: Sequence[int], params: SamplingParams) -> None: ...
    async def verify(self, session_id: str, window: Window) -> Verdict | None:
        """The verdict (with the answering verifier's address in Verdict.verifier, where the port knows it);
        None when an optimistic window's assumption did not hold."""
    async def close(self, session_id: str) -> None: ...


class FreeProposal(Protocol):
    """A free draft (edgespec.backends.suffix.Proposal): tokens and the estimated acceptance of each."""
    tokens: tuple[int, ...]          # [L] proposed ids
    confidence: tuple[float, ...]    # [L] acceptance of each given the ones before it
    def prefix(self, length: int) -> "FreeProposal": ...


class FreeDraftSession(Protocol):
    """A drafter that costs nothing and runs in the coordinator's process (edgespec.backends.suffix): asked
    every round, it proposes what the session's text continues, or nothing."""
    def propose(self, committed: Sequence[int], limit: int) -> FreeProposal: ...
    def observe(self, proposal: FreeProposal, accepted: int) -> None: ...
    def declined(self, proposal: FreeProposal) -> None:
        """A proposal that was not sent (it would not pay by its estimate)."""


class RoundSink(Protocol):
    """Where committed rounds are counted: the coordinator's metrics, the simulator's records."""
    def round(self, sample: RoundSample) -> None: ...


class Rounds:
    """State shared by the loops: what the drafter has seen, window numbers, drafter health."""

    def __init__(self, session: SessionLog, session_id: str, drafter: DrafterPort, verifier: VerifierPort,
                 policy: WindowPolicy, params: SamplingParams, config: SpeculationConfig = SpeculationConfig(),
                 telemetry: Telemetry | None = None, metrics: RoundSink | None = None,
                 free: FreeDraftSession | None = None):
        """``config``: settled for ``params`` (SpeculationConfig.settled)."""
        self.session, self.session_id, self.drafter, self.verifier = session, session_id, drafter, verifier
        self.policy, self.params, self.config = policy, params, config
        self.max_draft = config.max_window          # most tokens one draft call may ask for (the drafter's max_window)
        # token trees where the drafter port drafts them. Whether the verifiers score trees and the drafter drafts
        # them is settled before (Generations): a tree window they cannot do is refused (InvalidArgument).
        self.tree_depth = config.tree_depth if hasattr(drafter, "draft_tree") else 0
        self.cloud_draft = config.cloud_draft         # "on" every round, "fallback" while the drafter is down
        self.telemetry = telemetry or Telemetry()   # per-round measurements; policies may read it (goodput, AWC)
        self.telemetry.at_position(session.position)
        self.metrics = metrics                      # where committed rounds are counted; None = nowhere
        self.fingerprint = params.fingerprint()
        self.drafter_synced = session.position   # the drafter's first drafter_synced tokens are committed ones
        # Tokens committed by rounds the drafter did not draft (target-only, self-drafted) since it last drafted:
        # its next draft computes them first, a catch-up that is no part of what drafting a token costs.
        self.undrafted = 0
        self.catchup = 0    # the last draft's catch-up, tokens
        # None while the drafter holds the session; else when to (re)open it there
        # (0 at the start: opened on the first draft, so a down drafter only costs speed).
        self.drafter_down_until: float | None = 0.0
        self.drafter_refusals = 0   # RESOURCE_EXHAUSTED answers from the drafter in a row (the backoff grows)
        self.open_seconds = 0.0     # spent (re)opening the drafter session so far, seconds
        self.next_seq = 0
        # free drafts (lossless sessions): proposed every round, sent when they pay by the measured costs
        self.free = free if config.free_drafts else None
        self._free_sent: tuple[int, FreeProposal] | None = None   # (window seq, proposal) of the free window in flight
        self.first_token_alone = config.first_token_alone
        self.target_steps = config.target_steps   # most steps of a target-only window (1: a token a round trip)
        if not isinstance(policy, FixedWindow):
            self.telemetry.target_steps = config.target_steps   # what a target-only round commits, for the costs

    def window(self, base: int, draft: Sequence[int], q: Sequence[SparseDist] | None,
               parent: int | None = None, parents: Sequence[int] = (), steps: int = 0) -> Window:
        self.next_seq += 1
        return Window(self.next_seq - 1, base, tuple(draft), tuple(q or ()), self.fingerprint, parent, tuple(parents),
                      steps=steps)

    @property
    def first_token(self) -> bool:
        """No token generated yet: the round is a target-only step, whatever the policy or a free drafter would
        send. A draft would only delay the first token, by the drafter's prefill and draft, and by a forward over
        the drafted rows where the verifier has the next token's logits from the prompt already (llama.cpp keeps
        the last row; measured: 170 ms more TTFT at one session, 2 CPUs). Pipelined rounds draft the next window
        while this one is verified."""
        return not self.session.generated and self.first_token_alone

    def steps_now(self) -> int:
        """Steps of a target-only window sent now (0: one token): up to target_steps, within the budget and the
        verifier's window; none for the first token (it streams as soon as it is computed: the time to the first
        token stays one step), nor while a drafter a fixed window asked for is down (its return is noticed at the
        next token)."""
        if self.target_steps <= 1 or not self.session.generated:
            return 0
        if isinstance(self.policy, FixedWindow) and self.policy.k > 0:
            return 0
        steps = min(self.target_steps, self.session.remaining, self.max_draft)
        return steps if steps > 1 else 0

    def self_drafted_window(self) -> Window:
        """A window the verifier drafts itself (cloud drafting), committing at most what the budget leaves."""
        limit = min(SELF_DRAFT_TOKENS, self.session.remaining - 1)
        self.next_seq += 1
        return Window(self.next_seq - 1, self.session.position, (), (), self.fingerprint, self_draft=max(0, limit))

    def free_window(self) -> tuple[Window, float] | None:
        """A window of free draft tokens and the seconds proposing took, if one pays (pick_free_draft)."""
        limit = self.session.clamp_window(self.max_draft)
        if self.free is None or limit <= 0 or self.first_token:
            return None
        started = now()
        proposal = pick_free_draft(self.free, self.session.committed, self.session.eos_ids, self.telemetry, limit)
        if proposal is None:   # nothing to copy
            return None
        if not proposal.tokens:   # a copy that cannot pay by the measured costs
            self.session.stats.free_declined += 1
            return None
        window = self.window(self.session.position, proposal.tokens, None)
        self._free_sent = (window.seq, proposal)
        return window, now() - started

    def catchup_outweighs_drafting(self) -> bool:
        """A draft now would first have the drafter prefill what it has not seen (the whole committed text when its
        session is not open yet, else the tokens committed since it last drafted): True where that prefill, priced
        by the drafter's own measure, costs more than drafting could save in the rest of the session with every
        drafted token accepted (Telemetry.best_case_saving). Such a draft, a probe or the policy's choice, cannot
        pay for what it costs; the round is target-only. False where the prefill's price is unknown."""
        t = self.telemetry
        behind = len(self.session.committed) if self.drafter_down_until is not None else self.undrafted
        if not t.draft_prefill_per_token or behind <= 1:
            return False
        return behind * t.draft_prefill_per_token > self.session.remaining * t.best_case_saving(self.max_draft)

    def start_round(self, optimistic: bool = False) -> Span:
        """The span of one window's round, child of the current span (the generation); not made current."""
        return tracer().start_span("round", attributes={SESSION_ID: self.session_id, "edgespec.optimistic": optimistic})

    async def verify(self, window: Window) -> Verdict | None:
        """Send ``window`` to the verifier port, in a "verify" span (the port carries its context to the verifier)."""
        with tracer().start_as_current_span("verify", kind=SpanKind.CLIENT,
                                            attributes={"edgespec.window_seq": window.seq}) as span:
            verdict = await self.verifier.verify(self.session_id, window)
            if verdict is None:
                span.set_attribute("edgespec.discarded", True)
            else:
                span.set_attributes({"edgespec.accepted": verdict.accepted,
                                     "edgespec.verify_compute_seconds": verdict.verify_compute_seconds,
                                     "edgespec.queue_depth": verdict.queue_depth})
            return verdict

    async def draft(self, k: int, speculative: Sequence[int] = (),
                    tree_depth: int = 0) -> tuple[list[int], list[SparseDist] | None, tuple[int, ...]] | None:
        """(tokens, q, parents): k tokens after the committed prefix + ``speculative`` (with tree_depth, a token
        tree: the parents of its tokens; () for a chain); None if the drafter is down.

        In a "draft" span, which covers (re)opening the drafter session when that comes first."""
        with tracer().start_as_current_span("draft", kind=SpanKind.CLIENT, attributes={"edgespec.k": k}) as span:
            if not await self._drafter_ready():
                span.set_attribute("edgespec.drafter_down", True)
                return None
            session = self.session
            append = session.committed[self.drafter_synced:] + list(speculative)
            base = session.position + len(speculative)
            try:
                if tree_depth:
                    tokens, q, parents = await self.drafter.draft_tree(self.session_id, base, append, k, tree_depth)
                    result = (tokens, q, tuple(parents))
                else:
                    result = (*await self.drafter.draft(self.session_id, base, append, k), ())
            except DRAFTER_FAULTS as error:
                self._drafter_fault(error)
                span.set_attribute("edgespec.drafter_down", True)
                return None
            self.drafter_synced = session.position
            self.catchup, self.undrafted = self.undrafted, 0
            return result

    def _drafter_fault(self, error: Exception) -> None:
        if isinstance(error, ResourceExhausted):
            # Refused (its session quota, a rate limit), not broken: target-only rounds, and ask again after
            # its hint or a backoff that grows while the refusals go on (jittered: refused sessions spread out).
            self.drafter_refusals += 1
            seconds = backoff_seconds(self.drafter_refusals, DRAFTER_BACKOFF_SECONDS,
                                      DRAFTER_MAX_REFUSED_BACKOFF_SECONDS, jitter=0.25,
                                      at_least=error.retry_after_seconds or 0.0)
            log.info("session %s: the drafter refused (%s); target-only rounds for %.1fs",
                     self.session_id, error, seconds)
        else:
            seconds = DRAFTER_BACKOFF_SECONDS
            log.warning("session %s: drafter unavailable (%s); target-only rounds for %.1fs",
                        self.session_id, error, seconds)
        self.drafter_down_until = now() + seconds

    async def _drafter_ready(self) -> bool:
        if self.drafter_down_until is None:
            return True
        if now() < self.drafter_down_until:
            return False
        started = now()
        try:
            await self.drafter.open(self.session_id, self.session.committed, self.params)
        except DRAFTER_FAULTS as error:
            self._drafter_fault(error)
            return False
        finally:
            seconds = now() - started
            self.open_seconds += seconds
            self.session.stats.draft_seconds += seconds   # the session waited on the drafter all the same
        log.info("session %s: drafter opened at position %d", self.session_id, self.session.position)
        self.drafter_down_until = None
        self.drafter_refusals = 0
        self.drafter_synced = self.session.position
        self.undrafted = 0   # opening prefilled every committed token
        return True

    def commit(self, window: Window, verdict: Verdict, draft_seconds: float, verify_wall_seconds: float) -> Chunk:
        """Commit the round's tokens and record the round, once, as the RoundSample every consumer reads:
        the session's stats, the telemetry (before the policy, which may read it), the metrics, the round's
        span, the window policy and the drafter port. Call it with the round's span current."""
        session = self.session
        free = self._free_sent[1] if self._free_sent is not None and self._free_sent[0] == window.seq else None
        chain = next((i for i, p in enumerate(window.parents) if p != i - 1), len(window.draft))
        sample = RoundSample(chain, verdict.accepted, draft_seconds, verify_wall_seconds,
                             verdict.verify_compute_seconds, verdict.queue_depth, verdict.verifier,
                             verifier_seconds=verdict.verifier_seconds,
                             target_logprob=verdict.target_logprob, batch_windows=verdict.batch_windows,
                             batch_tokens=verdict.batch_tokens, siblings=len(window.draft) - chain,
                             took_sibling=bool(window.draft) and any(i >= chain for i in verdict.path),
                             self_drafted=verdict.self_drafted,
                             draft_catchup=self.catchup if window.draft and free is None else 0, free=free is not None,
                             after_prompt=not session.generated,
                             **({"steps": len(verdict.drafted) + 1, "committed": len(verdict.drafted) + 1}
                                if window.steps > 1 else {}))
        trace.get_current_span().set_attributes({
            "edgespec.k": sample.k, "edgespec.accepted": sample.accepted,
            "edgespec.base_position": window.base_position, "edgespec.rtt_seconds": sample.rtt,
            "edgespec.queue_depth": sample.queue_depth, "edgespec.verifier": sample.link,
            "edgespec.tree_siblings": sample.siblings, "edgespec.took_sibling": sample.took_sibling,
            "edgespec.self_drafted": sample.self_drafted, "edgespec.free_draft": sample.free})
        with tracer().start_as_current_span("commit"):
            position = len(session.generated)
            tokens = session.commit(window.draft, verdict)
            if not window.draft or free is not None:
                self.undrafted += len(tokens)
            session.stats.record(sample)
            self.telemetry.record(sample)
            self.telemetry.at_position(session.position)   # the next window's costs: those where it starts
            if self.metrics is not None:
                self.metrics.round(sample)
            if free is not None:   # the drafter and its window policy learn from their own windows only
                self._free_sent = None
                self.free.observe(free, verdict.accepted)
            else:
                self.policy.observe(sample)
                if window.draft:
                    self.drafter.observe(window.draft, sample)   # a routed drafter learns from its verdicts
            if log.isEnabledFor(logging.DEBUG):
                log.debug("session %s round: k %d%s accepted %d, %d tokens in %d steps; forward %.1f ms over %d windows "
                          "/ %d tokens, waited %.1f ms, link %.1f ms", self.session_id, sample.k,
                          " (free)" if sample.free else "", sample.accepted, sample.tokens, sample.steps,
                          1e3 * sample.verify_compute_seconds, sample.batch_windows, sample.batch_tokens,
                          1e3 * sample.verifier_wait, 1e3 * sample.rtt)
            return Chunk(tokens, position, logprobs=verdict.logprobs)

    async def degraded(self, max_unverified: int) -> AsyncIterator[Chunk]:
        """No verifier: stream drafter tokens flagged unverified while looking for one.

        A background probe keeps trying to re-open the session (each try waits up
        to the verifier port's recovery deadline). The unverified run stops at
        ``max_unverified`` tokens, a draft EOS or the budget; then we wait for
        the probe once more. Verified output resumes as soon as a probe succeeds;
        if none does, the generation ends "unverified".
        """
        session = self.session
        provisional: list[int] = []
        probe = asyncio.ensure_future(self._reopen())
        try:
            while (len(provisional) < max_unverified and not (provisional and provisional[-1] in session.eos_ids)
                   and len(session.generated) + len(provisional) < session.max_new_tokens):
                if probe.done():
                    if probe.result():
                        return
                    probe = asyncio.ensure_future(self._reopen())
                k = min(4, session.max_new_tokens - len(session.generated) - len(provisional))
                drafted = await self.draft(k, provisional)
                if drafted is None:
                    raise Unavailable("no verifier reachable and the drafter is down")
                tokens = drafted[0]
                if any(t in session.eos_ids for t in tokens):
                    tokens = tokens[:next(i for i, t in enumerate(tokens) if t in session.eos_ids) + 1]
                yield Chunk(tokens, len(session.generated) + len(provisional), unverified=True)
                provisional += tokens
            for _ in range(2):    # the probe in flight, then one full wait after the run ended
                if await probe:
                    return
                probe = asyncio.ensure_future(self._reopen())
        finally:
            probe.cancel()
        session.unverified = len(provisional)
        session.finish_reason = "unverified"

    async def _reopen(self) -> bool:
        """Re-open the session on a verifier with the committed prefix; False if none took it."""
        try:
            await self.verifier.open(self.session_id, self.session.committed, self.params)
        except Unavailable:
            return False
        log.info("session %s: a verifier is back; verified output resumes at position %d",
                 self.session_id, self.session.position)
        return True


def pick_free_draft(free: FreeDraftSession, committed: Sequence[int], eos_ids: Collection[int],
                    telemetry: Telemetry, limit: int) -> FreeProposal | None:
    """What to send of the free drafter's proposal after ``committed``: the prefix that maximises expected tokens
    per second by the measured costs (edgespec.control.goodput: its confidences as acceptance, drafting costed at
    0, the link's round trip and the verifier's forward time by window); None where nothing usable was proposed, and
    an empty proposal where a target-only round does better (the proposal is then declined). At most ``limit``
    tokens, and no longer than a window whose cost is known (the verifier's profile, or measured in rounds): past
    it the cost would be extrapolated, and a long copy guessed cheap where it is not. Tokens from an EOS on are
    never sent (the verifier would reject an EOS draft and emit it itself)."""
    t = telemetry
    costed = max(max(t.profile, default=0) - 1, max(t.verify_compute, default=0))
    proposal = free.propose(committed, min(limit, costed or limit))
    usable = next((i for i, token in enumerate(proposal.tokens) if token in eos_ids), len(proposal.tokens))
    if not usable:
        return None
    length = best_window(proposal.confidence[:usable], 0.0, t.round_overhead(),
                         lambda k: max(1e-6, t.verify_estimate(k)), usable, steps=t.target_steps)
    if length == 0:
        free.declined(proposal)
    return proposal.prefix(length)


async def draft_window(rounds: Rounds, k: int) -> tuple[Window, float]:
    """Draft a window of up to k tokens at the committed position (none if k = 0 or the drafter is down).

    The seconds returned are the drafting of this window (its catch-up on the tokens committed since the
    drafter last drafted included), not (re)opening the drafter session: that is paid once per session,
    and costing it per drafted token would make the window policy stop drafting for good."""
    if rounds.first_token:
        return rounds.window(rounds.session.position, (), None), 0.0
    if rounds.cloud_draft == "on" and (k > 0 or not isinstance(rounds.policy, FixedWindow)) \
            and rounds.session.remaining > 1:
        return rounds.self_drafted_window(), 0.0   # every round but those asked to be target-only
    if k > 0 and not isinstance(rounds.policy, FixedWindow) and rounds.catchup_outweighs_drafting():
        k = 0
    started, opening = now(), rounds.open_seconds
    depth = rounds.telemetry.tree_depth(k, AUTO_TREE_DEPTH) if rounds.tree_depth < 0 else rounds.tree_depth
    depth = max(0, min(depth, k, rounds.max_draft - k))
    drafted = await rounds.draft(k, tree_depth=depth) if k > 0 else None
    if drafted is None and k > 0 and rounds.cloud_draft == "fallback" and rounds.session.remaining > 1:
        return rounds.self_drafted_window(), 0.0   # the drafter is down: the verifier drafts for itself
    draft, q, parents = drafted if drafted is not None else ([], None, ())
    seconds = now() - started - (rounds.open_seconds - opening)
    return (rounds.window(rounds.session.position, draft, q, parents=parents, steps=0 if draft else rounds.steps_now()),
            seconds if draft else 0.0)


@contextmanager
def in_round(span: Span) -> Iterator[None]:
    """Make a round's span current for one step of the round; an exception out of the step ends the round."""
    try:
        with trace.use_span(span):
            yield
    except BaseException:
        span.end()
        raise


def end_round(span: Span, reason: str) -> None:
    """End a round whose window will not be committed (an optimistic window that missed, or was never sent)."""
    span.set_attribute("edgespec.dropped", reason)
    span.end()
