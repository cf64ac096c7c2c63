"""The verifier process under load, over real gRPC: batching, overload, idle eviction, its metrics.

Each test starts its own verifier process on a tiny model and talks to it with the generated stubs.
"""
import asyncio
import re
import time
import urllib.request

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from edgespec.backends.registry import TINY_EOS
from harness.cluster import start_service, stop_service
from edgespec.v1 import verifier_pb2 as pb
from edgespec.v1 import verifier_pb2_grpc
from edgespec.engines.verifier import VerifierEngine
from tests.tiny import tiny

TARGET = "tiny:3"
METRICS_AT = re.compile(r"metrics on (http://\S+/metrics)")
PROMPTS = [list(f"session {i}: def f(x):".encode()) for i in range(16)]


@pytest.fixture
def verifier(request, tmp_path):
    service = start_service("services.verifier", ["--model", TARGET, "--metrics-port", "0", *request.param],
                            tmp_path, "verifier")
    yield service
    stop_service(service)


def scrape(service) -> dict[tuple[str, tuple], float]:
    [url] = METRICS_AT.findall(service.log_path.read_text())
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def one_window(stub, session_id: str, base: int, draft: list[int]):
    """Send one window on its own stream; the verdict, or (status, trailers)."""
    call = stub.VerifyStream()
    await call.write(pb.Window(session_id=session_id, base_position=base, draft_tokens=draft))
    await call.done_writing()
    try:
        async for verdict in call:
            return verdict
    except grpc.aio.AioRpcError as error:
        return error.code(), dict(error.trailing_metadata() or ())


@pytest.mark.parametrize("verifier", [["--max-batch", "8", "--batch-wait-ms", "200", "--batch-wait-fraction", "1000"]], indirect=True)
def test_concurrent_sessions_share_forwards_and_get_the_unbatched_verdicts(verifier):
    reference = VerifierEngine(tiny(TARGET), [TINY_EOS])
    rounds = 4

    async def go():
        async with grpc.aio.insecure_channel(verifier.address) as channel:
            stub = verifier_pb2_grpc.VerifierStub(channel)
            for i, prompt in enumerate(PROMPTS[:8]):
                await stub.OpenSession(pb.OpenSessionRequest(session_id=f"s{i}", tokens=prompt))

            async def session(i: int) -> list[pb.Verdict]:
                call, verdicts, base = stub.VerifyStream(), [], len(PROMPTS[i])
                for r in range(rounds):
                    await call.write(pb.Window(session_id=f"s{i}", window_seq=r, base_position=base,
                                               draft_tokens=[(7 * i + r) % 300, 101, 102][:1 + (i + r) % 3]))
                    verdicts.append(await call.read())
                    base = verdicts[-1].committed_position
                await call.done_writing()
                return verdicts
            return await asyncio.gather(*(session(i) for i in range(8)))

    results = asyncio.run(go())
    for i, verdicts in enumerate(results):
        reference.open(f"s{i}", PROMPTS[i])
        base = len(PROMPTS[i])
        for r, verdict in enumerate(verdicts):
            expected = reference.verify(f"s{i}", base, [(7 * i + r) % 300, 101, 102][:1 + (i + r) % 3])
            assert (verdict.accepted, verdict.next_token, verdict.committed_position) == (
                expected.verdict.accepted, expected.verdict.next_token, expected.committed_position)
            k = len([(7 * i + r) % 300, 101, 102][:1 + (i + r) % 3])
            # the forward that scored it, for load-aware window control: its windows and the tokens it fed
            assert 1 <= verdict.batch_windows <= 8 and k + 1 <= verdict.batch_tokens <= 4 * verdict.batch_windows
            base = verdict.committed_position
    metrics = scrape(verifier)
    forwards = metrics[("edgespec_verifier_batch_size_count", ())]
    assert metrics[("edgespec_verifier_batch_size_sum", ())] == 8 * rounds    # every window in exactly one forward
    assert forwards < 8 * rounds                                               # ... and some forwards held several
    assert any(v.batch_windows > 1 for verdicts in results for v in verdicts)
    assert metrics[("edgespec_verifier_open_sessions", ())] == 8


