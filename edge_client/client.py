"""The device-side client: ask a coordinator to generate and stream the result.

Depends only on grpcio, protobuf and the generated code.
"""
from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import AsyncIterator, Callable, Sequence

import grpc

from edgespec.backoff import backoff_seconds
from edgespec.v1 import common_pb2
from edgespec.v1 import coordinator_pb2 as pb
from edgespec.v1 import coordinator_pb2_grpc
from edgespec.net.transport import PLAINTEXT, ClientSecurity, open_channel


async def generate(address: str, prompt: str, max_new_tokens: int, window: int = -1, chat: bool = True,
                   timeout_seconds: float | None = None, temperature: float = 0.0, top_k: int = 0,
                   top_p: float = 1.0, seed: int | None = None, relaxed: str = "", coupled: bool = False,
                   resume_token_ids: Sequence[int] = (),
                   security: ClientSecurity = PLAINTEXT, stop: Sequence[str] = (),
                   system: str | None = None, min_tokens: int = 0, ignore_eos: bool = False,
                   logprobs: int | None = None) -> AsyncIterator[pb.GenerateResponse]:
    """Yield the coordinator's events: TokenChunk messages, then one GenerationStats.

    temperature 0 is greedy; > 0 samples (losslessly) with top_k / top_p / seed.
    relaxed: opt into lossy relaxed verification (see ``relaxation``); "" = lossless.
    coupled: the coupled sampler: with a seed, the text is token for token target-only sampling with
    that seed, whatever the windows, failovers or resumes (lossless; lower acceptance than the default).
    resume_token_ids: tokens an interrupted call with the same arguments already
    streamed (verified ones); the coordinator continues after them.
    security: TLS / mutual TLS and the bearer token (default plaintext, no token).
    stop: stop sequences: the text ends just before the first one (finish reason "stop").
    system: a system turn before the prompt (sent as chat messages, through the model's chat template).
    min_tokens: the first min_tokens tokens are never EOS, and no stop sequence ends within them (vLLM's).
    ignore_eos: an EOS token does not end the generation: it runs to max_new_tokens.
    logprobs: each chunk carries the target's log-probability of each token and of this many most likely ones.
    Raises grpc.aio.AioRpcError with the coordinator's status on failure.
    """
    sampling = common_pb2.SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p,
                                         relaxation=relaxation(relaxed), coupled=coupled, ignore_eos=ignore_eos)
    if seed is not None:
        sampling.seed = seed
    if logprobs is not None:
        sampling.logprobs = logprobs
    async with open_channel(address, security) as channel:
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        request = pb.GenerateRequest(prompt=prompt, max_new_tokens=max_new_tokens, window=window, chat=chat,
                                     sampling=sampling, resume_token_ids=resume_token_ids, stop=stop,
                                     min_tokens=min_tokens)
        if system is not None:
            request.prompt = ""
            request.messages.extend([pb.ChatMessage(role="system", content=system),
                                     pb.ChatMessage(role="user", content=prompt)])
        async for event in stub.Generate(request, timeout=timeout_seconds):
            yield event


@dataclass(slots=True)
class Generated:
    """One generation read whole (collect): its tokens, its final stats, and when its token chunks came."""
    tokens: list[int]              # token ids streamed, in order
    stats: pb.GenerationStats | None   # the last event (None if the stream ended without one)
    started: float                 # time.perf_counter() when the call began
    first: float | None = None     # ... when the first chunk with tokens came
    last: float | None = None      # ... when the last one came
    first_tokens: int = 0          # tokens in the first chunk

    @property
    def ttft(self) -> float:
        """Seconds to the first token (NaN if none came)."""
        return self.first - self.started if self.first is not None else float("nan")

    @property
    def seconds(self) -> float:
        """Seconds to the last token (NaN if none came)."""
        return self.last - self.started if self.last is not None else float("nan")

    @property
    def decode_tps(self) -> float:
        """Tokens per second after the first chunk (NaN with no tokens after it)."""
        after = len(self.tokens) - self.first_tokens
        return after / (self.last - self.first) if after and self.last > self.first else float("nan")


async def collect(address: str, prompt: str, max_new_tokens: int, window: int = -1,
                  on_text: Callable[[str], None] | None = None, **options) -> Generated:
    """generate() read to its end: the tokens, the stats and the chunks' times. ``on_text`` hears each chunk's
    text as it comes (echo); ``options`` are generate()'s."""
    out = Generated([], None, time.perf_counter())
    async for event in generate(address, prompt, max_new_tokens, window, **options):
        if event.HasField("chunk"):
            if on_text is not None:
                on_text(event.chunk.text)
            if event.chunk.token_ids:
                out.last = time.perf_counter()
                if out.first is None:
                    out.first, out.first_tokens = out.last, len(event.chunk.token_ids)
            out.tokens.extend(event.chunk.token_ids)
        elif event.HasField("stats"):
            out.stats = event.stats
    return out


RELAXED_HELP = ("LOSSY relaxed verification, off by default: 'diversed:W' (verify against w*q + (1-w)*p, "
                "W in [0, 0.95]), 'diversed:learned[:CAP]' (w per position from the verifier's learned head, "
                "at most CAP, default 0.9), 'diversed:task[=code|qa|chat]' (the coordinator's measured weight for "
                "the prompt's category, or the one named), 'cospec:MARGIN' (keep a draft token at a mismatch when "
                "its target log-probability is within MARGIN nats of the best)")


