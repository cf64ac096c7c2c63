"""The default real pair through the real services: greedy output equals target-only.

Slow (loads Qwen2.5-Coder-1.5B and -0.5B); the target-only reference is computed
first in its own process so the target is never loaded twice at once.
"""
import asyncio
import json
import subprocess
import sys

import pytest

from edge_client.client import generate
from bench.chaos import exactly_once, run_with_fault
from harness.cluster import REPO_ROOT, LocalCluster
from bench.prompts import PROMPTS

pytestmark = pytest.mark.real_models
MAX_NEW = 48


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    subprocess.run([sys.executable, "-m", "edgespec.ops.prepare"], cwd=REPO_ROOT, check=True)
    out = tmp_path_factory.mktemp("ref") / "baseline.json"
    subprocess.run([sys.executable, "-m", "bench.baselines", "--out", str(out), "--limit", "1",
                    "--hf-windows", "", "--max-new-tokens", str(MAX_NEW)], cwd=REPO_ROOT, check=True)
    row = json.loads(out.read_text())["rows"][0]
    assert row["system"] == "target-only" and len(row["tokens"]) >= 32
    return row["tokens"]


async def run(address, window):
    tokens, stats = [], None
    async for event in generate(address, PROMPTS[0][1], MAX_NEW, window, chat=True, timeout_seconds=900):
        if event.HasField("chunk"):
            tokens.extend(event.chunk.token_ids)
        else:
            stats = event.stats
    return tokens, stats


def test_real_pair_greedy_equals_target_only(reference, tmp_path):
    with LocalCluster(tmp_path) as cluster:
        for window in (2, 4, 0):
            tokens, stats = asyncio.run(run(cluster.coordinator.address, window))
            assert tokens == reference, f"window {window}: first difference at {next(i for i, (a, b) in enumerate(zip(tokens + [-1], reference)) if a != b)}"
            assert stats.prompt_tokens >= 32
            if window:
                # The real draft agrees with the target most of the time on code.
                assert stats.acceptance_rate > 0.5, stats


def test_real_pair_verifier_killed_mid_generation_output_unchanged(reference, tmp_path):
    """SIGKILL the only verifier (pipelined coordinator) a third of the way in, restart it: the session
    waits, is re-opened with its committed prefix on the fresh process, and the output is unchanged.
    The old process is dead before the new one loads, so the target is never loaded twice at once."""
    with LocalCluster(tmp_path, coordinator_args=["--pipeline", "on", "--failover-deadline", "300",
                                                  "--deadline", "120"]) as cluster:
        def kill_and_restart():
            cluster.kill(cluster.verifier)
            cluster.restart(cluster.verifier)

        chunks, stats, _ = run_with_fault(cluster.coordinator.address, PROMPTS[0][1], MAX_NEW, kill_and_restart,
                                          MAX_NEW // 3, chat=True)
    assert exactly_once(chunks, reference)
    assert stats.failovers >= 1 and stats.pipelined