@pytest.mark.parametrize("verifier", [["--max-batch", "1", "--max-queue", "1"]], indirect=True)
def test_a_full_queue_is_resource_exhausted_with_a_retry_hint_and_the_window_can_be_resent(verifier):
    async def go():
        async with grpc.aio.insecure_channel(verifier.address) as channel:
            stub = verifier_pb2_grpc.VerifierStub(channel)
            for i, prompt in enumerate(PROMPTS):
                await stub.OpenSession(pb.OpenSessionRequest(session_id=f"s{i}", tokens=prompt))
            first = await asyncio.gather(*(one_window(stub, f"s{i}", len(p), [1, 2, 3]) for i, p in enumerate(PROMPTS)))
            refused = [i for i, r in enumerate(first) if isinstance(r, tuple)]
            # A refused window changed nothing: resent at the same base position, it is verified.
            again = [await one_window(stub, f"s{i}", len(PROMPTS[i]), [1, 2, 3]) for i in refused]
            return first, refused, again

    first, refused, again = asyncio.run(go())
    assert refused, "16 windows at once never overflowed a queue of 1"
    for i in refused:
        status, trailers = first[i]
        assert status == grpc.StatusCode.RESOURCE_EXHAUSTED and int(trailers["retry-after-ms"]) >= 1
    assert all(isinstance(v, pb.Verdict) and v.committed_position > v.base_position for v in again)
    metrics = scrape(verifier)
    assert metrics[("edgespec_verifier_rejected_windows_total", (("reason", "overload"),))] == len(refused)
    assert metrics[("edgespec_verifier_batch_size_sum", ())] == len(PROMPTS)


@pytest.mark.parametrize("verifier", [["--idle-ttl", "0.4", "--forget-after", "2"]], indirect=True)
def test_idle_sessions_are_evicted_restored_and_then_forgotten(verifier):
    reference = VerifierEngine(tiny(TARGET), [TINY_EOS])
    reference.open("r", PROMPTS[0])
    expected = reference.verify("r", len(PROMPTS[0]), [5, 6])

    async def go():
        async with grpc.aio.insecure_channel(verifier.address) as channel:
            stub = verifier_pb2_grpc.VerifierStub(channel)
            await stub.OpenSession(pb.OpenSessionRequest(session_id="s", tokens=PROMPTS[0]))
            before = scrape(verifier)[("edgespec_verifier_kv_cache_bytes", ())]
            await asyncio.sleep(0.8)                        # idle past the TTL: its KV cache is evicted
            evicted = scrape(verifier)
            verdict = await one_window(stub, "s", len(PROMPTS[0]), [5, 6])   # restored from the committed prefix
            await asyncio.sleep(3)                          # idle past forget-after: dropped
            lost = await one_window(stub, "s", verdict.committed_position, [1])
            return before, evicted, verdict, lost

    before, evicted, verdict, lost = asyncio.run(go())
    assert before > 0 and evicted[("edgespec_verifier_kv_cache_bytes", ())] == 0
    assert evicted[("edgespec_verifier_evictions_total", (("reason", "ttl"),))] == 1
    assert (verdict.accepted, verdict.next_token, verdict.committed_position) == (
        expected.verdict.accepted, expected.verdict.next_token, expected.committed_position)
    assert lost[0] == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize("verifier", [[]], indirect=True)
def test_a_shared_prompt_is_prefilled_once_and_the_verdicts_are_unchanged(verifier):
    """The default prefix cache: three sessions open with the same 40-token prompt; the first computes it, the
    others take it from the store (counted on /metrics), and every session gets the verdict an engine without
    the cache gives."""
    prompt = list(b"# shared system prompt for every user\nQ:")
    reference = VerifierEngine(tiny(TARGET), [TINY_EOS])
    reference.open("r", prompt)
    expected = reference.verify("r", len(prompt), [5, 6, 7])

    async def go():
        async with grpc.aio.insecure_channel(verifier.address) as channel:
            stub = verifier_pb2_grpc.VerifierStub(channel)
            verdicts = []
            for i in range(3):
                await stub.OpenSession(pb.OpenSessionRequest(session_id=f"s{i}", tokens=prompt))
                verdicts.append(await one_window(stub, f"s{i}", len(prompt), [5, 6, 7]))
            return verdicts, scrape(verifier)

    verdicts, metrics = asyncio.run(go())
    positions = len(prompt) - 1
    assert metrics[("edgespec_verifier_prefill_tokens_total", (("source", "computed"),))] == positions
    assert metrics[("edgespec_verifier_prefill_tokens_total", (("source", "prefix_cache"),))] == 2 * positions
    assert metrics[("edgespec_verifier_prefix_cache_bytes", ())] > 0
    for verdict in verdicts:
        assert (verdict.accepted, verdict.next_token, verdict.committed_position) == (
            expected.verdict.accepted, expected.verdict.next_token, expected.committed_position)


@pytest.mark.parametrize("verifier", [["--profile-window", "4"]], indirect=True)
def test_info_carries_the_forward_profile_measured_at_start(verifier):
    async def info():
        async with grpc.aio.insecure_channel(verifier.address) as channel:
            return await verifier_pb2_grpc.VerifierStub(channel).Info(pb.InfoRequest(), timeout=30)

    reply = asyncio.run(info())
    assert len(reply.forward_seconds) == 5 and all(s > 0 for s in reply.forward_seconds)   # windows of 0..4
    assert "forward cost by tokens fed" in verifier.log_path.read_text()
