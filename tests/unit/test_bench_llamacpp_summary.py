"""bench-llamacpp's per-mode summary: speed over all prompts, TPOT per request (p50/p99 across prompts)."""
import pytest

from bench.bench_llamacpp import aggregate


def test_tpot_percentiles_are_per_request_and_speed_is_over_all_tokens():
    rows = [{"new_tokens": n, "decode_seconds": s, "identical": i, "acceptance": 0.5, "drafted": d}
            for n, s, i, d in [(64, 3.2, True, 10), (64, 6.4, False, 30), (32, 0.8, True, 0)]]
    summary = aggregate(rows)
    assert summary["tokens_per_second"] == pytest.approx(160 / 10.4)
    assert summary["tpot_p50_ms"] == pytest.approx(50.0)        # 25, 50, 100 ms per token
    assert summary["tpot_p99_ms"] == pytest.approx(100.0)
    assert summary["identical"] == 2 and summary["prompts"] == 3
    assert summary["acceptance"] == pytest.approx(0.5)
