"""One generation, end to end: validate -> open -> speculate -> GenerationStats.

The coordinator's use case without its transport. The Generate servicer
(services/coordinator/servicer.py) turns the request into a GenerationRequest,
streams what ``Generations.run`` yields as protobuf, and does nothing else.
Here: the request against the coordinator's limits, the sampling parameters (a
per-task relaxed weight resolved from the prompt), the prompt's tokens, the
window policy, the drafter (the only one, or the router's pick), the costs
earlier sessions measured, the round loop, the text, closing both sides, and
the generation's stats, metrics, span attributes and log lines.

Ports, wired by the service: the tokenizer and an incremental detokenizer
(edgespec.backends.tokenizer), the drafters and the failover verifier (gRPC
clients in the service, in-process engines in tests), and the generation slots
of the calling client (the service's SessionOwners). Errors are raised as
EdgespecError; the service's interceptor turns them into statuses.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field, replace
from typing import AsyncIterator, Callable, Mapping, Protocol, Sequence

from opentelemetry import trace

from edgespec.control.capabilities import Capabilities
from edgespec.control.categories import resolve_task
from edgespec.control.router import Router, SessionRouting, request_features
from edgespec.control.telemetry import Telemetry
from edgespec.control.policies import window_policy
from edgespec.control.window import WindowPolicy
from edgespec.errors import EdgespecError, FailedPrecondition, InvalidArgument, NotFound, Unavailable
from edgespec.loop.chat import ChatMessage, check_messages, plain_transcript, prompt_text
from edgespec.loop.config import SpeculationConfig
from edgespec.loop.failover import FailoverVerifier
from edgespec.loop.routed_drafter import RoutedDrafter
from edgespec.loop.rounds import DrafterPort, FreeDraftSession
from edgespec.loop.session import SessionLog
from edgespec.loop.speculation import speculate
from edgespec.loop.stops import StopCutter, check_stops
from edgespec.observe.logs import LogThrottle
from edgespec.observe.metrics import CoordinatorMetrics
from edgespec.verify.eos import ending_ids
from edgespec.verify.logprobs import TokenLogprob
from edgespec.verify.relaxed import WeightHead, load_head
from edgespec.verify.sampling import SamplingParams, as_float32, check_params

log = logging.getLogger(__name__)

INFO_RETRY_SECONDS = 5.0   # a verifier whose Info failed is asked again this long after, at a generation's start
INFO_WAIT_SECONDS = 2.0    # how long a generation waits for the Infos of the rest of the pool after the first


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerationConfig:
    """The coordinator's generation settings (its flags; the defaults are theirs)."""
    max_new_tokens: int = 2048     # largest max_new_tokens a request may ask for, tokens
    max_prompt_tokens: int = 4096  # largest prompt after templating, tokens
    speculation: SpeculationConfig = SpeculationConfig()   # how sessions speculate: its window is that of a
                                   # request asking for -1, its max_window the largest a request may ask for


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    prompt: str                    # user text; must not be empty after stripping whitespace
    max_new_tokens: int            # tokens to generate, resumed ones included: 1..GenerationConfig.max_new_tokens
    window: int = -1               # draft window, tokens: 0 = target-only, -1 = the coordinator's (its config's)
    chat: bool = False             # wrap the prompt in the model's chat template (one user turn)
    params: SamplingParams = SamplingParams()   # as asked (checked here); the seed is already chosen
    resume: tuple[int, ...] = ()   # token ids an earlier, interrupted call committed; taken as committed
    messages: tuple[ChatMessage, ...] = ()  # chat turns instead of ``prompt`` (through the chat template)
    stop: tuple[str, ...] = ()     # stop sequences: the text ends before the first one (edgespec.loop.stops)
    min_tokens: int = 0            # tokens generated before an EOS (masked at the verifier) or a stop sequence may end
                                   # the text: 0..max_new_tokens (vLLM's min_tokens)

    @property
    def text(self) -> str:
        """The request's text for what reads it as text (router features, per-task weights)."""
        return prompt_text(self.prompt, self.messages)


