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


def test_a_generations_reported_counts_come_back_as_the_same_round_stats():
    """GenerationStats (the library's and protobuf's) reports RoundStats under its own names, by one mapping:
    a client pools what it was told as the coordinator pools sessions."""
    from dataclasses import fields

    from edgespec.loop.generation import GenerationStats
    from edgespec.loop.session import REPORTED, RoundStats
    from edgespec.v1 import coordinator_pb2 as pb

    stats = RoundStats()
    for sample in (RoundSample(3, 2, 0.1, 0.4), RoundSample(4, 4, 0.2, 0.5, free=True), RoundSample(0, 0, 0.0, 0.2)):
        stats.record(sample)
    stats.optimistic_windows, stats.optimistic_hits = 3, 2
    reported = stats.reported()
    assert set(REPORTED.values()) <= {f.name for f in fields(GenerationStats)}
    assert set(reported) <= set(pb.GenerationStats.DESCRIPTOR.fields_by_name)
    assert reported["acceptance_rate"] == stats.acceptance_rate and reported["free_drafted_tokens"] == 4
    wire = pb.GenerationStats(**reported)
    counted = dict(degraded=0, target_logprob=0.0)   # not reported as counts (finish reason; a mean per token)
    assert RoundStats.of(wire) == stats == RoundStats.of(reported)
    assert RoundStats.merged([RoundStats.of(wire), RoundStats.of(dict(rounds=2, drafted_tokens=1))]).rounds == 5
    assert RoundStats.of(dict(config="target-only")) == RoundStats(**counted)   # a row with no rounds counts 0
    row = dict(offered_at_depth=[1])
    stats.offered_at_depth.append(9), RoundStats.of(row).offered_at_depth.append(9)
    assert reported["offered_at_depth"] == [2, 2, 2, 1] and row["offered_at_depth"] == [1]   # copies, not views


def test_acceptance_by_depth_is_per_offered_depth_or_per_round_where_depths_are_unknown():
    from edgespec.loop.session import RoundStats

    edge = RoundStats(rounds=4, offered_at_depth=[4, 2], accepted_at_depth=[3, 1])
    assert edge.acceptance_by_depth == [0.75, 0.5]
    cloud = RoundStats(rounds=4, drafted=12, accepted_at_depth=[2, 1])
    assert cloud.acceptance_by_depth == [0.5, 0.25] and RoundStats().acceptance_by_depth == []
