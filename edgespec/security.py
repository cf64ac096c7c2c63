"""Server-side security: TLS / mutual TLS, bearer-token identities, rate limits, session owners.

Every call except health and reflection (which probes and load balancers use)
passes the ``Guard`` interceptor: it finds the caller's identity (a bearer token
from ``--auth-tokens``, else the client certificate's common name under mutual
TLS, else "anonymous"), applies the per-identity rate limit, and makes the
identity visible to the servicer through ``current_identity()``. Servicers bind
each session to the identity that opened it with ``SessionOwners``.
"""
from __future__ import annotations

import contextvars
import hashlib
import inspect
import logging
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import grpc

from edgespec import errors, rpc

log = logging.getLogger(__name__)

ANONYMOUS = "anonymous"
OPEN_METHOD_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
_IDENTITY: contextvars.ContextVar[str] = contextvars.ContextVar("edgespec_identity", default=ANONYMOUS)


def current_identity() -> str:
    """The identity of the client whose call is being served."""
    return _IDENTITY.get()


@dataclass(frozen=True, slots=True)
class ServerSecurity:
    tls_cert: str | None = None         # PEM: serve TLS with this certificate chain ...
    tls_key: str | None = None          # ... and this private key
    tls_client_ca: str | None = None    # PEM: require client certificates signed by this CA (mutual TLS)
    auth_tokens: str | None = None      # file of "IDENTITY TOKEN" lines: calls need "authorization: Bearer TOKEN"
    max_sessions_per_client: int = 64   # open sessions (generations, for the coordinator) per identity
    rate_limit: float = 0.0             # calls per second per identity (0 = unlimited)
    rate_burst: int = 0                 # calls allowed at once (0 = twice the rate, at least 1)
    max_message_bytes: int = 4 << 20    # largest message received or sent

    def __post_init__(self):
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("TLS needs both --tls-cert and --tls-key")
        if self.tls_client_ca and not self.tls_cert:
            raise ValueError("--tls-client-ca (mutual TLS) needs --tls-cert and --tls-key")
        if self.max_sessions_per_client < 1 or self.rate_limit < 0 or self.rate_burst < 0:
            raise ValueError("--max-sessions-per-client must be >= 1; --rate-limit and --rate-burst >= 0")
        if self.max_message_bytes < 1024:
            raise ValueError("--max-message-bytes must be at least 1024")


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def load_tokens(path: str) -> dict[str, str]:
    """sha256(token) -> identity, from lines "IDENTITY TOKEN" ('#' starts a comment)."""
    table: dict[str, str] = {}
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            raise ValueError(f"{path}:{number}: expected 'IDENTITY TOKEN'")
        identity, token = parts
        digest = token_digest(token)
        if digest in table:
            raise ValueError(f"{path}:{number}: token of {identity!r} is already given to {table[digest]!r}")
        table[digest] = identity
    if not table:
        raise ValueError(f"{path}: no tokens")
    return table


def server_credentials(security: ServerSecurity) -> grpc.ServerCredentials | None:
    if not security.tls_cert:
        return None
    pair = (Path(security.tls_key).read_bytes(), Path(security.tls_cert).read_bytes())
    client_ca = Path(security.tls_client_ca).read_bytes() if security.tls_client_ca else None
    return grpc.ssl_server_credentials([pair], root_certificates=client_ca, require_client_auth=client_ca is not None)


class RateLimiter:
    """A token bucket per key: ``rate`` calls per second, ``burst`` at once."""

    MAX_KEYS = 100_000   # forget idle buckets past this many (a full bucket carries no state)

    def __init__(self, rate: float, burst: int, clock=time.monotonic):
        self.rate = rate
        self.burst = burst or max(1, int(2 * rate))
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}   # key -> (tokens, at)

    def take(self, key: str) -> float:
        """Spend one call; return 0 if allowed, else the seconds until one is."""
        now = self._clock()
        tokens, at = self._buckets.get(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.rate)
        if tokens < 1:
            self._buckets[key] = (tokens, now)
            return (1 - tokens) / self.rate
        if len(self._buckets) >= self.MAX_KEYS and key not in self._buckets:
            self._forget_full(now)
        self._buckets[key] = (tokens - 1, now)
        return 0.0

    def _forget_full(self, now: float) -> None:
        for key, (tokens, at) in list(self._buckets.items()):
            if tokens + (now - at) * self.rate >= self.burst:
                del self._buckets[key]


class SessionOwners:
    """Which identity opened each session. A session answers only to its owner, and
    an identity holds at most ``max_per_client`` sessions."""

    def __init__(self, max_per_client: int):
        self.max_per_client = max_per_client
        self._owner: dict[str, str] = {}
        self._count: Counter[str] = Counter()

    def claim(self, session_id: str, identity: str) -> bool:
        """Before opening (or re-opening) a session: reserve it for ``identity``.
        Returns whether the reservation is new (release it if the open then fails)."""
        owner = self._owner.get(session_id)
        if owner is not None:
            self.check(session_id, identity)
            return False
        if self._count[identity] >= self.max_per_client:
            raise errors.ResourceExhausted(f"client {identity!r} has {self._count[identity]} open sessions, the "
                                           f"limit is {self.max_per_client}: close one first")
        self._owner[session_id] = identity
        self._count[identity] += 1
        return True

    def check(self, session_id: str, identity: str) -> None:
        """Before any other use: only the owner may read, drive or close a session.
        An unknown session passes (the engine answers NOT_FOUND)."""
        owner = self._owner.get(session_id)
        if owner is not None and owner != identity:
            raise errors.PermissionDenied(f"session {session_id!r} belongs to another client")

    def release(self, session_id: str) -> None:
        owner = self._owner.pop(session_id, None)
        if owner is not None:
            self._count[owner] -= 1
            if not self._count[owner]:
                del self._count[owner]

    def open_sessions(self, identity: str) -> int:
        return self._count[identity]


