"""Window policies on recorded traces."""
import pytest
from edgespec.control import goodput as model
from edgespec.control.goodput import expected_tokens
from edgespec.control.sample import RoundSample
from edgespec.control.telemetry import Telemetry
from edgespec.control.window import FixedWindow, GoodputWindow, HeuristicWindow

# Costs measured here on 2 cores (seconds): int8 draft per token, target verify by window size.
DRAFT = 0.037
VERIFY = {0: 0.225, 1: 0.237, 2: 0.248, 3: 0.420, 4: 0.430}


def goodput(max_k=4):
    return GoodputWindow(Telemetry(max_k=max_k), max_k=max_k)


def run(policy, acceptance, rounds=60, verify=VERIFY, draft=DRAFT, rtt=0.0):
    """Feed a policy a trace where each drafted position is accepted while its cumulative
    pattern says so: position j accepted iff j < floor(acceptance * k + 0.5) (deterministic).
    verify: the verifier's forward seconds by window; rtt: the link's share of the round trip.
    Each round is recorded into the policy's telemetry first, as the round loop does."""
    chosen = []
    for _ in range(rounds):
        k = policy.choose()
        accepted = min(k, int(acceptance * k + 0.5)) if acceptance < 1 else k
        sample = RoundSample(k, accepted, draft * k, verify[k] + rtt, verify[k])
        if isinstance(policy, GoodputWindow):
            policy.telemetry.record(sample)
        policy.observe(sample)
        chosen.append(k)
    return chosen


def test_fixed_window_never_moves():
    assert set(run(FixedWindow(3), 0.2)) == {3}


def test_goodput_settles_on_two_when_acceptance_is_high_and_four_tokens_cost_double():
    assert run(goodput(), 1.0)[-10:] == [2] * 10


def test_goodput_grows_the_window_when_verifying_more_is_nearly_free():
    flat = {k: 0.25 + 0.005 * k for k in range(5)}
    assert run(goodput(), 1.0, verify=flat)[-10:] == [4] * 10


def test_goodput_chooses_target_only_when_speculation_cannot_pay():
    # Nothing is ever accepted: drafting only costs time. One probe round per 17.
    tail = run(goodput(), 0.0, rounds=100)[-34:]
    assert tail.count(0) == 32 and tail.count(1) == 2


def test_goodput_reacts_to_an_acceptance_drop():
    policy = goodput()
    assert run(policy, 1.0)[-1] == 2
    after = run(policy, 0.0, rounds=30)
    assert after[-1] == 0 and after.index(0) < 10


def test_goodput_drafts_longer_windows_when_the_round_trip_grows():
    # An RTT of 300 ms on every verify makes longer windows relatively cheaper.
    assert run(goodput(), 1.0, rtt=0.3)[-1] == 4


def test_goodput_starts_with_one_token_and_tries_each_window_it_has_not_measured():
    flat = {k: 0.25 + 0.005 * k for k in range(5)}
    # nothing measured yet: 1; then one target-only round (its cost unknown); then 4, costed (optimistically)
    # as 1 is, its positions never judged taken to accept as the first did; then 3, costed as 1 is, then 4
    assert run(goodput(), 1.0, rounds=5, verify=flat) == [1, 0, 4, 3, 4]
    # 4 tried and found dear; 3, costed as 1 is, tried and found dear too; then 2, costed as 1 is
    assert run(goodput(), 1.0, rounds=5) == [1, 0, 4, 3, 2]


def test_expected_tokens_formula():
    assert expected_tokens([0.5] * 3, 0) == 1.0
    assert expected_tokens([0.5] * 3, 3) == 1 + 0.5 + 0.25 + 0.125
    assert Telemetry(max_k=3, alpha=[0.5, 0.5, 0.5]).expected_tokens(3) == 1 + 0.5 + 0.25 + 0.125


def test_goodput_probes_again_after_falling_back_to_target_only():
    policy = goodput()
    run(policy, 0.0, rounds=20)
    assert run(policy, 1.0, rounds=60)[-1] == 2   # acceptance recovered and was noticed


def test_heuristic_grows_by_two_on_full_acceptance_and_shrinks_by_one_otherwise():
    policy = HeuristicWindow(k=1, min_k=1, max_k=4)
    assert run(policy, 1.0, rounds=4) == [1, 3, 4, 4]       # bounded by max_k
    assert run(policy, 0.0, rounds=6) == [4, 3, 2, 1, 1, 1]   # bounded by min_k, never 0


def test_heuristic_ignores_budget_clamped_target_only_steps():
    policy = HeuristicWindow(k=3)
    policy.observe(RoundSample(0, 0, 0.0, 0.2))
    assert policy.choose() == 3


def test_a_target_only_window_of_steps_amortises_the_round_overhead_as_a_drafted_window_does():
    alphas, draft, forward = [0.7] * 4, 0.01, lambda k: 0.1 + 0.03 * k
    assert model.goodput([], 0, 0.0, 0.2, 0.1, steps=4) == pytest.approx(4 / (0.2 + 0.4))
    assert model.goodput([], 0, 0.0, 0.2, 0.1) == pytest.approx(1 / 0.3)          # one step: as before
    # a round that waits 0.2 s (a busy verifier): against single steps drafting pays, against 4 steps it does not
    assert model.best_window(alphas, draft, 0.2, forward, 4) > 0
    assert model.best_window(alphas, draft, 0.2, forward, 4, steps=4) == 0


def test_a_rounds_wait_in_the_verifier_counts_as_overhead_capped_at_two_of_its_forwards():
    t = Telemetry(smoothing=1.0)
    t.record(RoundSample(0, 0, 0.0, 0.5, 0.4, verifier_seconds=0.45, steps=4))   # waited 50 ms behind a forward
    assert t.verifier_wait == pytest.approx(0.05) and t.round_overhead() == pytest.approx(0.05 + 0.05)
    t.record(RoundSample(0, 0, 0.0, 3.2, 0.4, verifier_seconds=3.1, steps=4))    # 2.7 s behind others' prompts
    assert t.verifier_wait == pytest.approx(0.2)                                  # two of its 0.1 s forwards
