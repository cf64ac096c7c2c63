"""DSD-Sim: cost profiles, links, the oracle, determinism, conservation, the closed form, batching."""
import json
import random
from pathlib import Path

import pytest

from edgespec.sim import best_window, expected_tokens, load_profile, run_policy, run_scenario
from edgespec.sim.model import LinkModel, MIN_RTO
from edgespec.sim.scenario import build
from edgespec.sim import run as sim_cli

SCENARIOS = Path(__file__).resolve().parents[2] / "edgespec" / "sim" / "scenarios"
CPU = load_profile("cpu-1.5b-int8")


def single(**over):
    scenario = {"name": "t", "seed": 3, "profile": "cpu-1.5b-int8", "devices": 1, "requests_per_device": 4,
                "tokens_per_request": 64, "link": {"rtt_ms": 50}, "acceptance": {"regime": "chat"}, "max_k": 8}
    scenario.update(over)
    return scenario


def strip(summary):
    return {k: v for k, v in summary.items() if k != "wall_seconds"}


def test_cpu_profile_interpolates_the_measured_points():
    assert CPU.forward_seconds(1) == pytest.approx(0.39)
    assert CPU.forward_seconds(3) == pytest.approx(0.39 + (0.663 - 0.39) / 2)
    assert CPU.forward_seconds(8) == pytest.approx(0.897)
    assert CPU.forward_seconds(12) == pytest.approx(0.897 + 4 * (0.897 - 0.663) / 4)   # last slope onward
    assert CPU.batch_seconds([2, 2]) == pytest.approx(CPU.forward_seconds(4))


def test_every_shipped_profile_names_its_source():
    profiles = json.loads((SCENARIOS.parent / "profiles.json").read_text())
    for name, spec in profiles.items():
        if not name.startswith("_"):
            assert spec["source"] and load_profile(name).forward_seconds(1) > 0, name


def test_link_adds_transmission_time_and_a_retransmission_on_loss():
    rng = random.Random(1)
    assert LinkModel(0.1).one_way(rng, 1000) == pytest.approx(0.05)
    assert LinkModel(0.1, rate=10_000).one_way(rng, 1000) == pytest.approx(0.15)
    assert LinkModel(0.1, loss=1.0).one_way(rng, 10) == pytest.approx(0.05 + MIN_RTO)
    delays = [LinkModel(0.1, jitter=0.01).one_way(rng, 10) for _ in range(2000)]
    assert min(delays) >= 0.05 and sum(delays) / len(delays) == pytest.approx(0.05 + 0.01 * 0.798, rel=0.05)


def test_oracle_window():
    assert expected_tokens([0.5] * 3, 3) == pytest.approx(1.875)
    flat = lambda k: 0.02
    assert best_window([0.0] * 8, 0.01, 0.0, flat, 8) == 0          # nothing accepted: never draft
    assert best_window([0.95] * 8, 0.001, 0.2, flat, 8) == 8        # near-free draft, long RTT: draft all
    assert best_window([0.8] * 8, 0.035, 0.0, lambda k: CPU.forward_seconds(k + 1), 8) == 1


def test_same_seed_same_run_and_another_seed_another():
    for policy in ("goodput", "awc"):
        a, b = run_policy(single(), policy), run_policy(single(), policy)
        assert strip(a) == strip(b)
        assert strip(run_policy(single(seed=4), policy))["series"] != strip(a)["series"]


def test_tokens_committed_equal_the_sum_of_accepted_plus_one():
    sim = build(single(requests_per_device=3, tokens_per_request=50, devices=3), "heuristic")
    sim.run()
    r = sim.records
    assert sum(n + 1 for n in r.accepted) == 3 * 3 * 50 == sum(r.request_tokens)
    assert all(0 <= n <= k for n, k in zip(r.accepted, r.k))


