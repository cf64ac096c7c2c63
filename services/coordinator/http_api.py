"""The coordinator's OpenAI-compatible HTTP API (--http-port): FastAPI on uvicorn, in the gRPC server's process
and event loop.

    POST /v1/chat/completions   POST /v1/completions   (stream: true = Server-Sent Events, then data: [DONE])
    GET  /v1/models             GET  /health
    POST /tokenize              POST /detokenize       (vLLM's: the coordinator's tokenizer and chat template)
    GET  /metrics               (Prometheus: the coordinator's metrics, vLLM's spec-decode counters among them)

Each completion runs through the same path as the gRPC Generate (servicer.run_generation
over edgespec.loop.generation), never over a gRPC loopback. The OpenAI shapes (what a
request may say, what a response looks like) are edgespec.api.openai_compat's; this module
is the HTTP plumbing: the caller's identity (the gRPC port's Guard: the same bearer
tokens, rate limit and per-client limits), errors as HTTP statuses with OpenAI's error
object (the gRPC status table: INVALID_ARGUMENT 400, UNAUTHENTICATED 401,
PERMISSION_DENIED 403, RESOURCE_EXHAUSTED 429 with Retry-After, UNAVAILABLE 503, others
500), and the generation's lifetime. A generation runs in a task of its own: a client
that goes away (mid-stream, or while waiting for a whole completion) cancels it, and it
still closes its sessions on the verifier and the drafter (inside the request's own
cancel scope those closing calls would be cancelled too).
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import secrets
import signal
import socket
import ssl
import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

import grpc
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from edge_client.client import relaxation as relaxation_spec
from edgespec import errors
from edgespec.api.openai_compat import (ApiError, OpenAIRequest, chunk_body, completion_body, detokenize_body,
                                        error_body, logprobs_body, parse_chat, parse_completion, parse_detokenize,
                                        parse_tokenize, tokenize_body, usage_chunk_body)
from edgespec.loop.config import SpeculationConfig
from edgespec.loop.generation import GenerationRequest, Generations, GenerationStats, TextChunk
from edgespec.net import rpc
from edgespec.net.security import Guard, ServerSecurity
from edgespec.net.wire import relaxation_from_pb
from edgespec.observe import logs
from edgespec.verify.sampling import SamplingParams
from services.coordinator.servicer import run_generation

log = logging.getLogger("edgespec.coordinator")

HTTP_STATUS = {grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.FAILED_PRECONDITION: 400,
               grpc.StatusCode.UNAUTHENTICATED: 401,
               grpc.StatusCode.PERMISSION_DENIED: 403, grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
               grpc.StatusCode.UNAVAILABLE: 503}
ERROR_TYPE = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
              429: "rate_limit_error", 503: "service_unavailable_error"}
PARAM_NAMES = {"max_new_tokens": "max_tokens", "sampling.temperature": "temperature", "sampling.top_p": "top_p",
               "sampling.top_k": "edgespec.top_k", "window": "edgespec.window"}   # GenerateRequest's -> OpenAI's


def api_error(error: errors.EdgespecError, kind: str = "chat") -> ApiError:
    """The HTTP answer to what the generation path raised: the gRPC status table, then HTTP_STATUS."""
    status = HTTP_STATUS.get(rpc.status_of(error), 500)
    param = None
    if isinstance(error, errors.InvalidArgument):
        param = PARAM_NAMES.get(error.field, error.field)
        if error.field == "prompt" and kind == "chat":
            param = "messages"
    problem = ApiError(str(error), param, status, ERROR_TYPE.get(status, "server_error"),
                       rpc.status_of(error).name.lower())
    problem.retry_after = getattr(error, "retry_after_seconds", None)
    return problem


@dataclass(frozen=True, slots=True)
class HttpConfig:
    host: str                  # interface to bind
    port: int                  # TCP port (0 = any free port, logged)
    model_name: str = ""       # the model id /v1/models and responses name ("": the verifier's model)
    sse_ping_seconds: float = 0.0   # an SSE comment on a stream this often (0 = none, as vLLM's and llama.cpp's
                                    # servers: vLLM's benchmark client loses every event after one)


class _HttpCall:
    """An HTTP request as the Guard reads a gRPC call: its headers as metadata and its peer."""

    def __init__(self, request):
        self._metadata = tuple((key.lower(), value) for key, value in request.headers.items())
        client = request.client
        self._peer = f"ipv4:{client.host}:{client.port}" if client else "unknown"

    def invocation_metadata(self):
        return self._metadata

    def peer(self) -> str:
        return self._peer

    def auth_context(self) -> dict:
        return {}   # uvicorn does not tell the client certificate: a mutual-TLS identity needs a bearer token


_DONE = object()


class _Run:
    """One generation in a task of its own, its events through a queue (see the module doc)."""

    def __init__(self, events: AsyncIterator, tasks: set[asyncio.Task]):
        self.queue: asyncio.Queue = asyncio.Queue()
        self.task = asyncio.ensure_future(self._pump(events))
        tasks.add(self.task)
        self.task.add_done_callback(tasks.discard)

    async def _pump(self, events: AsyncIterator) -> None:
        try:
            async for event in events:
                if isinstance(event, SpeculationConfig):
                    continue   # the plan: the OpenAI API has no place for it (the first event is the first text)
                self.queue.put_nowait(event)
        except Exception as error:   # noqa: BLE001 - handed to the request, which answers it
            self.queue.put_nowait(error)
        else:
            self.queue.put_nowait(_DONE)

    async def next(self):
        """The next event; _DONE at the end; raises what the generation raised."""
        item = await self.queue.get()
        if isinstance(item, Exception):
            raise item
        return item

    def cancel(self) -> None:
        if not self.task.done():
            self.task.cancel()


async def _disconnected(request) -> None:
    """Returns when the client has gone away (the request body has been read by then)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _next_or_gone(run: _Run, request) -> Any:
    """The run's next event, or None (and the run cancelled) if the client goes away first."""
    getter = asyncio.ensure_future(run.next())
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({getter, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not getter.done():
            getter.cancel()
    if getter.done() and not getter.cancelled():
        return getter.result()
    run.cancel()
    return None


class _Text:
    """The output text as the client may see it: verified text at once; drafter text no verifier checked
    (--on-verifier-loss draft-only) held back, dropped when verified text replaces it, and given only when
    the generation ends on it (finish reason "unverified")."""

    def __init__(self):
        self.unverified: list[str] = []

    def add(self, chunk: TextChunk) -> str:
        if chunk.unverified:
            self.unverified.append(chunk.text)
            return ""
        self.unverified.clear()
        return chunk.text

    def end(self, stats: GenerationStats) -> str:
        return "".join(self.unverified) if stats.unverified_tokens else ""


class OpenAIApp:
    """The FastAPI app and what its handlers share."""

    def __init__(self, generations: Generations, guard: Guard | None, config: HttpConfig,
                 draft_only: bool = False, metrics: Callable[[], tuple[bytes, str]] | None = None):
        self.generations = generations
        self.metrics = metrics          # the Prometheus text and its content type (None: no /metrics)
        self.guard = guard              # the gRPC port's: tokens, rate limit, identity (None: everyone anonymous)
        self.config = config
        self.draft_only = draft_only    # --on-verifier-loss draft-only: serving without a verifier
        self.tasks: set[asyncio.Task] = set()   # generations running
        self.shutting_down = False
        self.created = int(time.time())
        self._model = config.model_name
        self._info = None               # the first answering verifier's Info (model, vocabulary, limits), once asked
        self.app = self._build()

    def _build(self):
        app = FastAPI(title="edgespec coordinator (OpenAI-compatible)", docs_url=None, redoc_url=None,
                      openapi_url=None)

        @app.get("/health")
        async def health():
            serving = not self.shutting_down and (self.draft_only or any(
                endpoint.serving for endpoint in self.generations.verifier.pool.endpoints.values()))
            return JSONResponse({"status": "ok" if serving else "unavailable"}, status_code=200 if serving else 503)

        @app.get("/metrics")
        async def metrics():   # open, as /health and the --metrics-port endpoint are: counters, no session data
            if self.metrics is None:
                return JSONResponse(error_body("no metrics here", "not_found_error"), status_code=404)
            text, content_type = self.metrics()
            return Response(text, media_type=content_type)

        @app.get("/v1/models")
        async def models(request: Request):
            try:
                self._admit(request)
            except errors.EdgespecError as error:
                return self._error(api_error(error))
            return JSONResponse({"object": "list", "data": [
                {"id": await self.model(), "object": "model", "created": self.created, "owned_by": "edgespec"}]})

        @app.post("/v1/chat/completions")
        async def chat_completions(request: Request):
            return await self.complete(request, "chat")

        @app.post("/v1/completions")
        async def completions(request: Request):
            return await self.complete(request, "text")

        @app.post("/tokenize")
        async def tokenize(request: Request):
            return await self.tokenize(request)

        @app.post("/detokenize")
        async def detokenize(request: Request):
            return await self.detokenize(request)

        return app

    async def model(self) -> str:
        """The model id: --served-model-name, else the verifier's model (asked once), else "edgespec"."""
        if not self._model:
            info = await self.verifier_info()
            if info is not None:
                self._model = info.model or "edgespec"
        return self._model or "edgespec"

    async def verifier_info(self):
        """The first answering verifier's Info (asked until one answers, then kept); None while none does."""
        if self._info is None:
            for endpoint in self.generations.verifier.endpoints.values():
                try:
                    self._info = await endpoint.info()
                    break
                except errors.EdgespecError:
                    continue
        return self._info

    async def _body(self, request, kind: str = "chat"):
        """The caller admitted and the JSON body read: (body, None), or (None, the error response)."""
        try:
            self._admit(request)
        except errors.EdgespecError as error:
            return None, self._error(api_error(error, kind))
        try:
            return json.loads(await request.body()), None
        except (ValueError, UnicodeDecodeError) as error:
            return None, self._error(ApiError(f"the request body is not valid JSON: {error}"))

    async def tokenize(self, request):
        """vLLM's POST /tokenize: the token ids a prompt (or chat turns, through the chat template) has here, and
        the longest sequence a session may hold (the verifier's limit; without one answering, the coordinator's)."""
        body, refused = await self._body(request)
        if refused is not None:
            return refused
        tokenizer = self.generations.tokenizer
        try:
            parsed = parse_tokenize(body)
            if parsed.messages:
                tokens = tokenizer.encode_chat(parsed.messages, parsed.add_generation_prompt,
                                               parsed.continue_final_message, parsed.add_special_tokens)
            else:
                tokens = tokenizer.tokenize(parsed.prompt, parsed.add_special_tokens)
        except ApiError as problem:
            return self._error(problem)
        except errors.EdgespecError as error:
            return self._error(api_error(error))
        info = await self.verifier_info()
        config = self.generations.config
        limit = info.max_session_tokens if info is not None else config.max_prompt_tokens + config.max_new_tokens
        strs = tokenizer.token_strs(tokens) if parsed.return_token_strs else None
        return JSONResponse(tokenize_body(list(tokens), limit, strs))

    async def detokenize(self, request):
        """vLLM's POST /detokenize: the text of token ids (each in the verifier's vocabulary)."""
        body, refused = await self._body(request)
        if refused is not None:
            return refused
        info = await self.verifier_info()
        try:
            tokens = parse_detokenize(body, info.vocab_size if info is not None else None)
        except ApiError as problem:
            return self._error(problem)
        return JSONResponse(detokenize_body(self.generations.tokenizer.decode(tokens)))

    def _admit(self, request) -> str:
        """Authenticate and rate-limit the caller as the gRPC port does, and set its identity for the
        generation's slots and upstream calls; return the request id (raises EdgespecError)."""
        call = _HttpCall(request)
        if self.guard is None:
            return logs.request_id_from(call.invocation_metadata())
        return self.guard._admit(call)   # the Guard's own admission of a gRPC call, with this request's headers

    def _error(self, problem: ApiError):
        headers = {}
        retry_after = getattr(problem, "retry_after", None)
        if problem.status == 429:
            headers["Retry-After"] = str(max(1, math.ceil(retry_after or 1)))
        if problem.status == 401:
            headers["WWW-Authenticate"] = "Bearer"
        return JSONResponse(problem.body(), status_code=problem.status, headers=headers)

    def generation_request(self, parsed: OpenAIRequest) -> GenerationRequest:
        try:
            relaxation = relaxation_from_pb(relaxation_spec(parsed.relaxed))
        except ValueError as error:
            raise ApiError(str(error).replace("--relaxed", "edgespec.relaxed"), "edgespec.relaxed") from None
        params = SamplingParams(temperature=parsed.temperature, top_k=parsed.top_k, top_p=parsed.top_p,
                                seed=secrets.randbits(63) if parsed.seed is None else parsed.seed,
                                relaxation=relaxation, coupled=parsed.coupled, ignore_eos=parsed.ignore_eos,
                                logprobs=parsed.logprobs)
        max_tokens = self.generations.config.max_new_tokens if parsed.max_tokens is None else parsed.max_tokens
        return GenerationRequest(parsed.prompt, max_tokens, parsed.window, False, params,
                                 messages=parsed.messages, stop=parsed.stop, min_tokens=parsed.min_tokens)

    async def complete(self, request, kind: str):
        try:
            request_id = self._admit(request) or uuid.uuid4().hex
        except errors.EdgespecError as error:
            return self._error(api_error(error, kind))
        try:
            body = json.loads(await request.body())
        except (ValueError, UnicodeDecodeError) as error:
            return self._error(ApiError(f"the request body is not valid JSON: {error}"))
        try:
            parsed = parse_chat(body) if kind == "chat" else parse_completion(body)
            generation = self.generation_request(parsed)
        except ApiError as problem:
            return self._error(problem)
        session_id = uuid.uuid4().hex
        response_id = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{session_id}"
        if parsed.user:
            log.info("session %s: for user %r", session_id, parsed.user)
        run = _Run(run_generation(self.generations, session_id, request_id, _HttpCall(request).invocation_metadata(),
                                  generation), self.tasks)
        try:
            first = await _next_or_gone(run, request)   # a refused request is an HTTP status, not a stream
            if first is None:
                return self._gone(session_id)
            model = await self.model()
            if parsed.stream:
                return self._stream(run, first, parsed, response_id, model, request_id)
            return await self._whole(run, first, parsed, response_id, model, request, request_id, session_id)
        except errors.EdgespecError as error:
            return self._error(api_error(error, kind))
        except BaseException:
            run.cancel()
            raise

    def _gone(self, session_id: str):
        log.info("session %s: the HTTP client went away; generation cancelled", session_id)
        return Response(status_code=499)

    async def _whole(self, run: _Run, event, parsed: OpenAIRequest, response_id: str, model: str, request,
                     request_id: str, session_id: str):
        text, pieces, entries = _Text(), [], []
        while event is not _DONE:
            if isinstance(event, GenerationStats):
                pieces.append(text.end(event))
                logprobs = logprobs_body(parsed, entries, self.generations.tokenizer.token_text)
                return JSONResponse(completion_body(parsed, response_id, int(time.time()), model, "".join(pieces),
                                                    event, logprobs), headers={logs.REQUEST_ID_KEY: request_id})
            pieces.append(text.add(event))
            entries.extend(event.logprobs)
            event = await _next_or_gone(run, request)
            if event is None:
                return self._gone(session_id)
        raise errors.Unavailable("the generation ended without its statistics")

    def _stream(self, run: _Run, first, parsed: OpenAIRequest, response_id: str, model: str, request_id: str):
        from sse_starlette import EventSourceResponse

        created = int(time.time())

        def data(body: dict) -> dict:
            return {"data": json.dumps(body, ensure_ascii=False, separators=(",", ":"))}

        token_text = self.generations.tokenizer.token_text

        async def events():
            text, event, offset = _Text(), first, 0   # offset: completions' text_offset of the next token
            try:
                if parsed.kind == "chat":
                    yield data(chunk_body(parsed, response_id, created, model, "", first=True))
                while event is not _DONE:
                    if isinstance(event, GenerationStats):
                        tail = text.end(event)
                        if tail:
                            yield data(chunk_body(parsed, response_id, created, model, tail))
                        yield data(chunk_body(parsed, response_id, created, model, stats=event))
                        if parsed.include_usage:
                            yield data(usage_chunk_body(parsed, response_id, created, model, event))
                    else:
                        piece = text.add(event)
                        logprobs = logprobs_body(parsed, event.logprobs, token_text, offset) if event.logprobs else None
                        offset += sum(len(token_text(entry.token)) for entry in event.logprobs)
                        if piece or logprobs:
                            yield data(chunk_body(parsed, response_id, created, model, piece, logprobs=logprobs))
                    event = await run.next()
            except errors.EdgespecError as error:   # after the headers: an error event, as OpenAI sends one
                problem = api_error(error, parsed.kind)
                yield data(problem.body())
            finally:
                run.cancel()   # the client went away (or the stream ended): end the generation, close its sessions
            yield {"data": "[DONE]"}

        return EventSourceResponse(events(), sep="\n", ping=self.config.sse_ping_seconds,
                                   headers={logs.REQUEST_ID_KEY: request_id, "Cache-Control": "no-cache"})

    async def drain(self, seconds: float) -> None:
        """At shutdown, after the server stopped: let cancelled generations finish closing their sessions."""
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=seconds)


class _Server:
    """uvicorn without its own signal handling: the coordinator's shutdown stops it with the gRPC server."""

    def __init__(self, app, sock: socket.socket, security: ServerSecurity, grace_seconds: float):
        import uvicorn

        class Server(uvicorn.Server):
            def capture_signals(self):   # the coordinator handles SIGTERM/SIGINT for both servers
                import contextlib
                return contextlib.nullcontext()

        options: dict[str, Any] = {}
        if security.tls_cert:
            options.update(ssl_certfile=security.tls_cert, ssl_keyfile=security.tls_key)
            if security.tls_client_ca:
                options.update(ssl_ca_certs=security.tls_client_ca, ssl_cert_reqs=ssl.CERT_REQUIRED)
        self.config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="off", ws="none",
                                     timeout_graceful_shutdown=max(0.1, grace_seconds), **options)
        self.server = Server(self.config)
        self.sock = sock
        self.task: asyncio.Task | None = None

    def start(self) -> None:
        self.task = asyncio.ensure_future(self.server.serve(sockets=[self.sock]))

    async def stop(self) -> None:
        self.server.should_exit = True
        if self.task is not None:
            await self.task


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (0 = a free port); a used port is rpc.StartupError."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(512)
        sock.setblocking(False)
    except OSError as error:
        raise rpc.StartupError(f"cannot serve HTTP on {host}:{port}: {error.strerror or error}") from None
    return sock


