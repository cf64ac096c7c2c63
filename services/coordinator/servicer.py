"""gRPC servicer for the coordinator: validate, run the round loop, stream tokens.

Each generation is one trace: a "generate" span (child of the client's span when
its metadata carries one) over the rounds' spans; its logs carry its session id
and request id (the client's x-request-id, or a new one, echoed in the initial
metadata).
"""
from __future__ import annotations

import logging
import secrets
import time
import uuid

import grpc
from opentelemetry.trace import Span

from edgespec.observe import logs, tracing
from edgespec.net import rpc
from edgespec.errors import EdgespecError, InvalidArgument, NotFound, Unavailable
from edgespec.loop.failover import FailoverVerifier
from edgespec.engines.limits import check_token_ids
from edgespec.observe.metrics import CoordinatorMetrics
from edgespec.verify.sampling import check_params
from edgespec.net.security import SessionOwners, current_caller
from edgespec.loop.session import SessionLog
from edgespec.loop.speculation import speculate
from edgespec.backends.tokenizer import TextStream, Tokenizer
from edgespec.v1 import coordinator_pb2 as pb
from edgespec.v1 import coordinator_pb2_grpc
from edgespec.net.wire import params_from_pb, params_to_pb
from edgespec.control.categories import resolve_task
from edgespec.verify.relaxed import WeightHead, load_head
from edgespec.control.router import Router, SessionRouting, request_features
from edgespec.loop.routed_drafter import RoutedDrafter
from edgespec.control.awc import AwcWindow
from edgespec.control.telemetry import Telemetry
from edgespec.control.window import FixedWindow, GoodputWindow, HeuristicWindow, WindowPolicy
from services.coordinator.clients import GrpcDrafter

log = logging.getLogger(__name__)


class LogThrottle:
    """At most one record per key and interval for a problem that repeats (no verifier reachable: every
    request fails the same way, as often as clients retry); the next record says how many were held back,
    and those go to DEBUG meanwhile."""

    MAX_KEYS = 1000

    def __init__(self, interval_seconds: float = 30.0, clock=time.monotonic):
        self.interval = interval_seconds
        self.clock = clock
        self._last: dict[str, tuple[float, int]] = {}   # key -> (when last logged, records held back since)

    def log(self, logger: logging.Logger, level: int, key: str, message: str, *args) -> None:
        now = self.clock()
        at, held = self._last.get(key, (None, 0))
        if at is not None and now - at < self.interval:
            self._last[key] = (at, held + 1)
            logger.debug(message, *args)
            return
        if held:
            message, args = message + " (%d more like it in the last %.0fs)", (*args, held, now - at)
        if len(self._last) >= self.MAX_KEYS and key not in self._last:
            self._last.clear()
        self._last[key] = (now, 0)
        logger.log(level, message, *args)


