"""gRPC servicer for the coordinator: GenerateRequest in, edgespec.loop.generation, GenerateResponse out.

Protobuf conversion only; the generation itself (validation, policy, drafter,
round loop, text, stats) is the library's (edgespec.loop.generation), and the
per-call plumbing (identity, errors as statuses) the Guard's
(edgespec.net.security). Each generation is one trace: a "generate" span (child
of the client's span when its metadata carries one) over the rounds' spans; its
logs carry its session id and request id (the client's x-request-id, or a new
one, echoed in the initial metadata).
"""
from __future__ import annotations

import dataclasses
import secrets
import uuid
from typing import AsyncIterator, Mapping, Sequence

import grpc

from edgespec.backends.tokenizer import TextStream, Tokenizer
from edgespec.control.router import Router
from edgespec.loop.chat import ChatMessage
from edgespec.loop.config import SpeculationConfig
from edgespec.loop.failover import FailoverVerifier
from edgespec.loop.generation import (FreeDrafter, GenerationConfig, GenerationRequest, Generations, GenerationStats,
                                     TextChunk)
from edgespec.loop.rounds import DrafterPort
from edgespec.net.security import SessionOwners
from edgespec.net.wire import logprobs_to_pb, params_from_pb
from edgespec.observe import logs, tracing
from edgespec.observe.metrics import CoordinatorMetrics
from edgespec.v1 import coordinator_pb2 as pb
from edgespec.v1 import coordinator_pb2_grpc


class CoordinatorServicer(coordinator_pb2_grpc.CoordinatorServicer):
    def __init__(self, config: GenerationConfig, tokenizer: Tokenizer, drafters: Mapping[str, DrafterPort],
                 verifier: FailoverVerifier, owners: SessionOwners | None = None, router: Router | None = None,
                 metrics: CoordinatorMetrics | None = None, free_drafter: FreeDrafter | None = None):
        """``owners``: generations in progress per client identity (the Guard's, which also limits them);
        ``router``: picks among several drafters, fed by the generations (None with one drafter);
        ``free_drafter``: free drafts in this process (the suffix drafter; None = off)."""
        self.generations = Generations(config, tokenizer, lambda: TextStream(tokenizer), drafters, verifier,
                                       owners or SessionOwners(64), router, metrics, free_drafter)

    async def Generate(self, request: pb.GenerateRequest, context):
        metadata = context.invocation_metadata()
        session_id, request_id = uuid.uuid4().hex, logs.request_id_from(metadata) or uuid.uuid4().hex
        await context.send_initial_metadata(((logs.REQUEST_ID_KEY, request_id),))
        async for event in run_generation(self.generations, session_id, request_id, metadata,
                                          request_from_pb(request)):
            yield response_to_pb(event)


async def run_generation(generations: Generations, session_id: str, request_id: str,
                         metadata: Sequence[tuple[str, str | bytes]] | None, request: GenerationRequest
                         ) -> AsyncIterator[SpeculationConfig | TextChunk | GenerationStats]:
    """One generation as a traced, logged call: the one path of the gRPC Generate and the HTTP API
    (services/coordinator/http_api.py). ``metadata``: the call's (header) pairs, for the caller's trace."""
    logs.bind(session_id, request_id)   # the session starts here (the Guard bound the caller's ids)
    with tracing.server_span("generate", tracing.incoming_carrier(metadata),
                             {tracing.SESSION_ID: session_id, tracing.REQUEST_ID: request_id}):
        async for event in generations.run(session_id, request):
            yield event


def request_from_pb(request: pb.GenerateRequest) -> GenerationRequest:
    """An absent seed is a fresh random one (reported in the stats)."""
    return GenerationRequest(request.prompt, request.max_new_tokens, request.window, request.chat,
                             params_from_pb(request.sampling, default_seed=secrets.randbits(63)),
                             tuple(request.resume_token_ids),
                             tuple(ChatMessage(m.role, m.content) for m in request.messages), tuple(request.stop),
                             request.min_tokens)


def response_to_pb(event: SpeculationConfig | TextChunk | GenerationStats) -> pb.GenerateResponse:
    """The dataclasses have their message's field names (SpeculationConfig: SpeculationPlan's)."""
    values = {field.name: getattr(event, field.name) for field in dataclasses.fields(event)}
    if isinstance(event, SpeculationConfig):
        return pb.GenerateResponse(plan=pb.SpeculationPlan(**values))
    if isinstance(event, GenerationStats):
        return pb.GenerateResponse(stats=pb.GenerationStats(**values))
    return pb.GenerateResponse(chunk=pb.TokenChunk(**{**values, "logprobs": logprobs_to_pb(event.logprobs)}))


def register(servicer: CoordinatorServicer):
    def add(server: grpc.aio.Server) -> list[str]:
        coordinator_pb2_grpc.add_CoordinatorServicer_to_server(servicer, server)
        return [pb.DESCRIPTOR.services_by_name["Coordinator"].full_name]
    return add
