"""The one retry-wait helper: doubling, cap, hint, floor and jitter; and the callers' schedules it replaced."""
import random

import pytest

from edge_client.client import reconnect_delay
from edgespec.backoff import backoff_seconds
from edgespec.loop.failover import open_retry_delay
from edgespec.loop.pool import VerifierPool


def test_doubles_from_the_first_wait_up_to_the_cap():
    assert [backoff_seconds(n, 0.1, 0.5) for n in range(1, 6)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    assert [backoff_seconds(n, 1.0, 30.0) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]
    assert backoff_seconds(0, 0.25, 8.0) == backoff_seconds(-3, 0.25, 8.0) == 0.25   # before the first: the first


def test_a_long_run_of_failures_stays_at_the_cap_instead_of_overflowing():
    assert backoff_seconds(5000, 0.5, 30.0) == 30.0
    pool = VerifierPool(["a"], clock=lambda: 0.0)
    pool.endpoints["a"].failures = 2000     # a verifier down for many hours, banned again and again
    assert pool.ban("a") == 30.0


def test_a_hint_replaces_the_backoff_and_a_floor_only_raises_it():
    assert backoff_seconds(6, 0.1, 5.0, hint=1.5) == 1.5          # shorter than the backoff (3.2 s): still the hint
    assert backoff_seconds(1, 0.1, 5.0, hint=9.0) == 9.0          # longer than the cap: still the hint
    assert backoff_seconds(1, 0.1, 5.0, hint=0.0) == 0.0          # a hint of 0 is a hint, not "none"
    assert backoff_seconds(6, 1.0, 30.0, at_least=1.5) == 30.0    # the backoff is longer: the backoff
    assert backoff_seconds(1, 1.0, 30.0, at_least=7.0) == 7.0     # the floor is longer: the floor


def test_jitter_stretches_by_up_to_the_fraction_and_spreads_the_waits():
    rng = random.Random(1234)
    draws = [backoff_seconds(3, 1.0, 30.0, jitter=0.25, rng=rng.random) for _ in range(2000)]
    assert all(4.0 <= d < 5.0 for d in draws)                      # 4 s, up to 25% longer
    assert min(draws) < 4.05 and max(draws) > 4.95                 # the whole range is used ...
    assert len(set(draws)) == len(draws)                           # ... and the waits differ
    assert backoff_seconds(3, 1.0, 30.0, jitter=0.25, rng=lambda: 0.0) == 4.0
    assert backoff_seconds(3, 1.0, 30.0, jitter=0.25, rng=lambda: 1.0) == 5.0
    assert backoff_seconds(1, 0.1, 5.0, jitter=0.25, hint=2.0, rng=lambda: 1.0) == 2.5   # the hint is jittered too
    assert backoff_seconds(1, 1.0, 30.0, jitter=0.5, at_least=4.0, rng=lambda: 1.0) == 6.0   # and the floor


def test_no_jitter_draws_no_random_number():
    def rng():
        raise AssertionError("drew a random number without jitter")
    assert backoff_seconds(4, 0.5, 30.0, rng=rng) == 4.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_callers_schedules_are_unchanged(seed):
    draws = random.Random(seed)
    for n in range(1, 40):
        for hint in (None, 0.0, 0.05, 1.0, 7.5):
            r = draws.random()
            old_open = (hint if hint is not None else min(5.0, 0.1 * 2 ** (n - 1))) * (1 + 0.25 * r)
            assert open_retry_delay(hint, n, rng=lambda: r) == old_open
            old_drafter = max(hint or 0.0, min(30.0, 1.0 * 2 ** (n - 1))) * (1 + 0.25 * r)
            assert backoff_seconds(n, 1.0, 30.0, jitter=0.25, at_least=hint or 0.0, rng=lambda: r) == old_drafter
        ceiling = min(8.0, 0.25 * 2 ** (n - 1))
        assert reconnect_delay(n, rng=lambda: r) == pytest.approx(ceiling / 2 + r * ceiling / 2, rel=1e-15)
        assert backoff_seconds(n, 0.5, 30.0) == min(30.0, 0.5 * 2 ** (n - 1))
