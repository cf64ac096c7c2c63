"""DSD-Sim: a discrete-event simulator of distributed speculative decoding (docs/architecture.md §7).

Edge devices run the library's own round loop (edgespec.loop) with the real window policies and telemetry,
on a virtual-time asyncio event loop, against modelled links and batching verifiers.
See docs/simulator.md.
"""
from edgespec.sim.model import CostProfile
from edgespec.control.goodput import best_window, expected_tokens
from edgespec.sim.scenario import build, load_profile, run_policy, run_scenario

__all__ = ["CostProfile", "best_window", "build", "expected_tokens", "load_profile", "run_policy", "run_scenario"]
