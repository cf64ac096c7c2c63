"""Telemetry: per-round samples in, per-link RTT statistics, acceptance, costs and AWC features out."""
import subprocess
import sys

import pytest

from edgespec.control.sample import RoundSample
from edgespec.control.telemetry import FEATURE_NAMES, LinkStats, Telemetry


def sample(k=2, n=1, draft=0.07, wall=0.5, compute=0.4, queue=0, link="v1", **kw):
    return RoundSample(k, n, draft, wall, compute, queue, link, **kw)


def test_rtt_is_the_round_trip_minus_the_verifiers_forward_time():
    t = Telemetry(smoothing=0.5)
    t.record(sample(wall=0.45, compute=0.40))
    assert t.links["v1"].mean == pytest.approx(0.05)
    t.record(sample(wall=0.55, compute=0.40))       # rtt 0.15
    stats = t.links["v1"]
    assert stats.mean == pytest.approx(0.10)        # 0.5 * 0.05 + 0.5 * 0.15
    assert stats.jitter == pytest.approx(0.05)      # 0.5 * |0.15 - 0.05|
    assert stats.trend == pytest.approx(0.025)      # 0.5 * (0.10 - 0.05)


def test_the_first_rounds_forward_is_no_windows_cost():
    """llama.cpp answers a session's first row from the prompt's prefill: 0.6 ms where a step costs 85 ms. Taken as
    the cost of a target-only window it made every window look free (the profile is scaled by what was measured)."""
    t = Telemetry(smoothing=0.5)
    t.record(sample(k=0, n=0, compute=0.0006, after_prompt=True))
    assert t.verify_compute == {} and t.forward_curve == {} and t.rounds == 1
    t.record(sample(k=0, n=0, compute=0.085, batch_tokens=1))
    assert t.verify_compute == {0: pytest.approx(0.085)} and t.forward_curve == {1: pytest.approx(0.085)}


def test_a_windows_wait_behind_other_sessions_in_the_verifier_is_not_link_latency():
    t = Telemetry(smoothing=0.5)
    waited = sample(wall=0.95, compute=0.40, verifier_seconds=0.90)   # 0.5 s behind other sessions' forwards
    assert waited.rtt == pytest.approx(0.05) and waited.verifier_wait == pytest.approx(0.5)
    t.record(waited)
    assert t.links["v1"].mean == pytest.approx(0.05)
    assert sample(wall=0.95, compute=0.40).verifier_wait == 0   # a verifier that reports only its forward
    assert sample(wall=0.95, compute=0.40).rtt == pytest.approx(0.55)


def test_a_session_that_starts_beside_others_takes_its_forwards_as_shared_until_measured():
    t = Telemetry()
    t.expect_company(3)
    assert t.batch_windows == 4 and t.shared_forwards()
    alone = Telemetry()
    alone.expect_company(0)
    assert alone.batch_windows == 0 and not alone.shared_forwards()


def test_a_drafter_on_the_verifiers_cpus_costs_its_time_for_every_session_sharing_the_forward():
    def costs(shares_cpus, windows):
        t = Telemetry(smoothing=1.0)
        t.alpha = [0.9] * t.max_k
        t.draft_per_token, t.batch_windows, t.drafter_shares_cpus = 0.03, windows, shares_cpus
        t.forward_curve = {4: 0.12, 8: 0.15, 12: 0.18, 16: 0.21, 20: 0.24}   # batching pays
        t.verify_compute = {0: 0.05}
        return t
    assert costs(False, 4).draft_seconds() == pytest.approx(0.03)
    assert costs(True, 4).draft_seconds() == pytest.approx(0.12)    # 4 sessions wait for what it takes
    assert costs(True, 1).draft_seconds() == pytest.approx(0.03)    # alone: only its own rounds wait
    assert costs(False, 4).goodput_window(4) > 0                      # drafting pays on a drafter of its own
    assert costs(True, 4).goodput_window(4) == 0                      # not on the verifier's CPUs, at this load
    assert costs(True, 4).drafting_cannot_pay(4)


def test_rtt_trend_is_positive_while_the_link_slows_and_decays_when_it_settles():
    t = Telemetry()
    for rtt in [0.02] * 10 + [0.02 + 0.01 * i for i in range(1, 11)]:
        t.record(sample(wall=0.4 + rtt, compute=0.4))
    rising = t.links["v1"].trend
    assert rising > 0.005
    for _ in range(40):
        t.record(sample(wall=0.5, compute=0.4))
    assert abs(t.links["v1"].trend) < rising / 20


