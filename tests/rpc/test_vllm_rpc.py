"""The verifier on vLLM (services.verifier --backend vllm, in the vLLM environment .venv-vllm; SmolLM2-135M):
greedy output over gRPC equals vLLM's own greedy generation (no speculation, a separate engine) at every
window, with trees and cloud drafting refused and fallen back from; a session survives its verifier killed
mid-generation in both directions between a vLLM and a torch verifier; sampling runs; the modes vLLM cannot
do exactly are refused with FAILED_PRECONDITION. The sampling distribution is tested at the engine level
(tests/vllm_checks.py, run in the vLLM environment)."""
import asyncio
import signal

import grpc
import pytest

from bench.chaos import exactly_once, opened_count, run_with_fault, serving_verifier
from harness.cluster import LocalCluster
from bench.vllm_jobs import VLLM_PYTHON, run as vllm_run
from edge_client.client import generate
from edgespec.backends.registry import model_path
from edgespec.backends.tokenizer import load_tokenizer
from tests.streams import generated

if not VLLM_PYTHON.exists():
    pytest.skip("the vLLM environment is missing: bash scripts/vllm_env.sh (scripts/test.sh makes it)",
                allow_module_level=True)

PROMPTS = ["Write a Python function that adds two numbers.", "What is the capital of France?"]
MAX_NEW = 48
# float32 in both backends: on these prompts vLLM's and torch's greedy outputs agree (measured; the failover test
# checks it again, since a session moved between them mid-generation must match the reference either way).
VLLM = ["--backend", "vllm", "--model", "smollm2", "--dtype", "float32", "--max-model-len", "2048",
        "--vllm-kv-cache-gb", "1", "--max-window", "8"]
TORCH = ["--model", "smollm2", "--max-window", "8"]
COORDINATOR = ["--tokenizer", "smollm2"]


@pytest.fixture(scope="module", autouse=True)
def prepared_model():
    """The vLLM verifier loads SmolLM2's Hugging Face directory, which edgespec's environment converts once."""
    return model_path("smollm2")


@pytest.fixture(scope="module")
def prompt_ids():
    tokenizer = load_tokenizer("smollm2")
    return [tokenizer.encode(text, True) for text in PROMPTS]


@pytest.fixture(scope="module")
def references(prompt_ids):
    """vLLM's own greedy generation, no speculative decoding configured: each output ends at EOS or MAX_NEW."""
    job = dict(model=str(model_path("smollm2")), dtype="float32", prompts=prompt_ids, max_new=MAX_NEW)
    return vllm_run("bench.vllm_reference", job)["outputs"]


def collect(address, prompt, window, **options):
    return generated(address, prompt, MAX_NEW, window, chat=True, timeout_seconds=600, **options)


def test_greedy_over_grpc_on_vllm_equals_vllm_target_only(tmp_path, references):
    with LocalCluster(tmp_path, verifier_args=VLLM, verifier_python=str(VLLM_PYTHON), drafter_args=TORCH,
                      coordinator_args=COORDINATOR) as cluster:
        for window in (0, 3, -1):
            for prompt, expected in zip(PROMPTS, references):
                tokens, stats = collect(cluster.coordinator.address, prompt, window)
                assert tokens == expected, (prompt, window)
                if window > 0:
                    assert stats.accepted_tokens > 0     # the same model drafts: most windows hold
                # window -1 drafts what the measured costs say pays (free drafts, maybe no model draft at all):
                # its text is checked, not how much it drafted (CI saw 8 free-draft tokens, none accepted, 0 model)
        log = cluster.verifier.log_path.read_text(errors="replace")
        assert "vLLM on cpu" in log and "forward cost by tokens fed" in log
    # trees and cloud drafting: this backend's Info says it does neither, and the coordinator plans chains
    with LocalCluster(tmp_path / "fallback", verifier_args=VLLM, verifier_python=str(VLLM_PYTHON),
                      drafter_args=TORCH,
                      coordinator_args=[*COORDINATOR, "--tree-depth", "2", "--cloud-draft", "fallback"]) as cluster:
        tokens, stats = collect(cluster.coordinator.address, PROMPTS[0], 3)
        assert tokens == references[0]
        assert "does not score token trees" in cluster.coordinator.log_path.read_text(errors="replace")


def test_failover_between_a_vllm_and_a_torch_verifier_loses_nothing(tmp_path, prompt_ids, references):
    """Kill the serving verifier mid-generation, then the other one in the next generation: the session moves
    vLLM -> torch and torch -> vLLM (in some order) with its committed prefix, exactly once each time."""
    with LocalCluster(tmp_path, verifier_args=VLLM, verifier_python=str(VLLM_PYTHON), drafter_args=TORCH,
                      extra_verifiers=[(TORCH, None)], coordinator_args=[*COORDINATOR, "--window", "3"]) as cluster:
        moved = []
        for _ in range(2):
            before = [opened_count(v) for v in cluster.verifiers]
            killed = []

            def kill_serving():
                victim = serving_verifier(cluster, before)
                killed.append(victim)
                cluster.kill(victim, signal.SIGKILL)
            chunks, stats, _ = run_with_fault(cluster.coordinator.address, PROMPTS[0], MAX_NEW, kill_serving, 12,
                                              chat=True, window=3)
            assert exactly_once(chunks, references[0])
            assert stats.failovers >= 1
            moved.append(killed[0].name)
            cluster.restart(killed[0])
        assert sorted(moved) == ["verifier", "verifier1"]   # one of each backend was killed while serving


def test_sampling_runs_and_inexact_modes_are_refused(tmp_path):
    async def first_error(address, **options):
        try:
            async for _ in generate(address, PROMPTS[1], 8, 3, chat=True, timeout_seconds=120, **options):
                pass
        except grpc.aio.AioRpcError as error:
            return error.code(), error.details()
        return None, ""

    with LocalCluster(tmp_path, verifier_args=VLLM, verifier_python=str(VLLM_PYTHON), drafter_args=TORCH,
                      coordinator_args=COORDINATOR) as cluster:
        address = cluster.coordinator.address
        tokens, stats = collect(address, PROMPTS[0], 3, temperature=0.8, seed=7)
        assert 0 < len(tokens) <= MAX_NEW and stats.rounds > 0
        for options, mode in (({"coupled": True}, "coupled"), ({"relaxed": "diversed:0.5"}, "relaxed")):
            code, details = asyncio.run(first_error(address, temperature=0.8, seed=1, **options))
            assert code == grpc.StatusCode.FAILED_PRECONDITION, (mode, code, details)
            assert mode in details and "--backend torch" in details


def test_the_vllm_engine_rolls_back_exactly_and_samples_the_targets_distribution():
    """Greedy windows with wrong tokens (and EOS) commit exactly target-only decoding, whether the token vLLM
    sampled past a prefill or a step settles them. Sampled windows verified inside vLLM commit tokens distributed
    as the target: a chi-square test over the first two committed tokens (tests/vllm_checks.py)."""
    result = vllm_run("tests.vllm_checks", dict(model=str(model_path("smollm2")), samples=400))
    assert result["greedy_identical"], result
    assert result["greedy_rejected"] > 10 and result["greedy_stepped"] > 10 and result["greedy_settled_by_ahead"] > 0
    assert result["windows_accepted"] > 0 and result["windows_rejected"] > 0   # both paths exercised
    assert result["chi2"] < result["critical"], result                 # alpha = 0.001
    assert result["biased_chi2"] > result["biased_critical"], result   # the test can fail: a verifier leaning to
                                                                       # its drafter fails it
