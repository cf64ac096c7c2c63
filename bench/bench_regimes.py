"""`edgespec bench regimes`: window control through a trace whose regime changes, against fixed windows.

    edgespec bench regimes --json bench-results/regimes.json --plot bench-results/regimes.png

The set-up of `edgespec bench capacity` (one verifier on its own core; emulated edge devices that propose
the draft model's recorded greedy choices after its measured draft time; an emulated link, real sockets), run
through one trace of phases, each with its own link RTT, number of concurrent users and kind of prompt:

    code, 1 user, RTT 20 -> code, 1 user, RTT 150 -> code, 16 users, RTT 150 -> chat, 16 users, RTT 20
    -> chat, 1 user, RTT 20

Each mode runs the whole trace in turn, one link and one set of costs throughout, so the adaptive policies
carry what they measured from one phase into the next, as a coordinator would: fixed windows (k=1, 2, 4),
autoregressive serving (ar), the default policy (auto, the load-aware goodput policy) and AWC (the learned
controller). Reported per phase and over the whole trace: committed tokens/s, per-user TPOT p50, acceptance;
each phase's best fixed window (ar is window 0); the adaptive policies' ratios to it and, over the trace, to
the best single fixed window. Every output is checked against the target's greedy output (exit 1 on a difference).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench.bench_capacity import (MAX_K, add_device_flags, check_device_flags, draft_seconds_per_token, ensure_drafts,
                                  pinned_devices, report_mismatches, run_sessions, verifier_command)
from bench.bench_load import ensure_references, reference_key, running_verifier
from bench.devices import RUN_FAILURES, failure, verifier_info
from bench.prompt_set import PROMPT_SET
from bench.report import progress
from harness.link import DelayProxy, LinkProfile
from edgespec.control.telemetry import Telemetry


@dataclass(frozen=True, slots=True)
class Phase:
    rtt_ms: float
    sessions: int
    category: str     # "code", "qa" or "chat": the prompts its users send

    @property
    def name(self) -> str:
        return f"{self.category}, {self.sessions} user{'s' if self.sessions > 1 else ''}, RTT {self.rtt_ms:g}"


DEFAULT_TRACE = "20:1:code,150:1:code,150:16:code,20:16:chat,20:1:chat"
MODES = ("ar", "k=1", "k=2", "k=4", "auto", "awc")
ADAPTIVE = ("auto", "auto-blind", "awc")


def parse_trace(text: str) -> list[Phase]:
    """RTT_MS:SESSIONS:CATEGORY,... -> phases; ValueError naming the bad part."""
    phases = []
    for part in text.split(","):
        fields = part.split(":")
        if len(fields) != 3:
            raise ValueError(f"trace phase {part!r}: expected RTT_MS:SESSIONS:CATEGORY")
        try:
            rtt, sessions = float(fields[0]), int(fields[1])
        except ValueError:
            raise ValueError(f"trace phase {part!r}: RTT and SESSIONS must be numbers") from None
        if rtt < 0 or sessions < 1 or fields[2] not in ("code", "qa", "chat"):
            raise ValueError(f"trace phase {part!r}: need RTT >= 0, SESSIONS >= 1, CATEGORY code, qa or chat")
        phases.append(Phase(rtt, sessions, fields[2]))
    return phases


def summarize_trace(rows: list[dict], phases: list[Phase], modes: list[str]) -> dict:
    """Per mode: tokens/s over the whole trace; per phase: the best fixed window and each mode's ratio to it."""
    good = {(r["mode"], r["phase"]): r for r in rows if not r["error"]}
    fixed = [m for m in modes if m == "ar" or m.startswith("k=")]   # ar is the fixed window 0
    totals = {}
    for mode in modes:
        mine = [good[mode, i] for i in range(len(phases)) if (mode, i) in good]
        if len(mine) == len(phases):
            totals[mode] = round(sum(r["tokens"] for r in mine) / sum(r["seconds"] for r in mine), 3)
    per_phase = []
    for i, phase in enumerate(phases):
        speeds = {m: good[m, i]["tokens_per_second"] for m in modes if (m, i) in good}
        best_fixed = max((m for m in fixed if m in speeds), key=speeds.get, default=None)
        per_phase.append({"phase": i, "name": phase.name, "best_fixed": best_fixed,
                          "vs_best_fixed": {m: round(v / speeds[best_fixed], 3) for m, v in speeds.items()}
                          if best_fixed else {}})
    best_single = max((m for m in fixed if m in totals), key=totals.get, default=None)
    return {"trace_tokens_per_second": totals, "best_single_fixed": best_single,
            "vs_best_single_fixed": {m: round(v / totals[best_single], 3) for m, v in totals.items()}
            if best_single else {}, "phases": per_phase}


