"""Pipelining through the real services at the largest window the flags allow (default --max-window 16 on
coordinator, drafter and verifier): the look-ahead asks the drafter for its bonus guess and the next window
in one call, which must stay within the drafter's limit (it asked for 17 tokens and the generation failed)."""
import asyncio

from edge_client.client import generate
from harness.cluster import LocalCluster
from tests.tiny import target_only_greedy


def test_pipelining_at_window_16_over_grpc_equals_target_only(tmp_path):
    prompt = "def add(a, b):"
    with LocalCluster(tmp_path, verifier_args=["--model", "tiny:7"], drafter_args=["--model", "tiny:7"],
                      coordinator_args=["--tokenizer", "bytes", "--pipeline", "on"]) as cluster:
        async def go():
            tokens, stats = [], None
            async for event in generate(cluster.coordinator.address, prompt, 64, 16, chat=False, timeout_seconds=300):
                if event.HasField("chunk"):
                    tokens.extend(event.chunk.token_ids)
                else:
                    stats = event.stats
            return tokens, stats
        tokens, stats = asyncio.run(go())
    assert tokens == target_only_greedy("tiny:7", list(prompt.encode()), 64)
    assert stats.pipelined and stats.optimistic_windows > 0 and stats.drafted_tokens >= 16