def relaxation(spec: str) -> common_pb2.Relaxation:
    """Parse a --relaxed spec (RELAXED_HELP); "" = lossless. ValueError on a malformed one."""
    if not spec:
        return common_pb2.Relaxation()
    method, _, rest = spec.partition(":")
    try:
        if method == "diversed" and rest.startswith("learned"):
            cap = rest.removeprefix("learned").removeprefix(":")
            return common_pb2.Relaxation(method=common_pb2.Relaxation.DIVERSED, learned=True,
                                         weight=float(cap) if cap else 0.9)
        if method == "diversed" and rest.startswith("task"):
            task = rest.removeprefix("task").removeprefix("=")
            return common_pb2.Relaxation(method=common_pb2.Relaxation.DIVERSED, task=task or "auto")
        if method == "diversed" and rest:
            return common_pb2.Relaxation(method=common_pb2.Relaxation.DIVERSED, weight=float(rest))
        if method == "cospec" and rest:
            return common_pb2.Relaxation(method=common_pb2.Relaxation.COSPEC, margin=float(rest))
    except ValueError:
        pass
    raise ValueError(f"--relaxed {spec!r}: expected one of diversed:W, diversed:learned[:CAP], "
                     f"diversed:task[=code|qa|chat], cospec:MARGIN")


RECONNECT_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN,
                   grpc.StatusCode.INTERNAL)
TLS_FAILURE_WORDS = ("handshake", "ssl", "certificate", "tls")   # in the details of a connection TLS refused


def _retryable(error: grpc.aio.AioRpcError) -> bool:
    """A dropped connection or a restarting coordinator: yes. A TLS failure: no, it will not heal by itself."""
    details = (error.details() or "").lower()
    return error.code() in RECONNECT_CODES and not any(word in details for word in TLS_FAILURE_WORDS)


RECONNECT_SECONDS = 45.0          # how long generate_resilient keeps trying before it gives up
RECONNECT_FIRST_SECONDS = 0.25    # the first wait's ceiling; it doubles per failed try ...
RECONNECT_MAX_SECONDS = 8.0       # ... up to this


def reconnect_delay(attempt: int, first: float = RECONNECT_FIRST_SECONDS, cap: float = RECONNECT_MAX_SECONDS,
                    rng: Callable[[], float] = random.random) -> float:
    """Seconds to wait before reconnect try ``attempt`` (1 = the first retry): exponential backoff with
    "equal jitter", between half and all of min(cap, first * 2^(attempt-1)), so that clients cut off
    together do not come back together, and none hammers a coordinator that answers at once."""
    return backoff_seconds(attempt, first / 2, cap / 2, jitter=1.0, rng=rng)   # half the ceiling, up to twice that


@dataclass(frozen=True, slots=True)
class Waiting:
    """What generate_resilient is doing while it cannot reach a working coordinator (for ``on_wait``)."""
    attempt: int                   # failed tries so far, since the trouble began
    waited_seconds: float          # since the trouble began
    delay_seconds: float           # until the next try
    give_up_in_seconds: float      # until generate_resilient gives up and raises the last error
    error: grpc.aio.AioRpcError    # the last failure


async def generate_resilient(address: str, prompt: str, max_new_tokens: int,
                             reconnect_seconds: float = RECONNECT_SECONDS,
                             on_wait: Callable[[Waiting], None] | None = None,
                             **kwargs) -> AsyncIterator[pb.GenerateResponse]:
    """generate() that survives a coordinator restart, a dropped connection, or no verifier for a while.

    When a call fails with a status that may heal (UNAVAILABLE and the like), it tries again, backing off
    exponentially with jitter (``reconnect_delay``), and resumes with the verified tokens it already has,
    so no token is lost or repeated. It gives up, raising the last error, ``reconnect_seconds`` after the
    trouble began (the start of the failed call, or its last event). ``on_wait`` hears of every wait.
    Greedy output is identical to an uninterrupted call, and so is coupled
    sampling (``coupled=True``) with a ``seed``; with the standard sampler the resumed
    tail is a fresh sample of the right distribution, not necessarily the same text.
    Unverified tokens (degraded mode) are not kept: the resumed call recomputes them.
    """
    verified: list[int] = []
    broken_since: float | None = None
    attempt = 0
    while True:
        progress = time.monotonic()      # the trouble, if any, began no earlier than this call's start ...
        try:
            async for event in generate(address, prompt, max_new_tokens, resume_token_ids=verified, **kwargs):
                broken_since, attempt, progress = None, 0, time.monotonic()   # ... or its last event
                if event.HasField("chunk") and event.chunk.token_ids and not event.chunk.unverified:
                    del verified[event.chunk.position:]
                    verified += event.chunk.token_ids
                yield event
            return
        except grpc.aio.AioRpcError as error:
            if not _retryable(error):
                raise
            broken_since = broken_since or progress
            attempt += 1
            now = time.monotonic()
            left = broken_since + reconnect_seconds - now
            if left <= 0:
                raise
            delay = min(reconnect_delay(attempt), left)
            if on_wait is not None:
                on_wait(Waiting(attempt, now - broken_since, delay, left, error))
            await asyncio.sleep(delay)