def test_each_verifier_link_has_its_own_statistics():
    t = Telemetry()
    t.record(sample(wall=0.41, link="near"))
    t.record(sample(wall=0.60, link="far"))
    assert t.links["near"].mean == pytest.approx(0.01)
    assert t.links["far"].mean == pytest.approx(0.20)
    assert t.link_stats().mean == pytest.approx(0.20)      # the last link is the current one
    assert t.link_stats("near").mean == pytest.approx(0.01)


def test_rtt_percentiles_over_the_recent_window():
    stats = LinkStats(window=100)
    for ms in range(1, 201):       # only the last 100 (101..200 ms) are kept
        stats.add(ms / 1000)
    assert stats.percentile(50) == pytest.approx(0.150)
    assert stats.percentile(99) == pytest.approx(0.199)
    assert stats.percentile(0) == pytest.approx(0.101)
    assert LinkStats().percentile(50) == 0.0


def test_conditional_acceptance_updates_only_the_positions_that_were_judged():
    t = Telemetry(max_k=4, smoothing=0.5, prior_alpha=0.5)
    t.record(sample(k=4, n=1))     # position 0 accepted, 1 rejected, 2 and 3 never judged
    assert t.alpha == [0.75, 0.25, 0.5, 0.5]
    t.record(sample(k=2, n=2))     # a full window judges both positions
    assert t.alpha == [0.875, 0.625, 0.5, 0.5]
    assert t.expected_tokens(2) == pytest.approx(1 + 0.875 + 0.875 * 0.625)


def test_acceptance_rate_and_per_token_estimate():
    t = Telemetry(smoothing=1.0)          # no memory: the last round only
    t.record(sample(k=4, n=2))            # 2 accepted of 3 judged (the third was rejected)
    assert t.acceptance == pytest.approx(0.5)
    assert t.alpha_per_token() == pytest.approx(2 / 3)
    t.record(sample(k=4, n=4))
    assert t.acceptance == 1.0 and t.alpha_per_token() == 1.0


def test_target_only_rounds_leave_acceptance_and_draft_cost_alone():
    t = Telemetry(smoothing=0.5)
    t.record(sample(k=2, n=2, draft=0.08))
    before = (list(t.alpha), t.acceptance, t.draft_per_token)
    t.record(sample(k=0, n=0, draft=0.0, wall=0.45, compute=0.39))
    assert (t.alpha, t.acceptance, t.draft_per_token) == before
    assert t.verify_compute[0] == pytest.approx(0.39)
    assert t.rounds == 2


def test_costs_queue_and_time_per_output_token():
    t = Telemetry(smoothing=0.5, queue_capacity=4)
    t.record(sample(k=2, n=1, draft=0.08, wall=0.5, compute=0.4, queue=4))   # 2 tokens in 0.58 s
    t.record(sample(k=4, n=3, draft=0.16, wall=0.8, compute=0.6, queue=0))   # 4 tokens in 0.96 s
    assert t.draft_per_token == pytest.approx(0.04)
    assert t.verify_compute == {2: pytest.approx(0.4), 4: pytest.approx(0.6)}
    assert t.verify_slope_seconds() == pytest.approx(0.1)          # (0.6 - 0.4) / (4 - 2)
    assert t.queue_last == 0 and t.queue_ema == pytest.approx(1.0)  # 0.5 * (0.5 * 4)
    assert t.tpot == pytest.approx(0.5 * 0.29 + 0.5 * 0.24)


def test_committed_and_round_seconds_override_the_defaults():
    t = Telemetry(smoothing=1.0)
    t.record(sample(k=2, n=1, committed=1, round_seconds=2.0))   # e.g. budget-truncated round
    assert t.tpot == pytest.approx(2.0)


def test_features_are_ordered_named_and_normalised_by_one_verifier_pass():
    t = Telemetry(max_k=8, smoothing=1.0, queue_capacity=8)
    t.record(sample(k=1, n=1, draft=0.04, wall=0.5, compute=0.4, queue=4))
    t.record(sample(k=3, n=1, draft=0.12, wall=0.8, compute=0.6, queue=4))
    f = t.features(prev_k=4)
    assert len(f) == len(FEATURE_NAMES) == 11
    named = dict(zip(FEATURE_NAMES, f))
    ref = 0.4                                   # forward time of the smallest window measured (k = 1)
    assert named["queue_util"] == pytest.approx(0.5)
    assert named["acceptance"] == pytest.approx(1 / 3)
    assert named["alpha"] == pytest.approx(0.5)        # 1 accepted of 2 judged
    assert named["rtt_mean"] == pytest.approx(0.2 / ref)
    assert named["rtt_jitter"] == pytest.approx(0.1 / ref)
    assert named["rtt_trend"] == pytest.approx(0.1 / ref)
    assert named["tpot"] == pytest.approx(0.92 / 2 / ref)
    assert named["draft_cost"] == pytest.approx(0.04 / ref)
    assert named["verify_slope"] == pytest.approx(0.1 / ref)
    assert named["prev_k"] == 0.5
    assert named["goodput_k"] == t.goodput_window() / 8


