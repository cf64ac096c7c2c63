"""The benchmarks' plots (bench.plots) draw a PNG from a report of the shape each bench writes as JSON.

The rows are made by the benches' own code where it is cheap (bench-load's summarize, soak's latency and memory
summaries); bench-wan's and bench-policy's reports are built inline in their main, so their shape is copied here.
"""
from __future__ import annotations

import json

import pytest

pytest.importorskip("matplotlib")

from bench import plots  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


def written(path) -> bool:
    return path.is_file() and path.stat().st_size > 1000 and path.read_bytes()[:8] == PNG


def load_report() -> dict:
    from bench.bench_load import LoadRun, on_off_ratios, summarize
    from bench.devices import DeviceRun
    from edgespec.control.sample import RoundSample
    from edgespec.loop.session import RoundStats

    rows = []
    for mode, speed in (("on", 3.0), ("off", 1.0)):
        for n in (1, 2, 4):
            samples = [RoundSample(4, accepted, 0.0, wall, 0.05, depth, "v")
                       for accepted, wall, depth in ((3, 0.1, 0), (3, 0.2, n - 1), (3, 0.3, 1))]
            sessions = [DeviceRun(generated=[5] * 8, seconds=8 / speed, samples=samples,
                                  stats=RoundStats(rounds=3, drafted=12, accepted=9)) for _ in range(n)]
            load = LoadRun(sessions, [[5] * 8] * n, wall_seconds=8 / speed, open_seconds=0.5,
                           batch_before=None, batch_after=None)
            rows.append(summarize(mode, n, load, {"rss_mib": 900.0, "hwm_mib": 950.0}))
    rows.append({"mode": "off", "sessions": 8, "error": "timed out after 900s", "mismatches": 0})
    # JSON round trip: the plot reads what the bench wrote
    return json.loads(json.dumps({"model": "tiny:3", "tokens": 8, "window": 4, "acceptance": 0.8, "seed": 0,
                                  "rows": rows, "ratios_on_off": on_off_ratios(rows), "mismatches": 0}))


def test_bench_load_plot(tmp_path):
    assert written(plots.plot_load(load_report(), tmp_path / "load.png"))


def test_bench_load_writes_its_plot_beside_the_json():
    """bench-load's main writes the report it plots: the plot call sits beside the JSON write."""
    import inspect

    from bench import bench_load

    source = inspect.getsource(bench_load.main)
    assert "plot_load(report, config.json.with_suffix('.png'))" in source


def wan_report() -> dict:
    def mode(tok_s: float) -> dict:
        return {"best_window": 2, "tokens": 120, "seconds": 120 / tok_s, "tok_s": tok_s, "tpot_p50_ms": 300.0,
                "tpot_p99_ms": 900.0, "optimistic_windows": 10, "optimistic_hits": 7, "identical": True,
                "all": {}}
    results = []
    for rtt, lossy in ((0.0, False), (20.0, False), (50.0, False), (100.0, False), (50.0, True)):
        setting = "rtt 50 ms, jitter 5 ms, loss 0.5%" if lossy else f"rtt {rtt:g} ms"
        row = {"setting": setting, "rtt_ms": rtt, "measured_rtt_ms": rtt + 0.4,
               "cloud_only": {"tok_s": 3.0 - rtt / 100, "tpot_p50_ms": 330.0, "tpot_p99_ms": 400.0},
               "blocking": mode(4.0 - rtt / 50), "pipelined": mode(4.2 - rtt / 80)}
        row["pipelined_over_blocking"] = row["pipelined"]["tok_s"] / row["blocking"]["tok_s"]
        results.append(row)
    return json.loads(json.dumps({"date": "2026-12-01", "max_new_tokens": 40, "backend": "torch", "quantize": "auto",
                                  "prompts": ["code", "qa", "chat"], "windows": [2, 4], "results": results}))


def test_bench_wan_plot(tmp_path):
    assert written(plots.plot_wan(wan_report(), tmp_path / "wan.png"))


def soak_report() -> dict:
    from bench.soak import Tally, latency_over_time, memory_summary

    tally, began = Tally(), 1000.0
    for i in range(200):                                   # one generation ends every 0.3 s, slower over time
        tally.finished.append((began + 0.3 * (i + 1), 1.0 + i / 100))
    samples = [{"t": float(t), "verifier": 2000 + t / 10, "drafter": 900.0, "coordinator": 150 + t / 60}
               for t in range(0, 61, 10)]
    names = ("verifier", "drafter", "coordinator")
    return json.loads(json.dumps({
        "minutes": 1, "clients": 4, "overload_clients": 2, "generations": 200, "statuses": {"OK": 200},
        "failures": 0, "overloaded": 0, "divergences": [], "tokens": 4000, "seconds": 60.0,
        "tokens_per_second": 66.7, "generation_seconds_p50": 2.0, "generation_seconds_p99": 2.9,
        "warm_up_seconds": 5.0, "exited_services": [],
        "memory": {name: memory_summary(samples, name, 5.0) for name in names}, "memory_samples": samples,
        "latency_over_time": latency_over_time(tally, began, 10)}))


def test_soak_latency_over_time_bins_by_when_generations_ended():
    report = soak_report()
    bins = report["latency_over_time"]
    assert [b["t"] for b in bins] == [10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0]
    assert sum(b["generations"] for b in bins) == 200
    assert all(b["p50_seconds"] <= b["p99_seconds"] for b in bins)
    assert bins[0]["p99_seconds"] < bins[-1]["p99_seconds"]


def test_soak_plot(tmp_path):
    assert written(plots.plot_soak(soak_report(), tmp_path / "soak.png"))
    old = soak_report()
    del old["latency_over_time"]                           # a report written before the field existed
    assert written(plots.plot_soak(old, tmp_path / "old.png"))


def policy_report() -> dict:
    configs = ["1", "2", "3", "4", "goodput", "heuristic", "awc"]
    results = []
    for rtt in (0.0, 20.0, 50.0, 100.0):
        rows = {}
        for regime, base in (("code", 5.0), ("chat", 3.0)):
            rows[regime] = {name: {"tokens": 80, "seconds": 20.0, "rounds": 30, "drafted": 60, "accepted": 40,
                                   "draft_seconds": 2.0, "verify_wall_seconds": 15.0,
                                   "tok_s": base - rtt / 50 + (0.3 if not name.isdigit() else int(name) / 10),
                                   "round_ms": 600.0, "tpot_p50_ms": 200.0, "tpot_p99_ms": 500.0}
                            for name in configs}
        results.append({"rtt_ms": rtt, "measured_rtt_ms": rtt + 0.5, "rows": rows})
    return json.loads(json.dumps({"date": "2026-12-01", "tiny": True, "max_new_tokens": 40,
                                  "prompts": {"code": ["x"], "chat": ["y"]}, "configs": configs, "results": results}))


def test_bench_policy_plot(tmp_path):
    assert written(plots.plot_policy(policy_report(), tmp_path / "policy.png"))


def test_bench_policy_plot_with_a_subset_of_configs(tmp_path):
    report = policy_report()
    report["configs"] = ["2", "goodput"]
    for result in report["results"]:
        result["rows"] = {regime: {n: rows[n] for n in ("2", "goodput")} for regime, rows in result["rows"].items()}
    assert written(plots.plot_policy(report, tmp_path / "sub" / "policy.png"))   # the folder is made