@dataclass(frozen=True, slots=True)
class TextChunk:
    """Tokens one round committed (or drafted, unverified), with their text. Fields as protobuf's TokenChunk."""
    token_ids: Sequence[int]       # token ids, in order; empty only for the text held back until the end
    text: str                      # the text they add (UTF-8; "" while a multi-byte character is incomplete)
    generated: int                 # generated tokens after this chunk, unverified ones included, tokens
    position: int                  # index in the generated tokens of this chunk's first token
    unverified: bool = False       # drafter tokens no verifier has checked (draft-only mode): may be replaced
    logprobs: Sequence[TokenLogprob] = ()   # the target's log-probabilities at token_ids (sampling.logprobs set)


@dataclass(frozen=True, slots=True)
class GenerationStats:
    """How a generation went. Fields as protobuf's GenerationStats (edgespec/v1/coordinator.proto); the round
    counts and their derived values are the session's RoundStats, under the names RoundStats.reported gives them
    (RoundStats.of reads them back)."""
    prompt_tokens: int             # tokens in the (templated) prompt
    new_tokens: int                # tokens generated (resumed ones included)
    rounds: int                    # windows verified
    drafted_tokens: int            # draft tokens proposed in all rounds
    accepted_tokens: int           # draft tokens the verifier accepted
    acceptance_rate: float         # accepted_tokens / drafted_tokens (0 if none drafted)
    mean_accepted_length: float    # tokens committed per round: (accepted + rounds) / rounds
    seconds: float                 # wall time from request to last token, seconds
    tokens_per_second: float       # new_tokens / seconds
    draft_seconds: float           # waiting on the drafter, seconds
    verify_wall_seconds: float     # waiting on the verifier (wire, queue and forward), seconds
    finish_reason: str             # "eos" | "length" | "stop" (a stop sequence) | "unverified" (degraded)
    verifier: str                  # address of the verifier that served the session last
    prefill_seconds: float         # request to verifier session open (prefill included), seconds
    seed: int                      # the seed used
    verification: str              # "greedy", "lossless-sampling", "coupled-sampling" or a relaxed label
    failovers: int                 # times the session was re-homed or re-opened on a verifier
    recovery_seconds: float        # re-opening after verifier faults, seconds
    unverified_tokens: int         # degraded: tokens at the end no verifier checked
    pipelined: bool                # drafted ahead with optimistic windows
    optimistic_windows: int        # pipelining: optimistic windows sent
    optimistic_hits: int           # pipelining: of those, verified (not discarded)
    target_logprob: float          # mean target log-probability (T = 1) per generated token, nats
    lossy: bool                    # relaxed verification: not exactly the target's output
    drafter: str                   # drafter(s) that served, by name; "a>b" when the router switched
    stop_sequence: str = ""        # finish_reason "stop": the stop sequence that ended the text
    offered_at_depth: list[int] = field(default_factory=list)    # [d - 1]: edge windows drafting a token at depth d
    accepted_at_depth: list[int] = field(default_factory=list)   # [d - 1]: rounds whose accepted path reached depth d
    free_rounds: int = 0           # rounds whose window was a free draft (the suffix drafter at the coordinator)
    free_drafted_tokens: int = 0   # ... their draft tokens (in drafted_tokens too)
    free_accepted_tokens: int = 0  # ... of those, accepted (in accepted_tokens too)
    free_declined: int = 0         # rounds whose free draft was found but not sent: by the costs it could not pay


class TokenizerPort(Protocol):
    """Text to token ids. Chat turns go through ``encode_chat(messages)`` where the tokenizer has one (a chat
    template); otherwise through ``encode`` of their plain transcript (edgespec.loop.chat)."""
    def encode(self, prompt: str, chat: bool) -> list[int]: ...


class TextStreamPort(Protocol):
    """Incremental detokenization: the text each push adds; flush() what was held back."""
    def push(self, tokens: Sequence[int]) -> str: ...
    def flush(self) -> str: ...


