"""gRPC clients for the drafter and the verifier, as the round loop's ports.

grpc errors become domain errors here (edgespec.rpc.from_rpc_error) and nowhere
else on the coordinator side.
"""
from __future__ import annotations

import asyncio
from typing import Sequence

import grpc

from edgespec import errors, rpc
from edgespec.sampling import SamplingParams, SparseDist
from edgespec.v1 import drafter_pb2, drafter_pb2_grpc, verifier_pb2, verifier_pb2_grpc
from edgespec.verification import Verdict
from edgespec.wire import dists_from_pb, dists_to_pb, params_to_pb


class GrpcDrafter:
    def __init__(self, address: str, deadline_seconds: float, q_ids: int = 16):
        self.address = address
        self.q_ids = q_ids   # sampling: ids of q per position (0 = deterministic drafting, one-hot q)
        self._deadline = deadline_seconds
        self._channel = grpc.aio.insecure_channel(address)
        self._stub = drafter_pb2_grpc.DrafterStub(self._channel)

    async def open(self, session_id: str, tokens: Sequence[int], params: SamplingParams) -> None:
        await self._call(self._stub.OpenSession, drafter_pb2.DrafterOpenRequest(
            session_id=session_id, tokens=tokens, sampling=params_to_pb(params), q_ids=self.q_ids))

    async def draft(self, session_id: str, base_position: int, append: Sequence[int],
                    k: int) -> tuple[list[int], list[SparseDist] | None]:
        reply = await self._call(self._stub.Draft, drafter_pb2.DraftRequest(
            session_id=session_id, base_position=base_position, append=append, k=k))
        return list(reply.tokens), (dists_from_pb(reply.probs) or None)

    async def close(self, session_id: str) -> None:
        await self._call(self._stub.CloseSession, drafter_pb2.DrafterCloseRequest(session_id=session_id))

    async def _call(self, method, request):
        try:
            return await method(request, timeout=self._deadline)
        except grpc.aio.AioRpcError as error:
            raise rpc.from_rpc_error(error, f"drafter {self.address}") from error

    async def aclose(self) -> None:
        await self._channel.close()


class GrpcVerifier:
    """One VerifyStream per session: a window is written, its verdict read back."""

    def __init__(self, address: str, deadline_seconds: float):
        self.address = address
        self._deadline = deadline_seconds
        self._channel = grpc.aio.insecure_channel(address)
        self._stub = verifier_pb2_grpc.VerifierStub(self._channel)
        self._streams: dict[str, grpc.aio.StreamStreamCall] = {}

    async def info(self) -> verifier_pb2.InfoResponse:
        return await self._call(self._stub.Info, verifier_pb2.InfoRequest())

    async def open(self, session_id: str, tokens: Sequence[int], params: SamplingParams) -> None:
        await self._call(self._stub.OpenSession, verifier_pb2.OpenSessionRequest(
            session_id=session_id, tokens=tokens, sampling=params_to_pb(params)))
        self._streams[session_id] = self._stub.VerifyStream()

    async def verify(self, session_id: str, window_seq: int, base_position: int, draft: Sequence[int],
                     q: Sequence[SparseDist], params_fingerprint: int) -> Verdict:
        stream = self._streams[session_id]
        try:
            await stream.write(verifier_pb2.Window(session_id=session_id, window_seq=window_seq,
                                                   base_position=base_position, draft_tokens=draft,
                                                   params_fingerprint=params_fingerprint, draft_probs=dists_to_pb(q)))
            reply = await asyncio.wait_for(stream.read(), self._deadline)
        except grpc.aio.AioRpcError as error:
            self._streams.pop(session_id, None)
            raise rpc.from_rpc_error(error, f"verifier {self.address}") from error
        except asyncio.TimeoutError:
            self._streams.pop(session_id, None).cancel()
            raise errors.Unavailable(f"verifier {self.address}: no verdict within {self._deadline}s") from None
        if reply is grpc.aio.EOF:
            self._streams.pop(session_id, None)
            raise errors.Unavailable(f"verifier {self.address}: stream ended ({await stream.code()})")
        return Verdict(accepted=reply.accepted, next_token=reply.next_token)

    async def close(self, session_id: str) -> None:
        stream = self._streams.pop(session_id, None)
        if stream is not None:
            await stream.done_writing()
        await self._call(self._stub.CloseSession, verifier_pb2.CloseSessionRequest(session_id=session_id))

    async def _call(self, method, request):
        try:
            return await method(request, timeout=self._deadline)
        except grpc.aio.AioRpcError as error:
            raise rpc.from_rpc_error(error, f"verifier {self.address}") from error

    async def aclose(self) -> None:
        await self._channel.close()