class Guard(grpc.aio.ServerInterceptor):
    """Authenticate, rate-limit, refuse malformed messages, and set ``current_identity()``, for every
    call but health and reflection."""

    def __init__(self, tokens: dict[str, str] | None, mutual_tls: bool, limiter: RateLimiter | None):
        self.tokens = tokens
        self.mutual_tls = mutual_tls
        self.limiter = limiter

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(OPEN_METHOD_PREFIXES):
            return handler
        return _wrap(handler, self._admit)

    def identify(self, context: grpc.aio.ServicerContext) -> str:
        if self.tokens is not None:
            values = [v for k, v in context.invocation_metadata() or () if k == "authorization"]
            if len(values) != 1 or not isinstance(values[0], str) or not values[0].startswith("Bearer "):
                raise errors.Unauthenticated("this server needs a bearer token: send 'authorization: Bearer <token>'")
            identity = self.tokens.get(token_digest(values[0][len("Bearer "):].strip()))
            if identity is None:
                raise errors.Unauthenticated("unknown bearer token")
            return identity
        if self.mutual_tls:
            names = (context.auth_context() or {}).get("x509_common_name") or [b"?"]
            return "cert:" + names[0].decode(errors="replace")
        return ANONYMOUS

    async def _admit(self, context: grpc.aio.ServicerContext) -> None:
        try:
            identity = self.identify(context)
            if self.limiter is not None:
                key = identity if identity != ANONYMOUS else f"{ANONYMOUS}@{_peer_host(context.peer())}"
                wait = self.limiter.take(key)
                if wait:
                    raise errors.ResourceExhausted(f"rate limit of {self.limiter.rate:g} calls/s for {identity!r}: "
                                                   f"retry in {wait:.2f}s", retry_after_seconds=wait)
        except errors.EdgespecError as error:
            log.info("refused a call from %s: %s", context.peer(), error)
            await rpc.abort(context, error)
        _IDENTITY.set(identity)


def _peer_host(peer: str) -> str:
    """'ipv4:10.0.0.1:5000' -> '10.0.0.1' (the port changes per connection)."""
    return peer.rsplit(":", 1)[0] if peer.count(":") >= 2 else peer


class _Malformed:
    """What a request that is not a valid protobuf message deserializes to (see ``_wrap``)."""

    def __init__(self, error: Exception):
        self.problem = str(error) or type(error).__name__


def _tolerant(deserializer):
    def parse(data: bytes):
        try:
            return deserializer(data) if deserializer else data
        except Exception as error:   # noqa: BLE001 - any parse failure is the caller's malformed message
            return _Malformed(error)
    return parse


async def _refuse_malformed(request, context) -> None:
    if isinstance(request, _Malformed):
        await rpc.abort(context, errors.InvalidArgument("request", f"not a valid message: {request.problem}"))


async def _checked(requests, context):
    async for request in requests:
        await _refuse_malformed(request, context)
        yield request


def _wrap(handler: grpc.RpcMethodHandler, admit) -> grpc.RpcMethodHandler:
    """The same handler, with ``await admit(context)`` first (it aborts or sets the identity), and
    INVALID_ARGUMENT for a request that does not parse (grpc itself answers INTERNAL or UNKNOWN)."""
    streaming_in = handler.request_streaming

    async def prepare(request, context):
        await admit(context)
        if streaming_in:
            return _checked(request, context)
        await _refuse_malformed(request, context)
        return request

    if handler.unary_unary or handler.stream_unary:
        inner = handler.unary_unary or handler.stream_unary

        async def unary_response(request, context):
            return await inner(await prepare(request, context), context)
        behaviour = unary_response
    else:
        inner = handler.unary_stream or handler.stream_stream
        if not inspect.isasyncgenfunction(inner):
            raise TypeError(f"streaming handler {inner!r} must be an async generator")

        async def stream_response(request, context):
            async for response in inner(await prepare(request, context), context):
                yield response
        behaviour = stream_response
    make = {(False, False): grpc.unary_unary_rpc_method_handler, (False, True): grpc.unary_stream_rpc_method_handler,
            (True, False): grpc.stream_unary_rpc_method_handler, (True, True): grpc.stream_stream_rpc_method_handler}
    return make[(handler.request_streaming, handler.response_streaming)](
        behaviour, request_deserializer=_tolerant(handler.request_deserializer),
        response_serializer=handler.response_serializer)


def server_parts(security: ServerSecurity) -> tuple[grpc.ServerCredentials | None, list[Guard]]:
    """(credentials, interceptors) for rpc.create_server; reads the certificate and token files."""
    tokens = load_tokens(security.auth_tokens) if security.auth_tokens else None
    limiter = RateLimiter(security.rate_limit, security.rate_burst) if security.rate_limit else None
    return server_credentials(security), [Guard(tokens, security.tls_client_ca is not None, limiter)]