@pytest.mark.parametrize("k, alpha, rtt_ms", [(2, 0.6, 50), (4, 0.8, 0), (1, 0.5, 100)])
def test_fixed_window_throughput_matches_the_closed_form(k, alpha, rtt_ms):
    scenario = single(requests_per_device=4, tokens_per_request=3000, link={"rtt_ms": rtt_ms},
                      acceptance={"alpha": alpha})
    tps = run_policy(scenario, f"fixed:{k}")["tokens_per_second"]
    alphas = [alpha] * k
    expected = expected_tokens(alphas, k) / (k * CPU.draft_seconds_per_token + rtt_ms / 1000
                                             + CPU.forward_seconds(k + 1))
    assert tps == pytest.approx(expected, rel=0.03)


def test_batching_reduces_verifier_busy_time_at_load():
    load = single(devices=16, requests_per_device=2, tokens_per_request=64, start_spread_seconds=1.0,
                  acceptance={"regime": "code"})
    one = run_policy({**load, "verifiers": {"count": 1, "max_batch": 1}}, "fixed:2")
    batched = run_policy({**load, "verifiers": {"count": 1, "max_batch": 8, "batch_wait_ms": 5}}, "fixed:2")
    assert one["tokens"] == batched["tokens"] == 16 * 2 * 64
    assert one["batch_size"]["max"] == 1 and batched["batch_size"]["mean"] > 3
    assert batched["verifier_busy_seconds"] < 0.5 * one["verifier_busy_seconds"]
    assert batched["tokens_per_second"] > one["tokens_per_second"]


def test_devices_share_the_coordinators_verifier_pool_and_go_to_the_least_loaded_verifier():
    sim = build(single(devices=6, verifiers={"count": 3}), "fixed:1")
    for address in ("verifier-0", "verifier-0", "verifier-2"):
        sim.pool.pin(address)
    assert sim.pool.pick() == "verifier-1"
    sim = build(single(devices=6, requests_per_device=1, verifiers={"count": 3}), "fixed:1")
    sim.run()
    # six concurrent requests over three verifiers: two each, and every round's verdict names its verifier
    assert [v.windows > 0 for v in sim.verifiers.values()] == [True] * 3
    assert {link for t in sim.telemetries for link in t.links} == set(sim.verifiers)


def test_acceptance_drop_is_seen_by_goodput_mid_run():
    # code acceptance for the first 60 s, then the draft stops agreeing with the target
    scenario = single(requests_per_device=10, tokens_per_request=128, link={"rtt_ms": 0},
                      acceptance={"regime": "code", "schedule": [[60, {"alpha": 0.0}]]})
    s = run_policy(scenario, "goodput")["series"]
    t, mean_k = s["t"], s["mean_k"]
    early = [k for ti, k in zip(t, mean_k) if ti < 55 and k is not None]
    late = [k for ti, k in zip(t, mean_k) if ti > 90 and k is not None]
    assert min(early) >= 0.9 and max(late) <= 0.3


def test_run_scenario_and_the_cli_write_results_and_plots(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(single(requests_per_device=2, policies=["fixed:1", "goodput"])))
    result = run_scenario(path)
    assert set(result["policies"]) == {"fixed:1", "goodput"}
    assert sim_cli.main([str(path), "--out", str(tmp_path / "out")]) == 0
    saved = json.loads((tmp_path / "out" / "result.json").read_text())
    assert saved["policies"]["goodput"]["tokens"] == 128
    for png in ("window.png", "acceptance.png", "latency.png"):
        assert (tmp_path / "out" / png).stat().st_size > 1000


def test_shipped_scenarios_cover_the_grid_and_the_fleet():
    names = {p.stem for p in SCENARIOS.glob("*.json")}
    for regime in ("code", "chat"):
        for rtt in (0, 20, 50, 100):
            scenario = json.loads((SCENARIOS / f"single-{regime}-rtt{rtt}.json").read_text())
            assert scenario["link"]["rtt_ms"] == rtt and scenario["acceptance"]["regime"] == regime
    fleet = json.loads((SCENARIOS / "fleet-10k.json").read_text())
    assert fleet["devices"] == 10_000 and fleet["verifiers"]["count"] > 1
    assert "fleet-10k" in names
