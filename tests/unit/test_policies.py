"""The window policies by name (edgespec.control.policies): one registry for the coordinator, DSD-Sim and the
benches, so a name means the same policy everywhere."""
import json

from dataclasses import replace

import pytest

from edgespec.control.awc import WEIGHTS, AwcWindow
from edgespec.control.policies import ADAPTIVE, window_policy
from edgespec.control.telemetry import Telemetry
from edgespec.control.window import FixedWindow, GoodputWindow, HeuristicWindow
from edgespec.loop.config import AUTO_POLICIES, SpeculationConfig
from edgespec.loop.generation import Generations
from edgespec.sim.scenario import policy_factory


def test_each_name_makes_its_class_reading_the_session_telemetry():
    telemetry = Telemetry(max_k=6)
    assert window_policy("fixed:0", telemetry, 6) == FixedWindow(0)
    assert window_policy("fixed:3", telemetry, 6) == FixedWindow(3)
    goodput = window_policy("goodput", telemetry, 6)
    assert isinstance(goodput, GoodputWindow) and goodput.telemetry is telemetry and goodput.max_k == 6
    heuristic = window_policy("heuristic", telemetry, 6)
    assert isinstance(heuristic, HeuristicWindow) and (heuristic.k, heuristic.min_k, heuristic.max_k) == (2, 1, 6)
    awc = window_policy("awc", telemetry, 1)
    assert isinstance(awc, AwcWindow) and awc.telemetry is telemetry and (awc.k, awc.max_k) == (1, 1)


def test_awc_takes_a_weights_file(tmp_path):
    weights = json.loads(WEIGHTS.read_text())
    path = tmp_path / "awc.json"
    path.write_text(json.dumps(weights))
    policy = window_policy(f"awc:{path}", Telemetry(), 4)
    assert isinstance(policy, AwcWindow) and policy.model is not window_policy("awc", Telemetry(), 4).model


@pytest.mark.parametrize("name", ["", "fixed", "fixed:", "fixed:-1", "fixed:x", "goodput:3", "greedy", "Goodput"])
def test_an_unknown_name_is_refused_naming_the_choices(name):
    with pytest.raises(ValueError, match="fixed:K.*goodput, heuristic, awc"):
        window_policy(name, Telemetry(), 4)
    with pytest.raises(ValueError):
        policy_factory(name, 4)     # the simulator refuses it before it runs


def test_the_coordinator_and_the_simulator_run_the_registry_s_policies():
    assert AUTO_POLICIES == tuple(ADAPTIVE) == ("goodput", "heuristic", "awc")
    for name in AUTO_POLICIES:
        plan = SpeculationConfig(auto_policy=name, auto_max_window=5)
        telemetry = Telemetry(max_k=5)
        policy = Generations._policy(plan, telemetry)
        assert type(policy) is type(window_policy(name, telemetry, 5)) and policy.max_k == 5
        assert Generations._policy(replace(plan, window=3), telemetry) == FixedWindow(3)
        simulated = policy_factory(name, 5)(telemetry)
        assert type(simulated) is type(policy) and simulated.max_k == 5
    with pytest.raises(ValueError, match="auto_policy"):
        SpeculationConfig(auto_policy="fixed:2")
