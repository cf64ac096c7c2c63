"""The three services as real processes on loopback, with tiny models."""
import asyncio
import os
import socket
import subprocess
import sys
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from edge_client.client import generate
from edgespec.backends.registry import TINY_EOS
from harness.cluster import REPO_ROOT, LocalCluster
from edgespec.v1 import drafter_pb2, drafter_pb2_grpc, verifier_pb2, verifier_pb2_grpc
from edgespec.engines.verifier import VerifierEngine
from tests.streams import generated
from tests.tiny import target_only_greedy, tiny

PAIRS = [("tiny:7", "tiny:7~1"), ("tiny:8", "tiny:9")]   # partial agreement, and almost none
PROMPTS = ["def add(a, b):", "Speculative decoding is", "Q: 2+2?\nA:", "¿Qué tal? ünïcödé"]


@pytest.fixture(scope="module", params=PAIRS, ids=["close-draft", "unrelated-draft"])
def cluster(request, tmp_path_factory):
    target, draft = request.param
    with LocalCluster(tmp_path_factory.mktemp("logs"),
                      verifier_args=["--model", target, "--max-window", "8", "--max-session-tokens", "512"],
                      drafter_args=["--model", draft, "--max-window", "8"],
                      coordinator_args=["--tokenizer", "bytes", "--window", "auto", "--max-window", "8",
                                        "--max-new-tokens", "200"]) as running:
        running.target = target
        yield running


def collect(address, prompt, max_new, window):
    async def go():
        chunks, stats = [], None
        async for event in generate(address, prompt, max_new, window, chat=False, timeout_seconds=120):
            if event.HasField("chunk"):
                chunks.append(event.chunk)
            else:
                stats = event.stats
        return chunks, stats
    return asyncio.run(go())


@pytest.mark.parametrize("window", [0, 1, 3, 8, -1], ids=["k0", "k1", "k3", "k8", "auto"])
def test_generate_over_grpc_equals_target_only_greedy(cluster, window):
    for prompt in PROMPTS:
        chunks, stats = collect(cluster.coordinator.address, prompt, 48, window)
        tokens = [t for c in chunks for t in c.token_ids]
        assert tokens == target_only_greedy(cluster.target, list(prompt.encode()), 48), (prompt, window)
        # Each token exactly once, in order; counts agree with the stream.
        assert [c.generated for c in chunks if c.token_ids] == list(
            __import__("itertools").accumulate(len(c.token_ids) for c in chunks if c.token_ids))
        assert stats.new_tokens == len(tokens)
        assert stats.finish_reason == ("eos" if tokens[-1] == TINY_EOS else "length")
        assert stats.accepted_tokens + stats.rounds == len(tokens)
        if window == 0:
            assert stats.drafted_tokens == 0 and stats.rounds == len(tokens)


def test_the_client_s_collect_reads_the_whole_stream_as_its_chunks_say(cluster):
    """edge_client.collect: the tokens and stats of the stream, its text as it came, and times in order."""
    from edge_client.client import collect as read_whole

    prompt = PROMPTS[1]
    chunks, stats = collect(cluster.coordinator.address, prompt, 32, 0)
    heard = []
    run = asyncio.run(read_whole(cluster.coordinator.address, prompt, 32, 0, heard.append, chat=False,
                                 timeout_seconds=120))
    assert run.tokens == [t for c in chunks for t in c.token_ids] and run.stats.new_tokens == stats.new_tokens
    assert "".join(heard) == "".join(c.text for c in chunks)
    assert run.first_tokens == len(next(c for c in chunks if c.token_ids).token_ids)
    assert 0 < run.ttft <= run.seconds and run.decode_tps > 0


@pytest.mark.parametrize("kwargs,field", [
    (dict(prompt="", max_new_tokens=5), "prompt"),
    (dict(prompt="   ", max_new_tokens=5), "prompt"),
    (dict(prompt="hi", max_new_tokens=0), "max_new_tokens"),
    (dict(prompt="hi", max_new_tokens=-3), "max_new_tokens"),
    (dict(prompt="hi", max_new_tokens=201), "max_new_tokens"),
    (dict(prompt="hi", max_new_tokens=5, window=9), "window"),
    (dict(prompt="hi", max_new_tokens=5, window=-2), "window"),
])
def test_generate_bad_input_is_invalid_argument_naming_the_field(cluster, kwargs, field):
    kwargs = {"window": -1, **kwargs}
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        collect(cluster.coordinator.address, kwargs["prompt"], kwargs["max_new_tokens"], kwargs["window"])
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert raised.value.details().startswith(field)


