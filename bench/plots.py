"""The benchmarks' pictures: each takes the report a bench writes as JSON and draws a PNG next to it.

    plot_load(report, path)     bench-load: tokens/s and TPOT against concurrent sessions, batching on vs off
    plot_wan(report, path)      bench-wan: tokens/s against the link's RTT, per mode
    plot_soak(report, path)     soak: each service's RSS and the generations' p50/p99 latency over time
    plot_policy(report, path)   bench-policy: tokens/s against RTT per window policy, one panel per regime
    plot_serve(report, path)    bench-serve: output tokens/s, TTFT and TPOT against concurrency, per system

matplotlib with the Agg backend (no display needed), as the simulator's and bench's plots.
"""
from __future__ import annotations

from pathlib import Path


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(figure, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    _pyplot().close(figure)
    return path


def plot_load(report: dict, path: Path) -> Path:
    """bench-load: committed tokens/s (left) and TPOT p50 (solid) / p99 (dashed) per session (right) against N,
    one line per verifier mode (cross-session batching on / off). Failed runs are left out."""
    plt = _pyplot()
    rows = [r for r in report["rows"] if not r.get("error")]
    modes = list(dict.fromkeys(r["mode"] for r in report["rows"]))
    names = {"on": "batching on", "off": "batching off"}
    figure, (speed, tpot) = plt.subplots(1, 2, figsize=(11, 4))
    for mode in modes:
        mine = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["sessions"])
        if not mine:
            continue
        ns = [r["sessions"] for r in mine]
        line, = speed.plot(ns, [r["tokens_per_second"] for r in mine], "o-", label=names.get(mode, mode))
        tpot.plot(ns, [r["tpot_p50_ms"] for r in mine], "o-", color=line.get_color(),
                  label=f"{names.get(mode, mode)} p50")
        tpot.plot(ns, [r["tpot_p99_ms"] for r in mine], "s--", color=line.get_color(),
                  label=f"{names.get(mode, mode)} p99")
    speed.set_ylabel("committed tokens/s (all sessions)")
    tpot.set_ylabel("time per output token, ms")
    for axis in (speed, tpot):
        axis.set_xlabel("concurrent sessions N")
        axis.set_xscale("log", base=2)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.suptitle(f"one verifier ({report.get('model', '?')}), window {report.get('window', '?')}, "
                    f"acceptance {report.get('acceptance', '?')}")
    return _save(figure, path)


def plot_wan(report: dict, path: Path) -> Path:
    """bench-wan: tokens/s against the configured RTT for cloud-only, blocking and pipelined (best window each);
    settings with jitter or loss are drawn as separate markers at their RTT."""
    plt = _pyplot()
    modes = {"cloud_only": "cloud-only (target in the cloud)", "blocking": "blocking speculation",
             "pipelined": "pipelined speculation"}
    clean = sorted((r for r in report["results"] if "loss" not in r["setting"] and "jitter" not in r["setting"]),
                   key=lambda r: r["rtt_ms"])
    noisy = [r for r in report["results"] if r not in clean]
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for key, label in modes.items():
        line, = axis.plot([r["rtt_ms"] for r in clean], [r[key]["tok_s"] for r in clean], "o-", label=label)
        for r in noisy:
            axis.plot([r["rtt_ms"]], [r[key]["tok_s"]], "x", color=line.get_color(), markersize=9)
    if noisy:
        axis.plot([], [], "x", color="grey", label="; ".join(r["setting"] for r in noisy))
    axis.set_xlabel("link RTT, ms")
    axis.set_ylabel("tokens/s at the client")
    axis.set_title(f"edge-cloud link ({report.get('backend', 'torch')}, {report.get('max_new_tokens', '?')} tokens "
                   "per prompt)")
    axis.set_ylim(bottom=0)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    return _save(figure, path)


