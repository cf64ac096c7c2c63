"""Many sessions through one coordinator; session quotas, refusals and idle sessions, on real processes.

Per-client session limits are for end users. A coordinator is infrastructure: it
holds one drafter and one verifier session per generation, all under its own
identity, so on the model services it gets the service budget
(--max-sessions-per-service) and names the end user it calls for; a refusal of a
session (RESOURCE_EXHAUSTED) is a reason to wait, not a fault: the verifier is
not banned, the drafter is replaced by target-only rounds for a while.
"""
import asyncio
import time

import grpc
import pytest

from edge_client.client import generate
from edgespec.engines.drafter import DrafterEngine
from edgespec.net.security import END_USER_KEY
from harness.cluster import LocalCluster, start_service, stop_service
from edgespec.ops.devcerts import make_dev_certs
from edgespec.net.transport import ClientSecurity, open_channel
from edgespec.v1 import drafter_pb2, drafter_pb2_grpc, verifier_pb2, verifier_pb2_grpc
from tests.tiny import target_only_greedy, tiny

TARGET, DRAFT = "tiny:7", "tiny:7~1"
PROMPTS = ["def add(a, b):", "Speculative decoding is", "Q: 2+2?\nA:", "hello"]


async def collect(address, prompt, max_new, window=-1, timeout=300):
    tokens, stats = [], None
    async for event in generate(address, prompt, max_new, window, chat=False, timeout_seconds=timeout):
        if event.HasField("chunk"):
            tokens += event.chunk.token_ids
        else:
            stats = event.stats
    return tokens, stats


def test_200_concurrent_generations_through_one_coordinator_with_default_flags(tmp_path):
    """Default session limits everywhere (64 per client): 200 generations at once all finish, each equal to
    target-only greedy decoding. Before the fix the 65th failed with RESOURCE_EXHAUSTED."""
    count, max_new = 200, 6
    with LocalCluster(tmp_path, verifier_args=["--model", TARGET], drafter_args=["--model", DRAFT],
                      coordinator_args=["--tokenizer", "bytes"]) as cluster:
        async def go():
            return await asyncio.gather(*(collect(cluster.coordinator.address, PROMPTS[i % len(PROMPTS)], max_new)
                                          for i in range(count)), return_exceptions=True)
        started = time.monotonic()
        results = asyncio.run(go())
        seconds = time.monotonic() - started
    failures = [r for r in results if isinstance(r, BaseException)]
    assert not failures, f"{len(failures)} of {count} failed, e.g. {failures[0]!r}"
    truth = {p: target_only_greedy(TARGET, list(p.encode()), max_new) for p in PROMPTS}
    for i, (tokens, stats) in enumerate(results):
        assert tokens == truth[PROMPTS[i % len(PROMPTS)]], i
        assert stats.new_tokens == len(tokens)
    print(f"{count} concurrent generations of {max_new} tokens in {seconds:.1f}s")


async def call(address, stub_class, method, request, security=None, metadata=()):
    async with open_channel(address, security or ClientSecurity()) as channel:
        return await getattr(stub_class(channel), method)(request, timeout=30, metadata=metadata)


def verifier_open(address, sid, tokens, security=None, metadata=()):
    return call(address, verifier_pb2_grpc.VerifierStub, "OpenSession",
                verifier_pb2.OpenSessionRequest(session_id=sid, tokens=tokens), security, metadata)


def verifier_close(address, sid, security=None, metadata=()):
    return call(address, verifier_pb2_grpc.VerifierStub, "CloseSession",
                verifier_pb2.CloseSessionRequest(session_id=sid), security, metadata)


def drafter_call(address, method, request, security=None):
    return call(address, drafter_pb2_grpc.DrafterStub, method, request, security)


def code_of(coroutine) -> grpc.StatusCode:
    async def go():
        try:
            await coroutine
        except grpc.aio.AioRpcError as error:
            return error.code()
        return grpc.StatusCode.OK
    return asyncio.run(go())


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    """Verifier and drafter with room for one session each (the coordinator's service budget is 1), and a
    coordinator that would ban a failed verifier for 30 s: longer than its failover deadline."""
    with LocalCluster(tmp_path_factory.mktemp("logs"),
                      verifier_args=["--model", TARGET, "--max-sessions-per-service", "1"],
                      drafter_args=["--model", DRAFT, "--max-sessions-per-service", "1"],
                      coordinator_args=["--tokenizer", "bytes", "--window", "3", "--ban", "30", "--max-ban", "30",
                                        "--failover-deadline", "20"]) as cluster:
        yield cluster


def test_a_drafter_refusing_the_session_gives_target_only_rounds(full):
    prompt = PROMPTS[0]
    truth = target_only_greedy(TARGET, list(prompt.encode()), 24)
    asyncio.run(drafter_call(full.drafter.address, "OpenSession",
                             drafter_pb2.DrafterOpenRequest(session_id="blocker", tokens=[1, 2])))
    try:
        tokens, stats = asyncio.run(collect(full.coordinator.address, prompt, 24, window=3, timeout=60))
    finally:
        asyncio.run(drafter_call(full.drafter.address, "CloseSession",
                                 drafter_pb2.DrafterCloseRequest(session_id="blocker")))
    assert tokens == truth
    assert stats.drafted_tokens == 0 and stats.rounds == 24       # target-only rounds: slower, never wrong
    tokens, stats = asyncio.run(collect(full.coordinator.address, prompt, 24, window=3, timeout=60))
    assert tokens == truth and stats.drafted_tokens > 0           # room again: drafting again


