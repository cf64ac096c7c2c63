"""Service lifecycle as an operator sees it: real processes, real sockets.

SIGTERM ends a service within --grace while health Watch streams are open (a coordinator watches every
verifier); a second service on a used port fails to start instead of sharing it; services without their
prepared models on a read-only cache say how to prepare them instead of dying with a traceback.
"""
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from edge_client.client import generate
from harness.cluster import LISTENING, REPO_ROOT, Service, start_service

GRACE = 2            # --grace of every service here, seconds
EXIT_SLACK = 10      # what a loaded 2-core machine may add to the grace before the process is gone
TINY = ["--threads", "1", "--grace", str(GRACE)]     # verifier and drafter
NO_UPSTREAM = ["--tokenizer", "bytes", "--verifier", "127.0.0.1:9", "--drafter", "127.0.0.1:9", "--grace", str(GRACE)]


def service_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT)}


class Watch:
    """A health Watch stream held open on a service (service "" = the server as a whole)."""

    def __init__(self, address: str):
        self.channel = grpc.insecure_channel(address)
        self.call = health_pb2_grpc.HealthStub(self.channel).Watch(health_pb2.HealthCheckRequest(service=""),
                                                                  timeout=600)
        first = next(self.call)    # the server answered: the stream is open on its side
        assert first.status == health_pb2.HealthCheckResponse.SERVING

    def close(self) -> None:
        self.call.cancel()
        self.channel.close()


def kill(service: Service) -> None:
    if service.process.poll() is None:
        service.process.kill()
        service.process.wait()


def seconds_to_exit_after_sigterm(service: Service, limit: float) -> float | None:
    """SIGTERM the service and wait up to ``limit`` seconds; None (and SIGKILL) if it is still alive."""
    began = time.monotonic()
    service.process.send_signal(signal.SIGTERM)
    try:
        service.process.wait(limit)
    except subprocess.TimeoutExpired:
        kill(service)
        return None
    return time.monotonic() - began


def one_generation(address: str) -> int:
    async def go():
        tokens = 0
        async for event in generate(address, "hello", 8, 2, chat=False, timeout_seconds=120):
            if event.HasField("chunk"):
                tokens += len(event.chunk.token_ids)
        return tokens
    return asyncio.run(go())


def test_every_service_exits_within_grace_after_sigterm_while_health_is_watched(tmp_path):
    # The verifier is watched by a real coordinator (its verifier pool follows health) and by us; before the
    # asyncio health servicer, the synchronous one kept a thread blocked per Watch and the process logged
    # "verifier stopped" and never exited.
    services, watches = [], []
    try:
        verifier = start_service("services.verifier", ["--model", "tiny:1", *TINY], tmp_path, "verifier")
        services.append(verifier)
        drafter = start_service("services.drafter", ["--model", "tiny:1~1", *TINY], tmp_path, "drafter")
        services.append(drafter)
        coordinator = start_service("services.coordinator", [
            "--tokenizer", "bytes", "--verifier", verifier.address, "--drafter", drafter.address, "--grace", str(GRACE)],
            tmp_path, "coordinator")
        services.append(coordinator)
        assert one_generation(coordinator.address) > 0     # streams and watches in use, as in production
        watches = [Watch(s.address) for s in services]
        for service in services:    # the verifier first: the coordinator still watches it
            took = seconds_to_exit_after_sigterm(service, GRACE + EXIT_SLACK)
            assert took is not None, (f"{service.name} still running {GRACE + EXIT_SLACK}s after SIGTERM "
                                      f"(--grace {GRACE}):\n{service.log_tail()}")
            assert service.process.returncode == 0, service.log_tail()
            assert f"{service.name} stopped" in service.log_tail(), service.log_tail()
    finally:
        for watch in watches:
            watch.close()
        for service in services:
            kill(service)


@pytest.mark.parametrize("module,args", [
    ("services.verifier", ["--model", "tiny:1", *TINY]),
    ("services.coordinator", NO_UPSTREAM),
], ids=["verifier", "coordinator"])
def test_a_second_service_on_a_used_port_fails_to_start(tmp_path, module, args):
    first = start_service(module, args, tmp_path, "first")
    port = first.address.rsplit(":", 1)[1]
    log_path = tmp_path / "second.log"
    second = None
    try:
        with open(log_path, "w") as sink:
            second = subprocess.Popen([sys.executable, "-m", module, "--host", "127.0.0.1", "--port", port, *args],
                                      stdout=sink, stderr=subprocess.STDOUT, cwd=REPO_ROOT, env=service_env())
        deadline = time.monotonic() + 300
        while second.poll() is None and time.monotonic() < deadline:
            assert not LISTENING.search(log_path.read_text()), f"second service shares port {port}:\n" + \
                log_path.read_text()
            time.sleep(0.2)
        out = log_path.read_text()
        assert second.poll() is not None, f"second service neither failed nor listened:\n{out}"
        assert second.returncode != 0, out
        assert f"127.0.0.1:{port}" in out and "already in use" in out, out
        assert "Traceback" not in out, out
        with grpc.insecure_channel(first.address) as channel:   # the first one serves on
            status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=30).status
        # A coordinator without a reachable verifier answers NOT_SERVING (services/coordinator/readiness.py):
        # an answer at all is what says the first one still holds its port.
        expected = health_pb2.HealthCheckResponse.SERVING if module == "services.verifier" \
            else health_pb2.HealthCheckResponse.NOT_SERVING
        assert status == expected
    finally:
        if second is not None and second.poll() is None:
            second.kill()
            second.wait()
        kill(first)


def read_only(directory: Path, argv: list[str]) -> list[str]:
    """``argv`` run so that ``directory`` is read-only to it, as a `:ro` volume is in a container."""
    if os.geteuid() != 0:
        directory.chmod(0o555)
        return argv
    # root writes through permission bits: a read-only bind mount in a private mount namespace instead.
    unshare = shutil.which("unshare")
    probe = subprocess.run([unshare, "-rm", "sh", "-c", 'mount --bind -o ro "$0" "$0" && ! touch "$0/x"',
                            str(directory)], capture_output=True) if unshare else None
    if probe is None or probe.returncode != 0:
        pytest.skip("running as root without unshare/mount: cannot make a read-only directory")
    return [unshare, "-rm", "sh", "-c", 'mount --bind -o ro "$0" "$0" && exec "$@"', str(directory), *argv]


@pytest.mark.parametrize("module,args", [
    ("services.verifier", ["--model", "target"]),
    ("services.drafter", ["--model", "draft"]),
    ("services.coordinator", ["--tokenizer", "draft", "--verifier", "127.0.0.1:9", "--drafter", "127.0.0.1:9"]),
], ids=["verifier", "drafter", "coordinator"])
def test_unprepared_models_on_a_read_only_cache_say_how_to_prepare_them(tmp_path, module, args):
    # compose mounts the model cache read-only; without the prepare profile run first it is empty.
    cache = tmp_path / "cache"
    cache.mkdir()
    argv = read_only(cache, [sys.executable, "-m", module, "--host", "127.0.0.1", "--port", "0", *args])
    try:
        out = subprocess.run(argv, capture_output=True, text=True, cwd=REPO_ROOT, timeout=300,
                             env={**service_env(), "EDGESPEC_CACHE": str(cache)})
    finally:
        cache.chmod(0o755)
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert "models are not prepared" in text and "--profile prepare" in text, text
    assert "Traceback" not in text, text
    assert list(cache.iterdir()) == []
