"""The WAN-emulation proxy really delays bytes on loopback sockets, and never loses or reorders them."""
import asyncio
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health, health_pb2_grpc

from harness.cluster import REPO_ROOT
from harness.link import (DelayProxy, EchoServer, LinkProfile, grpc_health_rtt_ms, measure_rtt,
                                recv_exactly, split_address)

MB = 1_000_000


@pytest.fixture
def echo():
    with EchoServer() as server:
        yield server


def random_bytes(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


def echo_all(address: str, pieces: list[bytes], gap_s: float = 0.0) -> tuple[bytes, float]:
    """Send ``pieces`` (``gap_s`` apart), then half-close; return everything echoed until EOF and the seconds taken."""
    with socket.create_connection(split_address(address), timeout=10) as sock:
        def send() -> None:
            for piece in pieces:
                sock.sendall(piece)
                time.sleep(gap_s)
            sock.shutdown(socket.SHUT_WR)

        start = time.perf_counter()
        sender = threading.Thread(target=send)
        sender.start()
        received = []
        while chunk := sock.recv(65536):
            received.append(chunk)
        elapsed = time.perf_counter() - start
        sender.join()
    return b"".join(received), elapsed


def wait_for(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        time.sleep(0.01)


def test_megabyte_crosses_intact_both_ways_and_close_propagates(echo):
    data = random_bytes(MB)
    with DelayProxy(echo.address) as proxy:
        echoed, _ = echo_all(proxy.address, [data])
        assert echoed == data
        assert proxy.bytes_forwarded == {"up": MB, "down": MB}
        wait_for(lambda: proxy.connections == 0)


def test_added_rtt_is_what_round_trips_measure(echo):
    with DelayProxy(echo.address, LinkProfile(rtt_ms=40)) as proxy:
        rtts = measure_rtt(proxy.address, 10)
    assert min(rtts) >= 40
    assert statistics.median(rtts) < 40 + 25


def test_set_profile_changes_the_measured_rtt(echo):
    with DelayProxy(echo.address) as proxy:
        assert statistics.median(measure_rtt(proxy.address, 10)) < 10
        proxy.set_profile(LinkProfile(rtt_ms=40))
        assert min(measure_rtt(proxy.address, 5)) >= 40
        proxy.set_profile(LinkProfile())
        assert statistics.median(measure_rtt(proxy.address, 10)) < 10


def test_jitter_spreads_rtts_but_never_reorders_bytes(echo):
    numbered = [i.to_bytes(4, "big") * 25 for i in range(100)]   # 100 chunks with independent jitter
    with DelayProxy(echo.address, LinkProfile(rtt_ms=10, jitter_ms=10, seed=1)) as proxy:
        rtts = measure_rtt(proxy.address, 20)
        echoed, _ = echo_all(proxy.address, numbered, gap_s=0.001)
    assert min(rtts) >= 10
    assert statistics.stdev(rtts) > 2
    assert echoed == b"".join(numbered)


def test_rate_limit_paces_a_megabyte_at_8_mbit_to_one_second(echo):
    data = random_bytes(MB, seed=2)
    with DelayProxy(echo.address, LinkProfile(rate_mbit=8)) as proxy:
        echoed, seconds = echo_all(proxy.address, [data])
    assert echoed == data
    # Up and down are serialized concurrently, so the echo takes about one transfer time, not two.
    assert 0.8 <= seconds <= 1.6


def test_loss_delays_round_trips_by_an_rto_reproducibly_and_loses_no_byte(echo):
    def late_round_trips() -> list[bool]:
        with DelayProxy(echo.address, LinkProfile(loss=0.5, seed=3)) as proxy:
            rtts = measure_rtt(proxy.address, 6)   # raises if an echo differs
        assert all(rtt >= 200 for rtt in rtts if rtt >= 150)   # late means at least one RTO
        return [rtt >= 150 for rtt in rtts]

    late = late_round_trips()
    assert any(late) and not all(late)
    assert late_round_trips() == late

    data = random_bytes(200_000, seed=4)
    with DelayProxy(echo.address, LinkProfile(loss=0.5, seed=5)) as proxy:
        echoed, seconds = echo_all(proxy.address, [data])
    assert echoed == data
    assert seconds >= 0.2


def test_partition_holds_bytes_then_delivers_them_in_order(echo):
    data = random_bytes(10_000, seed=6)
    with DelayProxy(echo.address) as proxy, socket.create_connection(split_address(proxy.address), 10) as sock:
        sock.sendall(b"warm")
        assert recv_exactly(sock, 4) == b"warm"
        proxy.partition(0.5)
        start = time.perf_counter()
        sock.sendall(data)
        echoed = recv_exactly(sock, len(data))
        seconds = time.perf_counter() - start
        assert echoed == data
        assert 0.45 <= seconds < 1.0
        assert statistics.median(measure_rtt(proxy.address, 5)) < 10


def test_reset_connections_sends_rst_and_new_connections_work(echo):
    with DelayProxy(echo.address) as proxy, socket.create_connection(split_address(proxy.address), 10) as sock:
        sock.sendall(b"ping")
        assert recv_exactly(sock, 4) == b"ping"
        assert proxy.connections == 1
        assert proxy.reset_connections() == 1
        assert proxy.connections == 0
        with pytest.raises(ConnectionResetError):
            sock.recv(1)
        assert len(measure_rtt(proxy.address, 3)) == 3


def test_refused_upstream_resets_the_client():
    with socket.socket() as placeholder:
        placeholder.bind(("127.0.0.1", 0))
        closed_port = placeholder.getsockname()[1]
    with DelayProxy(f"127.0.0.1:{closed_port}") as proxy:
        # The RST can reach the client before its connect() returns (a descheduled thread on a busy
        # machine): then connect() itself reports the reset. Either way the client sees a reset.
        with pytest.raises(ConnectionResetError):
            with socket.create_connection(split_address(proxy.address), 10) as sock:
                sock.recv(1)


def test_grpc_health_checks_through_the_proxy_see_the_rtt():
    async def check_through_proxy() -> list[float]:
        server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            with DelayProxy(f"127.0.0.1:{port}", LinkProfile(rtt_ms=30)) as proxy:
                return await grpc_health_rtt_ms(proxy.address, 5)
        finally:
            await server.stop(None)

    rtts = asyncio.run(check_through_proxy())
    assert min(rtts) >= 30
    assert statistics.median(rtts) < 30 + 40


@pytest.mark.parametrize("fields", [{"rtt_ms": -1}, {"jitter_ms": float("nan")}, {"rate_mbit": -8}, {"loss": 1.0}])
def test_impossible_profiles_are_refused(fields):
    with pytest.raises(ValueError):
        LinkProfile(**fields)


def test_cli_proxies_until_sigterm(echo):
    process = subprocess.Popen([sys.executable, "-m", "harness.link", "--upstream", echo.address,
                                "--rtt-ms", "20", "--loss", "0.005"],
                               stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT,
                               env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    try:
        banner = process.stdout.readline()
        match = re.fullmatch(r"wan proxy listening on (\S+) -> (\S+) \((.*)\)\n", banner)
        assert match, banner
        assert match.group(2) == echo.address
        assert match.group(3) == "rtt 20 ms, jitter 0 ms, unlimited, loss 0.50%, seed 0"
        assert min(measure_rtt(match.group(1), 3)) >= 20
        process.send_signal(signal.SIGTERM)
        assert process.wait(10) == 0
        assert process.stdout.read() == "wan proxy stopped; forwarded 192 bytes up, 192 bytes down\n"
    finally:
        process.kill()
        process.stdout.close()
