"""The coordinator's own gRPC health follows its verifiers.

A coordinator without a serving verifier can only answer UNAVAILABLE (with the
default --on-verifier-loss fail), so it says NOT_SERVING — for its Coordinator
service and for "" — while no verifier of its pool is SERVING (per the health
watch it keeps on each), and SERVING again as soon as one is. Load balancers and
readiness probes then stop sending it work it cannot do. With --on-verifier-loss
draft-only it still serves (flagged unverified text), so it stays SERVING.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Sequence

from grpc_health.v1 import health_pb2

from edgespec.loop.pool import VerifierPool

log = logging.getLogger("edgespec.coordinator")

REASSERT_SECONDS = 1.0   # the status is set again this often (a repeated set changes nothing for watchers)


async def follow_verifier_health(health, names: Sequence[str], pool: VerifierPool, changed: asyncio.Event) -> None:
    """Keep ``health`` (the server's asyncio health servicer) NOT_SERVING for ``names`` while no verifier in
    ``pool`` is serving, SERVING otherwise. Wakes on ``changed`` (set on every health-watch report) and at
    least every REASSERT_SECONDS, so the status also holds over the server's own start (which sets every
    name SERVING). Runs until cancelled."""
    last: bool | None = None
    while True:
        changed.clear()
        serving = any(endpoint.serving for endpoint in pool.endpoints.values())
        if serving != last and last is not None:
            if serving:
                log.info("a verifier is serving again: coordinator health SERVING")
            else:
                log.warning("no verifier is serving (%s): coordinator health NOT_SERVING until one is",
                            ", ".join(pool.endpoints))
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in names:
            await health.set(name, status)    # the asyncio servicer: a coroutine; ignored once shutting down
        last = serving
        try:
            await asyncio.wait_for(changed.wait(), REASSERT_SECONDS)
        except asyncio.TimeoutError:
            pass