class VerifierInfo(Protocol):
    model: str                     # the target's name
    vocab_size: int                # token ids the target accepts: [0, vocab_size)
    eos_token_ids: Sequence[int]   # tokens that end a generation
    capabilities: object           # what it does beyond windows of a chain (Capabilities.of reads it)


class FreeDrafter(Protocol):
    """The coordinator's free drafter (edgespec.backends.suffix.SuffixDrafter): a session per generation,
    whose measured acceptance, and verified output, it takes back when the generation ends."""
    def session(self) -> FreeDraftSession: ...
    def absorb(self, session: FreeDraftSession, output: Sequence[int] = ()) -> None: ...


class SlotsPort(Protocol):
    """Generations in progress per client: claim raises ResourceExhausted past the calling client's limit."""
    def claim(self, session_id: str) -> object: ...
    def release(self, session_id: str) -> None: ...


@dataclass(slots=True)
class _Checked:
    """A validated request."""
    window: int                    # tokens, as asked: -1 = the coordinator's
    params: SamplingParams         # checked, per-task weight resolved, floats as the wire carries them
    prompt: list[int]              # token ids, templated
    eos_ids: frozenset[int]        # the tokens that end this generation (none with ignore_eos)
    resume: list[int] = field(default_factory=list)


class Generations:
    """The coordinator's generations: one ``run`` per Generate call, sharing the costs earlier sessions
    measured, the router (when several drafters serve), the verifier's vocabulary and the metrics."""

    def __init__(self, config: GenerationConfig, tokenizer: TokenizerPort, text_stream: Callable[[], TextStreamPort],
                 drafters: Mapping[str, DrafterPort], verifier: FailoverVerifier, slots: SlotsPort | None = None,
                 router: Router | None = None, metrics: CoordinatorMetrics | None = None,
                 free_drafter: FreeDrafter | None = None):
        if not drafters:
            raise ValueError("a coordinator needs at least one drafter")
        self.config = config
        self.tokenizer = tokenizer
        self.text_stream = text_stream         # a new incremental detokenizer
        self.drafters = drafters               # by name; one unless the router picks among them
        self.verifier = verifier
        self.slots = slots                     # None: no per-client limit
        self.router = router                   # picks a drafter per request; this object feeds it the verify cost
        self.metrics = metrics or CoordinatorMetrics()   # rounds, generations (and the verifier port's failovers)
        self.free_drafter = free_drafter       # asked every round of adaptive-window requests; None = off
        self.costs = Telemetry()               # what earlier sessions measured (costs) and accepted (a prior)
        self.running = 0                       # generations under way (past their checks)
        # drafter name -> (seconds per drafted token, per prefilled token), as its Info says
        self.draft_costs: dict[str, tuple[float, float]] = {}
        self.throttle = LogThrottle()          # repeated warnings (no verifier) once per 30 s
        self._info: VerifierInfo | None = None # a verifier's vocabulary and EOS ids (cached)
        self._infos: dict[str, VerifierInfo] = {}            # address -> its Info, once it answered
        self._asking: dict[str, asyncio.Future] = {}         # address -> its Info call in progress
        self._info_retry: dict[str, float] = {}              # address -> when to ask again after a failure
        self._head: WeightHead | None = None   # relaxed verification: the per-task weights, loaded on first use
        self._placements: dict[str, object] = {}   # drafter name ("" = the verifier) -> its Info's Placement
        self._drafter_trees: dict[str, bool] = {}   # drafter name -> whether it drafts token trees, by its Info
        self._drafter_retry: dict[str, float] = {}  # drafter name -> when to ask its Info again after a failure
        self._placed: tuple | None = None           # the (verifier, drafter) placements last compared

    async def run(self, session_id: str, request: GenerationRequest
                  ) -> AsyncIterator[SpeculationConfig | TextChunk | GenerationStats]:
        """Validate, take a slot of the calling client, settle the plan, open, speculate; yield the plan (the settled
        SpeculationConfig), each round's text, then the stats.
        Raises InvalidArgument (the request), ResourceExhausted (the client's slots), Unavailable (no verifier)."""
        checked = await self._validate(request)
        if self.slots is not None:
            self.slots.claim(session_id)   # a generation slot of this client (or service)
        params = checked.params
        session = SessionLog(checked.prompt, request.max_new_tokens, checked.eos_ids, generated=checked.resume)
        text = self.text_stream()
        text.push(checked.resume)    # context for decoding what follows; the client has this text
        unverified_text: TextStreamPort | None = None
        started = time.perf_counter()
        telemetry = Telemetry()
        telemetry.start_from(self.costs)   # start from what earlier sessions measured and accepted
        telemetry.expect_company(self.running)
        drafter = self._drafter_for(session_id, request.text, telemetry)
        own_costs = self.draft_costs.get(next(iter(self.drafters))) if self.router is None else None
        if own_costs is not None:
            draft, prefill = own_costs
            # until rounds measure drafting, cost it as the drafter measured itself, so that a drafter that cannot
            # pay here is not run (and prefilled) to find that out; its prefill prices opening and catching it up
            if telemetry.draft_per_token is None:
                telemetry.draft_per_token = draft
            telemetry.draft_prefill_per_token = prefill
        cutter = StopCutter(request.stop)
        kept = len(session.generated)      # generated tokens returned: all, or those up to a stop sequence
        self.running += 1
        plan: SpeculationConfig | None = None
        free = None
        try:
            plan = await self._settle(checked)
            policy = self._policy(plan, telemetry)
            # free drafts in adaptive windows: a fixed window asks for the drafter's k (and 0 for none at all)
            free = self.free_drafter.session() if plan.free_drafts and self.free_drafter is not None else None
            log.info("session %s: %d prompt tokens, max %d new%s, window %s, %s%s%s", session_id, len(checked.prompt),
                     request.max_new_tokens, f" (resuming after {len(checked.resume)})" if checked.resume else "",
                     "auto" if plan.window < 0 else plan.window, "greedy" if params.greedy else params,
                     ", pipelined" if plan.pipeline else "", "".join(f"; {note}" for note in plan.notes))
            yield plan   # the client's, before the first token
            # The drafter opens on the first draft, after this: prefilling both at once
            # oversubscribes the cores (measured on 2 cores: 1.0-1.8 s together vs 0.75 s in turn).
            await self.verifier.open(session_id, session.committed, params)
            prefill = time.perf_counter() - started
            rounds = speculate(session, session_id, drafter, self.verifier, policy, params, plan,
                               telemetry=telemetry, metrics=self.metrics, free=free)
            async with contextlib.aclosing(rounds):   # a stop sequence ends the rounds early (in-flight ones too)
                async for chunk in rounds:
                    if chunk.unverified:
                        if unverified_text is None:
                            unverified_text = self.text_stream()
                            held = cutter.flush()   # stop sequences are looked for in verified text only
                            if held:
                                yield TextChunk((), held, kept, kept)
                        yield TextChunk(chunk.tokens, unverified_text.push(chunk.tokens),
                                        chunk.position + len(chunk.tokens), chunk.position, True)
                        continue
                    unverified_text = None
                    tokens, piece = _cut(text, cutter, chunk.tokens, chunk.position, request.min_tokens)
                    kept = chunk.position + len(tokens)
                    yield TextChunk(tokens, piece, kept, chunk.position, logprobs=chunk.logprobs[:len(tokens)])
                    if cutter.stopped:
                        break
        except EdgespecError as error:
            if isinstance(error, Unavailable):   # no verifier: every generation fails alike while it lasts
                self.throttle.log(log, logging.WARNING, "unavailable", "session %s failed after %d tokens: %s",
                                  session_id, len(session.generated), error)
            else:
                log.warning("session %s failed after %d tokens: %s", session_id, len(session.generated), error)
            self.metrics.failed()
            raise
        finally:
            self.running -= 1
            if self.slots is not None:
                self.slots.release(session_id)
            if telemetry.rounds:
                self.costs.absorb(telemetry)
            if free is not None:
                self.free_drafter.absorb(free, session.generated)
            failover = self.verifier.stats(session_id)
            served_by = self.verifier.address_of(session_id) or ""
            await self._close(session_id, drafter, plan is not None and plan.window != 0)
        tail = cutter.push(text.flush(), armed=kept > request.min_tokens) + cutter.flush() \
            if session.unverified == 0 else ""
        if tail:
            yield TextChunk((), tail, kept, kept)
        finish_reason = "stop" if cutter.stopped else session.finish_reason or ""
        seconds = time.perf_counter() - started
        # The speculation stats count every round, the last one's tokens past a stop sequence included;
        # new_tokens counts the tokens returned.
        rounds, new = session.stats, kept
        link = telemetry.links.get(telemetry.last_link)
        log.info("session %s: %d tokens in %.2fs (%.2f tok/s), acceptance %.2f, %.2f tokens/round, free drafts "
                 "%d/%d accepted in %d rounds (%d declined); link rtt %.1f ms (jitter %.1f), verifier queue %.2f",
                 session_id, new, seconds, new / seconds, rounds.acceptance_rate, rounds.mean_accepted_length,
                 rounds.free_accepted, rounds.free_drafted, rounds.free_rounds, rounds.free_declined,
                 1000 * (link.mean or 0.0) if link else 0.0, 1000 * link.jitter if link else 0.0, telemetry.queue_ema)
        self.metrics.generation(finish_reason, new, seconds - prefill)
        trace.get_current_span().set_attributes({   # the service's span of this call
            "edgespec.prompt_tokens": len(checked.prompt), "edgespec.new_tokens": new,
            "edgespec.loop.rounds": rounds.rounds, "edgespec.window_policy": self._policy_label(plan),
            "edgespec.acceptance": rounds.acceptance_rate, "edgespec.finish_reason": finish_reason,
            "edgespec.verifier": served_by, "edgespec.failovers": failover.failovers})
        yield GenerationStats(
            **rounds.reported(), prompt_tokens=len(checked.prompt), new_tokens=new, seconds=seconds,
            tokens_per_second=new / seconds, finish_reason=finish_reason, verifier=served_by, prefill_seconds=prefill,
            seed=params.seed, verification=verification_label(params), failovers=failover.failovers,
            recovery_seconds=failover.recovery_seconds, unverified_tokens=session.unverified, pipelined=plan.pipeline,
            target_logprob=rounds.target_logprob / len(session.generated) if session.generated else 0.0,
            lossy=params.relaxation.lossy,
            drafter=drafter.label if isinstance(drafter, RoutedDrafter) else next(iter(self.drafters)),
            stop_sequence=cutter.matched or "")

    async def _validate(self, request: GenerationRequest) -> _Checked:
        config = self.config
        if request.messages:
            if request.prompt:
                raise InvalidArgument("messages", "give the prompt or the messages, not both")
            problem = check_messages(request.messages)
            if problem:
                raise InvalidArgument("messages", problem)
        elif not request.prompt.strip():
            raise InvalidArgument("prompt", "must not be empty")
        problem = check_stops(request.stop)
        if problem:
            raise InvalidArgument("stop", problem)
        if not 1 <= request.max_new_tokens <= config.max_new_tokens:
            raise InvalidArgument("max_new_tokens", f"must be in 1..{config.max_new_tokens}, got {request.max_new_tokens}")
        if not 0 <= request.min_tokens <= request.max_new_tokens:
            raise InvalidArgument("min_tokens", f"must be in 0..max_new_tokens ({request.max_new_tokens}), "
                                  f"got {request.min_tokens}")
        if not -1 <= request.window <= config.speculation.max_window:
            raise InvalidArgument("window", f"must be -1 (coordinator default) or 0..{config.speculation.max_window}, "
                                  f"got {request.window}")
        params = request.params
        check_params(params)
        if params.min_length:
            raise InvalidArgument("sampling.min_length", "is the verifier's: ask for min_tokens instead")
        if request.min_tokens and params.relaxation.lossy:
            raise InvalidArgument("min_tokens", "min_tokens masks the target's EOS; relaxed verification blends in "
                                  "the draft's distribution, which does not: not together")
        if params.relaxation.task:   # the peers read the resolved weight from a float32: so does our copy
            params = as_float32(resolve_task(params, request.text, self._weights()))
        prompt = self._encode(request)
        if len(prompt) > config.max_prompt_tokens:
            raise InvalidArgument("prompt", f"{len(prompt)} tokens exceeds the limit of {config.max_prompt_tokens}")
        if request.min_tokens:   # EOS masked at the positions of the first min_tokens generated tokens
            params = replace(params, min_length=len(prompt) + request.min_tokens)
        info = await self._verifier_info()
        for address, other in self._infos.items():   # a session may move to any of them: each must do it all
            lacking = Capabilities.of(other.capabilities).lacks(params)
            if lacking:
                raise FailedPrecondition(f"verifier {address} ({other.model}) does not do {lacking}, and a session "
                                         "may move to any verifier of the pool: serve it from verifiers that do "
                                         "(--backend torch does all)")
        eos_ids = ending_ids(params, info.eos_token_ids)
        resume = list(request.resume)
        for i, token in enumerate(resume):
            if not 0 <= token < info.vocab_size:
                raise InvalidArgument("resume_token_ids", f"token id {token} at index {i} is outside the vocabulary "
                                      f"[0, {info.vocab_size})")
        if len(resume) >= request.max_new_tokens or eos_ids.intersection(resume):
            raise InvalidArgument("resume_token_ids", f"{len(resume)} tokens already finish the generation "
                                  f"(max_new_tokens {request.max_new_tokens}, or an EOS among them)")
        return _Checked(request.window, params, prompt, eos_ids, resume)

    def _encode(self, request: GenerationRequest) -> list[int]:
        """The prompt's token ids: the prompt (templated as one user turn when ``chat``), or the chat turns
        through the tokenizer's chat template (its ``encode_chat``), else their plain transcript."""
        if not request.messages:
            return self.tokenizer.encode(request.prompt, request.chat)
        encode_chat = getattr(self.tokenizer, "encode_chat", None)
        if encode_chat is None:
            return self.tokenizer.encode(plain_transcript(request.messages), False)
        return encode_chat(request.messages)   # raises InvalidArgument("messages", ...) if the template refuses

    def _weights(self) -> WeightHead:
        if self._head is None:
            try:
                self._head = load_head()
            except (OSError, ValueError, KeyError) as error:
                raise InvalidArgument("sampling.relaxation.task", f"no per-task weights on this coordinator: {error}") from None
        return self._head

    @staticmethod
    def _policy_label(plan: SpeculationConfig) -> str:
        return f"fixed {plan.window}" if plan.window >= 0 else plan.auto_policy

    @staticmethod
    def _policy(plan: SpeculationConfig, telemetry: Telemetry) -> WindowPolicy:
        name = f"fixed:{plan.window}" if plan.window >= 0 else plan.auto_policy
        return window_policy(name, telemetry, plan.auto_max_window)

    def drafter_info(self, name: str, info: object) -> None:
        """A drafter's Info (services/coordinator/readiness.py asks each once): its measured cost per drafted token,
        the drafting cost of rounds before any round has measured it (0 or absent: not measured)."""
        seconds = float(getattr(info, "draft_seconds_per_token", 0.0) or 0.0)
        prefill = float(getattr(info, "prefill_seconds_per_token", 0.0) or 0.0)
        self._placements[name] = getattr(info, "placement", None)
        self._drafter_trees[name] = Capabilities.of(getattr(info, "capabilities", None)).token_trees
        self._check_placement()
        if seconds > 0:
            self.draft_costs[name] = (seconds, prefill)
            log.info("drafter %s: a drafted token costs %.1f ms, a prefilled one %.2f ms, by its own measure", name,
                     1000 * seconds, 1000 * prefill)

    def verifier_placement(self, info: object) -> None:
        """A verifier's Info, asked at the coordinator's start (readiness.check_vocabularies): where it runs, so
        that where the drafter runs is judged before the first generation, not only at it."""
        self._placements[""] = getattr(info, "placement", None)
        self._check_placement()

    def _check_placement(self) -> None:
        """The only drafter on the verifier's CPUs (both Infos say where they run): its drafting takes the verifier's
        time, which the window policy prices under load (Telemetry.drafter_shares_cpus)."""
        if self.router is not None or "" not in self._placements or len(self._placements) < 2:
            return
        verifier = self._placements[""]
        drafter = next(p for name, p in self._placements.items() if name)
        shared = _share_cpus(verifier, drafter)
        if (verifier, drafter) != self._placed:
            self._placed = (verifier, drafter)
            self.costs.drafter_shares_cpus = shared
            log.info("the drafter %s: %s", "shares CPUs with the verifier" if shared else "runs on other CPUs than the verifier",
                     "under load a drafted token is priced as the verifier's time it takes" if shared
                     else "drafting takes no verifier time")

    async def _verifier_info(self) -> VerifierInfo:
        """Vocabulary and EOS ids, from the first verifier that answered Info (cached). On the way, every verifier
        of the pool not heard from yet is asked for its Info (one that failed, again INFO_RETRY_SECONDS later): what
        all of them do settles each session's plan (_validate, _settle). Waits for the first answer, then up to
        INFO_WAIT_SECONDS for the others; later answers arrive in the background."""
        now, asked = time.monotonic(), set()
        for address in self.verifier.pool.endpoints:
            if address not in self._infos and address not in self._asking and self._info_retry.get(address, 0) <= now:
                self._asking[address] = asyncio.ensure_future(self._ask_info(address))
                asked.add(self._asking[address])
        pending = set(self._asking.values())
        while pending and self._info is None:
            _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        pending &= asked    # a call an earlier generation started (a verifier slow to answer) holds up no other
        if pending:
            await asyncio.wait(pending, timeout=INFO_WAIT_SECONDS)
        if self._info is None:
            raise Unavailable("no verifier answered Info")
        return self._info

    async def _ask_info(self, address: str) -> None:
        try:
            info = await self.verifier.endpoints[address].info()
        except EdgespecError as error:
            self._info_retry[address] = time.monotonic() + INFO_RETRY_SECONDS
            self.throttle.log(log, logging.WARNING, f"info {address}", "verifier %s: Info failed: %s", address, error)
            return
        finally:
            self._asking.pop(address, None)
        self._infos[address] = info
        log.info("verifier %s: %s", address, Capabilities.of(info.capabilities))
        if self._info is None:
            self._info = info
            # its forward time by tokens fed, measured at its start: the cost of windows not sent yet
            near, far = getattr(info, "forward_seconds", ()), getattr(info, "far_forward_seconds", ())
            self.costs.take_profiles({n + 1: seconds for n, seconds in enumerate(near)},
                                     {n + 1: seconds for n, seconds in enumerate(far)},
                                     getattr(info, "far_positions", 0))
            self.verifier_placement(info)

    async def _settle(self, checked: _Checked) -> SpeculationConfig:
        """The session's plan: the coordinator's speculation config settled for the request, the verifier's largest
        window, a free drafter where one runs, and token trees and cloud drafting where every verifier of the pool
        scores token trees by its Info and every drafter drafts them by its own (a verifier not heard from counts
        as one that does not: the session may move to it)."""
        config = self.config.speculation
        max_draft = getattr(self._info, "max_window", 0) or None
        plan = config.settled(checked.params, window=checked.window, max_draft=max_draft,
                              free=self.free_drafter is not None)
        if plan.tree_depth or plan.cloud_draft != "off":
            plan = plan.settled(checked.params, trees=self._without_trees())
        if plan.tree_depth:
            plan = plan.settled(checked.params, drafter_trees=await self._drafters_without_trees())
        return plan

    def _without_trees(self) -> str:
        """Why a session opening now cannot have token trees by its verifiers ("" = it can)."""
        lacking = [a for a in self.verifier.pool.endpoints
                   if a not in self._infos or not Capabilities.of(self._infos[a].capabilities).token_trees]
        if not lacking:
            return ""
        return f"verifier {lacking[0]} " + ("does not score token trees" if lacking[0] in self._infos
                                            else "has not answered Info yet")

    async def _drafters_without_trees(self) -> str:
        """Why a session opening now cannot have token trees by its drafters ("" = each drafts them by its Info;
        a drafter not heard from yet is asked now)."""
        for name, drafter in self.drafters.items():
            if name not in self._drafter_trees:
                ask = getattr(drafter, "info", None)
                if ask is None or self._drafter_retry.get(name, 0) > time.monotonic():
                    return f"drafter {name} has not answered Info"
                try:
                    info = await asyncio.wait_for(ask(), INFO_WAIT_SECONDS)
                except (EdgespecError, asyncio.TimeoutError) as error:
                    self._drafter_retry[name] = time.monotonic() + INFO_RETRY_SECONDS
                    return f"drafter {name} has not answered Info ({error or 'timed out'})"
                self._drafter_trees[name] = Capabilities.of(getattr(info, "capabilities", None)).token_trees
            if not self._drafter_trees[name]:
                return f"drafter {name} does not draft token trees"
        return ""

    def _drafter_for(self, session_id: str, prompt: str, telemetry: Telemetry) -> DrafterPort:
        """The drafter port of one generation: the only drafter, or the router's pick."""
        if self.router is None:
            return next(iter(self.drafters.values()))
        if telemetry.verify_wall is not None:
            self.router.verify_wall_seconds = telemetry.verify_wall   # what earlier sessions measured
        x = request_features(prompt)
        decision = self.router.choose(x)
        log.info("session %s: drafter %s (predicted acceptance %s; tok/s %s)", session_id, decision.drafter,
                 ", ".join(f"{n} {a:.2f}" for n, a in decision.predicted_alpha.items()),
                 ", ".join(f"{n} {r:.2f}" for n, r in decision.rates.items()))
        return RoutedDrafter(self.drafters, SessionRouting(self.router, x, decision.drafter))

    async def _close(self, session_id: str, drafter: DrafterPort, drafted: bool) -> None:
        """Free both sides' session state; a failure here must not hide the generation's result."""
        for side, wanted in ((self.verifier, True), (drafter, drafted)):
            if not wanted:
                continue
            try:
                await side.close(session_id)
            except NotFound:
                pass   # never opened there (e.g. the policy never drafted)
            except EdgespecError as error:
                log.warning("closing session %s on the %s: %s", session_id, type(side).__name__, error)


