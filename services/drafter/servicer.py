"""gRPC servicer for the drafter: protobuf in, one engine call, protobuf out.

Draft and OpenSession run in a server span, child of the coordinator's span
when the call's metadata carries one. The Guard interceptor (edgespec.net.security)
binds every call's log ids, lets only a session's owner use it, and turns the
EdgespecError a method raises into its status.
"""
from __future__ import annotations

import asyncio
import logging

import grpc

from edgespec.observe import tracing
from edgespec.engines.drafter import DrafterEngine
from edgespec.observe.metrics import DrafterMetrics
from edgespec.net.security import SessionOwners
from edgespec.v1 import drafter_pb2 as pb
from edgespec.net.wire import dists_to_pb, params_from_pb
from edgespec.v1 import drafter_pb2_grpc
from edgespec.engines.worker import ModelWorker

log = logging.getLogger(__name__)


class DrafterServicer(drafter_pb2_grpc.DrafterServicer):
    def __init__(self, engine: DrafterEngine, worker: ModelWorker, info: pb.DrafterInfoResponse,
                 owners: SessionOwners, metrics: DrafterMetrics | None = None):
        self.engine = engine
        self.worker = worker
        self.info = info
        self.owners = owners     # each session answers only to the client that opened it
        self.metrics = metrics or DrafterMetrics()

    async def Info(self, request, context):
        return self.info

    async def OpenSession(self, request: pb.DrafterOpenRequest, context):
        with (_call_span("drafter.open_session", request.session_id, context, {"edgespec.tokens": len(request.tokens)}),
              self.owners.opening(request.session_id)):
            position, _ = await self.worker.call(self.engine.open, request.session_id, list(request.tokens),
                                                 params_from_pb(request.sampling), request.q_ids)
        log.info("session %s opened at position %d", request.session_id, position)
        return pb.DrafterOpenResponse(committed_position=position)

    async def Draft(self, request: pb.DraftRequest, context):
        with _call_span("drafter.draft", request.session_id, context,
                        {"edgespec.k": request.k, "edgespec.base_position": request.base_position}) as span:
            proposal, _ = await self.worker.call(self.engine.draft, request.session_id, request.base_position,
                                                 list(request.append), request.k, request.tree_depth)
            span.set_attribute("edgespec.draft_seconds", proposal.seconds)
        self.metrics.draft(len(proposal.tokens), proposal.seconds)
        return pb.DraftResponse(tokens=proposal.tokens, draft_seconds=proposal.seconds, probs=dists_to_pb(proposal.q),
                                parents=proposal.parents or ())

    async def Crop(self, request: pb.CropRequest, context):
        position, _ = await self.worker.call(self.engine.crop, request.session_id, request.position)
        return pb.CropResponse(committed_position=position)

    async def CloseSession(self, request: pb.DrafterCloseRequest, context):
        try:
            await self.worker.call(self.engine.close, request.session_id)
        finally:
            self.owners.release(request.session_id)
        log.info("session %s closed", request.session_id)
        return pb.DrafterCloseResponse()

    async def sweep(self, period_seconds: float) -> None:
        """Every period: evict idle sessions' KV caches, forget long-idle sessions (runs until cancelled)."""
        while True:
            await asyncio.sleep(period_seconds)
            await self.sweep_once()

    async def sweep_once(self) -> tuple[list[str], list[str]]:
        """One idle sweep on the model worker; a forgotten session's owner slot is released.
        Returns (sessions whose KV cache was evicted, sessions forgotten)."""
        evicted, _ = await self.worker.call(self.engine.evict_idle)
        for session_id in evicted.forgotten:
            self.owners.release(session_id)
        if evicted.kv_dropped or evicted.forgotten:
            log.info("idle sweep: %d KV caches evicted (rebuilt on their next draft), %d sessions forgotten",
                     len(evicted.kv_dropped), len(evicted.forgotten))
        return evicted.kv_dropped, evicted.forgotten


def _call_span(name: str, session_id: str, context, attributes: dict):
    """The call's server span (child of the caller's, from the metadata)."""
    return tracing.server_span(name, tracing.incoming_carrier(context.invocation_metadata()),
                               {tracing.SESSION_ID: session_id, **attributes})


def register(servicer: DrafterServicer):
    def add(server: grpc.aio.Server) -> list[str]:
        drafter_pb2_grpc.add_DrafterServicer_to_server(servicer, server)
        return [pb.DESCRIPTOR.services_by_name["Drafter"].full_name]
    return add
