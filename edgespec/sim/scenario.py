"""Scenario files -> simulations -> results. `run_scenario()` is the programmatic entry point.

A scenario (JSON; every key optional but `profile`):

    name                 str
    seed                 int, default 1 (the same seed for every policy: common random numbers)
    profile              a name in profiles.json, or an inline profile dict
                         {draft_seconds_per_token, forward_seconds_by_tokens: {tokens: s}, batch_seq_overhead_seconds}
    devices              edge devices, default 1
    requests_per_device  default 20;  tokens_per_request: default 128
    think_seconds        mean exponential pause between a device's requests, default 0
    start_spread_seconds devices start uniformly in [0, this], default 0
    prefill_seconds      per request, the verifier's session open before the first round, default 0
    draft_scale          [lo, hi]: each device's drafter is this much slower/faster than the profile, default 1
    link                 {rtt_ms, jitter_ms, rate_mbit, loss, rtt_schedule: [[t_s, rtt_ms], ...]};
                         rtt_ms / jitter_ms may be [lo, hi]: uniform per device
    acceptance           {regime: code|chat|poor} | {alpha, decay} | {per_position: [...]} |
                         {mix: {regime: weight}} (drawn per request); schedule: [[t_s, regime|alpha|{...}], ...]
                         replaces it for everyone from time t
    verifiers            {count, max_batch, batch_wait_ms, gather: oldest|verifier, wait_fraction}: a batch starts
                         when max_batch windows wait or the oldest waited batch_wait_ms ("oldest", default),
                         or by the real verifier's rule ("verifier": wait for the open sessions' windows,
                         at most batch_wait_ms and wait_fraction of a forward)
    max_k                largest window any policy may choose, default 8
    policies             ["fixed:2", "heuristic", "goodput", "awc", ...]
    time_bins            for the over-time plots, default 40
"""
from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Callable

import numpy as np

from edgespec.control.policies import window_policy
from edgespec.control.telemetry import Telemetry
from edgespec.loop.session import latency_ms
from edgespec.sim.model import CostProfile, DeviceSpec, LinkModel, Simulation, position_alphas

PROFILES = Path(__file__).with_name("profiles.json")
DEFAULT_POLICIES = ["fixed:0", "fixed:1", "fixed:2", "fixed:3", "fixed:4", "fixed:6", "heuristic", "goodput", "awc"]


def load_profile(spec: str | dict) -> CostProfile:
    if isinstance(spec, dict):
        return CostProfile.from_dict(spec)
    return CostProfile.from_dict(json.loads(PROFILES.read_text())[spec])


def policy_factory(name: str, max_k: int) -> Callable[[Telemetry], object]:
    """'fixed:K' | 'heuristic' | 'goodput' | 'awc[:PATH]' -> telemetry -> a fresh policy (the registry's,
    edgespec.control.policies: the classes the coordinator runs). ValueError for an unknown name, at once."""
    window_policy(name, Telemetry(max_k=max_k), max_k)   # a bad name, or AWC weights that do not load, fail here
    return lambda telemetry: window_policy(name, telemetry, max_k)


def _uniform(rng: random.Random, value, scale: float = 1.0) -> float:
    if isinstance(value, (list, tuple)):
        return rng.uniform(float(value[0]), float(value[1])) * scale
    return float(value) * scale


def _acceptance(spec: dict, max_k: int) -> Callable[[random.Random, float], list[float]]:
    if "mix" in spec:
        names = list(spec["mix"])
        weights = [float(spec["mix"][n]) for n in names]
        table = {n: position_alphas(n, max_k) for n in names}
        return lambda rng, now: table[rng.choices(names, weights)[0]]
    alphas = position_alphas({k: v for k, v in spec.items() if k != "schedule"}, max_k)
    return lambda rng, now: alphas


def build(scenario: dict, policy: str | Callable[[Telemetry], object], observer=None) -> Simulation:
    """The Simulation of one scenario under one policy (a name, or telemetry -> policy), not yet run."""
    max_k = int(scenario.get("max_k", 8))
    seed = int(scenario.get("seed", 1))
    profile = load_profile(scenario["profile"])
    link = scenario.get("link", {})
    accept = scenario.get("acceptance", {"regime": "chat"})
    rng = random.Random(seed)            # per-device parameters: the same for every policy
    devices = []
    acceptance = _acceptance(accept, max_k)
    for _ in range(int(scenario.get("devices", 1))):
        devices.append(DeviceSpec(
            link=LinkModel(_uniform(rng, link.get("rtt_ms", 0), 1e-3), _uniform(rng, link.get("jitter_ms", 0), 1e-3),
                           float(link.get("rate_mbit", 0)) * 1e6 / 8, float(link.get("loss", 0))),
            acceptance=acceptance,
            requests=int(scenario.get("requests_per_device", 20)),
            tokens=int(scenario.get("tokens_per_request", 128)),
            think=float(scenario.get("think_seconds", 0)),
            start=rng.uniform(0, float(scenario.get("start_spread_seconds", 0))),
            prefill=float(scenario.get("prefill_seconds", 0)),
            draft_scale=_uniform(rng, scenario.get("draft_scale", 1.0))))
    rtt_schedule = [(float(t), float(ms) / 1000) for t, ms in link.get("rtt_schedule", [])]
    alpha_schedule = [(float(t), position_alphas(a, max_k)) for t, a in accept.get("schedule", [])]
    make_policy = policy_factory(policy, max_k) if isinstance(policy, str) else policy
    return Simulation(profile, scenario.get("verifiers", {}), devices, make_policy, max_k,
                      seed, rtt_schedule, alpha_schedule, observer)


