"""gRPC servicer for the verifier: protobuf in, one engine call, protobuf out."""
from __future__ import annotations

import logging

import grpc

from edgespec import rpc
from edgespec.errors import EdgespecError
from edgespec.security import SessionOwners, current_identity
from edgespec.v1 import verifier_pb2 as pb
from edgespec.wire import dists_from_pb, params_from_pb
from edgespec.v1 import verifier_pb2_grpc
from edgespec.verifier_engine import VerifierEngine
from edgespec.worker import ModelWorker

log = logging.getLogger(__name__)


class VerifierServicer(verifier_pb2_grpc.VerifierServicer):
    def __init__(self, engine: VerifierEngine, worker: ModelWorker, model: str, device: str, dtype: str,
                 owners: SessionOwners):
        self.engine = engine
        self.worker = worker
        self.owners = owners     # each session answers only to the client that opened it
        self.info = pb.InfoResponse(model=model, vocab_size=engine.target.vocab_size,
                                    eos_token_ids=sorted(engine.eos_ids), max_window=engine.limits.max_window,
                                    max_session_tokens=engine.limits.max_session_tokens, device=device, dtype=dtype)

    async def Info(self, request, context):
        return self.info

    async def OpenSession(self, request: pb.OpenSessionRequest, context):
        new = False
        try:
            new = self.owners.claim(request.session_id, current_identity())
            seconds, _ = await self.worker.call(self.engine.open, request.session_id, list(request.tokens),
                                                params_from_pb(request.sampling))
        except EdgespecError as error:
            if new:
                self.owners.release(request.session_id)
            await rpc.abort(context, error)
        log.info("session %s opened: %d tokens prefilled in %.3fs", request.session_id, len(request.tokens), seconds)
        return pb.OpenSessionResponse(committed_position=len(request.tokens), prefill_seconds=seconds)

    async def VerifyStream(self, request_iterator, context):
        async for window in request_iterator:
            try:
                self.owners.check(window.session_id, current_identity())
                result, depth = await self.worker.call(self.engine.verify, window.session_id, window.base_position,
                                                       list(window.draft_tokens), dists_from_pb(window.draft_probs),
                                                       window.params_fingerprint,
                                                       window.parent_token if window.optimistic else None)
            except EdgespecError as error:
                log.info("window %d of session %s rejected: %s", window.window_seq, window.session_id, error)
                await rpc.abort(context, error)
            verdict = result.verdict
            yield pb.Verdict(session_id=window.session_id, window_seq=window.window_seq,
                             base_position=window.base_position, discarded=verdict is None,
                             accepted=verdict.accepted if verdict else 0, next_token=verdict.next_token if verdict else 0,
                             committed_position=result.committed_position,
                             verify_seconds=result.verify_seconds, queue_depth=depth,
                             target_logprob=verdict.target_logprob if verdict else 0.0)

    async def CloseSession(self, request: pb.CloseSessionRequest, context):
        try:
            self.owners.check(request.session_id, current_identity())
            try:
                await self.worker.call(self.engine.close, request.session_id)
            finally:
                self.owners.release(request.session_id)
        except EdgespecError as error:
            await rpc.abort(context, error)
        log.info("session %s closed", request.session_id)
        return pb.CloseSessionResponse()


def register(servicer: VerifierServicer):
    def add(server: grpc.aio.Server) -> list[str]:
        verifier_pb2_grpc.add_VerifierServicer_to_server(servicer, server)
        return [pb.DESCRIPTOR.services_by_name["Verifier"].full_name]
    return add
