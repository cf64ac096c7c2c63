"""A long prompt's prefill does not stall other sessions (the verifier process over real gRPC, llama.cpp with
SmolLM2-135M as shipped): it is prefilled a --prefill-chunk part at a time, and another session's windows are
verified between the parts; an open whose caller goes away leaves no session behind."""
import asyncio
import time

import grpc
import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is installed by scripts/install.sh")

from harness.cluster import start_service, stop_service  # noqa: E402
from edgespec.v1 import verifier_pb2 as pb  # noqa: E402
from edgespec.v1 import verifier_pb2_grpc  # noqa: E402

LLAMA = ["--backend", "llamacpp", "--model", "smollm2", "--threads", "1", "--ctx-tokens", "4096",
         "--prefill-chunk", "16", "--profile-window", "0"]
LONG = [400 + i % 700 for i in range(1500)]   # 94 parts of 16 tokens
SHORT = [504, 3301, 28, 216, 11, 2030, 327, 1330]


@pytest.fixture(scope="module")
def verifier(tmp_path_factory):
    service = start_service("services.verifier", LLAMA, tmp_path_factory.mktemp("verifier"), "verifier")
    yield service
    stop_service(service)


def test_another_sessions_windows_are_verified_while_a_long_prompt_is_prefilled(verifier):
    async def go():
        async with grpc.aio.insecure_channel(verifier.address) as channel:
            stub = verifier_pb2_grpc.VerifierStub(channel)
            await stub.OpenSession(pb.OpenSessionRequest(session_id="short", tokens=SHORT))
            opening = [0.0, 0.0]

            async def open_long():
                opening[0] = time.monotonic()
                reply = await stub.OpenSession(pb.OpenSessionRequest(session_id="long", tokens=LONG))
                opening[1] = time.monotonic()
                return reply

            call, base, times, inside = stub.VerifyStream(), len(SHORT), [], []
            await call.write(pb.Window(session_id="short", window_seq=0, base_position=base))
            base = (await call.read()).committed_position
            task = asyncio.create_task(open_long())
            seq = 1
            while not task.done():
                sent = time.perf_counter()
                await call.write(pb.Window(session_id="short", window_seq=seq, base_position=base))
                verdict = await call.read()
                inside.append((verdict.verify_compute_seconds, verdict.verifier_seconds, time.perf_counter() - sent))
                base, seq = verdict.committed_position, seq + 1
                times.append(time.monotonic())
            reply = await task
            await call.done_writing()
            for session_id in ("short", "long"):
                await stub.CloseSession(pb.CloseSessionRequest(session_id=session_id))
            return reply, opening, times, inside

    reply, (started, opened), times, inside = asyncio.run(go())
    assert reply.committed_position == len(LONG) and reply.prefill_seconds > 0
    during = [t for t in times if started < t < opened]
    assert len(during) >= 5, (len(during), opened - started)
    # Each verdict says how long its window was inside the verifier: its forward, plus any wait behind a part of
    # the prefill, and never more than the caller's own round trip.
    assert all(0 < compute <= verifier <= round_trip for compute, verifier, round_trip in inside), inside


def test_an_open_whose_caller_goes_away_leaves_no_session(verifier):
    async def go():
        async with grpc.aio.insecure_channel(verifier.address) as channel:
            stub = verifier_pb2_grpc.VerifierStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await stub.OpenSession(pb.OpenSessionRequest(session_id="gone", tokens=LONG), timeout=0.3)
            assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            await asyncio.sleep(1.0)   # the part in flight finishes; the rest is dropped
            call = stub.VerifyStream()
            await call.write(pb.Window(session_id="gone", window_seq=0, base_position=len(LONG)))
            await call.done_writing()
            with pytest.raises(grpc.aio.AioRpcError) as missing:
                async for _ in call:
                    pass
            return missing.value.code()

    assert asyncio.run(go()) == grpc.StatusCode.NOT_FOUND
    assert "prefilled" not in verifier.log_path.read_text().split("gone")[-1]