def plot_soak(report: dict, path: Path) -> Path:
    """soak: RSS of each service (top) and the p50/p99 latency of the generations that ended in each sampling
    interval (bottom) against minutes since the start; the overload burst, if any, shaded."""
    plt = _pyplot()
    figure, (memory, latency) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True)
    samples = report.get("memory_samples", [])
    for name in report.get("memory", {}):
        points = [(s["t"] / 60, s[name]) for s in samples if name in s]
        memory.plot([t for t, _ in points], [m for _, m in points], ".-", label=name)
    memory.set_ylabel("RSS, MiB")
    memory.legend(fontsize=8)
    bins = report.get("latency_over_time", [])
    if bins:
        ts = [b["t"] / 60 for b in bins]
        latency.plot(ts, [b["p50_seconds"] for b in bins], ".-", label="p50")
        latency.plot(ts, [b["p99_seconds"] for b in bins], ".-", label="p99")
        latency.legend(fontsize=8)
    else:
        latency.text(0.5, 0.5, "no latency_over_time in this report (written before soak kept it)", ha="center",
                     va="center", transform=latency.transAxes, color="grey")
    latency.set_ylabel("generation latency, s")
    latency.set_xlabel("minutes since start")
    if report.get("overload_clients"):
        minutes = report["minutes"]
        for axis in (memory, latency):
            axis.axvspan(minutes / 3, 2 * minutes / 3, color="orange", alpha=0.15, label="overload burst")
    for axis in (memory, latency):
        axis.grid(alpha=0.3)
    completed = report.get("statuses", {}).get("OK", "?")
    figure.suptitle(f"soak: {report.get('clients', '?')} clients, {completed} generations completed, "
                    f"{report.get('failures', '?')} failures")
    return _save(figure, path)


def plot_policy(report: dict, path: Path) -> Path:
    """bench-policy: tokens/s against RTT for every fixed window (dashed) and adaptive policy (solid), one panel
    per acceptance regime (code, chat)."""
    plt = _pyplot()
    results = sorted(report["results"], key=lambda r: r["rtt_ms"])
    regimes = list(dict.fromkeys(regime for r in results for regime in r["rows"]))
    names = report.get("configs") or list(dict.fromkeys(n for r in results for rows in r["rows"].values()
                                                          for n in rows))
    figure, axes = plt.subplots(1, max(1, len(regimes)), figsize=(5.5 * max(1, len(regimes)), 4.2), squeeze=False,
                                sharey=True)
    for axis, regime in zip(axes[0], regimes):
        for name in names:
            points = [(r["rtt_ms"], r["rows"][regime][name]["tok_s"]) for r in results
                      if name in r["rows"].get(regime, {})]
            fixed = name.isdigit()
            axis.plot([x for x, _ in points], [y for _, y in points], "o--" if fixed else "s-",
                      label=f"k={name}" if fixed else name, alpha=0.7 if fixed else 1.0)
        axis.set_title(f"{regime} prompts")
        axis.set_xlabel("link RTT, ms")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7, ncol=2)
    axes[0][0].set_ylabel("tokens/s")
    figure.suptitle("window policies: fixed k vs adaptive" + (" (tiny models)" if report.get("tiny") else ""))
    return _save(figure, path)


def plot_serve(report: dict, path: Path) -> Path:
    """bench-serve: output tokens/s (left), TTFT p50 (middle) and TPOT p50 (solid) / p99 (dashed) (right) against
    the requests in flight, one line per system. Failed runs are left out."""
    plt = _pyplot()
    rows = [r for r in report["rows"] if not r.get("error")]
    figure, (speed, ttft, tpot) = plt.subplots(1, 3, figsize=(14, 4.2))
    for system in dict.fromkeys(r["system"] for r in report["rows"]):
        mine = sorted((r for r in rows if r["system"] == system), key=lambda r: r["concurrency"])
        if not mine:
            continue
        cs = [r["concurrency"] for r in mine]
        line, = speed.plot(cs, [r["output_tok_s"] for r in mine], "o-", label=system)
        ttft.plot(cs, [r["ttft_p50_ms"] for r in mine], "o-", color=line.get_color(), label=system)
        tpot.plot(cs, [r["tpot_p50_ms"] for r in mine], "o-", color=line.get_color(), label=f"{system} p50")
        tpot.plot(cs, [r["tpot_p99_ms"] for r in mine], "s--", color=line.get_color(), alpha=0.6,
                  label=f"{system} p99")
    speed.set_ylabel("output tokens/s (all requests)")
    ttft.set_ylabel("time to first token p50, ms")
    tpot.set_ylabel("time per output token, ms")
    levels = sorted({r["concurrency"] for r in rows})
    for axis in (speed, ttft, tpot):
        axis.set_xlabel("requests in flight (concurrency)")
        axis.set_xscale("log", base=2)
        axis.set_xticks(levels, [str(c) for c in levels])
        axis.minorticks_off()
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    figure.suptitle(f"vllm bench serve: {report.get('prompts', '?')} Spec-Bench prompts, {report.get('tokens', '?')} "
                    f"tokens each, greedy ({report.get('date', '')})")
    return _save(figure, path)
