"""The coupled sampler on the default real pair: the text equals target-only sampling with the same seed,
token for token, across windows 1-4, pipelining and a verifier killed mid-generation.

The reference is computed first in its own process (transformers, one token per forward), so the target is
never loaded twice at once; the verifier kill restarts the only verifier after the old process is dead.
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
MAX_NEW = 32
SEED = 2026
TEMPERATURE = 0.8
SAMPLING = dict(temperature=TEMPERATURE, seed=SEED, coupled=True)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    subprocess.run([sys.executable, "-m", "edgespec.ops.prepare"], cwd=REPO_ROOT, check=True)
    out = tmp_path_factory.mktemp("ref") / "baseline.json"
    subprocess.run([sys.executable, "-m", "bench.baselines", "--out", str(out), "--limit", "1",
                    "--hf-windows", "", "--max-new-tokens", str(MAX_NEW), "--temperature", str(TEMPERATURE),
                    "--coupled-seed", str(SEED)], cwd=REPO_ROOT, check=True)
    [row] = [r for r in json.loads(out.read_text())["rows"] if r["system"] == "target-only-coupled"]
    greedy = next(r for r in json.loads(out.read_text())["rows"] if r["system"] == "target-only")
    assert len(row["tokens"]) >= 16 and row["tokens"] != greedy["tokens"][:len(row["tokens"])]   # really sampled
    return row["tokens"]


async def run(address, window):
    tokens, stats = [], None
    async for event in generate(address, PROMPTS[0][1], MAX_NEW, window, chat=True, timeout_seconds=900,
                                **SAMPLING):
        if event.HasField("chunk"):
            tokens.extend(event.chunk.token_ids)
        else:
            stats = event.stats
    return tokens, stats


def test_real_pair_coupled_sampling_equals_target_only_sampling_at_every_window(reference, tmp_path):
    with LocalCluster(tmp_path) as cluster:
        for window in (1, 2, 3, 4):
            tokens, stats = asyncio.run(run(cluster.coordinator.address, window))
            assert tokens == reference, window
            assert stats.verification == "coupled-sampling" and stats.seed == SEED and stats.accepted_tokens > 0


def test_real_pair_coupled_sampling_pipelined_and_across_a_verifier_kill(reference, tmp_path):
    with LocalCluster(tmp_path, coordinator_args=["--pipeline", "on", "--failover-deadline", "300",
                                                  "--deadline", "120"]) as cluster:
        tokens, stats = asyncio.run(run(cluster.coordinator.address, 3))
        assert tokens == reference and stats.pipelined and stats.optimistic_windows > 0

        def kill_and_restart():
            cluster.kill(cluster.verifier)
            cluster.restart(cluster.verifier)

        chunks, stats, _ = run_with_fault(cluster.coordinator.address, PROMPTS[0][1], MAX_NEW, kill_and_restart,
                                          MAX_NEW // 3, chat=True, window=3, **SAMPLING)
    assert exactly_once(chunks, reference)
    assert stats.failovers >= 1 and stats.pipelined
