"""Speculative sampling with the real pair over gRPC: same distribution as target-only sampling.

Two-sample chi-square (homogeneity) per position, temperature 0.7, many seeds:
edgespec (window 2, sparse q) against target-only sampling (window 0) on the
same verifier. Categories with few observations are pooled.

The test opens 243 sessions. With the chat template (~40 prompt tokens to prefill
on target and draft) on float32 PyTorch that took ~12 minutes, past the timeout on
a loaded machine; here each session is a raw completion of a 4-token prompt on
llama.cpp (the GGUF files as shipped, one core each). The verification rules are
the same code on every backend; tests/system/test_real_pair_coupled.py samples the
pair on PyTorch.
"""
import asyncio

import pytest

from edge_client.client import generate
from harness.cluster import LocalCluster

pytestmark = pytest.mark.real_models
pytest.importorskip("llama_cpp", reason="llama-cpp-python is installed by scripts/install.sh")
LLAMA = ["--backend", "llamacpp", "--threads", "1", "--ctx-tokens", "4096", "--max-sequences", "8"]
PROMPT = "My favourite fruit is"   # raw completion: a few prompt tokens, a varied next word
SEEDS = 120
CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32, 8: 26.12, 9: 27.88, 10: 29.59}


async def sample_many(address, window, seeds):
    out = []
    for seed in seeds:
        tokens, stats = [], None
        async for event in generate(address, PROMPT, 3, window, chat=False, timeout_seconds=300, temperature=0.7,
                                    seed=seed):
            if event.HasField("chunk"):
                tokens.extend(event.chunk.token_ids)
            else:
                stats = event.stats
        assert stats.verification == "lossless-sampling" and stats.seed == seed
        out.append(tokens)
    return out


def homogeneity(a: list[int], b: list[int]) -> tuple[float, int]:
    """Two-sample chi-square statistic over categories, pooling those with < 10 total observations."""
    from collections import Counter
    ca, cb = Counter(a), Counter(b)
    cats, pooled = [], [0, 0]
    for token in set(ca) | set(cb):
        if ca[token] + cb[token] >= 10:
            cats.append((ca[token], cb[token]))
        else:
            pooled[0] += ca[token]
            pooled[1] += cb[token]
    if sum(pooled):
        cats.append(tuple(pooled))
    na, nb = len(a), len(b)
    stat = 0.0
    for x, y in cats:
        total = x + y
        for observed, n in ((x, na), (y, nb)):
            expected = total * n / (na + nb)
            stat += (observed - expected) ** 2 / expected
    return stat, max(len(cats) - 1, 1)


def test_real_pair_sampling_distribution_matches_target_only(tmp_path):
    with LocalCluster(tmp_path, verifier_args=["--model", "target", *LLAMA],
                      drafter_args=["--model", "draft", *LLAMA]) as cluster:
        speculative = asyncio.run(sample_many(cluster.coordinator.address, 2, range(SEEDS)))
        target_only = asyncio.run(sample_many(cluster.coordinator.address, 0, range(10_000, 10_000 + SEEDS)))
        # Same seed, same text.
        assert asyncio.run(sample_many(cluster.coordinator.address, 2, range(3))) == speculative[:3]
    assert len({tuple(t) for t in speculative}) > 1, "temperature 0.7 should give varied outputs"
    for position in range(2):
        a = [t[position] for t in speculative if len(t) > position]
        b = [t[position] for t in target_only if len(t) > position]
        stat, df = homogeneity(a, b)
        assert stat < CHI2_999[min(df, 10)], (position, stat, df)
