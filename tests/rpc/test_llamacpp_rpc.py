"""The services on llama.cpp (verifier and drafter --backend llamacpp, SmolLM2-135M GGUF as shipped): greedy
output over gRPC equals llama.cpp target-only greedy on the same backend, at every window and across a
verifier killed mid-generation (two llama.cpp verifiers, the session re-homed with its committed prefix)."""
import signal

import numpy as np
import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is installed by scripts/install.sh")

from bench.chaos import exactly_once, opened_count, run_with_fault, serving_verifier  # noqa: E402
from harness.cluster import LocalCluster  # noqa: E402
from edgespec.backends import llamacpp  # noqa: E402
from edgespec.backends.tokenizer import load_tokenizer  # noqa: E402
from tests.streams import generated  # noqa: E402

PROMPTS = ["Write a Python function that adds two numbers.", "What is the capital of France?"]
MAX_NEW = 48
LLAMA = ["--backend", "llamacpp", "--model", "smollm2", "--threads", "1", "--ctx-tokens", "2048"]


@pytest.fixture(scope="module")
def references():
    tokenizer = load_tokenizer("smollm2")
    lm = llamacpp.load("smollm2", threads=1, ctx_tokens=2048, max_sequences=2)
    eos, out = set(lm.eos_ids()), []
    for text in PROMPTS:
        state, seq, generated = lm.new_state(), tokenizer.encode(text, True), []
        for _ in range(MAX_NEW):
            token = int(np.argmax(lm.logits_rows(state, seq, 1)[0]))
            generated.append(token)
            if token in eos:
                break
            seq.append(token)
        out.append(generated)
    lm.close()
    return out


def collect(address, prompt, window):
    return generated(address, prompt, MAX_NEW, window, chat=True, timeout_seconds=600)


def test_greedy_over_grpc_on_llamacpp_equals_llamacpp_target_only(tmp_path, references):
    with LocalCluster(tmp_path, verifier_args=LLAMA, drafter_args=LLAMA,
                      coordinator_args=["--tokenizer", "smollm2"]) as cluster:
        for window in (0, 3, -1):
            for prompt, expected in zip(PROMPTS, references):
                tokens, stats = collect(cluster.coordinator.address, prompt, window)
                assert tokens == expected, (prompt, window)
                if window > 0:
                    assert stats.accepted_tokens > 0     # the same model drafts: most windows hold


def test_a_llamacpp_verifier_killed_mid_generation_loses_nothing(tmp_path, references):
    with LocalCluster(tmp_path, verifier_args=LLAMA, drafter_args=LLAMA, verifier_count=2,
                      coordinator_args=["--tokenizer", "smollm2", "--window", "2"]) as cluster:
        before = [opened_count(v) for v in cluster.verifiers]

        def kill_serving():
            cluster.kill(serving_verifier(cluster, before), signal.SIGKILL)
        chunks, stats, _ = run_with_fault(cluster.coordinator.address, PROMPTS[0], MAX_NEW, kill_serving, 12,
                                          chat=True)
    assert exactly_once(chunks, references[0])
    assert stats.failovers >= 1
