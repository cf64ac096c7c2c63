"""Server-side security: TLS / mutual TLS, bearer-token identities, rate limits, session owners.

Every call except health and reflection (which probes and load balancers use)
passes the ``Guard`` interceptor: it finds the caller's identity (a bearer token
from ``--auth-tokens``, else the client certificate's common name under mutual
TLS, else "anonymous"), applies the per-identity rate limit, and makes the
identity visible to the servicer through ``current_identity()``. It is also the
one place of the per-call plumbing every servicer shares: it binds the call's log
ids (the request's session id, the caller's request id), refuses a request for a
session another identity owns (``SessionOwners``: servicers claim a session when
they open it and release it when they close it), and ends the call with the status
of any ``EdgespecError`` the servicer raises (edgespec.net.rpc's table, with its
trailing metadata). Servicers only raise.

Per-client limits are for end users; a coordinator is infrastructure. Identities
listed in ``--service-identities`` are services: their sessions count against
``--max-sessions-per-service`` (one budget per service identity), and they may
name the end user they call for in the ``x-edgespec-end-user`` metadata, whose
own per-client limit then applies too. The rule against spoofing: that header is
read only from a caller authenticated as a listed service (from anyone else it is
ignored), the name is counted under that service ("alice via coordinator", never
as "alice" herself), and it changes only quotas, never ownership: a session still
answers only to the authenticated identity that opened it. Without authentication
every caller is "anonymous", which is listed by default: an unauthenticated
deployment trusts its network, and a per-client limit on one shared identity
would only cap the whole service (the 65th generation through a coordinator).
"""
from __future__ import annotations

import contextvars
import hashlib
import inspect
import logging
import time
import urllib.parse
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import grpc

from edgespec import errors
from edgespec.net import rpc
from edgespec.observe import logs

log = logging.getLogger(__name__)

