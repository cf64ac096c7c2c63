"""Every window policy (fixed, heuristic, goodput, AWC) on the same synthetic traces.

A trace is a seeded sequence of rounds: per-position Bernoulli acceptance, a draft cost per token,
a verifier forward time by window size (this machine's CPU curve or a flat GPU-like one) and an RTT,
each of which can change mid-trace. Every policy sees the same RoundSample through the real Telemetry.
"""
import random
from dataclasses import dataclass, field

import pytest

from edgespec.control.awc import AwcWindow
from edgespec.control.goodput import best_window
from edgespec.control.sample import RoundSample
from edgespec.control.telemetry import Telemetry
from edgespec.control.window import FixedWindow, GoodputWindow, HeuristicWindow

MAX_K = 8
# this machine: one target pass over 1/2/4/8 tokens = 1.0/1.0/1.7/2.3 x 390 ms; a window of k scores k + 1
CPU = {0: 0.39, 1: 0.39, 2: 0.527, 3: 0.663, 4: 0.722, 5: 0.78, 6: 0.839, 7: 0.897, 8: 0.956}
GPU = {k: 0.02 * (1 + 0.005 * k) for k in range(MAX_K + 1)}


@dataclass
class Trace:
    alpha: float = 0.8          # per-token acceptance
    draft: float = 0.035        # seconds per drafted token (int8 draft here)
    verify: dict = field(default_factory=lambda: dict(CPU))   # window k -> forward seconds
    rtt: float = 0.0            # seconds
    seed: int = 1

    def __post_init__(self):
        self.rng = random.Random(self.seed)


def make(name, telemetry):
    if name == "fixed":
        return FixedWindow(2)
    if name == "heuristic":
        return HeuristicWindow(k=2, min_k=1, max_k=MAX_K)
    if name == "goodput":
        return GoodputWindow(telemetry, max_k=MAX_K)
    return AwcWindow(telemetry, max_k=MAX_K)


def run(policy, telemetry, trace, rounds):
    chosen = []
    for _ in range(rounds):
        k = policy.choose()
        n = 0
        while n < k and trace.rng.random() < trace.alpha:
            n += 1
        compute = trace.verify[k]
        sample = RoundSample(k, n, k * trace.draft, compute + trace.rtt, compute, 0, "v1")
        telemetry.record(sample)     # as the round loop does: the telemetry first, then the policy
        policy.observe(sample)
        chosen.append(k)
    return chosen


def fresh(name):
    telemetry = Telemetry(max_k=MAX_K)
    return make(name, telemetry), telemetry


def mean(xs):
    return sum(xs) / len(xs)


# -- bounds ---------------------------------------------------------------------------------------

def test_every_policy_stays_within_zero_and_max_k_on_a_wild_trace():
    for name in ("fixed", "heuristic", "goodput", "awc"):
        policy, telemetry = fresh(name)
        trace = Trace(seed=3)
        chosen = []
        for phase in range(12):    # acceptance, RTT and cost jump around every 30 rounds
            trace.alpha = [0.95, 0.05, 0.5][phase % 3]
            trace.rtt = [0.0, 0.2, 0.05, 0.15][phase % 4]
            trace.verify = CPU if phase % 2 else GPU
            chosen += run(policy, telemetry, trace, 30)
        assert all(0 <= k <= MAX_K for k in chosen), name
        if name == "heuristic":
            assert min(chosen) >= 1       # the heuristic never stops drafting


# -- reaction to an acceptance drop -----------------------------------------------------------------

def test_adaptive_policies_shrink_the_window_when_acceptance_drops():
    for name in ("heuristic", "goodput", "awc"):
        policy, telemetry = fresh(name)
        trace = Trace(alpha=0.95, verify=GPU, draft=0.004, rtt=0.05)
        before = mean(run(policy, telemetry, trace, 80)[-20:])
        trace.alpha = 0.1
        after = mean(run(policy, telemetry, trace, 80)[-20:])
        assert before >= 3 and after <= 2.0, (name, before, after)   # the best window is now 1


def test_fixed_window_ignores_an_acceptance_drop():
    policy, telemetry = fresh("fixed")
    trace = Trace(alpha=0.95)
    assert set(run(policy, telemetry, trace, 20)) == {2}
    trace.alpha = 0.0
    assert set(run(policy, telemetry, trace, 20)) == {2}


# -- reaction to an RTT jump ------------------------------------------------------------------------

def test_goodput_and_awc_draft_longer_windows_after_the_rtt_jumps():
    # a GPU-like verifier (20 ms, flat) and a 10 ms/token draft: at RTT 0 one or two tokens are best;
    # at 200 ms each round is dear and the best window is 6-8
    for name in ("goodput", "awc"):
        policy, telemetry = fresh(name)
        trace = Trace(alpha=0.7, draft=0.01, verify=GPU, rtt=0.0, seed=5)
        before = mean(run(policy, telemetry, trace, 120)[-30:])
        trace.rtt = 0.2
        after = mean(run(policy, telemetry, trace, 120)[-30:])
        assert before <= 2.5 and after >= before + 2, (name, before, after)


