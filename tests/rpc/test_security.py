"""TLS, mutual TLS, bearer tokens, session ownership and limits, on real services over loopback.

The cluster runs fully secured, as in production: the edge client reaches the
coordinator over TLS with a bearer token; the coordinator reaches the verifier
and the drafter over mutual TLS with its own token. Every refusal must leave
the server's state unchanged.
"""
import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from edge_client.client import generate
from harness.cluster import LocalCluster, start_service, stop_service
from edgespec.ops.devcerts import make_dev_certs
from edgespec.net.transport import ClientSecurity, open_channel
from edgespec.v1 import drafter_pb2, drafter_pb2_grpc, verifier_pb2, verifier_pb2_grpc
from tests.tiny import target_only_greedy

TARGET, DRAFT = "tiny:7", "tiny:7~1"
MAX_SESSIONS = 3
MAX_MESSAGE = 64 << 10


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    out = tmp_path_factory.mktemp("certs")
    tokens = make_dev_certs(out, clients=("coordinator", "edge", "mallory"))
    return out, tokens


@pytest.fixture(scope="module")
def cluster(certs, tmp_path_factory):
    out, _ = certs
    tls = ["--tls-cert", str(out / "server.pem"), "--tls-key", str(out / "server-key.pem")]
    model_side = [*tls, "--tls-client-ca", str(out / "ca.pem"), "--auth-tokens", str(out / "tokens.txt"),
                  "--max-sessions-per-client", str(MAX_SESSIONS), "--max-message-bytes", str(MAX_MESSAGE)]
    with LocalCluster(tmp_path_factory.mktemp("logs"),
                      verifier_args=["--model", TARGET, "--max-window", "8", "--max-session-tokens", "512", *model_side],
                      drafter_args=["--model", DRAFT, "--max-window", "8", *model_side],
                      coordinator_args=["--tokenizer", "bytes", "--window", "3", "--max-window", "8",
                                        "--max-new-tokens", "64", "--max-prompt-tokens", "100", *tls,
                                        "--auth-tokens", str(out / "tokens.txt"),
                                        "--max-message-bytes", str(MAX_MESSAGE),
                                        "--upstream-tls-ca", str(out / "ca.pem"),
                                        "--upstream-tls-cert", str(out / "client-coordinator.pem"),
                                        "--upstream-tls-key", str(out / "client-coordinator-key.pem"),
                                        "--upstream-token-file", str(out / "token-coordinator.txt")]) as running:
        yield running


def client(certs, name: str | None, token: str | None = "own", cert: bool = True) -> ClientSecurity:
    """A client's security: TLS trusting the dev CA, its certificate, and its token (or another)."""
    out, tokens = certs
    pem = (str(out / f"client-{name}.pem"), str(out / f"client-{name}-key.pem")) if cert and name else (None, None)
    return ClientSecurity(str(out / "ca.pem"), *pem, tokens.get(name) if token == "own" else token)


def collect(address, prompt, max_new, security, window=3):
    async def go():
        tokens, stats = [], None
        async for event in generate(address, prompt, max_new, window, chat=False, timeout_seconds=60,
                                    security=security):
            if event.HasField("chunk"):
                tokens += event.chunk.token_ids
            else:
                stats = event.stats
        return tokens, stats
    return asyncio.run(go())


def status_of(coroutine_factory) -> grpc.StatusCode:
    async def go():
        try:
            await coroutine_factory()
        except grpc.aio.AioRpcError as error:
            return error.code()
        return grpc.StatusCode.OK
    return asyncio.run(go())


async def verifier_call(address, security, method, request):
    async with open_channel(address, security) as channel:
        return await getattr(verifier_pb2_grpc.VerifierStub(channel), method)(request, timeout=10)


async def verify(address, security, window):
    async with open_channel(address, security) as channel:
        call = verifier_pb2_grpc.VerifierStub(channel).VerifyStream(timeout=10)
        await call.write(window)
        verdict = await call.read()
        await call.done_writing()
        return verdict


def W(sid, base, draft):
    return verifier_pb2.Window(session_id=sid, base_position=base, draft_tokens=draft)


def test_generation_over_tls_and_mutual_tls_equals_target_only(cluster, certs):
    prompt = "def add(a, b):"
    tokens, stats = collect(cluster.coordinator.address, prompt, 32, client(certs, "edge", cert=False))
    assert tokens == target_only_greedy(TARGET, list(prompt.encode()), 32)
    assert stats.drafted_tokens > 0          # the drafter was reached too (mutual TLS, token)


