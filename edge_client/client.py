"""The device-side client: ask a coordinator to generate and stream the result.

Depends only on grpcio, protobuf and the generated code.
"""
from __future__ import annotations

from typing import AsyncIterator

import grpc

from edgespec.v1 import coordinator_pb2 as pb
from edgespec.v1 import coordinator_pb2_grpc


async def generate(address: str, prompt: str, max_new_tokens: int, window: int = -1, chat: bool = True,
                   timeout_seconds: float | None = None) -> AsyncIterator[pb.GenerateResponse]:
    """Yield the coordinator's events: TokenChunk messages, then one GenerationStats.

    Raises grpc.aio.AioRpcError with the coordinator's status on failure.
    """
    async with grpc.aio.insecure_channel(address) as channel:
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        request = pb.GenerateRequest(prompt=prompt, max_new_tokens=max_new_tokens, window=window, chat=chat)
        async for event in stub.Generate(request, timeout=timeout_seconds, wait_for_ready=True):
            yield event
