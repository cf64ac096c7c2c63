import pytest

from edgespec.control.sample import RoundSample
from edgespec.loop.session import SessionLog, latency_ms, percentile
from edgespec.verify.greedy import Verdict


def make(max_new=10):
    return SessionLog(prompt=[1, 2, 3], max_new_tokens=max_new, eos_ids=frozenset({0}))


def test_commit_records_tokens_and_the_stats_count_the_round_sample():
    log = make()
    assert log.commit([5, 6, 7], Verdict(2, 9)) == [5, 6, 9]
    assert log.committed == [1, 2, 3, 5, 6, 9]
    assert log.position == 6
    log.stats.record(RoundSample(3, 2, 0.1, 0.4, 0.3, target_logprob=-1.5))
    assert (log.stats.rounds, log.stats.drafted, log.stats.accepted) == (1, 3, 2)
    assert (log.stats.draft_seconds, log.stats.verify_wall_seconds, log.stats.target_logprob) == (0.1, 0.4, -1.5)
    assert log.stats.acceptance_rate == pytest.approx(2 / 3)
    assert log.stats.mean_accepted_length == 3
    assert log.finish_reason is None


def test_eos_finishes():
    log = make()
    log.commit([5], Verdict(1, 0))
    assert log.finish_reason == "eos"


def test_window_clamped_so_a_round_never_overshoots_the_budget():
    log = make(max_new=4)
    assert log.clamp_window(8) == 3
    log.commit([5, 6, 7], Verdict(3, 8))
    assert log.remaining == 0 and log.finish_reason == "length"
    log2 = make(max_new=1)
    assert log2.clamp_window(4) == 0


def test_commit_rejects_impossible_verdicts():
    log = make(max_new=2)
    with pytest.raises(ValueError):
        log.commit([5], Verdict(2, 1))
    with pytest.raises(ValueError):
        log.commit([5, 6, 7], Verdict(3, 1))
    assert log.generated == []



def test_merged_stats_count_every_round_of_every_generation():
    from edgespec.loop.session import RoundStats

    a, b = RoundStats(), RoundStats()
    a.record(RoundSample(3, 2, 0.1, 0.4))
    a.record(RoundSample(0, 0, 0.0, 0.2))
    b.record(RoundSample(4, 4, 0.2, 0.5, free=True))
    b.optimistic_windows, b.optimistic_hits = 3, 2
    one = RoundStats()
    for sample in (RoundSample(3, 2, 0.1, 0.4), RoundSample(0, 0, 0.0, 0.2), RoundSample(4, 4, 0.2, 0.5, free=True)):
        one.record(sample)
    one.optimistic_windows, one.optimistic_hits = 3, 2
    merged = RoundStats.merged([a, b])
    assert merged.offered_at_depth == one.offered_at_depth == [2, 2, 2, 1]
    assert merged.accepted_at_depth == one.accepted_at_depth == [2, 2, 1, 1]
    assert merged == one and merged.acceptance_rate == pytest.approx(6 / 7)
    assert merged.mean_accepted_length == pytest.approx(9 / 3)
    assert (a.rounds, a.accepted_at_depth) == (2, [1, 1])   # the parts are left as they were
    assert RoundStats.merged([]) == RoundStats()


def test_latencies_have_one_spelling_and_nearest_rank_percentiles():
    seconds = [0.001 * i for i in range(1, 101)]          # 1..100 ms
    assert latency_ms("tpot", seconds) == pytest.approx({"tpot_p50_ms": 51.0, "tpot_p99_ms": 100.0})
    assert latency_ms("itl", []) == {"itl_p50_ms": 0.0, "itl_p99_ms": 0.0}
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