def test_heuristic_does_not_see_the_rtt():
    runs = []
    for rtt in (0.0, 0.4):
        policy, telemetry = fresh("heuristic")
        runs.append(run(policy, telemetry, Trace(alpha=0.7, rtt=rtt, seed=5), 60))
    assert runs[0] == runs[1]


# -- hysteresis (AWC) -------------------------------------------------------------------------------

def test_awc_holds_its_window_on_a_steady_trace():
    policy, telemetry = fresh("awc")
    chosen = run(policy, telemetry, Trace(alpha=0.8, seed=2), 200)[50:]
    switches = sum(a != b for a, b in zip(chosen, chosen[1:]))
    assert switches <= 3, chosen


def test_awc_switches_less_often_than_the_heuristic():
    counts = {}
    for name in ("heuristic", "awc"):
        policy, telemetry = fresh(name)
        chosen = run(policy, telemetry, Trace(alpha=0.6, seed=4), 300)
        counts[name] = sum(a != b for a, b in zip(chosen, chosen[1:]))
    assert counts["awc"] * 5 <= counts["heuristic"], counts


# -- k = 0 when speculation cannot pay --------------------------------------------------------------

def test_goodput_and_awc_fall_back_to_target_only_when_nothing_is_accepted():
    # fp32 draft on this CPU (120 ms per token) and no acceptance: every drafted token is a loss
    for name in ("goodput", "awc"):
        policy, telemetry = fresh(name)
        tail = run(policy, telemetry, Trace(alpha=0.0, draft=0.12), 150)[-50:]
        assert tail.count(0) >= 44, (name, tail)     # target-only, apart from the occasional probe
        assert set(tail) <= {0, 1}, (name, tail)


def test_goodput_and_awc_leave_target_only_mode_when_acceptance_recovers():
    # goodput: a cheap drafter whose tokens are all rejected, then accepted; AWC: a dear drafter (with no
    # acceptance drafting cannot pay there) that turns cheap as acceptance recovers
    for name, draft, recovered in (("goodput", 0.005, 0.005), ("awc", 0.12, 0.005)):
        policy, telemetry = fresh(name)
        trace = Trace(alpha=0.0, draft=draft, verify=GPU, rtt=0.05)
        assert run(policy, telemetry, trace, 80)[-10:].count(0) >= 8, name
        trace.alpha, trace.draft = 0.9, recovered
        assert mean(run(policy, telemetry, trace, 150)[-20:]) >= 3, name


def test_goodput_probes_rarely_where_drafting_cannot_pay_at_any_acceptance():
    # draft and target sharing cores (llama.cpp here): a drafted token costs 2/3 of a target step and a
    # 2-token pass 1.4 steps, so even full acceptance loses to target-only rounds
    shared = {k: 0.09 * (1 + 0.4 * k) for k in range(MAX_K + 1)}
    policy, telemetry = fresh("goodput")
    chosen = run(policy, telemetry, Trace(alpha=0.8, draft=0.06, verify=shared), 600)
    assert telemetry.drafting_cannot_pay(MAX_K)
    assert chosen[0] == 1 and sum(k > 0 for k in chosen[1:]) == 2, chosen   # probes after 256 idle rounds
    # a drafter that would gain ~5% at full acceptance does not repay its probes either (10% margin)
    policy, telemetry = fresh("goodput")
    run(policy, telemetry, Trace(alpha=0.8, draft=0.045, verify=shared), 40)
    assert telemetry.drafting_cannot_pay(MAX_K) and not telemetry.drafting_cannot_pay(MAX_K, margin=1.0)
    # the same costs with a cheap drafter (the edge's own cores) can pay: probes every 16 rounds
    policy, telemetry = fresh("goodput")
    chosen = run(policy, telemetry, Trace(alpha=0.0, draft=0.005, verify=shared), 600)
    assert not telemetry.drafting_cannot_pay(MAX_K) and sum(k > 0 for k in chosen) >= 30, chosen


# -- load-aware window control: the verifier's forwards are shared by other sessions' windows -------------

A, B = 0.03, 0.005         # a verifier forward: 30 ms + 5 ms per token fed


def loaded_round(k: int, accepted: int, windows: int) -> RoundSample:
    """A round whose window shared its forward with ``windows - 1`` others drafting k as it did."""
    tokens = windows * (k + 1)
    return RoundSample(k, accepted, 0.001 * k, A + B * tokens + 0.001, A + B * tokens, link="v",
                       batch_windows=windows, batch_tokens=tokens)