ANONYMOUS = "anonymous"
OPEN_METHOD_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
END_USER_KEY = "x-edgespec-end-user"   # metadata: the end user a service identity calls for
MAX_END_USER_CHARS = 256


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a call is from, as far as limits go."""
    identity: str                  # the authenticated identity (or "anonymous"): owns what it opens
    service: bool = False          # listed in --service-identities: infrastructure, with the service budget
    end_user: str | None = None    # the end user a service calls for (END_USER_KEY), vouched for by it

    def end_user_name(self) -> str | None:
        """The end user whose per-client limit this call counts against; None when a service calls for itself."""
        return self.end_user if self.service else self.identity


_IDENTITY: contextvars.ContextVar[str] = contextvars.ContextVar("edgespec_identity", default=ANONYMOUS)
_CALLER: contextvars.ContextVar[Caller | None] = contextvars.ContextVar("edgespec_caller", default=None)


def current_identity() -> str:
    """The identity of the client whose call is being served."""
    return _IDENTITY.get()


def current_caller() -> Caller:
    """The caller of the call being served: identity, whether it is a service, and the end user it names."""
    return _CALLER.get() or Caller(_IDENTITY.get())


def end_user_metadata() -> list[tuple[str, str]]:
    """For a service's calls upstream (the coordinator's to the drafter and verifiers) while it serves a call:
    the end user whose per-client limit that call counts against, if any. Nothing outside a served call."""
    caller = _CALLER.get()
    name = caller.end_user_name() if caller is not None else None
    if not name:
        return []
    if not (name.isascii() and name.isprintable()):   # gRPC metadata values are printable ASCII
        name = urllib.parse.quote(name, safe="")
    return [(END_USER_KEY, name[:MAX_END_USER_CHARS])]


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
    service_identities: tuple[str, ...] = (ANONYMOUS,)   # infrastructure callers (a coordinator): see the module doc
    max_sessions_per_service: int = 4096  # open sessions per service identity, all its end users together

    def __post_init__(self):
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("TLS needs both --tls-cert and --tls-key")
        if self.tls_client_ca and not self.tls_cert:
            raise ValueError("--tls-client-ca (mutual TLS) needs --tls-cert and --tls-key")
        if self.max_sessions_per_client < 1 or self.rate_limit < 0 or self.rate_burst < 0:
            raise ValueError("--max-sessions-per-client must be >= 1; --rate-limit and --rate-burst >= 0")
        if self.max_sessions_per_service < 1:
            raise ValueError("--max-sessions-per-service must be >= 1")
        if self.max_message_bytes < 1024:
            raise ValueError("--max-message-bytes must be at least 1024")


def parse_identities(text: str) -> tuple[str, ...]:
    """'coordinator, cert:edge-gw' -> ('coordinator', 'cert:edge-gw'); '' -> ()."""
    return tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))


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
    an end user holds at most ``max_per_client`` sessions; a service identity holds at
    most ``max_per_service``, all the end users it names together (see ``Caller``)."""

    SERVICE_RETRY_SECONDS = 1.0   # retry hint when a service's budget is full: its sessions end all the time

    def __init__(self, max_per_client: int, max_per_service: int = 4096):
        self.max_per_client = max_per_client
        self.max_per_service = max_per_service
        self._owner: dict[str, str] = {}
        self._quotas: dict[str, tuple[tuple[str, ...], ...]] = {}   # session -> the quota keys it counts against
        self._count: Counter[tuple[str, ...]] = Counter()          # quota key -> open sessions
        self._owned: Counter[str] = Counter()                       # owner identity -> open sessions

    @classmethod
    def for_security(cls, security) -> "SessionOwners":
        """The limits a ServerSecurity configures."""
        return cls(security.max_sessions_per_client, security.max_sessions_per_service)

    def claim(self, session_id: str, caller: Caller | str | None = None) -> bool:
        """Before opening (or re-opening) a session: reserve it for ``caller`` (a Caller, a bare identity: an
        end user, or by default the caller of the call being served). Returns whether the reservation is new
        (release it if the open then fails: see ``opening``)."""
        caller = current_caller() if caller is None else caller if isinstance(caller, Caller) else Caller(caller)
        owner = self._owner.get(session_id)
        if owner is not None:
            self.check(session_id, caller.identity)
            return False
        quotas = self._quota_keys(caller)
        for key in quotas:
            self._check_quota(key)
        self._owner[session_id] = caller.identity
        self._quotas[session_id] = quotas
        self._owned[caller.identity] += 1
        for key in quotas:
            self._count[key] += 1
        return True

    @staticmethod
    def _quota_keys(caller: Caller) -> tuple[tuple[str, ...], ...]:
        if not caller.service:
            return (("client", caller.identity),)
        if caller.end_user is None:
            return (("service", caller.identity),)
        return (("service", caller.identity), ("via", caller.identity, caller.end_user))

    def _check_quota(self, key: tuple[str, ...]) -> None:
        held = self._count[key]
        if key[0] == "service":
            if held >= self.max_per_service:
                raise errors.ResourceExhausted(
                    f"service {key[1]!r} has {held} open sessions, the limit is {self.max_per_service} "
                    f"(--max-sessions-per-service)", retry_after_seconds=self.SERVICE_RETRY_SECONDS)
        elif held >= self.max_per_client:
            who = f"client {key[1]!r}" if key[0] == "client" else f"client {key[2]!r} of {key[1]!r}"
            raise errors.ResourceExhausted(f"{who} has {held} open sessions, the limit is {self.max_per_client} "
                                           f"(--max-sessions-per-client): close one first")

    @contextmanager
    def opening(self, session_id: str, caller: Caller | str | None = None) -> Iterator[bool]:
        """Claim ``session_id`` for the open (or re-open) inside the block; a new claim is released again
        when the block raises an EdgespecError (the open failed: there is no session to own)."""
        new = self.claim(session_id, caller)
        try:
            yield new
        except errors.EdgespecError:
            if new:
                self.release(session_id)
            raise

    def check(self, session_id: str, identity: str) -> None:
        """Before any other use: only the owner may read, drive or close a session.
        An unknown session passes (the engine answers NOT_FOUND)."""
        owner = self._owner.get(session_id)
        if owner is not None and owner != identity:
            raise errors.PermissionDenied(f"session {session_id!r} belongs to another client")

    def release(self, session_id: str) -> None:
        owner = self._owner.pop(session_id, None)
        if owner is None:
            return
        for counter, key in ((self._owned, owner), *((self._count, k) for k in self._quotas.pop(session_id, ()))):
            counter[key] -= 1
            if not counter[key]:
                del counter[key]

    def open_sessions(self, identity: str) -> int:
        """Sessions owned (opened) by ``identity``."""
        return self._owned[identity]


