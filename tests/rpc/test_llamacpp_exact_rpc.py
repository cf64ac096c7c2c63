"""llama.cpp's exact mode (--exact on): batches of any rows compute each row as a one-token decode does, so greedy
output through the services equals llama.cpp's own one-session target-only greedy with the same settings, at
every window, past 512 KV cells (where a two-thread one-token decode splits
its attention). SmolLM2-135M GGUF as shipped, two threads; the measurements by the shipped probe."""
import asyncio
import json
import subprocess
import sys

import grpc
import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is installed by scripts/install.sh")

from harness.cluster import REPO_ROOT, LocalCluster  # noqa: E402
from edgespec.backends import llamacpp  # noqa: E402
from edgespec.v1 import verifier_pb2 as pb, verifier_pb2_grpc  # noqa: E402
from bench.llama_exactness import many  # noqa: E402
from bench.llama_invariance import SETTINGS, run_setting  # noqa: E402
from tests.streams import generated  # noqa: E402

PARAGRAPH = ("The verifier keeps a cache of keys and values for each session and scores a window of drafted tokens "
             "in one pass. ")
PROMPTS = ["Summarise in one sentence: " + PARAGRAPH * 18, "Repeat the first sentence of this text: " + PARAGRAPH * 16]
MAX_NEW = 40
LLAMA = ["--backend", "llamacpp", "--model", "smollm2", "--ctx-tokens", "4096", "--max-sequences", "4"]
EXACT = next(s for s in SETTINGS if s.name.startswith("exact (--exact on)"))

REFERENCE = """
import json, sys
import numpy as np
from edgespec.backends import llamacpp
from edgespec.backends.tokenizer import load_tokenizer
prompts, max_new = json.loads(sys.argv[1]), int(sys.argv[2])
tokenizer = load_tokenizer("smollm2")
# the verifier's settings: exact, its prompts in parts of --prefill-chunk (llama.cpp's -ub)
lm = llamacpp.load("smollm2", threads=2, ctx_tokens=4096, max_sequences=2,
                   exact=llamacpp.exact_settings("on", 2, llamacpp.PREFILL_CHUNK))
eos, out = set(lm.eos_ids()), []
for text in prompts:
    state, seq, generated = lm.new_state(), tokenizer.encode(text, True), []
    for _ in range(max_new):
        token = int(np.argmax(lm.logits_rows(state, seq, 1)[0]))
        generated.append(token)
        if token in eos:
            break
        seq.append(token)
    out.append({"tokens": generated, "prompt_tokens": len(seq) - len(generated) + 1})
print(json.dumps(out))
"""


async def verifier_info(address: str):
    async with grpc.aio.insecure_channel(address) as channel:
        return await verifier_pb2_grpc.VerifierStub(channel).Info(pb.InfoRequest(), timeout=30)


@pytest.fixture(scope="module")
def references():
    """One session alone, its own context, prompt in one llama_decode (in ubatches of 64) then a token per decode:
    llama.cpp target-only with the verifier's exact settings (its own process: ggml's tiled-matmul setting is per process)."""
    out = subprocess.run([sys.executable, "-c", REFERENCE, json.dumps(PROMPTS), str(MAX_NEW)], capture_output=True,
                         text=True, cwd=REPO_ROOT, check=True, timeout=600).stdout
    refs = json.loads(out.strip().splitlines()[-1])
    assert min(r["prompt_tokens"] for r in refs) > 256   # past 256 cells: the split one-token path would apply
    return [r["tokens"] for r in refs]


def test_exact_settings_are_batch_invariant_where_the_default_is_not():
    exact = run_setting("smollm2", EXACT, 2)
    assert exact["short"]["n_star"] == exact["long"]["n_star"] == 16
    assert exact["batch"]["windows_identical"] and exact["batch"]["steps_identical"] and exact["rounds"]["identical"]
    default = run_setting("smollm2", SETTINGS[0], 2)   # the probe can tell: llama.cpp's defaults are not
    assert default["long"]["n_star"] < 16 and default["long"]["rows"]["2"]["max_abs_diff"] > 0


def test_greedy_on_llamacpp_exact_mode_equals_llamacpp_target_only(tmp_path, references):
    with LocalCluster(tmp_path, verifier_args=[*LLAMA, "--threads", "2", "--exact", "on"],
                      drafter_args=[*LLAMA, "--threads", "1"],
                      coordinator_args=["--tokenizer", "smollm2"]) as cluster:
        log = cluster.verifier.log_path.read_text()
        assert "-t 2 -tb 2 -fa on -ub 64" in log
        info = asyncio.run(verifier_info(cluster.verifier.address))   # windows past 240 positions costed apart
        assert info.far_positions == llamacpp.ONE_CHUNK_POSITIONS and f"past {info.far_positions} positions" in log
        assert len(info.far_forward_seconds) == len(info.forward_seconds) > 1 and min(info.far_forward_seconds) > 0
        for window in (0, 4, -1):
            for prompt, expected in zip(PROMPTS, references):
                tokens, stats = generated(cluster.coordinator.address, prompt, MAX_NEW, window, chat=True,
                                          timeout_seconds=600)
                assert tokens == expected, (prompt[:30], window)
                if window > 0:
                    assert stats.accepted_tokens > 0


def test_concurrent_sessions_rolling_back_on_exact_mode_equal_llamacpp_target_only(tmp_path, references):
    """Six sessions at once whose n-gram drafts are often rejected: each keeps a stream of KV cells of its own, so
    no token lands in a cell another session's rollback freed, before the session's earlier cells (attention would
    then sum its cells in another order than a one-session run)."""
    texts = PROMPTS * 3
    with LocalCluster(tmp_path, verifier_args=[*LLAMA[:4], "--ctx-tokens", "6144", "--max-sequences", "6",
                                               "--threads", "2", "--exact", "on"],
                      drafter_args=["--backend", "ngram", "--vocab-size", "49152"],
                      coordinator_args=["--tokenizer", "smollm2"]) as cluster:
        log = cluster.verifier.log_path.read_text()
        assert "6 sequences of up to 1024 tokens" in log and "KV per sequence" in log
        # a fixed window: with 6 sessions sharing the verifier the adaptive one keeps to target-only rounds here
        outputs = asyncio.run(many(cluster.coordinator.address, texts, MAX_NEW, 4))
    for text, (tokens, _) in zip(texts, outputs):
        assert tokens == references[PROMPTS.index(text)]
    assert sum(stats.drafted_tokens - stats.accepted_tokens for _, stats in outputs) > 0   # rollbacks happened