def summarise(sim: Simulation, wall_seconds: float, bins: int = 40) -> dict:
    """Per-policy numbers for result.json, plus `series` (over-time arrays) for the plots."""
    r = sim.records
    end, k, n, sec = (np.frombuffer(a, dtype=d) for a, d in
                      ((r.end, np.float64), (r.k, np.int32), (r.accepted, np.int32), (r.seconds, np.float64)))
    tokens = n + 1
    itl = np.repeat(sec / tokens, tokens)   # inter-token latency: every token of a round gets its seconds/token
    req_s = np.frombuffer(r.request_seconds, dtype=np.float64)
    req_t = np.frombuffer(r.request_tokens, dtype=np.int32)
    horizon = float(end.max()) if len(end) else 0.0
    drafted = int(k.sum())
    verifiers = list(sim.verifiers.values())
    batches = np.concatenate([np.frombuffer(v.batch_sizes, dtype=np.int32) for v in verifiers]) \
        if verifiers else np.zeros(0, np.int32)
    hist = np.bincount(k, minlength=sim.max_k + 1)
    edges = np.linspace(0, horizon, bins + 1) if horizon > 0 else np.zeros(bins + 1)
    idx = np.clip(np.searchsorted(edges, end, side="right") - 1, 0, bins - 1)
    series = {"t": ((edges[:-1] + edges[1:]) / 2).tolist(), "mean_k": [], "acceptance": [], "p50_ms": [], "p99_ms": []}
    for b in range(bins):
        m = idx == b
        if not m.any():
            for key in ("mean_k", "acceptance", "p50_ms", "p99_ms"):
                series[key].append(None)
            continue
        kk = k[m].sum()
        series["mean_k"].append(float(k[m].mean()))
        series["acceptance"].append(float(n[m].sum() / kk) if kk else None)
        series["p50_ms"].append(float(np.percentile(sec[m], 50) * 1e3))
        series["p99_ms"].append(float(np.percentile(sec[m], 99) * 1e3))
    return {
        "tokens": int(tokens.sum()),
        "rounds": int(len(k)),
        "requests": int(len(req_s)),
        "tokens_per_second": float(req_t.sum() / req_s.sum()) if req_s.sum() > 0 else 0.0,
        "fleet_tokens_per_second": float(tokens.sum() / horizon) if horizon > 0 else 0.0,
        **latency_ms("itl", itl), "itl_mean_ms": float(itl.mean() * 1e3) if len(itl) else 0.0,
        **latency_ms("round", sec),
        "acceptance": float(n.sum() / drafted) if drafted else None,
        "tokens_per_round": float(tokens.mean()) if len(tokens) else 0.0,
        "window_histogram": {str(i): int(c) for i, c in enumerate(hist)},
        "mean_window": float(k.mean()) if len(k) else 0.0,
        "verifier_utilisation": float(np.mean([v.busy_seconds for v in verifiers]) / horizon) if horizon else 0.0,
        "batch_size": {"mean": float(batches.mean()), "p50": float(np.percentile(batches, 50)),
                       "p99": float(np.percentile(batches, 99)), "max": int(batches.max())} if len(batches) else {},
        "verifier_busy_seconds": float(sum(v.busy_seconds for v in verifiers)),
        "sim_seconds": horizon,
        "wall_seconds": wall_seconds,
        "series": series,
    }


def run_policy(scenario: dict, policy: str, observer=None) -> dict:
    started = time.perf_counter()
    sim = build(scenario, policy, observer)
    sim.run()
    return summarise(sim, time.perf_counter() - started, int(scenario.get("time_bins", 40)))


def run_scenario(scenario: dict | str | Path, policies: list[str] | None = None) -> dict:
    """Run every policy on the scenario (a dict or a JSON path); {name, scenario, policies: {policy: summary}}.
    For sim-vs-real fidelity pass an inline profile measured from the real services, e.g.
    {"profile": {"draft_seconds_per_token": 0.037, "forward_seconds_by_tokens": {"1": 0.225, "3": 0.25}},
     "link": {"rtt_ms": 50}, "acceptance": {"per_position": [0.72, 0.66, 0.6]}, "policies": ["fixed:2"]}."""
    if not isinstance(scenario, dict):
        scenario = json.loads(Path(scenario).read_text())
    names = policies or scenario.get("policies") or DEFAULT_POLICIES
    return {"name": scenario.get("name", "scenario"), "scenario": scenario,
            "policies": {name: run_policy(scenario, name) for name in names}}