class Guard(grpc.aio.ServerInterceptor):
    """For every call but health and reflection: authenticate, rate-limit and set ``current_identity()``;
    refuse malformed messages; bind the log ids; refuse a request naming a session another identity owns;
    and end the call with the status of an EdgespecError the servicer raises (see the module doc)."""

    MAX_IGNORED_LOGGED = 1000   # identities whose ignored END_USER_KEY was logged (once each)

    def __init__(self, tokens: dict[str, str] | None, mutual_tls: bool, limiter: RateLimiter | None,
                 services: frozenset[str] = frozenset({ANONYMOUS}), owners: SessionOwners | None = None):
        self.tokens = tokens
        self.mutual_tls = mutual_tls
        self.limiter = limiter
        self.services = frozenset(services)   # identities trusted as infrastructure (may name an end user)
        self.owners = owners                  # the servicer's session owners (None: no session is checked)
        self._ignored: set[str] = set()

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(OPEN_METHOD_PREFIXES):
            return handler
        return _wrap(handler, handler_call_details.method, self._admit, self._accept)

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

    def _admit(self, context: grpc.aio.ServicerContext) -> str:
        """Identify and rate-limit the caller, set the identity; return the caller's request id (raises)."""
        try:
            identity = self.identify(context)
            if self.limiter is not None:
                key = identity if identity != ANONYMOUS else f"{ANONYMOUS}@{_peer_host(context.peer())}"
                wait = self.limiter.take(key)
                if wait:
                    raise errors.ResourceExhausted(f"rate limit of {self.limiter.rate:g} calls/s for {identity!r}: "
                                                   f"retry in {wait:.2f}s", retry_after_seconds=wait)
            caller = self.caller(identity, context)
        except errors.EdgespecError as error:
            log.info("refused a call from %s: %s", context.peer(), error)
            raise
        _IDENTITY.set(identity)
        _CALLER.set(caller)
        return logs.request_id_from(context.invocation_metadata())

    def _accept(self, request, request_id: str) -> None:
        """For the request (or each request of a stream): refuse a malformed one, bind the log ids, and
        only let the owner use a session (an unknown one passes: its servicer answers NOT_FOUND; an open
        claims it there)."""
        if isinstance(request, _Malformed):
            raise errors.InvalidArgument("request", f"not a valid message: {request.problem}")
        session_id = getattr(request, "session_id", "")
        logs.bind(session_id, request_id)
        if session_id and self.owners is not None:
            self.owners.check(session_id, _IDENTITY.get())

    def caller(self, identity: str, context: grpc.aio.ServicerContext) -> Caller:
        """The Caller: a listed service may name its end user; anyone else's END_USER_KEY is ignored."""
        values = [v for k, v in context.invocation_metadata() or () if k == END_USER_KEY]
        if identity not in self.services:
            if values and identity not in self._ignored and len(self._ignored) < self.MAX_IGNORED_LOGGED:
                self._ignored.add(identity)
                log.info("ignoring %s metadata from %r: not one of the --service-identities", END_USER_KEY, identity)
            return Caller(identity)
        if not values:
            return Caller(identity, service=True)
        name = values[0]
        if (len(values) != 1 or not isinstance(name, str) or not 0 < len(name) <= MAX_END_USER_CHARS
                or not name.isprintable()):
            raise errors.InvalidArgument(END_USER_KEY, f"must be one printable name of 1..{MAX_END_USER_CHARS} "
                                         f"characters")
        return Caller(identity, service=True, end_user=name)


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


def _wrap(handler: grpc.RpcMethodHandler, method: str, admit, accept) -> grpc.RpcMethodHandler:
    """The same handler, run as ``admit(context)`` (it raises, or sets the identity and returns the
    request id), ``accept(request, request_id)`` for the request or each request of a stream (INVALID_ARGUMENT
    for one that does not parse, where grpc itself answers INTERNAL or UNKNOWN), then the servicer's method.
    An EdgespecError raised by any of them ends the call with its status (rpc.abort)."""
    streaming_in = handler.request_streaming

    async def each(requests, request_id: str):
        async for request in requests:
            accept(request, request_id)
            yield request

    def prepare(request, context):
        request_id = admit(context)
        if streaming_in:
            logs.bind("", request_id)
            return each(request, request_id)
        accept(request, request_id)
        return request

    async def end(context, error: errors.EdgespecError):
        log.debug("%s: %s: %s", method, rpc.status_of(error).name, error)
        await rpc.abort(context, error)

    if handler.unary_unary or handler.stream_unary:
        inner = handler.unary_unary or handler.stream_unary

        async def unary_response(request, context):
            try:
                return await inner(prepare(request, context), context)
            except errors.EdgespecError as error:
                await end(context, error)
        behaviour = unary_response
    else:
        inner = handler.unary_stream or handler.stream_stream
        if not inspect.isasyncgenfunction(inner):
            raise TypeError(f"streaming handler {inner!r} must be an async generator")

        async def stream_response(request, context):
            try:
                async for response in inner(prepare(request, context), context):
                    yield response
            except errors.EdgespecError as error:
                await end(context, error)
        behaviour = stream_response
    make = {(False, False): grpc.unary_unary_rpc_method_handler, (False, True): grpc.unary_stream_rpc_method_handler,
            (True, False): grpc.stream_unary_rpc_method_handler, (True, True): grpc.stream_stream_rpc_method_handler}
    return make[(handler.request_streaming, handler.response_streaming)](
        behaviour, request_deserializer=_tolerant(handler.request_deserializer),
        response_serializer=handler.response_serializer)


def server_parts(security: ServerSecurity, owners: SessionOwners | None = None
                 ) -> tuple[grpc.ServerCredentials | None, list[Guard]]:
    """(credentials, interceptors) for rpc.create_server; reads the certificate and token files. ``owners``:
    the servicer's SessionOwners, which the Guard checks every request naming a session against."""
    tokens = load_tokens(security.auth_tokens) if security.auth_tokens else None
    limiter = RateLimiter(security.rate_limit, security.rate_burst) if security.rate_limit else None
    return server_credentials(security), [Guard(tokens, security.tls_client_ca is not None, limiter,
                                                frozenset(security.service_identities), owners)]
