"""A loopback TCP proxy that makes a connection behave like a WAN link.

This kernel has no netem, so the link between the edge and the cloud is emulated in user space: put a
``DelayProxy`` in front of a gRPC server and connect to the proxy's address instead. The proxy really
holds bytes back on a socket, so everything above TCP (HTTP/2 framing, gRPC deadlines, keepalives,
flow control) sees the delay.

What it emulates, per direction of the link:
  - propagation delay: half of ``rtt_ms`` each way;
  - jitter: an extra delay per chunk, normal with std-dev ``jitter_ms``, clipped at 0;
  - bandwidth: ``rate_mbit`` shared by all connections through the proxy; a chunk is serialized once
    the link is free (a busy-until timeline), then propagates;
  - loss, as TCP experiences it: TCP cannot lose bytes, it retransmits them. A chunk that has a lost
    1448-byte segment is late by one retransmission timeout, RTO = max(200 ms, rtt + 4 * jitter), and
    so is every chunk after it on that connection, because TCP delivers in order. No byte is ever
    dropped or reordered;
  - partitions: nothing moves in either direction for a while; held bytes are delivered, in order, when
    it ends (like a partition shorter than TCP's timeouts);
  - resets: every connection aborted with a TCP RST on both sides.

What it does not emulate:
  - real packets: timing is per chunk read from the socket (up to 64 KiB), not per segment, so a
    chunk arrives whole when its last byte would have;
  - the TCP handshake: the proxy accepts at once, so connecting costs no round trip;
  - congestion control: the sender is never slowed by loss, only delayed by it; a retransmission is
    never lost again (no RTO backoff); a partition releases held bytes at once, not at the next RTO;
  - buffers: up to 64 chunks per direction wait in the proxy before it stops reading and TCP flow
    control pushes back on the sender.

The proxy runs its own asyncio loop in a daemon thread, so synchronous code (pytest, benchmark
drivers) can start and steer it. ``python -m harness.link --help`` runs one from the shell.
"""
from __future__ import annotations

import argparse
import asyncio
import math
import random
import signal
import socket
import socketserver
import struct
import threading
import time
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

CHUNK_BYTES = 64 * 1024
SEGMENT_BYTES = 1448          # TCP payload of one 1500-byte Ethernet frame
MIN_RTO_MS = 200.0            # Linux's floor on the retransmission timeout
QUEUE_CHUNKS = 64             # chunks held per direction before the proxy stops reading
DIRECTIONS = ("up", "down")   # up: client -> upstream, down: upstream -> client
EOF = b""                     # queued after the last chunk: deliver a FIN
RESET = None                  # queued after the last chunk: deliver a RST


