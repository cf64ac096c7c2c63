"""The verifier contract on the vLLM backend, over gRPC: the checks tests/rpc/test_cluster_rpc.py makes of the
torch verifier (bad windows refused with the status that names what to do, the session unchanged; replayed
windows; pipelining's reordered, duplicated and wrong-parent optimistic windows; bad opens and closes; Info),
made of a vLLM verifier (SmolLM2-135M, float32, in the vLLM environment .venv-vllm)."""
import asyncio

import grpc
import pytest

from harness.cluster import LocalCluster
from bench.vllm_jobs import VLLM_PYTHON
from edgespec.backends.registry import model_path
from edgespec.v1 import verifier_pb2, verifier_pb2_grpc
from tests.rpc.test_cluster_rpc import W, check_optimistic_windows, open_session, verifier_stream_call

if not VLLM_PYTHON.exists():
    pytest.skip("the vLLM environment is missing: bash scripts/vllm_env.sh (scripts/test.sh makes it)",
                allow_module_level=True)

PROMPT = [504, 3575, 282, 4649, 314]   # five SmolLM2 token ids ("The capital of France is")
VOCAB = 49152


@pytest.fixture(scope="module")
def verifier(tmp_path_factory):
    model_path("smollm2")   # its Hugging Face directory, converted once by edgespec's environment
    with LocalCluster(tmp_path_factory.mktemp("logs"), verifier_python=str(VLLM_PYTHON),
                      verifier_args=["--backend", "vllm", "--model", "smollm2", "--dtype", "float32",
                                     "--max-window", "8", "--max-model-len", "512", "--vllm-kv-cache-gb", "1",
                                     "--profile-window", "0"],
                      drafter_args=["--model", "smollm2", "--max-window", "8"],
                      coordinator_args=["--tokenizer", "smollm2"]) as running:
        yield running.verifier.address


@pytest.fixture(scope="module")
def truth(verifier):
    """Target-only greedy after PROMPT on this verifier: empty windows, one token each."""
    asyncio.run(open_session(verifier, "truth", PROMPT))
    tokens = []
    for position in range(len(PROMPT), len(PROMPT) + 8):
        verdicts, status, details, _ = asyncio.run(verifier_stream_call(verifier, [W(position, [], sid="truth")]))
        assert status == grpc.StatusCode.OK, details
        tokens.append(verdicts[0].next_token)
    return tokens


@pytest.mark.parametrize("bad,code", [
    (W(5, [1], sid="missing"), grpc.StatusCode.NOT_FOUND),
    (W(5, [1] * 9), grpc.StatusCode.INVALID_ARGUMENT),
    (W(5, [1, VOCAB]), grpc.StatusCode.INVALID_ARGUMENT),
    (W(-1, [1]), grpc.StatusCode.INVALID_ARGUMENT),
    (W(99, [1]), grpc.StatusCode.INVALID_ARGUMENT),
    (W(2, [1]), grpc.StatusCode.ABORTED),
    (verifier_pb2.Window(session_id="v1", base_position=5, draft_tokens=[1, 2], draft_parents=[-1, -1]),
     grpc.StatusCode.INVALID_ARGUMENT),
    (verifier_pb2.Window(session_id="v1", base_position=5, self_draft=4), grpc.StatusCode.INVALID_ARGUMENT),
], ids=["unknown_session", "window_too_long", "id_outside_vocab", "negative_base", "future_base", "stale_base",
        "token_tree", "self_drafted"])
def test_bad_windows_are_refused_and_the_session_is_unchanged(verifier, truth, bad, code):
    asyncio.run(open_session(verifier, "v1", PROMPT))
    verdicts, status, details, trailers = asyncio.run(verifier_stream_call(verifier, [bad]))
    assert (verdicts, status) == ([], code), details
    if code == grpc.StatusCode.ABORTED:
        assert trailers["committed-position"] == "5"
    if bad.draft_parents or bad.self_draft:
        assert "vLLM" in details or "VllmTarget" in details   # names the backend that cannot
    # the next valid window gets exactly target-only decoding's verdict: nothing changed
    draft = [truth[0], truth[1], truth[2] + 1]
    verdicts, status, details, _ = asyncio.run(verifier_stream_call(verifier, [W(5, draft)]))
    assert status == grpc.StatusCode.OK, details
    assert (verdicts[0].accepted, verdicts[0].next_token, verdicts[0].committed_position) == (2, truth[2], 8)


def test_a_replayed_window_gets_the_same_verdict(verifier, truth):
    asyncio.run(open_session(verifier, "v2", PROMPT))
    window = W(5, [truth[0], truth[1] + 1], sid="v2")
    first, status1, _, _ = asyncio.run(verifier_stream_call(verifier, [window]))
    again, status2, _, _ = asyncio.run(verifier_stream_call(verifier, [window]))
    assert status1 == status2 == grpc.StatusCode.OK
    same = lambda v: (v.accepted, v.next_token, v.committed_position)  # noqa: E731
    assert same(first[0]) == same(again[0]) == (1, truth[1], 7)


def test_reordered_duplicated_and_wrong_parent_optimistic_windows(verifier, truth):
    check_optimistic_windows(verifier, "v3", PROMPT, truth[:6])


def test_bad_opens_unknown_close_and_info(verifier):
    async def go():
        async with grpc.aio.insecure_channel(verifier) as channel:
            stub = verifier_pb2_grpc.VerifierStub(channel)
            codes = []
            for request in (verifier_pb2.OpenSessionRequest(session_id="x", tokens=[]),
                            verifier_pb2.OpenSessionRequest(session_id="x", tokens=[1, VOCAB]),
                            verifier_pb2.OpenSessionRequest(session_id="", tokens=[1]),
                            verifier_pb2.OpenSessionRequest(session_id="x", tokens=[1] * 600)):
                with pytest.raises(grpc.aio.AioRpcError) as raised:
                    await stub.OpenSession(request)
                codes.append(raised.value.code())
            await stub.OpenSession(verifier_pb2.OpenSessionRequest(session_id="closed", tokens=PROMPT))
            await stub.CloseSession(verifier_pb2.CloseSessionRequest(session_id="closed"))
            for session_id in ("never-opened", "closed"):
                with pytest.raises(grpc.aio.AioRpcError) as raised:
                    await stub.CloseSession(verifier_pb2.CloseSessionRequest(session_id=session_id))
                codes.append(raised.value.code())
            return codes, await stub.Info(verifier_pb2.InfoRequest())
    codes, info = asyncio.run(go())
    assert codes == [grpc.StatusCode.INVALID_ARGUMENT] * 4 + [grpc.StatusCode.NOT_FOUND] * 2
    assert (info.vocab_size, list(info.eos_token_ids), info.max_window, info.device, info.dtype) == (
        VOCAB, [2], 8, "cpu", "float32")
    assert info.max_session_tokens == 512 - 8 - 2   # the session, a window and the token past it fit in vLLM
