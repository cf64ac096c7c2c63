"""gRPC servicer for the drafter: protobuf in, one engine call, protobuf out."""
from __future__ import annotations

import logging

import grpc

from edgespec import rpc
from edgespec.drafter_engine import DrafterEngine
from edgespec.errors import EdgespecError
from edgespec.security import SessionOwners, current_identity
from edgespec.v1 import drafter_pb2 as pb
from edgespec.wire import dists_to_pb, params_from_pb
from edgespec.v1 import drafter_pb2_grpc
from edgespec.worker import ModelWorker

log = logging.getLogger(__name__)


class DrafterServicer(drafter_pb2_grpc.DrafterServicer):
    def __init__(self, engine: DrafterEngine, worker: ModelWorker, info: pb.DrafterInfoResponse,
                 owners: SessionOwners):
        self.engine = engine
        self.worker = worker
        self.info = info
        self.owners = owners     # each session answers only to the client that opened it

    async def Info(self, request, context):
        return self.info

    async def OpenSession(self, request: pb.DrafterOpenRequest, context):
        new = False
        try:
            new = self.owners.claim(request.session_id, current_identity())
            position, _ = await self.worker.call(self.engine.open, request.session_id, list(request.tokens),
                                                 params_from_pb(request.sampling), request.q_ids)
        except EdgespecError as error:
            if new:
                self.owners.release(request.session_id)
            await rpc.abort(context, error)
        log.info("session %s opened at position %d", request.session_id, position)
        return pb.DrafterOpenResponse(committed_position=position)

    async def Draft(self, request: pb.DraftRequest, context):
        try:
            self.owners.check(request.session_id, current_identity())
            proposal, _ = await self.worker.call(self.engine.draft, request.session_id, request.base_position,
                                                 list(request.append), request.k)
        except EdgespecError as error:
            await rpc.abort(context, error)
        return pb.DraftResponse(tokens=proposal.tokens, draft_seconds=proposal.seconds, probs=dists_to_pb(proposal.q))

    async def Crop(self, request: pb.CropRequest, context):
        try:
            self.owners.check(request.session_id, current_identity())
            position, _ = await self.worker.call(self.engine.crop, request.session_id, request.position)
        except EdgespecError as error:
            await rpc.abort(context, error)
        return pb.CropResponse(committed_position=position)

    async def CloseSession(self, request: pb.DrafterCloseRequest, context):
        try:
            self.owners.check(request.session_id, current_identity())
            try:
                await self.worker.call(self.engine.close, request.session_id)
            finally:
                self.owners.release(request.session_id)
        except EdgespecError as error:
            await rpc.abort(context, error)
        log.info("session %s closed", request.session_id)
        return pb.DrafterCloseResponse()


def register(servicer: DrafterServicer):
    def add(server: grpc.aio.Server) -> list[str]:
        drafter_pb2_grpc.add_DrafterServicer_to_server(servicer, server)
        return [pb.DESCRIPTOR.services_by_name["Drafter"].full_name]
    return add
