"""Hostile input over real gRPC: a bounded fuzz run in CI (edgespec bench fuzz runs 100,000)."""
import grpc
import pytest

from bench import fuzz
from bench.fuzz import TARGETS, Fuzzer, acceptable, fuzz_cluster, method_name


@pytest.fixture(scope="module")
def fuzzer(tmp_path_factory):
    with fuzz_cluster(tmp_path_factory.mktemp("logs")) as cluster:
        running = Fuzzer(cluster)
        yield running
        running.close()


def test_fuzzed_requests_get_clear_statuses_and_change_nothing(fuzzer):
    snapshot = fuzzer.snapshot()
    report = fuzz.run(fuzzer, inputs=1500, shrink=True)     # derandomized: the same inputs every run
    assert report.inputs >= 1500 and not report.failures
    assert set(report.by_method) == {method_name(t[1]) for t in TARGETS} and len(report.by_method) == len(TARGETS)
    assert report.by_status["OK"] > 0 and report.by_status["INVALID_ARGUMENT"] > 0   # both sides were reached
    assert fuzzer.intact(snapshot), "canary sessions or the generation changed under fuzzing"
    assert fuzzer.alive()


@pytest.mark.parametrize("target", range(len(TARGETS)), ids=[t[1].rsplit("/", 1)[-1] + "@" + t[0] for t in TARGETS])
def test_bytes_that_are_not_a_message_are_invalid_argument(fuzzer, target):
    """grpc alone answers INTERNAL (unary) or UNKNOWN (streams) here; edgespec says whose fault it is."""
    if TARGETS[target][1].endswith("/Info"):
        pytest.skip("InfoRequest has no fields: every byte string that parses at all is a valid request")
    code, details = fuzzer.send((target, [b"\xff\xff\xff"]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
    assert "not a valid message" in details


def test_the_judge_fails_crashes_hangs_and_dead_servers():
    for code in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE,
                 grpc.StatusCode.INTERNAL):
        assert not acceptable(code, "boom")
    assert acceptable(grpc.StatusCode.INTERNAL, "Exception deserializing request!")
    assert acceptable(grpc.StatusCode.INVALID_ARGUMENT, "window: too long")
