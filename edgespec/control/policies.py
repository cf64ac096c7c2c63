"""The window policies by name: one registry for the coordinator, the simulator and the benches.

    fixed:K      FixedWindow(K), K >= 0 (0: target-only rounds)
    goodput      GoodputWindow, the default: the k of the highest expected tokens/s by the measured costs
    heuristic    HeuristicWindow: +2 after a fully accepted window, -1 otherwise (HF assisted generation's)
    awc[:PATH]   AwcWindow, the learned controller (weights PATH; default the shipped ones)

A new policy is one class in edgespec/control/ (the WindowPolicy protocol of window.py) and one entry in ADAPTIVE.
"""
from __future__ import annotations

from typing import Callable

from edgespec.control.awc import AwcWindow, load_model
from edgespec.control.telemetry import Telemetry
from edgespec.control.window import FixedWindow, GoodputWindow, HeuristicWindow, WindowPolicy

# name -> (the session's telemetry, the largest window, the part after "name:") -> a fresh policy. The adaptive
# ones start at a window of 2 (or max_k, if smaller); goodput and awc read the telemetry the round loop records.
ADAPTIVE: dict[str, Callable[[Telemetry, int, str], WindowPolicy]] = {
    "goodput": lambda telemetry, max_k, arg: GoodputWindow(telemetry, max_k=max_k),
    "heuristic": lambda telemetry, max_k, arg: HeuristicWindow(k=min(2, max_k), max_k=max_k),
    "awc": lambda telemetry, max_k, arg: AwcWindow(telemetry, load_model(arg) if arg else load_model(), max_k=max_k,
                                                   k=min(2, max_k)),
}


def window_policy(name: str, telemetry: Telemetry, max_k: int) -> WindowPolicy:
    """A fresh policy for one session: ``name`` as in the module doc; ValueError naming the choices otherwise."""
    kind, _, arg = name.partition(":")
    if kind == "fixed" and arg.isdigit():
        return FixedWindow(int(arg))
    if kind in ADAPTIVE and (arg == "" or kind == "awc"):
        return ADAPTIVE[kind](telemetry, max_k, arg)
    raise ValueError(f"unknown window policy {name!r}: use fixed:K (K >= 0), {', '.join(ADAPTIVE)} or awc:WEIGHTS")