async def verifier_stream_call(address, windows):
    """Send windows on one stream; return (verdicts, final status code, details, trailers)."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = verifier_pb2_grpc.VerifierStub(channel)
        call = stub.VerifyStream()
        verdicts = []
        try:
            for window in windows:
                await call.write(window)
                verdicts.append(await call.read())
            await call.done_writing()
        except grpc.aio.AioRpcError as error:
            return verdicts, error.code(), error.details(), dict(error.trailing_metadata() or ())
        return verdicts, grpc.StatusCode.OK, "", {}


async def open_session(address, session_id, tokens):
    async with grpc.aio.insecure_channel(address) as channel:
        return await verifier_pb2_grpc.VerifierStub(channel).OpenSession(
            verifier_pb2.OpenSessionRequest(session_id=session_id, tokens=tokens))


def W(base, draft, sid="v1", seq=0):
    return verifier_pb2.Window(session_id=sid, window_seq=seq, base_position=base, draft_tokens=draft)


@pytest.mark.parametrize("bad,code", [
    (W(5, [1], sid="missing"), grpc.StatusCode.NOT_FOUND),
    (W(5, [1] * 9), grpc.StatusCode.INVALID_ARGUMENT),
    (W(5, [1, 320]), grpc.StatusCode.INVALID_ARGUMENT),
    (W(-1, [1]), grpc.StatusCode.INVALID_ARGUMENT),
    (W(99, [1]), grpc.StatusCode.INVALID_ARGUMENT),
    (W(2, [1]), grpc.StatusCode.ABORTED),
], ids=["unknown_session", "window_too_long", "id_outside_vocab", "negative_base", "future_base", "stale_base"])
def test_verifier_rejects_bad_windows_and_the_session_is_unchanged(cluster, bad, code):
    address = cluster.verifier.address
    prompt = list(b"hello")
    asyncio.run(open_session(address, "v1", prompt))
    verdicts, status, details, trailers = asyncio.run(verifier_stream_call(address, [bad]))
    assert (verdicts, status) == ([], code), details
    if code == grpc.StatusCode.ABORTED:
        assert trailers["committed-position"] == "5"
    # A valid window at the unchanged committed position gets exactly the in-process verdict.
    verdicts, status, _, _ = asyncio.run(verifier_stream_call(address, [W(5, [104, 105, 106])]))
    reference = VerifierEngine(tiny(cluster.target), [TINY_EOS])
    reference.open("r", prompt)
    expected = reference.verify("r", 5, [104, 105, 106])
    assert status == grpc.StatusCode.OK
    assert (verdicts[0].accepted, verdicts[0].next_token, verdicts[0].committed_position) == (
        expected.verdict.accepted, expected.verdict.next_token, expected.committed_position)


def test_verifier_replayed_window_gets_the_same_verdict(cluster):
    address = cluster.verifier.address
    asyncio.run(open_session(address, "v2", list(b"abc")))
    window = W(3, [100, 101], sid="v2")
    first, status1, _, _ = asyncio.run(verifier_stream_call(address, [window]))
    again, status2, _, _ = asyncio.run(verifier_stream_call(address, [window]))
    assert status1 == status2 == grpc.StatusCode.OK
    assert first[0].committed_position == again[0].committed_position
    assert (first[0].accepted, first[0].next_token) == (again[0].accepted, again[0].next_token)


def test_verifier_reordered_and_duplicated_optimistic_windows_over_one_stream(cluster):
    """Pipelining's windows over a real stream: an optimistic window that arrives before the window it
    depends on is discarded (nothing changes); after it, the same window verifies; a duplicate replays."""
    prompt = list(b"hello")
    check_optimistic_windows(cluster.verifier.address, "v3", prompt, target_only_greedy(cluster.target, prompt, 6))


def check_optimistic_windows(address: str, sid: str, prompt: list[int], truth: list[int]) -> None:
    """Reordered, duplicated and wrong-parent optimistic windows of a session opened here on ``prompt`` (5
    tokens), whose target-only greedy continuation is ``truth`` (6 tokens); any verifier backend."""
    asyncio.run(open_session(address, sid, prompt))

    def optimistic(base, draft, parent, seq):
        return verifier_pb2.Window(session_id=sid, window_seq=seq, base_position=base, draft_tokens=draft,
                                   optimistic=True, parent_token=parent)

    ahead = optimistic(8, truth[3:5], truth[2], 1)        # assumes truth[0:3] already committed
    first = W(5, truth[0:2], sid=sid, seq=0)              # commits truth[0:3] (2 accepted + bonus)
    verdicts, status, details, _ = asyncio.run(verifier_stream_call(address, [ahead, first, ahead, ahead]))
    assert status == grpc.StatusCode.OK, details
    assert verdicts[0].discarded and verdicts[0].committed_position == 5          # reordered: discarded
    assert (verdicts[1].accepted, verdicts[1].committed_position) == (2, 8)
    assert not verdicts[2].discarded and verdicts[2].committed_position == 11      # now it holds
    assert verdicts[2].next_token == truth[5]
    same = lambda v: (v.discarded, v.accepted, v.next_token, v.committed_position)  # noqa: E731
    assert same(verdicts[3]) == same(verdicts[2])                                   # duplicate: same verdict
    wrong_parent = optimistic(11, [1], truth[5] + 1, 2)
    verdicts, status, _, _ = asyncio.run(verifier_stream_call(address, [wrong_parent]))
    assert verdicts[0].discarded and verdicts[0].committed_position == 11


def test_verifier_open_bad_prefix_and_unknown_close(cluster):
    async def go():
        async with grpc.aio.insecure_channel(cluster.verifier.address) as channel:
            stub = verifier_pb2_grpc.VerifierStub(channel)
            codes = []
            for request in (verifier_pb2.OpenSessionRequest(session_id="x", tokens=[]),
                            verifier_pb2.OpenSessionRequest(session_id="x", tokens=[1, 5000]),
                            verifier_pb2.OpenSessionRequest(session_id="", tokens=[1])):
                with pytest.raises(grpc.aio.AioRpcError) as raised:
                    await stub.OpenSession(request)
                codes.append(raised.value.code())
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await stub.CloseSession(verifier_pb2.CloseSessionRequest(session_id="never-opened"))
            codes.append(raised.value.code())
            info = await stub.Info(verifier_pb2.InfoRequest())
            return codes, info
    codes, info = asyncio.run(go())
    assert codes == [grpc.StatusCode.INVALID_ARGUMENT] * 3 + [grpc.StatusCode.NOT_FOUND]
    assert (info.vocab_size, list(info.eos_token_ids), info.max_window, info.device) == (320, [TINY_EOS], 8, "cpu")


def test_drafter_rpc_errors(cluster):
    async def go():
        async with grpc.aio.insecure_channel(cluster.drafter.address) as channel:
            stub = drafter_pb2_grpc.DrafterStub(channel)
            await stub.OpenSession(drafter_pb2.DrafterOpenRequest(session_id="d", tokens=[1, 2, 3]))
            codes = []
            for request in (drafter_pb2.DraftRequest(session_id="nope", base_position=3, k=2),
                            drafter_pb2.DraftRequest(session_id="d", base_position=3, k=0),
                            drafter_pb2.DraftRequest(session_id="d", base_position=3, k=9),
                            drafter_pb2.DraftRequest(session_id="d", base_position=9, append=[4], k=2)):
                with pytest.raises(grpc.aio.AioRpcError) as raised:
                    await stub.Draft(request)
                codes.append(raised.value.code())
            ok = await stub.Draft(drafter_pb2.DraftRequest(session_id="d", base_position=3, k=4))
            return codes, list(ok.tokens)
    codes, tokens = asyncio.run(go())
    assert codes == [grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT,
                     grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.ABORTED]
    assert len(tokens) == 4


def test_every_service_serves_health_and_reflection(cluster):
    async def go(address):
        async with grpc.aio.insecure_channel(address) as channel:
            health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""))
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)
            names = []
            async for reply in stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")])):
                names = [s.name for s in reply.list_services_response.service]
            return health.status, names
    for service, name in ((cluster.verifier, "edgespec.v1.Verifier"), (cluster.drafter, "edgespec.v1.Drafter"),
                          (cluster.coordinator, "edgespec.v1.Coordinator")):
        status, names = asyncio.run(go(service.address))
        assert status == health_pb2.HealthCheckResponse.SERVING
        assert name in names and "grpc.health.v1.Health" in names


def test_verifier_and_drafter_say_where_they_run_and_the_coordinator_sees_them_share_cpus(cluster):
    async def go():
        async with grpc.aio.insecure_channel(cluster.verifier.address) as v, \
                grpc.aio.insecure_channel(cluster.drafter.address) as d:
            return (await verifier_pb2_grpc.VerifierStub(v).Info(verifier_pb2.InfoRequest()),
                    await drafter_pb2_grpc.DrafterStub(d).Info(drafter_pb2.DrafterInfoRequest()))
    verifier, drafter = asyncio.run(go())
    for info in (verifier, drafter):   # unpinned, on this machine
        assert info.placement.host == socket.gethostname()
        assert list(info.placement.cpus) == sorted(os.sched_getaffinity(0))
    collect(cluster.coordinator.address, PROMPTS[0], 4, -1)   # the coordinator reads the verifier's Info
    assert PLACED[0] in placement_line(cluster.coordinator.log_path)


PLACED = ("the drafter shares CPUs with the verifier", "the drafter runs on other CPUs than the verifier")


def placement_line(path, seconds=150):
    """The coordinator's line on where the drafter runs, once its log holds one (it asks the verifier's and the
    drafter's Info in the background, backing off while either is not up); fails with the log's Info lines."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        lines = [line for line in path.read_text().splitlines() if any(p in line for p in PLACED)]
        if lines:
            return "\n".join(lines)
        time.sleep(0.2)
    pytest.fail("no placement line in the coordinator's log after %d s; its lines on Info and the drafter:\n%s" % (
        seconds, "\n".join(line for line in path.read_text().splitlines() if "drafter" in line or "Info" in line)))