@pytest.mark.parametrize("token", [None, "not-a-token", "edge"], ids=["no-token", "unknown-token", "bare-name"])
def test_unauthenticated_calls_are_refused_everywhere(cluster, certs, token):
    coordinator, verifier, drafter = (s.address for s in (cluster.coordinator, cluster.verifier, cluster.drafter))
    edge = client(certs, "edge", token=token, cert=False)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        collect(coordinator, "hi", 4, edge)
    assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
    anonymous = client(certs, "coordinator", token=token)   # right certificate, no valid token
    assert status_of(lambda: verifier_call(verifier, anonymous, "Info", verifier_pb2.InfoRequest())) == \
        grpc.StatusCode.UNAUTHENTICATED
    assert status_of(lambda: verifier_call(verifier, anonymous, "OpenSession", verifier_pb2.OpenSessionRequest(
        session_id="sneaky", tokens=[1, 2]))) == grpc.StatusCode.UNAUTHENTICATED

    async def draft_open():
        async with open_channel(drafter, anonymous) as channel:
            await drafter_pb2_grpc.DrafterStub(channel).OpenSession(
                drafter_pb2.DrafterOpenRequest(session_id="sneaky", tokens=[1, 2]), timeout=10)
    assert status_of(draft_open) == grpc.StatusCode.UNAUTHENTICATED
    # Nothing was opened: the owner of the name finds no session.
    owner = client(certs, "coordinator")
    assert status_of(lambda: verify(verifier, owner, W("sneaky", 2, [1]))) == grpc.StatusCode.NOT_FOUND


def test_health_stays_open_for_probes(cluster, certs):
    async def check(address):
        async with open_channel(address, client(certs, "coordinator", token=None)) as channel:
            return (await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)).status
    for service in (cluster.verifier, cluster.drafter):
        assert asyncio.run(check(service.address)) == health_pb2.HealthCheckResponse.SERVING


def test_another_clients_session_is_permission_denied_and_unchanged(cluster, certs):
    verifier, drafter = cluster.verifier.address, cluster.drafter.address
    owner, mallory = client(certs, "coordinator"), client(certs, "mallory")
    prompt = list(b"hello")
    asyncio.run(verifier_call(verifier, owner, "OpenSession",
                              verifier_pb2.OpenSessionRequest(session_id="mine", tokens=prompt)))
    denied = grpc.StatusCode.PERMISSION_DENIED
    assert status_of(lambda: verify(verifier, mallory, W("mine", 5, [104]))) == denied
    assert status_of(lambda: verifier_call(verifier, mallory, "CloseSession",
                                           verifier_pb2.CloseSessionRequest(session_id="mine"))) == denied
    assert status_of(lambda: verifier_call(verifier, mallory, "OpenSession", verifier_pb2.OpenSessionRequest(
        session_id="mine", tokens=[1, 2, 3]))) == denied
    # Unchanged: the owner's window at position 5 verifies exactly as target-only decoding says.
    truth = target_only_greedy(TARGET, prompt, 3)
    verdict = asyncio.run(verify(verifier, owner, W("mine", 5, truth[:2])))
    assert (verdict.accepted, verdict.next_token, verdict.committed_position) == (2, truth[2], 8)
    asyncio.run(verifier_call(verifier, owner, "CloseSession", verifier_pb2.CloseSessionRequest(session_id="mine")))

    async def drafter_calls(security, method, request):
        async with open_channel(drafter, security) as channel:
            return await getattr(drafter_pb2_grpc.DrafterStub(channel), method)(request, timeout=10)
    asyncio.run(drafter_calls(owner, "OpenSession", drafter_pb2.DrafterOpenRequest(session_id="d", tokens=prompt)))
    for method, request in (("Draft", drafter_pb2.DraftRequest(session_id="d", base_position=5, k=2)),
                            ("Crop", drafter_pb2.CropRequest(session_id="d", position=2)),
                            ("CloseSession", drafter_pb2.DrafterCloseRequest(session_id="d")),
                            ("OpenSession", drafter_pb2.DrafterOpenRequest(session_id="d", tokens=[7]))):
        assert status_of(lambda: drafter_calls(mallory, method, request)) == denied, method
    reply = asyncio.run(drafter_calls(owner, "Draft", drafter_pb2.DraftRequest(session_id="d", base_position=5, k=2)))
    assert len(reply.tokens) == 2     # still at position 5, still the owner's
    asyncio.run(drafter_calls(owner, "CloseSession", drafter_pb2.DrafterCloseRequest(session_id="d")))


def test_open_sessions_per_client_are_limited(cluster, certs):
    verifier, owner, other = cluster.verifier.address, client(certs, "coordinator"), client(certs, "mallory")
    open_ = lambda who, sid: verifier_call(verifier, who, "OpenSession",   # noqa: E731
                                           verifier_pb2.OpenSessionRequest(session_id=sid, tokens=[1, 2]))
    close = lambda who, sid: verifier_call(verifier, who, "CloseSession",  # noqa: E731
                                           verifier_pb2.CloseSessionRequest(session_id=sid))
    for i in range(MAX_SESSIONS):
        asyncio.run(open_(owner, f"s{i}"))
    assert status_of(lambda: open_(owner, "one-too-many")) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert status_of(lambda: verify(verifier, owner, W("one-too-many", 2, [1]))) == grpc.StatusCode.NOT_FOUND
    asyncio.run(open_(owner, "s0"))          # re-opening one's own session is not a new one
    asyncio.run(open_(other, "theirs"))      # the limit is per client
    asyncio.run(close(owner, "s0"))
    asyncio.run(open_(owner, "one-too-many"))
    for sid in ("s1", "s2", "one-too-many"):
        asyncio.run(close(owner, sid))
    asyncio.run(close(other, "theirs"))