@dataclass(frozen=True)
class LinkProfile:
    """One WAN link, the same in both directions."""
    rtt_ms: float = 0.0       # round-trip delay added, ms (half each direction)
    jitter_ms: float = 0.0    # std-dev of an extra per-chunk delay, ms (normal, clipped at 0), per direction
    rate_mbit: float = 0.0    # bandwidth per direction, Mbit/s (0 = unlimited)
    loss: float = 0.0         # probability that a 1448-byte segment is lost (and retransmitted after one RTO)
    seed: int = 0             # seed of the jitter and loss draws

    def __post_init__(self) -> None:
        for name in ("rtt_ms", "jitter_ms", "rate_mbit"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")
        if not 0 <= self.loss < 1:
            raise ValueError(f"loss must be in [0, 1), got {self.loss}")

    @property
    def rto_ms(self) -> float:
        """Retransmission timeout, ms: what a lost segment costs."""
        return max(MIN_RTO_MS, self.rtt_ms + 4 * self.jitter_ms)

    def __str__(self) -> str:
        rate = f"{self.rate_mbit:g} Mbit/s" if self.rate_mbit else "unlimited"
        return (f"rtt {self.rtt_ms:g} ms, jitter {self.jitter_ms:g} ms, {rate}, "
                f"loss {self.loss:.2%}, seed {self.seed}")


class _Link:
    """One direction of the link: when does a chunk read now arrive on the far side?"""

    def __init__(self, profile: LinkProfile, direction: str) -> None:
        self.profile = profile
        self.rng = random.Random(f"{profile.seed}:{direction}")
        self.free_at = 0.0    # time.monotonic() when the link has sent everything queued so far

    def arrival(self, size: int, now: float) -> float:
        """Arrival time (time.monotonic()) of ``size`` bytes handed to the link at ``now``."""
        profile = self.profile
        sent = max(now, self.free_at)
        if profile.rate_mbit > 0:
            sent += size * 8 / (profile.rate_mbit * 1e6)
        self.free_at = sent
        delay_ms = profile.rtt_ms / 2
        if profile.jitter_ms > 0:
            delay_ms += max(0.0, self.rng.gauss(0.0, profile.jitter_ms))
        segments = math.ceil(size / SEGMENT_BYTES)
        # One draw for "any of the chunk's segments lost": they are all retransmitted within one RTO.
        if profile.loss > 0 and segments and self.rng.random() < 1 - (1 - profile.loss) ** segments:
            delay_ms += profile.rto_ms
        return sent + delay_ms / 1000


class _Connection:
    """One proxied TCP connection: a pipe per direction, each a reader task feeding a writer."""

    def __init__(self, proxy: DelayProxy, client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                 upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
        self.proxy = proxy
        self.client = client
        self.upstream = upstream
        self.pipes = [asyncio.create_task(self._pipe(client[0], upstream[1], "up")),
                      asyncio.create_task(self._pipe(upstream[0], client[1], "down"))]

    async def run(self) -> None:
        """Forward until both directions have ended, or reset both sides when one fails."""
        try:
            # Not gather: a pipe cancelled by stop() must end run() normally, not cancel it.
            done, _ = await asyncio.wait(self.pipes, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            self.stop()
        failures = [pipe.exception() for pipe in done if not pipe.cancelled() and pipe.exception()]
        if failures:
            self.abort()
        self.client[1].close()
        self.upstream[1].close()
        for failure in failures:
            if not isinstance(failure, OSError):
                raise failure

    def stop(self) -> None:
        """End both pipes, dropping what they still hold."""
        for pipe in self.pipes:
            pipe.cancel()

    def abort(self) -> None:
        """Close both sockets with a RST rather than a FIN."""
        _reset(self.client[1])
        _reset(self.upstream[1])

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: str) -> None:
        queue: asyncio.Queue[tuple[float, bytes | None]] = asyncio.Queue(QUEUE_CHUNKS)
        feeder = asyncio.create_task(self._read(reader, queue, direction))
        try:
            await self._write(queue, writer, direction)
        finally:
            feeder.cancel()

    async def _read(self, reader: asyncio.StreamReader, queue: asyncio.Queue, direction: str) -> None:
        while True:
            try:
                data = await reader.read(CHUNK_BYTES)
            except OSError:
                data = RESET
            await queue.put((self.proxy._arrival(direction, len(data or b"")), data))
            if not data:
                return

    async def _write(self, queue: asyncio.Queue, writer: asyncio.StreamWriter, direction: str) -> None:
        while True:
            arrival, data = await queue.get()
            await self.proxy._wait_until(arrival)
            if data is RESET:
                raise ConnectionResetError(f"the sender reset the connection (direction {direction})")
            if data == EOF:
                # Half-close, as TCP does: the other direction may still carry the peer's answer.
                if writer.can_write_eof():
                    writer.write_eof()
                return
            self.proxy.bytes_forwarded[direction] += len(data)
            writer.write(data)
            await writer.drain()


class DelayProxy:
    """A TCP proxy to ``upstream`` ("HOST:PORT") whose connections behave like a WAN link.

    Use as ``with DelayProxy(verifier_address, LinkProfile(rtt_ms=50)) as proxy:`` and connect to
    ``proxy.address``. Every method may be called from any thread.
    """

    def __init__(self, upstream: str, profile: LinkProfile = LinkProfile(), host: str = "127.0.0.1",
                 port: int = 0) -> None:
        self.upstream = upstream
        self.host = host
        self.port = port
        self.address = ""                                  # "HOST:PORT" once started
        self.bytes_forwarded = {direction: 0 for direction in DIRECTIONS}
        self._links = {direction: _Link(profile, direction) for direction in DIRECTIONS}
        self._links_lock = threading.Lock()
        self._partition_until = 0.0                        # time.monotonic()
        self._connections: dict[_Connection, asyncio.Task] = {}    # -> the task serving it
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None

    @property
    def profile(self) -> LinkProfile:
        """The link now (see ``set_profile``)."""
        return self._links["up"].profile

    @property
    def connections(self) -> int:
        """Proxied connections open now."""
        return len(self._connections)

    def start(self) -> DelayProxy:
        """Listen (in a daemon thread with its own event loop) and return self once ``address`` is set."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"wan-proxy-{self.upstream}",
                                        daemon=True)
        self._thread.start()
        try:
            self._call(self._listen())
        except BaseException:
            self._end_loop()
            raise
        return self

    def stop(self) -> None:
        """Close the listener and every connection, then end the thread."""
        if self._loop is None:
            return
        self._call(self._shutdown())
        self._end_loop()

    def __enter__(self) -> DelayProxy:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def set_profile(self, profile: LinkProfile) -> None:
        """Change the link for bytes read from now on; bytes already in flight keep their arrival time."""
        with self._links_lock:
            for direction, link in self._links.items():
                replacement = _Link(profile, direction)
                replacement.free_at = link.free_at     # what is being serialized still occupies the link
                self._links[direction] = replacement

    def partition(self, seconds: float) -> None:
        """Forward nothing in either direction for ``seconds`` from now; returns at once.

        Bytes keep being read (until the proxy's buffers fill) and are delivered in order afterwards.
        """
        self._partition_until = max(self._partition_until, time.monotonic() + seconds)

    def reset_connections(self) -> int:
        """Abort every proxied connection with a TCP RST to both peers; return how many there were.

        The listener stays up, so new connections work. When this returns, the RSTs have been sent.
        """
        return self._call(self._reset_all())

    def _end_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
        self._loop = None

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        self.address = f"{self.host}:{self.port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        host, port = split_address(self.upstream)
        try:
            upstream = await asyncio.open_connection(host, port)
        except OSError:
            _reset(writer)    # the way a refused connection would end
            return
        for _, side in ((reader, writer), upstream):
            side.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection = _Connection(self, (reader, writer), upstream)
        self._connections[connection] = asyncio.current_task()
        try:
            await connection.run()
        finally:
            self._connections.pop(connection, None)

    async def _reset_all(self) -> int:
        connections = list(self._connections)
        for connection in connections:
            self._connections.pop(connection)
            connection.abort()
            connection.stop()
        # Aborted transports close their sockets on the loop's next pass.
        await asyncio.sleep(0)
        return len(connections)

    async def _shutdown(self) -> None:
        self._server.close()
        serving = list(self._connections.values())
        for connection in self._connections:
            connection.stop()
        if serving:
            await asyncio.wait(serving)
        await self._server.wait_closed()

    def _arrival(self, direction: str, size: int) -> float:
        with self._links_lock:
            return self._links[direction].arrival(size, time.monotonic())

    async def _wait_until(self, arrival: float) -> None:
        # Re-check after each sleep: a partition may have begun (or grown) meanwhile.
        while (delay := max(arrival, self._partition_until) - time.monotonic()) > 0:
            await asyncio.sleep(delay)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close a stream's socket with a RST rather than a FIN (SO_LINGER 0)."""
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.fileno() != -1:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def split_address(address: str) -> tuple[str, int]:
    """"HOST:PORT" or "[V6HOST]:PORT" -> (host, port)."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


class _EchoHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while data := self.request.recv(CHUNK_BYTES):
                self.request.sendall(data)
        except OSError:
            pass    # a reset peer is part of what the proxy is tested with


class EchoServer:
    """A TCP echo server on loopback (a thread per connection), for tests and ``measure_rtt``."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._server = socketserver.ThreadingTCPServer((host, 0), _EchoHandler)
        self._server.daemon_threads = True
        self.address = f"{host}:{self._server.server_address[1]}"
        # A short poll interval makes shutdown quick: tests start and stop one per test.
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="echo-server",
                                        daemon=True)

    def __enter__(self) -> EchoServer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._server.shutdown()
        self._server.server_close()


def measure_rtt(address: str, count: int = 20, size: int = 64, timeout_s: float = 10.0) -> list[float]:
    """Round trips in ms of ``size`` bytes to the echo server at (or behind a proxy at) ``address``.

    One connection, ``count`` round trips one after another; the connection setup is not timed.
    Raises RuntimeError if the echo differs from what was sent.
    """
    rtts = []
    with socket.create_connection(split_address(address), timeout=timeout_s) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(count):
            payload = bytes([i % 256]) * size
            start = time.perf_counter()
            sock.sendall(payload)
            echo = recv_exactly(sock, size)
            rtts.append((time.perf_counter() - start) * 1000)
            if echo != payload:
                raise RuntimeError(f"round trip {i}: the echo differs from what was sent")
    return rtts


def recv_exactly(sock: socket.socket, size: int) -> bytes:
    """Read exactly ``size`` bytes; raises ConnectionError if the peer closes first."""
    parts, remaining = [], size
    while remaining:
        part = sock.recv(min(remaining, CHUNK_BYTES))
        if not part:
            raise ConnectionError(f"connection closed with {remaining} of {size} bytes unread")
        parts.append(part)
        remaining -= len(part)
    return b"".join(parts)


async def grpc_health_rtt_ms(address: str, count: int = 20, timeout_s: float = 10.0) -> list[float]:
    """Round trips in ms of standard gRPC health checks (grpc.health.v1 Check) to ``address``.

    The first check, which also sets up the connection, is not timed.
    """
    # A loopback experiment must not be routed through an HTTP proxy from the environment.
    async with grpc.aio.insecure_channel(address, options=[("grpc.enable_http_proxy", 0)]) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest()
        await stub.Check(request, timeout=timeout_s)
        rtts = []
        for _ in range(count):
            start = time.perf_counter()
            await stub.Check(request, timeout=timeout_s)
            rtts.append((time.perf_counter() - start) * 1000)
    return rtts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m harness.link",
        description="Run a TCP proxy on loopback that makes connections to UPSTREAM behave like a WAN link "
                    "(delay, jitter, bandwidth, loss as TCP retransmission delay). Point clients at the "
                    "printed address instead of UPSTREAM. Runs until SIGINT or SIGTERM.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--upstream", required=True, metavar="HOST:PORT", help="the server to proxy to")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    # --port too, so that harness.cluster.start_service can run the proxy like any service.
    parser.add_argument("--listen-port", "--port", type=int, default=0,
                        help="port to listen on (0 = any free port)")
    parser.add_argument("--rtt-ms", type=float, default=0.0, help="round-trip delay added, ms (half each way)")
    parser.add_argument("--jitter-ms", type=float, default=0.0,
                        help="std-dev of an extra delay per chunk and direction, ms (normal, clipped at 0)")
    parser.add_argument("--rate-mbit", type=float, default=0.0,
                        help="bandwidth per direction, Mbit/s (0 = unlimited)")
    parser.add_argument("--loss", type=float, default=0.0,
                        help="probability a 1448-byte segment is lost; each loss delays its data by one "
                             "RTO = max(200 ms, rtt + 4 * jitter), as a TCP retransmission would")
    parser.add_argument("--seed", type=int, default=0, help="seed of the jitter and loss draws")
    args = parser.parse_args(argv)
    try:
        profile = LinkProfile(args.rtt_ms, args.jitter_ms, args.rate_mbit, args.loss, args.seed)
    except ValueError as error:
        parser.error(str(error))

    stopped = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stopped.set())
    with DelayProxy(args.upstream, profile, args.host, args.listen_port) as proxy:
        print(f"wan proxy listening on {proxy.address} -> {args.upstream} ({profile})", flush=True)
        stopped.wait()
    print(f"wan proxy stopped; forwarded {proxy.bytes_forwarded['up']} bytes up, "
          f"{proxy.bytes_forwarded['down']} bytes down", flush=True)


if __name__ == "__main__":
    main()
