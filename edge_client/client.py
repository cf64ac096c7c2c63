"""The device-side client: ask a coordinator to generate and stream the result.

Depends only on grpcio, protobuf and the generated code.
"""
from __future__ import annotations

from typing import AsyncIterator

import grpc

from edgespec.v1 import common_pb2
from edgespec.v1 import coordinator_pb2 as pb
from edgespec.v1 import coordinator_pb2_grpc


async def generate(address: str, prompt: str, max_new_tokens: int, window: int = -1, chat: bool = True,
                   timeout_seconds: float | None = None, temperature: float = 0.0, top_k: int = 0,
                   top_p: float = 1.0, seed: int | None = None) -> AsyncIterator[pb.GenerateResponse]:
    """Yield the coordinator's events: TokenChunk messages, then one GenerationStats.

    temperature 0 is greedy; > 0 samples (losslessly) with top_k / top_p / seed.
    Raises grpc.aio.AioRpcError with the coordinator's status on failure.
    """
    sampling = common_pb2.SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    if seed is not None:
        sampling.seed = seed
    async with grpc.aio.insecure_channel(address) as channel:
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        request = pb.GenerateRequest(prompt=prompt, max_new_tokens=max_new_tokens, window=window, chat=chat,
                                     sampling=sampling)
        async for event in stub.Generate(request, timeout=timeout_seconds, wait_for_ready=True):
            yield event