def test_oversize_and_out_of_limit_requests(cluster, certs):
    edge = client(certs, "edge", cert=False)
    coordinator = cluster.coordinator.address
    for prompt, max_new, window, code in (
            ("x" * (MAX_MESSAGE + 1), 4, 3, grpc.StatusCode.RESOURCE_EXHAUSTED),   # message over --max-message-bytes
            ("y" * 200, 4, 3, grpc.StatusCode.INVALID_ARGUMENT),                   # prompt over --max-prompt-tokens
            ("hi", 65, 3, grpc.StatusCode.INVALID_ARGUMENT),                       # over --max-new-tokens
            ("hi", 4, 9, grpc.StatusCode.INVALID_ARGUMENT)):                       # over --max-window
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            collect(coordinator, prompt, max_new, edge, window)
        assert raised.value.code() == code, (len(prompt), max_new, window)
    owner = client(certs, "coordinator")
    huge = verifier_pb2.OpenSessionRequest(session_id="huge", tokens=[1] * (MAX_MESSAGE + 10))
    assert status_of(lambda: verifier_call(cluster.verifier.address, owner, "OpenSession", huge)) == \
        grpc.StatusCode.RESOURCE_EXHAUSTED
    assert status_of(lambda: verify(cluster.verifier.address, owner, W("huge", 2, [1]))) == grpc.StatusCode.NOT_FOUND
    tokens, _ = collect(coordinator, "hi", 4, edge)      # and the service still serves
    assert len(tokens) == 4


def test_plaintext_and_wrong_certificates_cannot_reach_tls_ports(cluster, certs, tmp_path):
    out, tokens = certs
    info = lambda security: verifier_call(cluster.verifier.address, security, "Info", verifier_pb2.InfoRequest())  # noqa: E731
    unavailable = grpc.StatusCode.UNAVAILABLE
    assert status_of(lambda: info(ClientSecurity())) == unavailable                       # plaintext
    assert status_of(lambda: info(client(certs, "coordinator", cert=False))) == unavailable  # TLS, no client cert
    foreign = make_dev_certs(tmp_path / "foreign", clients=("coordinator",))
    impostor = ClientSecurity(str(out / "ca.pem"), str(tmp_path / "foreign" / "client-coordinator.pem"),
                              str(tmp_path / "foreign" / "client-coordinator-key.pem"), tokens["coordinator"])
    assert foreign and status_of(lambda: info(impostor)) == unavailable                   # certificate of another CA
    wrong_ca = ClientSecurity(str(tmp_path / "foreign" / "ca.pem"), None, None, tokens["edge"])
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        collect(cluster.coordinator.address, "hi", 4, wrong_ca)                           # server not trusted
    assert raised.value.code() == unavailable
    assert asyncio.run(info(client(certs, "coordinator"))).vocab_size == 320             # the right client gets in


def test_a_token_is_never_sent_in_clear_text_over_a_network():
    async def go():
        with pytest.raises(ValueError, match="only over TLS"):
            open_channel("10.1.2.3:50051", ClientSecurity(token="secret"))
        await open_channel("127.0.0.1:50051", ClientSecurity(token="secret")).close()   # loopback: local credentials
    asyncio.run(go())


def test_rate_limit_gives_resource_exhausted_with_a_retry_hint(tmp_path):
    verifier = start_service("services.verifier", ["--model", TARGET, "--rate-limit", "1", "--rate-burst", "2"],
                             tmp_path, "verifier")
    try:
        async def go():
            async with grpc.aio.insecure_channel(verifier.address) as channel:
                stub, codes = verifier_pb2_grpc.VerifierStub(channel), []
                for _ in range(3):
                    try:
                        await stub.Info(verifier_pb2.InfoRequest(), timeout=10)
                        codes.append(grpc.StatusCode.OK)
                    except grpc.aio.AioRpcError as error:
                        codes.append(error.code())
                        hint = int(dict(error.trailing_metadata())["retry-after-ms"])
                health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
                await asyncio.sleep(hint / 1000)
                await stub.Info(verifier_pb2.InfoRequest(), timeout=10)     # allowed again after the hint
                return codes, hint, health.status
        codes, hint, health = asyncio.run(go())
        assert codes == [grpc.StatusCode.OK, grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED]
        assert 0 < hint <= 1000
        assert health == health_pb2.HealthCheckResponse.SERVING          # probes are never limited
    finally:
        stop_service(verifier)
