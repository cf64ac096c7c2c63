"""gRPC plumbing shared by the services: the error table, server setup, lifecycle.

Transport errors become domain errors (and back) here and nowhere else.
"""
from __future__ import annotations

import asyncio
import errno
import logging
import signal
import socket
from typing import Callable, Coroutine, Iterable, Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from edgespec import errors

log = logging.getLogger(__name__)

COMMITTED_POSITION_KEY = "committed-position"  # trailing metadata on ABORTED
RETRY_AFTER_KEY = "retry-after-ms"              # trailing metadata on RESOURCE_EXHAUSTED, when known

STATUS_OF: dict[type[errors.EdgespecError], grpc.StatusCode] = {
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    errors.Aborted: grpc.StatusCode.ABORTED,
    errors.ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
    errors.Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    errors.PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
}


def status_of(error: Exception) -> grpc.StatusCode:
    """The status for ``error``: its class's, else its nearest base class's (a backend's ContextFull is a
    ResourceExhausted), else UNKNOWN."""
    return next((STATUS_OF[cls] for cls in type(error).__mro__ if cls in STATUS_OF), grpc.StatusCode.UNKNOWN)


async def abort(context: grpc.aio.ServicerContext, error: errors.EdgespecError) -> None:
    """End the RPC with the status for ``error`` (raises)."""
    if isinstance(error, errors.Aborted):
        context.set_trailing_metadata(((COMMITTED_POSITION_KEY, str(error.committed_position)),))
    if isinstance(error, errors.ResourceExhausted) and error.retry_after_seconds is not None:
        context.set_trailing_metadata(((RETRY_AFTER_KEY, str(max(1, round(error.retry_after_seconds * 1000)))),))
    await context.abort(status_of(error), str(error))


def from_rpc_error(error: grpc.aio.AioRpcError, peer: str) -> errors.EdgespecError:
    """The domain error for a failed call to ``peer``."""
    code, detail = error.code(), f"{peer}: {error.details()}"
    if code == grpc.StatusCode.ABORTED:
        trailers = dict(error.trailing_metadata() or ())
        return errors.Aborted(detail, int(trailers.get(COMMITTED_POSITION_KEY, -1)))
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return errors.InvalidArgument("request", detail)
    if code == grpc.StatusCode.NOT_FOUND:
        return errors.NotFound(detail)
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return errors.FailedPrecondition(detail)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        hint = dict(error.trailing_metadata() or ()).get(RETRY_AFTER_KEY)
        return errors.ResourceExhausted(detail, int(hint) / 1000 if hint and hint.isdigit() else None)
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return errors.Unauthenticated(detail)
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return errors.PermissionDenied(detail)
    return errors.Unavailable(f"{detail} ({code.name})")


class StartupError(RuntimeError):
    """A service cannot start for a reason its message explains in full (a used port): one line, no traceback."""


class Health(health.aio.HealthServicer):
    """grpc.health.v1 for a grpc.aio server, knowing the services it reports SERVING once started.

    The asyncio servicer: a Watch stream is a coroutine that the server cancels when it stops. (The
    synchronous servicer parks a thread per Watch in a wait that nothing ends, and the process, which a
    coordinator's verifier pool always watches, never exits.)
    """

    def __init__(self, names: Sequence[str]):
        super().__init__()
        self.names = [*names, ""]

    async def serving(self) -> None:
        for name in self.names:
            await self.set(name, health_pb2.HealthCheckResponse.SERVING)


def create_server(host: str, port: int, register: Callable[[grpc.aio.Server], Iterable[str]],
                  max_message_bytes: int = 4 << 20, credentials: grpc.ServerCredentials | None = None,
                  interceptors: Sequence[grpc.aio.ServerInterceptor] = ()
                  ) -> tuple[grpc.aio.Server, int, Health]:
    """A grpc.aio server with standard health and reflection; returns (server, bound port, health).

    ``register`` adds the servicers and returns their full service names; serve() reports them SERVING
    (a caller starting the server itself awaits ``health.serving()``). Port 0 binds a free port (tests).
    With ``credentials`` the port speaks TLS only. The port is ours alone (no SO_REUSEPORT, which gRPC
    sets by default and which let a second service share a used port): a used port is a StartupError.
    """
    server = grpc.aio.server(interceptors=list(interceptors),
                             options=[("grpc.max_receive_message_length", max_message_bytes),
                                      ("grpc.max_send_message_length", max_message_bytes),
                                      ("grpc.so_reuseport", 0)])
    names = list(register(server))
    health_servicer = Health(names)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection([*names, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    try:
        if credentials is None:
            bound = server.add_insecure_port(f"{host}:{port}")
        else:
            bound = server.add_secure_port(f"{host}:{port}", credentials)
    except RuntimeError:   # grpcio raises "Failed to bind to address ..." (older versions returned 0)
        bound = 0
    if bound == 0:
        del server         # not started: let it go while the event loop still runs
        raise StartupError(f"cannot listen on {host}:{port}: {why_not_bindable(host, port)}")
    return server, bound, health_servicer


def why_not_bindable(host: str, port: int) -> str:
    """Why a TCP listener on host:port fails, found by trying one (gRPC's own error does not say)."""
    try:
        addresses = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as error:
        return f"cannot resolve {host!r} ({error})"
    for family, kind, proto, _, address in addresses:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as gRPC: TIME_WAIT is no conflict
                probe.bind(address)
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                return "address already in use (by another service?)"
            return error.strerror or str(error)
    return "gRPC could not bind it (GRPC_VERBOSITY=debug says more)"


async def serve(server: grpc.aio.Server, health_servicer: Health, what: str,
                address: str, grace_seconds: float, background: Coroutine | None = None) -> None:
    """Start, log the address, and run until SIGINT/SIGTERM; then drain gracefully.

    On a signal health turns NOT_SERVING (watchers hear it), new calls are refused, and calls in flight,
    health Watch streams included, get ``grace_seconds`` to finish before they are cancelled. ``background``
    (an engine's idle sweep) runs while the server does and is cancelled when it stops, however it stops.
    """
    task = asyncio.ensure_future(background) if background is not None else None
    try:
        await health_servicer.serving()
        await server.start()
        log.info("%s listening on %s", what, address)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("%s shutting down (grace %.1fs)", what, grace_seconds)
        await health_servicer.enter_graceful_shutdown()
        await server.stop(grace_seconds)
        log.info("%s stopped", what)
    finally:
        if task is not None:
            task.cancel()


def run(main_coro, what: str = "service", fatal: tuple[type[BaseException], ...] = ()) -> None:
    """Run a service's main coroutine on uvloop.

    A StartupError, or one of ``fatal`` (errors whose message tells the operator what to fix, e.g. models
    that are not prepared), ends the process with one error line and exit status 1 instead of a traceback.
    """
    import uvloop

    async def guarded() -> str | None:
        try:
            await main_coro
        except (StartupError, *fatal) as error:
            return str(error)   # only the text: the traceback's frames (a half-built server) go with the loop
        return None

    problem = uvloop.run(guarded())
    if problem is not None:
        log.error("%s cannot start: %s", what, problem)
        raise SystemExit(1)
