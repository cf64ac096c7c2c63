"""A drafter measures what a drafted token costs when it starts and reports it in its Info. The coordinator costs
drafting by it until rounds measure it, so where the verifier's own profile says that drafting cannot pay (here
SmolLM2 drafting for itself: a drafted token costs a target step), an adaptive-window session never runs the
drafter, nor prefills its prompt there, to find that out (free drafts, which cost nothing, still may run). Real llama.cpp services, SmolLM2-135M GGUF."""
import asyncio

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is installed by scripts/install.sh")

from harness.cluster import LocalCluster  # noqa: E402
from edgespec.v1 import drafter_pb2  # noqa: E402
from tests.rpc.test_model_by_id import wait_for_log  # noqa: E402
from tests.rpc.test_sessions_rpc import drafter_call  # noqa: E402
from tests.streams import generated  # noqa: E402

LLAMA = ["--backend", "llamacpp", "--model", "smollm2", "--threads", "1", "--ctx-tokens", "2048",
         "--max-sequences", "4"]
PROMPT = "Write a short poem about the sea."


def test_a_drafter_that_cannot_pay_is_never_opened(tmp_path):
    with LocalCluster(tmp_path, verifier_args=LLAMA, drafter_args=LLAMA,
                      coordinator_args=["--tokenizer", "smollm2"]) as cluster:
        info = asyncio.run(drafter_call(cluster.drafter.address, "Info", drafter_pb2.DrafterInfoRequest()))
        assert 0 < info.draft_seconds_per_token < 1 and 0 < info.prefill_seconds_per_token < 1
        wait_for_log(cluster.coordinator, "a drafted token costs")   # the coordinator has read it
        reference, _ = generated(cluster.coordinator.address, PROMPT, 32, 0, chat=True, timeout_seconds=300)
        tokens, stats = generated(cluster.coordinator.address, PROMPT, 32, -1, chat=True, timeout_seconds=300)
        # free drafts (prompt lookup) still run where the measured costs say they pay: on a loaded machine
        # that can go either way, so only the drafter's tokens are counted here
        assert tokens == reference and stats.drafted_tokens == stats.free_drafted_tokens
        assert stats.rounds == len(tokens) - stats.free_accepted_tokens
        assert "drafter opened" not in cluster.coordinator.log_path.read_text()
        assert "opened" not in cluster.drafter.log_path.read_text().split("a drafted token costs")[1]
        tokens, stats = generated(cluster.coordinator.address, PROMPT, 32, 3, chat=True, timeout_seconds=300)
        assert tokens == reference and stats.drafted_tokens > 0   # a fixed window asked for still drafts
