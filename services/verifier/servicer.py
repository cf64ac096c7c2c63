"""gRPC servicer for the verifier: protobuf in, one engine call, protobuf out.

Windows go through the batching scheduler (edgespec.engines.batching); opens, closes
and the idle sweep go straight to the model worker. The Guard interceptor
(edgespec.net.security) binds every call's (and every window's) log ids, lets only
a session's owner use it, and turns the EdgespecError a method raises into its status.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Sequence

import grpc

from edgespec.observe import tracing
from edgespec.engines.batching import BatchDone, VerifyScheduler
from edgespec.errors import EdgespecError
from edgespec.observe.metrics import VerifierMetrics
from edgespec.net import placement
from edgespec.net.security import SessionOwners
from edgespec.v1 import verifier_pb2 as pb
from edgespec.net.wire import capabilities_to_pb, logprobs_to_pb, params_from_pb, window_from_pb
from edgespec.v1 import verifier_pb2_grpc
from edgespec.engines.verifier import Usage, VerifierEngine
from edgespec.engines.worker import ModelWorker

log = logging.getLogger(__name__)


class VerifierServicer(verifier_pb2_grpc.VerifierServicer):
    def __init__(self, engine: VerifierEngine, worker: ModelWorker, scheduler: VerifyScheduler, model: str,
                 device: str, dtype: str, owners: SessionOwners, metrics: VerifierMetrics | None = None,
                 forward_seconds: Sequence[float] = (), far_positions: int = 0,
                 far_forward_seconds: Sequence[float] = ()):
        self.engine = engine
        self.worker = worker
        self.scheduler = scheduler
        self.metrics = metrics or VerifierMetrics()   # a no-op until the process installs a meter provider
        self._memory_evictions = 0                    # engine.usage().memory_evictions already counted
        self._prefilled = (0, 0)                      # engine.usage() prefill counts already counted
        scheduler.on_batch = self._batch_done
        scheduler.on_reject = lambda: self.metrics.rejected("overload")
        self.owners = owners     # each session answers only to the client that opened it
        self.info = pb.InfoResponse(model=model, vocab_size=engine.target.vocab_size,
                                    eos_token_ids=sorted(engine.eos_ids), max_window=engine.limits.max_window,
                                    max_session_tokens=engine.limits.max_session_tokens, device=device, dtype=dtype,
                                    forward_seconds=forward_seconds, far_positions=far_positions,
                                    far_forward_seconds=far_forward_seconds, placement=placement.here(),
                                    capabilities=capabilities_to_pb(engine.capabilities()))

    async def Info(self, request, context):
        return self.info

    async def OpenSession(self, request: pb.OpenSessionRequest, context):
        with (tracing.server_span("verifier.open_session", tracing.incoming_carrier(context.invocation_metadata()),
                                  {tracing.SESSION_ID: request.session_id, "edgespec.tokens": len(request.tokens)}),
              self.owners.opening(request.session_id)):
            seconds, usage = await self._open(request.session_id, list(request.tokens),
                                              params_from_pb(request.sampling))
        self._usage(usage)
        log.info("session %s opened: %d tokens prefilled in %.3fs", request.session_id, len(request.tokens), seconds)
        return pb.OpenSessionResponse(committed_position=len(request.tokens), prefill_seconds=seconds)

    async def VerifyStream(self, request_iterator, context):
        self.scheduler.streams += 1
        try:
            async for window in request_iterator:
                yield await self._verify(window)
        finally:
            self.scheduler.streams -= 1

    async def _verify(self, window: pb.Window) -> pb.Verdict:
        arrived = time.perf_counter()
        with tracing.server_span("verifier.verify", dict(window.trace_context), {
                tracing.SESSION_ID: window.session_id, "edgespec.window_seq": window.window_seq,
                "edgespec.k": len(window.draft_tokens)}) as span:
            try:
                result, depth = await self.scheduler.verify(window.session_id, window_from_pb(window))
            except EdgespecError as error:
                log.info("window %d of session %s rejected: %s", window.window_seq, window.session_id, error)
                raise
            span.set_attributes({"edgespec.batch_size": result.batch_size, "edgespec.queue_depth": depth,
                                 "edgespec.verify_compute_seconds": result.verify_compute_seconds})
        verdict = result.verdict
        return pb.Verdict(session_id=window.session_id, window_seq=window.window_seq,
                          base_position=window.base_position, discarded=verdict is None,
                          accepted=verdict.accepted if verdict else 0, next_token=verdict.next_token if verdict else 0,
                          committed_position=result.committed_position,
                          verify_compute_seconds=result.verify_compute_seconds, queue_depth=depth,
                          target_logprob=verdict.target_logprob if verdict else 0.0,
                          batch_windows=result.batch_size if verdict else 0,
                          batch_tokens=result.batch_tokens if verdict else 0,
                          accepted_nodes=verdict.path if verdict else (),
                          drafted_tokens=verdict.drafted if verdict else (),
                          self_drafted=verdict.self_drafted if verdict else 0,
                          logprobs=logprobs_to_pb(verdict.logprobs) if verdict else (),
                          verifier_seconds=time.perf_counter() - arrived)

    async def CloseSession(self, request: pb.CloseSessionRequest, context):
        try:
            usage, _ = await self.worker.call(self._close, request.session_id)
            self._usage(usage)
        finally:
            self.owners.release(request.session_id)
        log.info("session %s closed", request.session_id)
        return pb.CloseSessionResponse()

    async def sweep(self, period_seconds: float) -> None:
        """Every period: evict idle sessions' KV caches, forget long-idle sessions (runs until cancelled)."""
        while True:
            await asyncio.sleep(period_seconds)
            (evicted, usage), _ = await self.worker.call(self._sweep)
            for session_id in evicted.forgotten:
                self.owners.release(session_id)
            if evicted.kv_dropped or evicted.forgotten:
                self.metrics.evicted("ttl", len(evicted.kv_dropped) + len(evicted.forgotten))
                log.info("idle sweep: %d KV caches evicted (restored on their next window), %d sessions forgotten",
                         len(evicted.kv_dropped), len(evicted.forgotten))
            self._usage(usage)

    async def _open(self, session_id: str, tokens: list[int], params) -> tuple[float, Usage]:
        """Open a session, its prompt prefilled a part per worker call: windows the scheduler hands the worker
        meanwhile run between the parts, so one long prompt does not stall every other session's tokens."""
        await self.worker.call(self.engine.begin_open, session_id, tokens, params)
        try:
            while True:
                (seconds, usage), _ = await self.worker.call(self._prefill_more, session_id)
                if seconds is not None:
                    return seconds, usage
        except BaseException:   # cancelled (the caller went away) or failed: no half-open session stays behind
            await asyncio.shield(self.worker.call(self.engine.abandon_open, session_id))
            raise

    # On the model worker: the engine call, then the engine's usage for the metrics (read where it cannot change).
    def _prefill_more(self, session_id) -> tuple[float | None, Usage]:
        return self.engine.prefill_more(session_id), self.engine.usage()

    def _close(self, session_id) -> Usage:
        self.engine.close(session_id)
        return self.engine.usage()

    def _sweep(self):
        return self.engine.evict_idle(), self.engine.usage()

    def _batch_done(self, done: BatchDone) -> None:
        self.metrics.batch(done.windows, done.tokens, done.seconds, done.waiting)
        self._usage(done.usage)

    def _usage(self, usage: Usage) -> None:
        self.metrics.sessions(usage.sessions, usage.kv_bytes)
        if usage.memory_evictions > self._memory_evictions:
            self.metrics.evicted("memory", usage.memory_evictions - self._memory_evictions)
            self._memory_evictions = usage.memory_evictions
        prefilled = (usage.prefilled_tokens, usage.prefix_cache_tokens)
        if prefilled != self._prefilled:
            from_cache = prefilled[1] - self._prefilled[1]
            self.metrics.prefilled(prefilled[0] - self._prefilled[0] - from_cache, from_cache, usage.prefix_cache_bytes)
            self._prefilled = prefilled


def register(servicer: VerifierServicer):
    def add(server: grpc.aio.Server) -> list[str]:
        verifier_pb2_grpc.add_VerifierServicer_to_server(servicer, server)
        return [pb.DESCRIPTOR.services_by_name["Verifier"].full_name]
    return add