def test_a_verifier_refusing_the_session_is_asked_again_not_banned(full):
    prompt = PROMPTS[1]
    asyncio.run(verifier_open(full.verifier.address, "blocker", [1, 2]))

    async def go():
        generation = asyncio.ensure_future(collect(full.coordinator.address, prompt, 24, window=3, timeout=60))
        await asyncio.sleep(3)
        waiting = not generation.done()
        await verifier_close(full.verifier.address, "blocker")
        freed = time.monotonic()
        tokens, stats = await generation
        return waiting, tokens, stats, time.monotonic() - freed
    waiting, tokens, stats, after = asyncio.run(go())
    assert waiting                                                 # it waited for room ...
    assert tokens == target_only_greedy(TARGET, list(prompt.encode()), 24)
    assert after < 10, after                                       # ... and got it soon after: no 30 s ban
    assert stats.failovers == 0 and stats.verifier == full.verifier.address
    log = full.coordinator.log_path.read_text()
    assert "refused the session" in log and "banned" not in log


def test_the_coordinator_names_its_end_users_and_only_a_service_may(tmp_path):
    """With authentication: the verifier and drafter trust the coordinator's identity as a service, so each end
    user has its own per-client limit there (1 here), while the coordinator's own budget is large. The header
    means nothing from anyone else, and never grants access to a session."""
    tokens = make_dev_certs(tmp_path / "certs", clients=("coordinator", "edge", "mallory"))
    auth = ["--auth-tokens", str(tmp_path / "certs" / "tokens.txt")]
    model_side = [*auth, "--service-identities", "coordinator", "--max-sessions-per-client", "1"]
    who = {name: ClientSecurity(token=tokens[name]) for name in tokens}
    with LocalCluster(tmp_path / "logs", verifier_args=["--model", TARGET, *model_side],
                      drafter_args=["--model", DRAFT, *model_side],
                      coordinator_args=["--tokenizer", "bytes", "--window", "3", *auth, "--upstream-token-file",
                                        str(tmp_path / "certs" / "token-coordinator.txt")]) as cluster:
        verifier, coordinator = cluster.verifier.address, cluster.coordinator.address
        as_edge = [(END_USER_KEY, "edge")]
        # The coordinator holds edge's one verifier slot; its own sessions (no end user) are not edge's.
        asyncio.run(verifier_open(verifier, "held-for-edge", [1, 2], who["coordinator"], as_edge))
        asyncio.run(verifier_open(verifier, "coordinator-own", [1, 2], who["coordinator"]))
        # Mallory claiming to be edge: the header is ignored (she is no service): her own slot, her own session.
        asyncio.run(verifier_open(verifier, "mallory-1", [1, 2], who["mallory"], as_edge))
        assert code_of(verifier_open(verifier, "mallory-2", [1, 2], who["mallory"], as_edge)) == \
            grpc.StatusCode.RESOURCE_EXHAUSTED
        assert code_of(verifier_close(verifier, "held-for-edge", who["mallory"], as_edge)) == \
            grpc.StatusCode.PERMISSION_DENIED
        asyncio.run(verifier_close(verifier, "mallory-1", who["mallory"]))

        async def generations():
            def run(name, prompt):
                async def go():
                    got = []
                    async for event in generate(coordinator, prompt, 12, 3, chat=False, timeout_seconds=60,
                                                security=who[name]):
                        got += event.chunk.token_ids if event.HasField("chunk") else []
                    return got
                return asyncio.ensure_future(go())
            edge, mallory = run("edge", PROMPTS[0]), run("mallory", PROMPTS[1])
            mallory_tokens = await mallory              # mallory's generation has her own slots upstream ...
            edge_waiting = not edge.done()              # ... edge's waits: its slot is held
            await verifier_close(verifier, "held-for-edge", who["coordinator"])
            return mallory_tokens, edge_waiting, await edge
        mallory_tokens, edge_waiting, edge_tokens = asyncio.run(generations())
        assert mallory_tokens == target_only_greedy(TARGET, list(PROMPTS[1].encode()), 12)
        assert edge_waiting
        assert edge_tokens == target_only_greedy(TARGET, list(PROMPTS[0].encode()), 12)
        asyncio.run(verifier_close(verifier, "coordinator-own", who["coordinator"]))


def test_drafter_idle_sessions_lose_their_kv_then_are_forgotten_and_free_their_slot(tmp_path):
    drafter = start_service("services.drafter", ["--model", DRAFT, "--idle-ttl", "1", "--forget-after", "5",
                                                 "--max-sessions-per-service", "1"], tmp_path, "drafter")
    try:
        address, prompt = drafter.address, list(b"def fib(n):")
        reference = DrafterEngine(tiny(DRAFT))
        reference.open("a", prompt)
        asyncio.run(drafter_call(address, "OpenSession", drafter_pb2.DrafterOpenRequest(session_id="a", tokens=prompt)))
        assert code_of(drafter_call(address, "OpenSession", drafter_pb2.DrafterOpenRequest(
            session_id="b", tokens=prompt))) == grpc.StatusCode.RESOURCE_EXHAUSTED      # one slot, taken
        time.sleep(2.5)                                  # idle past the TTL: its KV cache goes, the session stays
        assert "1 KV caches evicted" in drafter.log_path.read_text()
        reply = asyncio.run(drafter_call(address, "Draft", drafter_pb2.DraftRequest(
            session_id="a", base_position=len(prompt), k=4)))
        assert list(reply.tokens) == reference.draft("a", len(prompt), [], 4).tokens    # rebuilt exactly
        time.sleep(7)                                    # idle past forget-after: dropped, and its slot freed
        assert code_of(drafter_call(address, "Draft", drafter_pb2.DraftRequest(
            session_id="a", base_position=len(prompt), k=4))) == grpc.StatusCode.NOT_FOUND
        asyncio.run(drafter_call(address, "OpenSession", drafter_pb2.DrafterOpenRequest(session_id="b", tokens=prompt)))
    finally:
        stop_service(drafter)
