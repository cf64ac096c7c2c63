"""AWC's training data: scenarios on cost curves measured by bench-capacity (--calibration)."""
import json
import random

import pytest

from edgespec.sim.scenario import build
from training import train_awc


def capacity_run(path):
    """A bench-capacity JSON as the bench writes it, trimmed to what calibration reads: a curve that is not
    smooth (3 tokens cost 3x one token, 16 tokens barely more than 8)."""
    rows = [{"mode": "ar", "error": None, "forwards": {"1,1": [40, 30.0], "4,4": [20, 60.0]}},
            {"mode": "k=2", "error": None, "forwards": {"1,3": [30, 90.0], "4,12": [10, 200.0]}},
            {"mode": "k=4", "error": None, "forwards": {"1,5": [30, 140.0], "2,10": [10, 205.0], "4,20": [5, 215.0]}}]
    path.write_text(json.dumps({"rows": rows, "draft_ms_per_token": 19.4, "prompts": [],
                                "verifier_batch": {"max_batch": 16, "batch_wait_ms": 200.0, "wait_fraction": 0.25}}))
    return path


def test_calibrated_scenarios_run_on_the_measured_curve_behind_the_runs_batching(tmp_path):
    [(profile, verifiers)] = train_awc.calibrated_profiles([capacity_run(tmp_path / "run.json")])
    assert verifiers == {"count": 1, "max_batch": 16, "batch_wait_ms": 200.0, "gather": "verifier",
                         "wait_fraction": 0.25}
    curve = {int(t): s for t, s in profile["forward_seconds_by_tokens"].items()}
    assert curve[1] == pytest.approx(0.030, rel=0.1) and curve[3] == pytest.approx(0.090, rel=0.1)
    assert profile["draft_seconds_per_token"] == pytest.approx(0.0194)
    rng = random.Random(1)
    scenarios = [train_awc.random_scenario(rng, i, [(profile, verifiers)]) for i in range(40)]
    measured = [s for s in scenarios if s["verifiers"].get("gather") == "verifier"]
    assert 8 <= len(measured) <= 32                       # about half
    for s in measured:                                    # the measured curve, scaled by 0.8-1.25 as a whole
        ratios = {s["profile"]["forward_seconds_by_tokens"][t] / v for t, v in profile["forward_seconds_by_tokens"].items()}
        assert max(ratios) - min(ratios) < 1e-9 and 0.8 <= ratios.pop() <= 1.25
    build(measured[0], lambda telemetry: train_awc.FixedWindow(2), lambda *a: None).run()   # the simulator takes it
    assert all("gather" not in s["verifiers"] for s in train_awc_scenarios_without_calibration())


def train_awc_scenarios_without_calibration():
    rng = random.Random(2)
    return [train_awc.random_scenario(rng, i) for i in range(10)]


def test_a_file_that_is_not_a_capacity_run_is_a_usage_error(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rows": []}))
    with pytest.raises(SystemExit) as exit_:
        train_awc.main(["--calibration", str(bad), "--out", str(tmp_path / "w.json")])
    assert exit_.value.code == 2 and "not a bench-capacity run" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train_awc.main(["--calibration", str(tmp_path / "missing.json"), "--out", str(tmp_path / "w.json")])
    assert not (tmp_path / "w.json").exists()
