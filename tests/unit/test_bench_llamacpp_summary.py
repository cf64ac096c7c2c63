"""bench-llamacpp's per-mode summary: speed over all prompts, TPOT per request (p50/p99 across prompts),
acceptance over all draft tokens."""
import pytest

from bench.bench_llamacpp import aggregate


def test_tpot_percentiles_are_per_request_and_speed_is_over_all_tokens():
    rows = [{"new_tokens": n, "decode_seconds": s, "identical": i, "accepted": a, "drafted": d}
            for n, s, i, a, d in [(64, 3.2, True, 2, 10), (64, 6.4, False, 18, 30), (32, 0.8, True, 0, 0)]]
    summary = aggregate(rows)
    assert summary["tokens_per_second"] == pytest.approx(160 / 10.4)
    assert summary["tpot_p50_ms"] == pytest.approx(50.0)        # 25, 50, 100 ms per token
    assert summary["tpot_p99_ms"] == pytest.approx(100.0)
    assert summary["identical"] == 2 and summary["prompts"] == 3
    assert summary["acceptance"] == pytest.approx(20 / 40)   # pooled counts, not the mean of the rates (0.4)


def test_the_ceiling_is_the_goodput_model_over_the_measured_curve():
    """E(k) / (k d + RTT + c(k + 1)) at its best k, written out for a curve that measured windows up to 3 tokens
    (so k <= 2, whatever max_k allows), against target-only, 1 / (RTT + c(1))."""
    from bench.bench_llamacpp import ceiling

    curve, d, alpha, rtt = {1: 1.0, 2: 1.2, 3: 1.5, 5: 1.9}, 0.1, 0.8, 0.5
    by_hand = [1 / (rtt + 1.0), (1 + alpha) / (d + rtt + 1.2), (1 + alpha + alpha ** 2) / (2 * d + rtt + 1.5)]
    assert ceiling(curve, d, alpha, rtt) == pytest.approx(max(by_hand))
    assert ceiling(curve, d, alpha, rtt, max_k=1) == pytest.approx(max(by_hand[:2]))
    assert ceiling({1: 1.0}, d, alpha, rtt) == pytest.approx(by_hand[0])