def test_drafting_backs_off_as_the_batch_fills_and_returns_when_it_drains():
    telemetry = Telemetry()
    policy = GoodputWindow(telemetry, max_k=4)
    rng = random.Random(0)

    def play(windows: int, rounds: int) -> list[int]:
        chosen = []
        for _ in range(rounds):
            k = policy.choose()
            accepted = next((j for j in range(k) if rng.random() > 0.6), k)   # each token accepted w.p. 0.6
            sample = loaded_round(k, accepted, windows)
            telemetry.record(sample)
            policy.observe(sample)
            chosen.append(k)
        return chosen

    alone = play(1, 60)
    assert sum(k > 0 for k in alone[-30:]) >= 20          # alone, a pass over k + 1 tokens costs little more: draft
    assert telemetry.forward_seconds(3) == pytest.approx(A + B * 3)
    crowded = play(64, 60)
    assert sum(k > 0 for k in crowded[-30:]) <= 2         # 64 windows a forward: a drafted token slows 63 others;
                                                          # only probes draft
    drained = play(1, 60)
    assert sum(k > 0 for k in drained[-30:]) >= 20        # drained: drafting returns


def test_the_shared_forward_is_charged_for_every_window_in_it():
    telemetry = Telemetry()
    for k in (0, 2):
        telemetry.record(loaded_round(k, k, 8))         # forwards of 8 and 24 tokens
    assert telemetry.shared_forwards() and telemetry.batch_windows == 8
    assert telemetry.verify_estimate(0) == pytest.approx(A + B * 8)        # measured
    assert telemetry.verify_estimate(1) == pytest.approx(A + B * 16)       # between measured sizes: interpolated
    assert telemetry.verify_estimate(3) == pytest.approx(A + B * 32)       # past them: along the last segment
    assert telemetry.forward_seconds(4) == pytest.approx(A + B * 8)        # below them: the smallest
    one = Telemetry()
    one.record(loaded_round(0, 0, 8))
    assert one.forward_seconds(16) == pytest.approx(2 * (A + B * 8))      # one size: in proportion


def test_noise_between_measured_sizes_does_not_make_a_shared_forwards_extra_tokens_free():
    """Forward times as 16 sessions on 2 CPUs measured them (one-host serving, 2026-12-07): sizes measured by a few
    rounds each, 16, 20 and 24 tokens within a millisecond of each other, 32 cheaper than 31. Along the last
    segment, a forward of 48 tokens cost what one of 32 did, and free drafts of 8 tokens at 60-90% confidence were
    sent to forwards every session waited for (0.84x window 0's throughput)."""
    t = Telemetry()
    t.batch_windows = 15.95
    t.forward_curve = {1: 0.059, 16: 0.752, 18: 0.941, 20: 0.649, 24: 0.698, 26: 0.719, 27: 0.8, 32: 0.79}
    assert t.verify_estimate(2) - t.verify_estimate(1) > 15 * 0.02           # the fitted slope, 27 ms a token
    t.profile = {n: 0.042 * c for n, c in zip(range(1, 10), (1, 1.74, 2.39, 3.46, 4.40, 5.10, 6.12, 7.02, 7.86))}
    assert t.token_seconds() >= 0.042 * 6.86 / 8                               # no less than the verifier's own
    confident = [0.9] * 8
    assert best_window(confident, 0.0, t.round_overhead(), lambda k: t.verify_estimate(k), 8) == 0
    t.batch_windows = 1.0                                                      # alone, the same drafts pay
    t.verify_compute = {0: 0.059}
    assert best_window(confident, 0.0, t.round_overhead(), lambda k: t.verify_estimate(k), 8) > 0


def test_without_batch_reports_the_estimates_are_the_measured_ones():
    """A verifier that reports no batch (an older one) leaves the per-window measurements in charge."""
    telemetry = Telemetry()
    for k in (0, 1, 2):
        telemetry.record(RoundSample(k, k, 0.0, 0.1 + 0.01 * k, 0.1 + 0.01 * k, link="v"))
    assert telemetry.forward_seconds(2) is None and not telemetry.shared_forwards()
    assert telemetry.verify_estimate(2) == pytest.approx(telemetry.verify_compute[2])


def test_costs_and_load_carry_over_to_the_next_session():
    earlier = Telemetry()
    for k in (0, 1, 2):
        earlier.record(loaded_round(k, k, 8))
    later = Telemetry()
    later.inherit_costs(earlier)
    assert later.forward_curve == earlier.forward_curve and later.batch_windows == earlier.batch_windows
    later.record(loaded_round(0, 0, 2))
    assert later.forward_curve != earlier.forward_curve   # a copy, not the earlier session's own
