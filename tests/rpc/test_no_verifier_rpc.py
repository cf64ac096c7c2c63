"""No verifier reachable: what the coordinator's health, its log and the `edgespec generate` CLI do.

Real processes on loopback: the verifier is stopped (SIGTERM) and started again on
its port while a coordinator keeps running.
"""
import asyncio
import subprocess
import sys
import time

import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from harness.cluster import REPO_ROOT, LocalCluster, stop_service
from edgespec.net.transport import ClientSecurity, open_channel
from edgespec.v1 import coordinator_pb2

COORDINATOR = coordinator_pb2.DESCRIPTOR.services_by_name["Coordinator"].full_name
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(tmp_path_factory.mktemp("logs"), verifier_args=["--model", "tiny:7"],
                      drafter_args=["--model", "tiny:7~1"], coordinator_args=["--tokenizer", "bytes"]) as running:
        yield running


def health_of(address: str) -> dict[str, int]:
    async def go():
        async with open_channel(address, ClientSecurity()) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            return {name: (await stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=10)).status
                    for name in ("", COORDINATOR)}
    return asyncio.run(go())


def wait_for_health(address: str, status: int, seconds: float = 30) -> float:
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        if set(health_of(address).values()) == {status}:
            return time.monotonic() - started
        time.sleep(0.2)
    raise AssertionError(f"coordinator health is {health_of(address)}, not {status} after {seconds}s")


def warnings_in(log: str) -> int:
    return sum(" WARNING " in line or '"WARNING"' in line for line in log.splitlines())


def test_health_follows_the_verifiers_and_the_cli_says_it_is_waiting_then_gives_up(cluster):
    coordinator = cluster.coordinator.address
    assert health_of(coordinator) == {"": SERVING, COORDINATOR: SERVING}
    stop_service(cluster.verifier)
    assert wait_for_health(coordinator, NOT_SERVING) < 10           # the health watch says so at once

    log_before = cluster.coordinator.log_path.read_text()
    started = time.monotonic()
    cli = subprocess.run([sys.executable, "-m", "edge_client.cli", "generate", "hi", "--raw",
                          "--coordinator", coordinator, "--max-new-tokens", "4"],
                         capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    seconds = time.monotonic() - started
    assert cli.returncode != 0
    assert seconds < 60, seconds                                      # gives up within a minute ...
    lines = cli.stderr.strip().splitlines()
    assert "waiting" in lines[0].lower() and "UNAVAILABLE" in lines[0], cli.stderr   # ... says so at once ...
    assert 2 <= sum("waiting" in line.lower() for line in lines) <= 8, cli.stderr   # ... then now and then
    assert "UNAVAILABLE" in lines[-1] and cli.stdout.strip() == "", cli.stderr
    # The coordinator answered every try at once; with the client backing off it logged a handful of
    # warnings, not five a second.
    warnings = warnings_in(cluster.coordinator.log_path.read_text()[len(log_before):])
    assert warnings <= 6, warnings

    cluster.restart(cluster.verifier)
    assert wait_for_health(coordinator, SERVING, seconds=60) < 60    # SERVING again once a verifier is