def markdown(rows: list[dict], phases: list[Phase], modes: list[str], summary: dict) -> str:
    good = {(r["mode"], r["phase"]): r for r in rows if not r["error"]}
    lines = ["| phase | " + " | ".join(modes) + " | best fixed |", "|---" * (len(modes) + 2) + "|"]
    for i, phase in enumerate(phases):
        cells = []
        for mode in modes:
            row = good.get((mode, i))
            ratio = summary["phases"][i]["vs_best_fixed"].get(mode)
            cells.append("failed" if row is None else f"{row['tokens_per_second']:.1f}"
                         + (f" ({ratio:.2f}x)" if ratio is not None and mode in ADAPTIVE else ""))
        lines.append(f"| {phase.name} | " + " | ".join(cells) + f" | {summary['phases'][i]['best_fixed']} |")
    totals, ratios = summary["trace_tokens_per_second"], summary["vs_best_single_fixed"]
    lines.append("| **whole trace** | " + " | ".join(
        f"**{totals[m]:.1f}**" + (f" ({ratios[m]:.2f}x)" if m in ratios else "") if m in totals else "failed"
        for m in modes) + f" | {summary['best_single_fixed']} |")
    return "\n".join(lines)


def plot(rows: list[dict], phases: list[Phase], modes: list[str], path: Path) -> None:
    """Grouped bars: tokens/s per phase, one bar per mode."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    good = {(r["mode"], r["phase"]): r["tokens_per_second"] for r in rows if not r["error"]}
    figure, axis = plt.subplots(figsize=(2.2 * len(phases) + 2, 4.5))
    width = 0.8 / len(modes)
    for j, mode in enumerate(modes):
        xs = [i + (j - (len(modes) - 1) / 2) * width for i in range(len(phases))]
        axis.bar(xs, [good.get((mode, i), 0.0) for i in range(len(phases))], width, label=mode)
    axis.set_xticks(range(len(phases)), [p.name.replace(", RTT", "\nRTT") for p in phases], fontsize=8)
    axis.set_ylabel("committed tokens/s (all users)")
    axis.set_title("One verifier through a regime-changing trace: fixed windows vs adaptive control")
    axis.legend(ncol=len(modes), fontsize=8)
    axis.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


async def measure(service, metrics_url, config, phases, prompts, keys) -> tuple[list[dict], float]:
    eos = frozenset((await verifier_info(service.address)).eos_token_ids)
    refs = {c: await ensure_references(service.address, config.references, keys[c], prompts[c], config.tokens, eos,
                                       config.timeout) for c in prompts}
    choices = {c: ensure_drafts(config.drafts, config.draft, 1, prompts[c], refs[c]) for c in prompts}
    first = next(iter(prompts.values()))[0]
    draft_seconds = (config.draft_ms / 1000 if config.draft_ms is not None else
                     draft_seconds_per_token(config.draft, 1, first))
    print(f"draft time per token (the edge device, one core): {1000 * draft_seconds:.1f} ms", flush=True)
    rows = []
    proxy = DelayProxy(service.address, LinkProfile(rtt_ms=phases[0].rtt_ms)).start()
    runs = len(config.modes) * sum(phase.sessions for phase in phases)
    try:
        with progress(runs, "bench-regimes", unit="session") as bar:
            for mode in config.modes:
                costs = Telemetry(max_k=MAX_K)   # one coordinator through the whole trace
                for i, phase in enumerate(phases):
                    proxy.set_profile(LinkProfile(rtt_ms=phase.rtt_ms))
                    c = phase.category
                    try:
                        row = await asyncio.wait_for(run_sessions(
                            proxy.address, prompts[c], refs[c], choices[c], phase.sessions, mode, draft_seconds, costs,
                            eos, f"trace-{mode}-{i}", service.process.pid, metrics_url, config.timeout), config.timeout)
                    except RUN_FAILURES as error:
                        row = {"mode": mode, "sessions": phase.sessions, "mismatches": 0,
                               "error": failure(error, config.timeout)}
                    row |= {"phase": i, "phase_name": phase.name, "rtt_ms": phase.rtt_ms, "category": c,
                            "backend": config.backend}
                    rows.append(row)
                    if not row["error"]:
                        report_mismatches(row)
                        print(f"{mode:>5} | {phase.name:<24} | {row['tokens_per_second']:6.2f} tok/s | TPOT p50 "
                              f"{row['tpot_p50_ms']:.0f} ms | windows {row['windows']}", flush=True)
                    else:
                        print(f"{mode:>5} | {phase.name:<24} | failed: {row['error']}", flush=True)
                    bar.update(phase.sessions)
    finally:
        proxy.stop()
    return rows, draft_seconds


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="edgespec bench regimes", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", default=DEFAULT_TRACE, help="phases RTT_MS:SESSIONS:CATEGORY, comma-separated "
                        "(default %(default)s)")
    add_device_flags(parser, ",".join(MODES))
    parser.add_argument("--json", type=Path, default=None, help="write rows and summary here")
    parser.add_argument("--md", type=Path, default=None, help="write the markdown table here")
    parser.add_argument("--plot", type=Path, default=None, help="draw tokens/s per phase and mode here (PNG)")
    args = parser.parse_args(argv)
    try:
        args.phases = parse_trace(args.trace)
    except ValueError as error:
        parser.error(f"--trace: {error}")
    check_device_flags(parser, args)
    return args


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    from edgespec.backends.tokenizer import load_tokenizer

    verifier_args = verifier_command(config, "edgespec bench regimes")
    if verifier_args is None:
        return 2
    tokenizer = load_tokenizer(config.tokenizer)
    need = {c: max(p.sessions for p in config.phases if p.category == c) for c in {p.category for p in config.phases}}
    prompts = {c: [tokenizer.encode(text, True) for cat, text in PROMPT_SET if cat == c][:n] for c, n in need.items()}
    keys = {c: [reference_key(config.model, shlex.join(verifier_args), config.tokens, p) for p in prompts[c]]
            for c in prompts}
    log_dir = config.log_dir or Path(tempfile.mkdtemp(prefix="edgespec-bench-regimes-"))
    print(f"verifier logs: {log_dir}", flush=True)
    with pinned_devices(config) as pin, \
            running_verifier(verifier_args, log_dir, "verifier", True, cpus=pin) as (service, metrics_url):
        rows, draft_seconds = asyncio.run(measure(service, metrics_url, config, config.phases, prompts, keys))
    summary = summarize_trace(rows, config.phases, config.modes)
    table = markdown(rows, config.phases, config.modes, summary)
    mismatches = sum(row["mismatches"] for row in rows)
    print("\n" + table)
    print(f"\nmismatches against the target's greedy output: {mismatches}" +
          ("  <-- CORRECTNESS FAILURE" if mismatches else ""))
    if config.plot:
        plot(rows, config.phases, config.modes, config.plot)
    if config.md:
        config.md.parent.mkdir(parents=True, exist_ok=True)
        config.md.write_text(table + "\n")
    if config.json:
        config.json.parent.mkdir(parents=True, exist_ok=True)
        config.json.write_text(json.dumps({
            "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()},
            "trace": config.trace, "modes": config.modes, "backend": config.backend, "draft": config.draft,
            "tokens": config.tokens, "draft_ms_per_token": round(1000 * draft_seconds, 2),
            "verifier_args": shlex.join(verifier_args), "verifier_cpus": pin, "rows": rows, "summary": summary,
            "mismatches": mismatches}, indent=1))
    return 1 if mismatches or any(row["error"] for row in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