class CoordinatorServicer(coordinator_pb2_grpc.CoordinatorServicer):
    def __init__(self, tokenizer: Tokenizer, drafters: dict[str, GrpcDrafter], verifier: FailoverVerifier,
                 default_window: int, max_window: int, max_new_tokens_limit: int, max_prompt_tokens: int,
                 auto_max_window: int = 4, auto_policy: str = "goodput", pipeline: bool = False,
                 on_verifier_loss: str = "fail", max_unverified: int = 256,
                 owners: SessionOwners | None = None, router: Router | None = None,
                 metrics: CoordinatorMetrics | None = None):
        self.tokenizer = tokenizer
        self.drafters = drafters                 # by name; one unless a router picks among them
        self.router = router
        self.verifier = verifier
        self.default_window = default_window
        self.max_window = max_window
        self.max_new_tokens_limit = max_new_tokens_limit
        self.max_prompt_tokens = max_prompt_tokens
        self.auto_max_window = auto_max_window   # largest k the adaptive policy considers
        self.auto_policy = auto_policy           # "goodput" | "heuristic"
        self.pipeline = pipeline                 # draft ahead and send optimistic windows
        self.on_verifier_loss = on_verifier_loss # "fail" | "draft-only"
        self.max_unverified = max_unverified     # draft-only: unverified tokens allowed ahead of verified ones
        self._info = None                        # a verifier's InfoResponse (vocabulary, EOS ids)
        self.owners = owners or SessionOwners(64) # generations in progress per client identity
        self.costs = Telemetry()                 # costs measured by earlier sessions (links, draft, verify by window)
        self._head: WeightHead | None = None     # relaxed verification: the per-task weights, loaded on first use
        self.metrics = metrics or CoordinatorMetrics()   # rounds, generations (and the verifier port's failovers)
        self.throttle = LogThrottle()            # repeated warnings (no verifier) once per 30 s

    async def Generate(self, request: pb.GenerateRequest, context):
        session_id = uuid.uuid4().hex
        metadata = context.invocation_metadata()
        request_id = logs.request_id_from(metadata) or uuid.uuid4().hex
        logs.bind(session_id, request_id)
        await context.send_initial_metadata(((logs.REQUEST_ID_KEY, request_id),))
        with tracing.server_span("generate", tracing.incoming_carrier(metadata),
                                 {tracing.SESSION_ID: session_id, tracing.REQUEST_ID: request_id}) as span:
            async for response in self._generate(request, context, session_id, span):
                yield response

    async def _generate(self, request: pb.GenerateRequest, context, session_id: str, span: Span):
        try:
            window = self._check(request)
            params = params_from_pb(request.sampling, default_seed=secrets.randbits(63))
            check_params(params)
            if params.relaxation.task:
                params = params_from_pb(params_to_pb(resolve_task(params, request.prompt, self._weights())))
            prompt = self.tokenizer.encode(request.prompt, request.chat)
            if len(prompt) > self.max_prompt_tokens:
                raise InvalidArgument("prompt", f"{len(prompt)} tokens exceeds the limit of {self.max_prompt_tokens}")
            info = await self._verifier_info()
            eos_ids = frozenset(info.eos_token_ids)
            resume = list(request.resume_token_ids)
            check_token_ids("resume_token_ids", resume, info.vocab_size)
            if len(resume) >= request.max_new_tokens or eos_ids.intersection(resume):
                raise InvalidArgument("resume_token_ids", f"{len(resume)} tokens already finish the generation "
                                      f"(max_new_tokens {request.max_new_tokens}, or an EOS among them)")
            self.owners.claim(session_id, current_caller())   # a generation slot of this client (or service)
        except EdgespecError as error:
            await rpc.abort(context, error)
        session = SessionLog(prompt, request.max_new_tokens, eos_ids, generated=resume)
        text = TextStream(self.tokenizer)
        text.push(resume)            # context for decoding what follows; the client has this text
        unverified_text: TextStream | None = None
        started = time.perf_counter()
        telemetry = Telemetry()
        telemetry.inherit_costs(self.costs)   # start from what earlier sessions measured; acceptance starts fresh
        policy = self._policy(window, telemetry)
        drafting = window != 0
        drafter = self._drafter_for(session_id, request.prompt, telemetry)
        log.info("session %s: %d prompt tokens, max %d new%s, window %s, %s%s", session_id, len(prompt),
                 request.max_new_tokens, f" (resuming after {len(resume)})" if resume else "",
                 "auto" if window < 0 else window, "greedy" if params.greedy else params,
                 ", pipelined" if self.pipeline else "")
        try:
            # The drafter opens on the first draft, after this: prefilling both at once
            # oversubscribes the cores (measured on 2 cores: 1.0-1.8 s together vs 0.75 s in turn).
            await self.verifier.open(session_id, session.committed, params)
            prefill = time.perf_counter() - started
            async for chunk in speculate(session, session_id, drafter, self.verifier, policy, params,
                                         pipeline=self.pipeline and drafting, on_verifier_loss=self.on_verifier_loss,
                                         max_unverified=self.max_unverified, telemetry=telemetry,
                                         metrics=self.metrics, max_draft=self.max_window):
                if chunk.unverified:
                    unverified_text = unverified_text or TextStream(self.tokenizer)
                    piece = unverified_text.push(chunk.tokens)
                else:
                    unverified_text, piece = None, text.push(chunk.tokens)
                yield pb.GenerateResponse(chunk=pb.TokenChunk(
                    token_ids=chunk.tokens, text=piece, generated=chunk.position + len(chunk.tokens),
                    position=chunk.position, unverified=chunk.unverified))
        except EdgespecError as error:
            if isinstance(error, Unavailable):   # no verifier: every generation fails alike while it lasts
                self.throttle.log(log, logging.WARNING, "unavailable", "session %s failed after %d tokens: %s",
                                  session_id, len(session.generated), error)
            else:
                log.warning("session %s failed after %d tokens: %s", session_id, len(session.generated), error)
            self.metrics.failed()
            await rpc.abort(context, error)
        finally:
            self.owners.release(session_id)
            if telemetry.rounds:
                self.costs.inherit_costs(telemetry)
            failover = self.verifier.stats(session_id)
            served_by = self.verifier.address_of(session_id) or ""
            await self._close(session_id, drafter, drafting)
        tail = text.flush() if session.unverified == 0 else ""
        if tail:
            yield pb.GenerateResponse(chunk=pb.TokenChunk(text=tail, generated=len(session.generated),
                                                          position=len(session.generated)))
        seconds = time.perf_counter() - started
        stats = session.stats
        link = telemetry.links.get(telemetry.last_link)
        log.info("session %s: %d tokens in %.2fs (%.2f tok/s), acceptance %.2f, %.2f tokens/round; "
                 "link rtt %.1f ms (jitter %.1f), verifier queue %.2f", session_id, len(session.generated), seconds,
                 len(session.generated) / seconds, stats.acceptance_rate, stats.mean_accepted_length,
                 1000 * (link.mean or 0.0) if link else 0.0, 1000 * link.jitter if link else 0.0, telemetry.queue_ema)
        self.metrics.generation(session.finish_reason or "", len(session.generated), seconds - prefill)
        span.set_attributes({"edgespec.prompt_tokens": len(prompt), "edgespec.new_tokens": len(session.generated),
                             "edgespec.loop.rounds": stats.rounds, "edgespec.window_policy": self._policy_label(window),
                             "edgespec.acceptance": stats.acceptance_rate,
                             "edgespec.finish_reason": session.finish_reason or "",
                             "edgespec.verifier": served_by, "edgespec.failovers": failover.failovers})
        yield pb.GenerateResponse(stats=pb.GenerationStats(
            prompt_tokens=len(prompt), new_tokens=len(session.generated), rounds=stats.rounds,
            drafted_tokens=stats.drafted, accepted_tokens=stats.accepted, acceptance_rate=stats.acceptance_rate,
            mean_accepted_length=stats.mean_accepted_length, seconds=seconds,
            tokens_per_second=len(session.generated) / seconds, draft_seconds=stats.draft_seconds,
            verify_seconds=stats.verify_seconds, finish_reason=session.finish_reason or "",
            verifier=served_by, prefill_seconds=prefill, seed=params.seed,
            verification=verification_label(params), lossy=params.relaxation.lossy,
            target_logprob=stats.target_logprob / len(session.generated) if session.generated else 0.0,
            failovers=failover.failovers,
            recovery_seconds=failover.recovery_seconds, unverified_tokens=session.unverified,
            pipelined=self.pipeline and drafting, optimistic_windows=stats.optimistic_windows,
            optimistic_hits=stats.optimistic_hits,
            drafter=drafter.label if isinstance(drafter, RoutedDrafter) else next(iter(self.drafters))))

    def _weights(self) -> WeightHead:
        if self._head is None:
            try:
                self._head = load_head()
            except (OSError, ValueError, KeyError) as error:
                raise InvalidArgument("sampling.relaxation.task", f"no per-task weights on this coordinator: {error}") from None
        return self._head

    def _check(self, request: pb.GenerateRequest) -> int:
        """Validate the request; return its window (-1 = adaptive)."""
        if not request.prompt.strip():
            raise InvalidArgument("prompt", "must not be empty")
        if not 1 <= request.max_new_tokens <= self.max_new_tokens_limit:
            raise InvalidArgument("max_new_tokens", f"must be in 1..{self.max_new_tokens_limit}, got {request.max_new_tokens}")
        if not -1 <= request.window <= self.max_window:
            raise InvalidArgument("window", f"must be -1 (coordinator default) or 0..{self.max_window}, got {request.window}")
        return self.default_window if request.window == -1 else request.window

    def _policy_label(self, window: int) -> str:
        return f"fixed {window}" if window >= 0 else self.auto_policy

    def _policy(self, window: int, telemetry: Telemetry) -> WindowPolicy:
        if window >= 0:
            return FixedWindow(window)
        if self.auto_policy == "awc":     # reads the telemetry the round loop records
            return AwcWindow(telemetry, max_k=self.auto_max_window, k=min(2, self.auto_max_window),
                             feeds_telemetry=False)
        if self.auto_policy == "heuristic":
            return HeuristicWindow(k=min(2, self.auto_max_window), max_k=self.auto_max_window)
        return GoodputWindow(max_k=self.auto_max_window)

    async def _verifier_info(self):
        """Vocabulary and EOS ids, from the first verifier that answers (cached)."""
        if self._info is None:
            for address in self.verifier.pool.endpoints:
                try:
                    self._info = await self.verifier.endpoints[address].info()
                    break
                except EdgespecError as error:
                    self.throttle.log(log, logging.WARNING, f"info {address}", "verifier %s: Info failed: %s",
                                      address, error)
            else:
                raise Unavailable("no verifier answered Info")
        return self._info

    def _drafter_for(self, session_id: str, prompt: str, telemetry: Telemetry):
        """The drafter port of one generation: the only drafter, or the router's pick."""
        if self.router is None:
            return next(iter(self.drafters.values()))
        if telemetry.verify_wall is not None:
            self.router.verify_seconds = telemetry.verify_wall   # what earlier sessions measured
        x = request_features(prompt)
        decision = self.router.choose(x)
        log.info("session %s: drafter %s (predicted acceptance %s; tok/s %s)", session_id, decision.drafter,
                 ", ".join(f"{n} {a:.2f}" for n, a in decision.predicted_alpha.items()),
                 ", ".join(f"{n} {r:.2f}" for n, r in decision.rates.items()))
        return RoutedDrafter(self.drafters, SessionRouting(self.router, x, decision.drafter))

    async def _close(self, session_id: str, drafter, drafted: bool) -> None:
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


def register(servicer: CoordinatorServicer):
    def add(server: grpc.aio.Server) -> list[str]:
        coordinator_pb2_grpc.add_CoordinatorServicer_to_server(servicer, server)
        return [pb.DESCRIPTOR.services_by_name["Coordinator"].full_name]
    return add


def verification_label(params) -> str:
    mode = "greedy" if params.greedy else "sampling"
    if params.relaxation.lossy:
        return f"{params.relaxation.label} {mode} (lossy)"
    return {"greedy": "greedy", "coupled": "coupled-sampling", "standard": "lossless-sampling"}[params.sampler]