async def serve(server: grpc.aio.Server, health: rpc.Health, address: str, grace_seconds: float,
                api: OpenAIApp, security: ServerSecurity) -> None:
    """rpc.serve for the gRPC server and the HTTP API together: both start before the coordinator says it
    listens, and SIGINT/SIGTERM drains both at once (``grace_seconds``), then lets cancelled generations
    close their sessions."""
    sock = bind(api.config.host, api.config.port)
    host, port = sock.getsockname()[:2]
    scheme = "https" if security.tls_cert else "http"
    http = _Server(api.app, sock, security, grace_seconds)
    await health.serving()
    await server.start()
    http.start()
    log.info("OpenAI-compatible API on %s://%s:%d/v1", scheme, host, port)
    log.info("coordinator listening on %s", address)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    stopped = asyncio.ensure_future(http.task) if http.task else None
    waits = [asyncio.ensure_future(stop.wait())] + ([stopped] if stopped else [])
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)   # a signal (or the HTTP server failing)
    log.info("coordinator shutting down (grace %.1fs)", grace_seconds)
    api.shutting_down = True
    await health.enter_graceful_shutdown()
    await asyncio.gather(server.stop(grace_seconds), http.stop(), return_exceptions=True)
    await api.drain(grace_seconds)
    log.info("coordinator stopped")
