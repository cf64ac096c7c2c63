"""DSD-Sim calibrated from a bench-capacity run (bench/sim_capacity.py), and the simulator's pieces it relies on:
replayed acceptance, the real verifier's batching rule, batch reports in verdicts."""
import json

import pytest

from bench import sim_capacity
from edgespec.control.telemetry import Telemetry
from edgespec.control.window import FixedWindow
from edgespec.sim.model import CostProfile, DeviceSpec, LinkModel, Simulation

CURVE = {1: 0.036, 2: 0.062, 4: 0.09, 8: 0.15, 16: 0.24, 32: 0.43}   # seconds by tokens fed
OVERHEAD = 0.004                                                      # seconds per extra window
BATCH = {"max_batch": 16, "batch_wait_ms": 200.0, "wait_fraction": 0.25}


def true_cost(windows: int, tokens: int) -> float:
    return CostProfile(0.0, tuple(CURVE.items()), OVERHEAD).batch_seconds([1] * (windows - 1) + [tokens - windows + 1])


def forwards_row(points) -> dict:
    return {"mode": "k=1", "sessions": 1, "rtt_ms": 0.0, "error": None,
            "forwards": {f"{w},{t}": [3, 1000 * true_cost(w, t)] for w, t in points}}


def test_the_fit_recovers_a_cost_curve_and_a_per_window_overhead():
    points = [(1, 1), (1, 2), (1, 3), (1, 5), (4, 4), (4, 8), (4, 12), (4, 20), (8, 8), (8, 16), (8, 24),
              (16, 16), (16, 32)]
    profile, error = sim_capacity.fit_costs([forwards_row(points)], 0.018)
    assert error < 1e-6
    assert profile.batch_seq_overhead_seconds == pytest.approx(OVERHEAD, abs=1e-6)
    for tokens in (1, 2, 3, 4, 5, 8, 12, 16, 20, 32):            # every size fed, and the curve between them
        assert profile.forward_seconds(tokens) == pytest.approx(true_cost(1, tokens), abs=1e-6)
    assert profile.draft_seconds_per_token == 0.018


def test_a_run_without_forwards_is_refused_by_name():
    with pytest.raises(ValueError, match="rerun bench-capacity"):
        sim_capacity.fit_costs([{"mode": "ar", "rtt_ms": 0.0, "sessions": 1}], 0.02)


def run(devices, profile, pool, k):
    sim = Simulation(profile, pool, devices, lambda telemetry: FixedWindow(k), 8, seed=1)
    sim.run()
    return sim


def test_replayed_acceptance_and_time_follow_the_closed_form():
    profile = CostProfile(0.02, tuple(CURVE.items()))
    # Draft agrees everywhere but at position 5: windows of 3 from 0 accept 3, from 4 accept 1 (4 only), ...
    device = DeviceSpec(LinkModel(0.05), lambda rng, now: [0.0] * 8, requests=1, tokens=12, matches="111110111111")
    sim = run([device], profile, {"count": 1, "max_batch": 1}, 3)
    accepted = list(sim.records.accepted)
    # rounds from positions 0, 4 (position 5 disagrees: 1 accepted), 6, 10 (2 tokens left: a window of 1)
    assert accepted == [3, 1, 3, 1] and list(sim.records.k) == [3, 3, 3, 1]
    rounds = len(accepted)
    expected = sum(0.05 + k * 0.02 + profile.forward_seconds(k + 1) for k in sim.records.k)
    assert sim.records.end[-1] == pytest.approx(expected)
    assert rounds == len(sim.records.k) and sum(accepted) + rounds == 12


def test_the_real_verifiers_rule_waits_for_every_open_sessions_window():
    profile = CostProfile(0.02, tuple(CURVE.items()))
    devices = [DeviceSpec(LinkModel(0.0), lambda rng, now: [0.0] * 8, requests=1, tokens=16, matches="1" * 16,
                          draft_scale=scale) for scale in (1.0, 1.25)]   # the second drafts more slowly
    oldest = run(devices, profile, {"count": 1, "max_batch": 16}, 2)
    gathered = run(devices, profile, {"count": 1, "max_batch": 16, "batch_wait_ms": 200, "gather": "verifier",
                                      "wait_fraction": 1.0}, 2)
    assert max(oldest.verifiers["verifier-0"].batch_sizes) == 1          # no wait: each window alone
    assert set(gathered.verifiers["verifier-0"].batch_sizes) == {2}      # waited for the slower device
    # A window due later than one forward is not waited for: that device drafts 10 times as slowly
    devices[1] = DeviceSpec(LinkModel(0.0), lambda rng, now: [0.0] * 8, requests=1, tokens=16, matches="1" * 16,
                            draft_scale=10.0)
    slow = run(devices, profile, {"count": 1, "max_batch": 16, "batch_wait_ms": 200, "gather": "verifier",
                                  "wait_fraction": 0.01}, 2)
    assert list(slow.verifiers["verifier-0"].batch_sizes).count(2) <= 1     # (once they meet by chance)
    with pytest.raises(ValueError, match="gather"):
        run(devices, profile, {"count": 1, "max_batch": 16, "gather": "newest"}, 2)