def test_goodput_window_is_the_analytic_best_window_from_the_estimates():
    t = Telemetry(max_k=4, smoothing=1.0, prior_alpha=0.9)
    # forward 0.4 s at k = 0, 0.44 s at k = 4 (slope 0.01 s/token); draft 0.01 s/token; RTT 0.2 s
    t.record(sample(k=0, n=0, draft=0.0, wall=0.6, compute=0.4))
    t.record(sample(k=4, n=4, draft=0.04, wall=0.64, compute=0.44))
    assert t.verify_estimate(2) == pytest.approx(0.42)
    assert t.goodput_window() == 4       # alphas 1.0: 5 tokens for 0.68 s beats everything shorter
    bad = Telemetry(max_k=4, smoothing=1.0)
    bad.record(sample(k=4, n=0, draft=0.4, wall=0.4, compute=0.4))    # rejected at once, draft 0.1 s/token
    assert bad.goodput_window() == 0


def test_features_before_any_round_use_the_priors():
    f = dict(zip(FEATURE_NAMES, Telemetry(prior_alpha=0.7).features(prev_k=2)))
    assert f["acceptance"] == 0.7 and f["alpha"] == 0.7 and f["rtt_mean"] == 0.0 and f["prev_k"] == 0.25


def test_telemetry_and_awc_import_no_torch_grpc_or_asyncio():
    code = ("import sys, edgespec.control.telemetry, edgespec.control.awc; "
            "bad = [m for m in ('torch', 'grpc', 'google.protobuf', 'asyncio') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_session_starts_from_the_acceptance_earlier_sessions_had_and_moves_it_by_a_weight():
    coordinator = Telemetry(max_k=4)
    first = Telemetry(max_k=4)
    first.start_from(coordinator)
    assert first.alpha == [0.7] * 4                           # nothing learnt yet: the fixed prior
    for _ in range(10):                                      # windows of 2, both accepted
        first.record(RoundSample(2, 2, 0.04, 0.1, 0.08, 0, "v"))
    assert first.judged_depth == 2 and first.alpha[0] > 0.95
    coordinator.absorb(first, weight=0.5)
    assert coordinator.alpha[:2] == pytest.approx([0.5 * 0.7 + 0.5 * a for a in first.alpha[:2]])
    assert coordinator.alpha[2:] == [0.7, 0.7]                # positions the session never drafted stay
    assert coordinator.verify_compute == first.verify_compute  # and its costs carry over as before
    second = Telemetry(max_k=4)
    second.start_from(coordinator)
    assert second.alpha == coordinator.alpha and second.alpha is not coordinator.alpha
    second.record(RoundSample(2, 0, 0.04, 0.1, 0.08, 0, "v"))   # its own text rejects: it moves at the usual rate
    assert second.alpha[0] == pytest.approx(0.7 * coordinator.alpha[0])
    untouched = list(coordinator.alpha)
    coordinator.absorb(Telemetry(max_k=4))                    # a session that never drafted changes no prior
    assert coordinator.alpha == untouched


# A forward's cost by tokens fed, as the torch verifier measured it on this 2-core CPU (relative to one token):
# a pass over 4 tokens costs less than one over 3.
JAGGED = {1: 1.0, 2: 2.1, 3: 3.0, 4: 1.9, 5: 2.3, 6: 2.5, 7: 2.6, 8: 2.7, 9: 2.9}


def measured_up_to_two(profile=None, scale=1.0):
    """Telemetry after rounds of windows 0, 1 and 2 whose costs follow JAGGED (times ``scale``), acceptance 0.8."""
    t = Telemetry(profile=dict(profile or {}))
    t.verify_compute = {k: scale * JAGGED[k + 1] for k in (0, 1, 2)}
    t.draft_per_token, t.alpha = 0.05, [0.8] * t.max_k
    return t


def test_without_a_profile_the_jagged_curve_reads_as_drafting_cannot_pay():
    # The straight line through windows 0..2 says every token costs a full step: no window could pay.
    assert measured_up_to_two().drafting_cannot_pay(8)


def test_the_verifier_profile_costs_untried_windows_and_ends_the_stall():
    t = measured_up_to_two(JAGGED)
    assert t.verify_estimate(3) == pytest.approx(1.9) and t.verify_estimate(7) == pytest.approx(2.7)
    assert not t.drafting_cannot_pay(8)
    assert t.goodput_window(optimistic=True) >= 3 and t.goodput_window() >= 3
    assert t.verify_estimate(1) == pytest.approx(2.1)          # a measured window keeps its measurement


def test_the_profile_is_scaled_to_what_rounds_measured_and_travels_with_the_costs():
    t = measured_up_to_two(JAGGED, scale=2.0)     # rounds run twice as slow as the profile at start
    assert t.verify_estimate(3) == pytest.approx(3.8)
    session = Telemetry()
    session.start_from(t)
    assert session.profile == JAGGED and session.verify_estimate(3) == pytest.approx(3.8)


def test_positions_never_judged_take_the_deepest_judged_acceptance_not_the_prior():
    # Measured: target-only 0.30 s, a window of 1 at 0.63 s, drafting 0.1 s a token, the first position accepted
    # 9 times in 10. With the prior 0.7 at positions 2 and 3 a window of 3 looked slower than target-only.
    t = Telemetry(profile={n: 0.3 * c for n, c in JAGGED.items()})
    t.verify_compute, t.draft_per_token = {0: 0.30, 1: 0.63}, 0.1
    t.alpha[0], t.judged_depth = 0.9, 1
    assert t._alphas(4)[:4] == [0.9, 0.9, 0.9, 0.9]
    assert t.goodput_window(4, optimistic=True) >= 3
    t.judged_depth = 3
    t.alpha[1:3] = [0.3, 0.3]       # once judged, the measurement stands
    assert t._alphas(4)[:4] == [0.9, 0.3, 0.3, 0.3]
    session = Telemetry()
    session.start_from(t)
    assert session.known_depth == 3 and session._alphas(4)[:4] == [0.9, 0.3, 0.3, 0.3]


# the default target in exact mode on 2 threads (docs/benchmarks.md, "Free drafts"): a one-token pass and the
# passes over 2 and 3 tokens after 32 positions, and after 300, where a one-token decode runs on one thread
NEAR = {1: 0.089, 2: 1.83 * 0.089, 3: 2.47 * 0.089}
FAR = {1: 0.163, 2: 0.96 * 0.163, 3: 1.34 * 0.163}


def test_past_far_positions_windows_are_costed_by_the_far_profile_and_what_was_measured_there():
    t = Telemetry(max_k=2, alpha=[0.6, 0.6])
    t.take_profiles(NEAR, FAR, 240)
    t.draft_per_token = 0.0                           # free drafts
    t.at_position(100)
    t.record(sample(k=0, n=0, wall=0.089, compute=0.089, batch_tokens=1))
    assert t.goodput_window(optimistic=True) == 0     # 1.6 tokens for 1.83 passes: drafting cannot pay
    t.at_position(300)
    assert t.far and t.profile == FAR and t.verify_compute == {}   # nothing measured past 240 yet
    t.record(sample(k=0, n=0, wall=0.163, compute=0.163, batch_tokens=1))
    assert t.verify_estimate(1) == pytest.approx(FAR[2]) and t.goodput_window(optimistic=True) == 1   # 1.6 for 0.96
    later = Telemetry()
    later.start_from(t)                               # a new session, its prompt short: the near costs again
    later.at_position(50)
    assert not later.far and later.profile == NEAR and later.verify_compute == {0: pytest.approx(0.089)}
    later.at_position(260)
    assert later.verify_compute == {0: pytest.approx(0.163)}


def test_without_a_far_profile_the_one_token_cost_measured_past_it_scales_every_window():
    t = Telemetry(max_k=2, alpha=[0.6, 0.6])
    t.take_profiles(NEAR, {}, 240)                    # a verifier whose costs do not change with the length
    assert t.far_positions == 0
    t.at_position(300)
    t.record(sample(k=0, n=0, wall=0.163, compute=0.163, batch_tokens=1))
    assert not t.far and t.verify_estimate(2) == pytest.approx(NEAR[3] * 0.163 / 0.089)
    assert t.goodput_window(optimistic=True) == 0