def _share_cpus(a: object, b: object) -> bool:
    """Two Placements (host, cpus; None = unknown) on one machine with a CPU in common."""
    host = getattr(a, "host", "")
    return bool(host) and host == getattr(b, "host", None) and bool(set(getattr(a, "cpus", ())) & set(getattr(b, "cpus", ())))


def _cut(text: TextStreamPort, cutter: StopCutter, tokens: Sequence[int], position: int = 0,
         min_tokens: int = 0) -> tuple[Sequence[int], str]:
    """One round's tokens (the first at ``position`` among the generated ones) through the detokenizer and the
    stop cutter: (the tokens kept, the text they add). With stop sequences, token by token: the tokens kept end
    with the one that completed a stop sequence, as if the target had generated alone and stopped there (the text
    is cut before the stop sequence). None ends within the text of the first ``min_tokens`` tokens (vLLM's rule)."""
    if not cutter.stops:
        return tokens, text.push(tokens)
    piece = ""
    for i, token in enumerate(tokens):
        piece += cutter.push(text.push((token,)), armed=position + i >= min_tokens)
        if cutter.stopped:
            return tokens[:i + 1], piece
    return tokens, piece


def verification_label(params: SamplingParams) -> str:
    mode = "greedy" if params.greedy else "sampling"
    if params.relaxation.lossy:
        return f"{params.relaxation.label} {mode} (lossy)"
    return {"greedy": "greedy", "coupled": "coupled-sampling", "standard": "lossless-sampling"}[params.sampler]
