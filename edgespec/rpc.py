"""gRPC plumbing shared by the services: the error table, server setup, lifecycle.

Transport errors become domain errors (and back) here and nowhere else.
"""
from __future__ import annotations

import asyncio
import logging
import signal
from typing import Callable, Iterable, Sequence

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
    errors.Aborted: grpc.StatusCode.ABORTED,
    errors.ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
    errors.Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    errors.PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
}


async def abort(context: grpc.aio.ServicerContext, error: errors.EdgespecError) -> None:
    """End the RPC with the status for ``error`` (raises)."""
    if isinstance(error, errors.Aborted):
        context.set_trailing_metadata(((COMMITTED_POSITION_KEY, str(error.committed_position)),))
    if isinstance(error, errors.ResourceExhausted) and error.retry_after_seconds is not None:
        context.set_trailing_metadata(((RETRY_AFTER_KEY, str(max(1, round(error.retry_after_seconds * 1000)))),))
    await context.abort(STATUS_OF.get(type(error), grpc.StatusCode.UNKNOWN), str(error))


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
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        hint = dict(error.trailing_metadata() or ()).get(RETRY_AFTER_KEY)
        return errors.ResourceExhausted(detail, int(hint) / 1000 if hint and hint.isdigit() else None)
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return errors.Unauthenticated(detail)
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return errors.PermissionDenied(detail)
    return errors.Unavailable(f"{detail} ({code.name})")


def create_server(host: str, port: int, register: Callable[[grpc.aio.Server], Iterable[str]],
                  max_message_bytes: int = 4 << 20, credentials: grpc.ServerCredentials | None = None,
                  interceptors: Sequence[grpc.aio.ServerInterceptor] = ()
                  ) -> tuple[grpc.aio.Server, int, health.HealthServicer]:
    """A grpc.aio server with standard health and reflection; returns (server, bound port, health).

    ``register`` adds the servicers and returns their full service names.
    Port 0 binds a free port (tests). With ``credentials`` the port speaks TLS only.
    """
    server = grpc.aio.server(interceptors=list(interceptors),
                             options=[("grpc.max_receive_message_length", max_message_bytes),
                                      ("grpc.max_send_message_length", max_message_bytes)])
    names = list(register(server))
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in [*names, ""]:
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection([*names, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    if credentials is None:
        bound = server.add_insecure_port(f"{host}:{port}")
    else:
        bound = server.add_secure_port(f"{host}:{port}", credentials)
    if bound == 0:
        raise OSError(f"could not bind {host}:{port}")
    return server, bound, health_servicer


async def serve(server: grpc.aio.Server, health_servicer: health.HealthServicer, what: str,
                address: str, grace_seconds: float) -> None:
    """Start, log the address, and run until SIGINT/SIGTERM; then drain gracefully."""
    await server.start()
    log.info("%s listening on %s", what, address)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("%s shutting down (grace %.1fs)", what, grace_seconds)
    health_servicer.enter_graceful_shutdown()
    await server.stop(grace_seconds)
    log.info("%s stopped", what)


def run(main_coro) -> None:
    """Run a service's main coroutine on uvloop."""
    import uvloop

    uvloop.run(main_coro)