def test_a_drafter_pinned_to_other_cpus_than_the_verifier_is_seen_apart(tmp_path):
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs to pin the services apart")
    with LocalCluster(tmp_path, verifier_args=["--model", "tiny:7"], drafter_args=["--model", "tiny:7~1"],
                      coordinator_args=["--tokenizer", "bytes"], verifier_cpus=str(cpus[-1]),
                      edge_cpus=str(cpus[0])) as running:
        chunks, _ = collect(running.coordinator.address, PROMPTS[0], 8, -1)
        placed = placement_line(running.coordinator.log_path)
    assert [t for c in chunks for t in c.token_ids] == target_only_greedy("tiny:7", list(PROMPTS[0].encode()), 8)
    assert placed.endswith(PLACED[1] + ": drafting takes no verifier time") and PLACED[0] not in placed


def test_cli_generate_streams_text_and_stats(cluster):
    result = subprocess.run([sys.executable, "-m", "edge_client.cli", "generate", "def add(a, b):", "--raw",
                             "--coordinator", cluster.coordinator.address, "--max-new-tokens", "20"],
                            capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    expected = target_only_greedy(cluster.target, list(b"def add(a, b):"), 20)
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip("\n") == bytes(t for t in expected if t < 256).decode("utf-8", errors="replace").rstrip("\n")
    assert "tokens in" in result.stderr and "acceptance" in result.stderr
    bad = subprocess.run([sys.executable, "-m", "edge_client.cli", "generate", "x", "--raw", "--coordinator",
                          cluster.coordinator.address, "--max-new-tokens", "0"], capture_output=True, text=True,
                         cwd=REPO_ROOT, timeout=60)
    assert bad.returncode == 1 and "INVALID_ARGUMENT: max_new_tokens" in bad.stderr


def sample(address, prompt, seed=None, temperature=0.9, top_k=0, top_p=1.0, window=3, max_new=24, relaxed="",
           coupled=False, resume=()):
    return generated(address, prompt, max_new, window, chat=False, timeout_seconds=120, temperature=temperature,
                     top_k=top_k, top_p=top_p, seed=seed, relaxed=relaxed, coupled=coupled, resume_token_ids=resume)


def test_sampling_over_grpc_is_reproducible_by_seed(cluster):
    tokens, stats = sample(cluster.coordinator.address, "def add(a, b):", seed=99)
    assert stats.verification == "lossless-sampling" and stats.seed == 99
    assert sample(cluster.coordinator.address, "def add(a, b):", seed=99)[0] == tokens
    free, free_stats = sample(cluster.coordinator.address, "def add(a, b):")      # coordinator picks a seed
    assert sample(cluster.coordinator.address, "def add(a, b):", seed=free_stats.seed)[0] == free
    assert any(sample(cluster.coordinator.address, "def add(a, b):", seed=s)[0] != tokens for s in range(3))


def test_coupled_sampling_over_grpc_is_target_only_sampling_whatever_the_windows(cluster):
    from edgespec.verify.sampling import SamplingParams
    from tests.tiny import target_only_coupled

    prompt = "def add(a, b):"
    expected = target_only_coupled(cluster.target, list(prompt.encode()), 32,
                                   SamplingParams(temperature=0.9, top_k=50, seed=4242, coupled=True))
    for window in (0, 1, 3, -1):
        tokens, stats = sample(cluster.coordinator.address, prompt, seed=4242, top_k=50, window=window, max_new=32,
                               coupled=True)
        assert tokens == expected, window
        assert stats.verification == "coupled-sampling" and stats.seed == 4242
    # Resume inside the generation: a sample may end on EOS within its first tokens (the unrelated draft's
    # cluster samples one), and a resume that already finishes the generation is INVALID_ARGUMENT.
    cut = min(5, len(expected) - 1)
    resumed, _ = sample(cluster.coordinator.address, prompt, seed=4242, top_k=50, max_new=32, coupled=True,
                        resume=expected[:cut])
    assert resumed == expected[cut:]


@pytest.mark.parametrize("kwargs", [dict(temperature=-0.5), dict(top_p=1.5), dict(top_p=-0.5), dict(top_k=-1),
                                    dict(coupled=True, relaxed="diversed:0.3")])
def test_bad_sampling_parameters_are_invalid_argument(cluster, kwargs):
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        sample(cluster.coordinator.address, "hi", seed=1, **{"temperature": 0.7, **kwargs})
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def target_logprob(spec: str, prompt: list[int], tokens: list[int]) -> float:
    """The target's own mean T=1 log-probability of ``tokens`` after ``prompt`` (one forward)."""
    import numpy as np

    from edgespec.verify.relaxed import log_softmax

    lm = tiny(spec)
    rows = lm.logits_rows(lm.new_state(), prompt + tokens[:-1], len(tokens))
    return float(np.mean([log_softmax(rows)[i, t] for i, t in enumerate(tokens)]))


def test_relaxed_verification_is_labelled_lossy_and_measured(cluster):
    prompt = "def add(a, b):"
    exact, exact_stats = sample(cluster.coordinator.address, prompt, temperature=0.0, window=4, max_new=40)
    assert not exact_stats.lossy and exact_stats.verification == "greedy"
    # the verifier's log-likelihood of the lossless output is the target's own
    assert exact_stats.target_logprob == pytest.approx(target_logprob(cluster.target, list(prompt.encode()), exact),
                                                       abs=1e-4)
    relaxed, stats = sample(cluster.coordinator.address, prompt, temperature=0.0, window=4, max_new=40,
                            relaxed="diversed:0.9")
    assert stats.lossy and stats.verification == "relaxed-diversed(static, w=0.90) greedy (lossy)"
    assert stats.acceptance_rate >= exact_stats.acceptance_rate
    assert stats.target_logprob == pytest.approx(target_logprob(cluster.target, list(prompt.encode()), relaxed),
                                                 abs=1e-4)
    arbiter, arbiter_stats = sample(cluster.coordinator.address, prompt, temperature=0.0, window=4, max_new=40,
                                    relaxed="cospec:0.0")
    assert arbiter == exact and arbiter_stats.lossy   # margin 0 keeps only the target's own choices (no ties here)
    _, task_stats = sample(cluster.coordinator.address, prompt, temperature=0.0, relaxed="diversed:task")
    assert "task code" in task_stats.verification   # "def add" is code: the coordinator's code weight
    _, learned_stats = sample(cluster.coordinator.address, prompt, temperature=0.0, relaxed="diversed:learned:0.5")
    assert learned_stats.verification.startswith("relaxed-diversed(learned, w<=0.50)")


def test_relaxed_sampling_is_reproducible_by_seed(cluster):
    first = sample(cluster.coordinator.address, "Speculative", seed=5, relaxed="diversed:learned")
    assert sample(cluster.coordinator.address, "Speculative", seed=5, relaxed="diversed:learned")[0] == first[0]
    assert first[1].verification == "relaxed-diversed(learned, w<=0.90) sampling (lossy)"


@pytest.mark.parametrize("relaxation, field", [
    (dict(method=1, weight=0.99), "relaxation.weight"),
    (dict(method=2, margin=-1.0), "relaxation.margin"),
    (dict(method=7), "relaxation.method"),
    (dict(method=2, margin=1.0, weight=0.3), "relaxation"),
    (dict(method=1, task="poetry"), "relaxation.task"),
])
def test_bad_relaxation_is_invalid_argument_naming_the_field(cluster, relaxation, field):
    from edgespec.v1 import common_pb2, coordinator_pb2, coordinator_pb2_grpc

    async def go():
        async with grpc.aio.insecure_channel(cluster.coordinator.address) as channel:
            request = coordinator_pb2.GenerateRequest(prompt="hi", max_new_tokens=4, sampling=common_pb2.SamplingParams(
                temperature=0.7, relaxation=common_pb2.Relaxation(**relaxation)))
            async for _ in coordinator_pb2_grpc.CoordinatorStub(channel).Generate(request, timeout=30):
                pass
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        asyncio.run(go())
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert raised.value.details().startswith(field + ":") or raised.value.details().startswith("sampling." + field)


def test_heuristic_policy_cluster_output_equals_target_only(tmp_path):
    """The session runs the heuristic (its plan says so) and its output is target-only's. How far its windows grow
    is the policy's unit test (test_window_policies): here the drafter, a model as large as the target, drafts
    only where its measured costs say it pays, which on a loaded machine they may never do."""
    async def go(address):
        plans, tokens = [], []
        async for event in generate(address, PROMPTS[0], 48, -1, chat=False, timeout_seconds=120):
            if event.HasField("plan"):
                plans.append(event.plan)
            elif event.HasField("chunk"):
                tokens += event.chunk.token_ids
        return plans, tokens

    with LocalCluster(tmp_path, verifier_args=["--model", "tiny:7"], drafter_args=["--model", "tiny:7~1"],
                      coordinator_args=["--tokenizer", "bytes", "--auto-policy", "heuristic"]) as running:
        plans, tokens = asyncio.run(go(running.coordinator.address))
    assert [(plan.window, plan.auto_policy) for plan in plans] == [(-1, "heuristic")]
    assert tokens == target_only_greedy("tiny:7", list(PROMPTS[0].encode()), 48)


def test_router_picks_a_drafter_per_request_and_output_stays_exact(tmp_path):
    """Two drafter services behind one coordinator: n-gram and a model. The router picks per
    request, a session may switch once; every output equals target-only greedy."""
    with LocalCluster(tmp_path, verifier_args=["--model", "tiny:7"], drafter_args=["--model", "tiny:7~1"],
                      extra_drafters={"ngram": ["--backend", "ngram", "--vocab-size", "320"]},
                      coordinator_args=["--tokenizer", "bytes", "--window", "4"]) as running:
        used = set()
        for prompt in ["def add(a, b):\n    return a + b\n\ndef add(a, b):", "Speculative decoding is", "Hi!"]:
            chunks, stats = collect(running.coordinator.address, prompt, 40, 4)
            assert [t for c in chunks for t in c.token_ids] == target_only_greedy("tiny:7", list(prompt.encode()), 40)
            assert stats.drafter and set(stats.drafter.split(">")) <= {"draft", "ngram"}
            used.update(stats.drafter.split(">"))
        log = (tmp_path / "coordinator.log").read_text()
        assert "drafter" in log and "predicted acceptance" in log


def test_a_target_only_window_of_steps_over_grpc_commits_what_single_steps_do(cluster):
    """Window.steps over the wire: the verifier answers a target-only window of 4 steps with the target's 4 tokens
    (all but the last in drafted_tokens, accepted 0), as 4 one-token windows give them; a window of steps with
    draft tokens is INVALID_ARGUMENT and changes nothing."""
    address = cluster.verifier.address
    prompt = list(b"hello")
    asyncio.run(open_session(address, "v3", prompt))
    bad = verifier_pb2.Window(session_id="v3", window_seq=0, base_position=5, draft_tokens=[104], steps=2)
    verdicts, status, details, _ = asyncio.run(verifier_stream_call(address, [bad]))
    assert (verdicts, status) == ([], grpc.StatusCode.INVALID_ARGUMENT) and details.startswith("steps")
    window = verifier_pb2.Window(session_id="v3", window_seq=1, base_position=5, steps=4)
    verdicts, status, _, _ = asyncio.run(verifier_stream_call(address, [window]))
    reference = VerifierEngine(tiny(cluster.target), [TINY_EOS])
    reference.open("r", prompt)
    expected = []
    while len(expected) < 4 and TINY_EOS not in expected:
        expected.append(reference.verify("r", 5 + len(expected), []).verdict.next_token)
    assert status == grpc.StatusCode.OK and verdicts[0].accepted == 0
    assert list(verdicts[0].drafted_tokens) + [verdicts[0].next_token] == expected
    assert verdicts[0].committed_position == 5 + len(expected)