def test_cohorts_over_a_wan_merge_when_a_shared_forward_is_cheaper():
    """Two groups of sessions out of step behind a 100 ms link, a wait budget of 1% of a forward: by their
    turnarounds the verifier waits for the other group once, and from then on they share forwards."""
    def cohorts(curve):
        devices = [DeviceSpec(LinkModel(0.1), lambda rng, now: [0.0] * 8, requests=1, tokens=32, matches="1" * 32,
                              start=0.0 if i < 4 else 0.6) for i in range(8)]
        return run(devices, CostProfile(0.02, curve), {"count": 1, "max_batch": 16, "batch_wait_ms": 500,
                                                       "gather": "verifier", "wait_fraction": 0.01}, 2)
    flat = list(cohorts(((1, 0.2), (64, 0.25))).verifiers["verifier-0"].batch_sizes)
    assert flat[:2] == [4, 4] and flat[2:8] == [8] * 6
def test_verdicts_report_the_batch_so_load_aware_policies_see_it():
    profile = CostProfile(0.0, tuple(CURVE.items()))
    devices = [DeviceSpec(LinkModel(0.0), lambda rng, now: [0.0] * 8, requests=1, tokens=8, matches="1" * 8)
               for _ in range(4)]
    seen = []
    sim = Simulation(profile, {"count": 1, "max_batch": 16, "batch_wait_ms": 100, "gather": "verifier"}, devices,
                     lambda telemetry: seen.append(telemetry) or FixedWindow(1), 8, seed=1)
    sim.run()
    assert all(t.batch_windows == pytest.approx(4.0) and t.forward_curve.keys() == {8} for t in seen)


def calibration_run(tmp_path, rows, **extra):
    run_json = {"draft_ms_per_token": 20.0, "verifier_batch": BATCH,
                "prompts": [{"tokens": 16, "matches": "1101111011111011"}], "rows": rows, **extra}
    path = tmp_path / "capacity.json"
    path.write_text(json.dumps(run_json))
    return path


def test_the_cli_predicts_every_simulable_row_and_writes_json_plot_and_table(tmp_path):
    points = [(1, 1), (1, 2), (1, 3), (1, 5), (4, 4), (4, 8), (4, 12), (4, 20)]
    base = forwards_row(points)
    rows = [dict(base, mode=mode, sessions=n, tokens_per_second=20.0, batch_windows_mean=1.0)
            for n in (1, 4) for mode in ("ar", "k=2", "auto", "auto-blind")]
    path = calibration_run(tmp_path, rows)
    out, plot, table = tmp_path / "sim.json", tmp_path / "sim.png", tmp_path / "sim.md"
    assert sim_capacity.main([str(path), "--json", str(out), "--plot", str(plot), "--markdown", str(table)]) == 0
    result = json.loads(out.read_text())
    assert [(r["sessions"], r["mode"]) for r in result["rows"]] == [(n, m) for n in (1, 4) for m in ("ar", "k=2", "auto")]
    for r in result["rows"]:
        assert r["simulated_tokens_per_second"] > 0
        assert r["error"] == pytest.approx(r["simulated_tokens_per_second"] / 20.0 - 1, abs=1e-3)
    assert result["fit_rms_error"] < 1e-6
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "rows within 10%" in table.read_text()


def test_compare_simulates_every_mode_at_every_cell_and_takes_other_awc_weights(tmp_path, capsys):
    points = [(1, 1), (1, 2), (1, 3), (1, 5), (4, 4), (4, 8), (4, 12), (4, 20)]
    rows = [dict(forwards_row(points), mode="ar", sessions=n, tokens_per_second=20.0, batch_windows_mean=1.0)
            for n in (1, 4)]                                 # only ar measured
    path, out = calibration_run(tmp_path, rows), tmp_path / "sim.json"
    assert sim_capacity.main([str(path), "--compare", "--json", str(out)]) == 0
    cells = json.loads(out.read_text())["compared"]
    assert [(c["rtt_ms"], c["sessions"]) for c in cells] == [(0, 1), (0, 4)]
    for c in cells:
        best = max(c[m] for m in ("ar", "k=1", "k=2", "k=4"))
        assert c["auto_vs_best"] == pytest.approx(c["auto"] / best, abs=2e-3) and c["awc"] > 0
    assert "auto: geometric mean" in capsys.readouterr().out
    weights = tmp_path / "w.json"
    weights.write_text("{}")
    with pytest.raises(SystemExit) as exit_info:
        sim_capacity.main([str(path), "--compare", "--awc-weights", str(weights)])
    assert exit_info.value.code == 2 and "--awc-weights" in capsys.readouterr().err


def test_a_run_that_is_not_json_is_refused(tmp_path, capsys):
    path = tmp_path / "run.json"
    path.write_text("not json")
    with pytest.raises(SystemExit) as exit_info:
        sim_capacity.main([str(path)])
    assert exit_info.value.code == 2 and "is not JSON" in capsys.readouterr().err


def test_a_run_from_before_calibration_data_is_refused(tmp_path, capsys):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"rows": []}))
    assert sim_capacity.main([str(path)]) == 2
    assert "predates calibration data" in capsys.readouterr().err


def test_bad_flags_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        sim_capacity.main([str(tmp_path / "missing.json")])
    assert exit_info.value.code == 2 and "cannot read" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sim_capacity.main([str(tmp_path / "x.json"), "--tolerance", "2"])
    assert "--tolerance" in capsys.readouterr().err


def test_telemetry_is_untouched_by_fixed_modes():
    warm = Telemetry(max_k=8)
    policy = sim_capacity.policy_maker("k=3", warm)(Telemetry(max_k=8))
    assert policy.choose() == 3 and warm.rounds == 0
