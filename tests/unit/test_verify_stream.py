"""The coordinator's verifier client opens a session's verify stream with the session, over real gRPC on
loopback: the verifier's batching counts open streams as sessions about to send a window, and waits for them
to share a forward. Opened only with the first window, sessions that start together were split into cohorts."""
import asyncio

from edgespec.backends.registry import TINY_EOS
from edgespec.engines.batching import VerifyScheduler
from edgespec.engines.verifier import VerifierEngine
from edgespec.engines.worker import ModelWorker
from edgespec.net import rpc
from edgespec.net.security import SessionOwners
from edgespec.verify.sampling import SamplingParams
from edgespec.verify.window import Window
from services.coordinator.clients import GrpcVerifier
from services.verifier.servicer import VerifierServicer, register
from tests.tiny import tiny

PROMPT = list(b"def add(a, b):")


def test_a_session_s_stream_is_open_from_its_opening_to_its_close():
    worker = ModelWorker("verifier")
    engine = VerifierEngine(tiny("tiny:7"), [TINY_EOS])
    scheduler = VerifyScheduler(engine, worker)
    servicer = VerifierServicer(engine, worker, scheduler, "tiny:7", "cpu", "float32", SessionOwners(8))

    async def eventually(condition, seconds=10.0):
        for _ in range(int(seconds / 0.01)):
            if condition():
                return True
            await asyncio.sleep(0.01)
        return False

    async def go():
        server, port, _ = rpc.create_server("127.0.0.1", 0, register(servicer))
        await server.start()
        ports = [GrpcVerifier(f"127.0.0.1:{port}", 30) for _ in range(2)]
        try:
            await asyncio.gather(*(p.open(f"s{i}", PROMPT, SamplingParams()) for i, p in enumerate(ports)))
            assert await eventually(lambda: scheduler.streams == 2)   # both, before either sent a window
            verdict = await ports[0].verify("s0", Window(0, len(PROMPT), (), (), SamplingParams().fingerprint()))
            assert verdict is not None and scheduler.streams == 2      # the window went on the stream opened
            await ports[0].close("s0")
            assert await eventually(lambda: scheduler.streams == 1)
            await ports[1].open("s1", PROMPT, SamplingParams())        # reopened (a failover): one stream still
            assert await eventually(lambda: scheduler.streams == 1)
        finally:
            for p in ports:
                await p.aclose()
            await server.stop(0)
        assert await eventually(lambda: scheduler.streams == 0)

    try:
        asyncio.run(go())
    finally:
        worker.shutdown()
