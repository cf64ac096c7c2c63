"""DSD-Sim: a discrete-event simulator of distributed speculative decoding (docs/architecture.md §7).

SimPy processes for edge devices, links and batching verifiers; the real window policies and telemetry.
See docs/simulator.md.
"""
from edgespec.sim.model import CostProfile
from edgespec.control.window import best_window, expected_tokens
from edgespec.sim.scenario import build, load_profile, run_policy, run_scenario

__all__ = ["CostProfile", "best_window", "build", "expected_tokens", "load_profile", "run_policy", "run_scenario"]
