"""Window policies on the real services over an emulated link, and the simulator's error against them.

    edgespec bench policy [--rtts 0,20,50,100] [--per-category 1] [--max-new-tokens 40] [--tiny]

One cluster (verifier on cpu 1, drafter and coordinators on cpu 0, one torch thread each, as bench-wan),
one coordinator per adaptive policy (goodput, heuristic, awc), a delay proxy in front of the verifier.
For each RTT and each acceptance regime (code and chat prompts) it runs fixed windows 1..4 and the three
adaptive policies and records tokens/s and ITL p50/p99 (the time between output tokens) as the client sees them.

Fidelity: the RTT-0 fixed-window runs calibrate a cost profile (draft seconds per token, verify seconds per
round by window, per-token acceptance per regime); DSD-Sim then predicts every fixed-window run at every
RTT with that profile, and the report gives the error of tokens/s and of per-round latency.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from edge_client.client import generate
from harness.cluster import REPO_ROOT, LocalCluster, start_service
from bench.prompts import PROMPTS
from bench.plots import plot_policy
from bench.report import progress, write_report
from edgespec.loop.session import RoundStats, latency_ms
from harness.link import LinkProfile, grpc_health_rtt_ms
from edgespec.control import policies

FIXED = (1, 2, 3, 4)
ADAPTIVE = tuple(policies.ADAPTIVE)   # the adaptive window policies (goodput first), each by one coordinator


async def _one(address: str, prompt: str, max_new: int, window: int, chat: bool):
    gaps, stats, last = [], None, time.perf_counter()
    async for event in generate(address, prompt, max_new, window, chat=chat, timeout_seconds=900):
        now = time.perf_counter()
        if event.HasField("chunk") and event.chunk.token_ids:
            gaps += [(now - last) / len(event.chunk.token_ids)] * len(event.chunk.token_ids)
            last = now
        elif event.HasField("stats"):
            stats = event.stats
    return gaps[1:], stats     # the first gap holds the prefill


def run(address: str, prompts: list[str], max_new: int, window: int, chat: bool, bar=None) -> dict:
    gaps, tokens, seconds, generations = [], 0, 0.0, []
    for prompt in prompts:
        token_gaps, s = asyncio.run(_one(address, prompt, max_new, window, chat))
        if bar is not None:
            bar.update(1)
        gaps += token_gaps
        tokens += s.new_tokens
        seconds += s.seconds - s.prefill_seconds
        generations.append(RoundStats.of(s))
    pooled = RoundStats.merged(generations)
    totals = dict(tokens=tokens, seconds=seconds, rounds=pooled.rounds, drafted=pooled.drafted,
                  accepted=pooled.accepted, draft_seconds=pooled.draft_seconds,
                  verify_wall_seconds=pooled.verify_wall_seconds)
    return {**totals, "tok_s": totals["tokens"] / totals["seconds"],
            "round_ms": 1000 * totals["seconds"] / max(1, totals["rounds"]),
            **latency_ms("itl", gaps)}


def alpha_from(runs: list[dict]) -> float:
    """Per-token acceptance alpha such that E[n | k] = sum_{i<=k} alpha^i matches the fixed-window runs."""
    def predicted(alpha: float) -> float:
        return sum(r["rounds"] * sum(alpha ** i for i in range(1, r["k"] + 1)) for r in runs)
    accepted = sum(r["accepted"] for r in runs)
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if predicted(mid) < accepted else (lo, mid)
    return (lo + hi) / 2


def calibrate(rows: dict, base_rtt_ms: float) -> dict:
    """A DSD-Sim profile from the RTT-0 fixed-window runs (both regimes pooled for costs)."""
    runs = [dict(r, k=k) for regime in rows.values() for k, r in regime.items() if isinstance(k, int)]
    draft = sum(r["draft_seconds"] for r in runs) / max(1, sum(r["drafted"] for r in runs))
    verify = {}
    for k in FIXED:
        same = [r for r in runs if r["k"] == k]
        wall = sum(r["verify_wall_seconds"] for r in same) / sum(r["rounds"] for r in same)
        verify[str(k + 1)] = max(1e-4, wall - base_rtt_ms / 1000)
    alphas = {regime: alpha_from([dict(r, k=k) for k, r in runs_.items() if isinstance(k, int)])
              for regime, runs_ in rows.items()}
    return {"draft_seconds_per_token": draft, "forward_seconds_by_tokens": verify, "alpha": alphas}


def simulate(profile: dict, alpha: float, rtt_ms: float, k: int, requests: int, tokens: int) -> dict:
    from edgespec.sim import run_scenario

    scenario = {"name": f"fidelity-k{k}-rtt{rtt_ms:g}", "seed": 1,
                "profile": {"draft_seconds_per_token": profile["draft_seconds_per_token"],
                            "forward_seconds_by_tokens": profile["forward_seconds_by_tokens"]},
                "link": {"rtt_ms": rtt_ms}, "acceptance": {"per_position": [alpha] * 8},
                "requests_per_device": max(20, requests), "tokens_per_request": tokens, "max_k": 8,
                "policies": [f"fixed:{k}"]}
    result = run_scenario(scenario)["policies"][f"fixed:{k}"]
    seconds = result["tokens"] / result["tokens_per_second"]      # generation time, summed over requests
    return {"tok_s": result["tokens_per_second"], "round_ms": 1000 * seconds / result["rounds"]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="edgespec bench policy", description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rtts", default="0,20,50,100", help="link RTTs, ms (default %(default)s)")
    parser.add_argument("--per-category", type=int, default=1, help="prompts per regime (default %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=40, help="tokens per generation (default %(default)s)")
    parser.add_argument("--configs", default="1,2,3,4,goodput,heuristic,awc",
                        help="fixed windows and policies to run; the simulator's error needs all of 1,2,3,4 "
                             "(default %(default)s)")
    parser.add_argument("--tiny", action="store_true", help="tiny random models (a smoke test of the tool)")
    parser.add_argument("--json", type=Path, default=Path("bench-results/policy.json"),
                        help="results (default %(default)s), and beside them (.png) tokens/s against RTT per policy "
                             "and regime")
    args = parser.parse_args(argv)
    rtts = [float(r) for r in args.rtts.split(",")]
    configs = [c.strip() for c in args.configs.split(",")]
    fixed = [int(c) for c in configs if c.isdigit()]
    adaptive = [c for c in configs if not c.isdigit()]
    if set(adaptive) - set(ADAPTIVE):
        parser.error(f"--configs: policies are {', '.join(ADAPTIVE)}")
    fidelity = set(FIXED) <= set(fixed)
    if rtts[0] != 0:
        parser.error("--rtts must start with 0 (the calibration run)")
    regimes = {c: [p for cat, p in PROMPTS if cat == c][:args.per_category] for c in ("code", "chat")}
    if args.tiny:
        models = (["--model", "tiny:7", "--max-window", "8"], ["--model", "tiny:7~1", "--max-window", "8"],
                  ["--tokenizer", "bytes"])
    else:
        subprocess.run([sys.executable, "-m", "edgespec.ops.prepare"], cwd=REPO_ROOT, check=True)
        models = (["--threads", "1"], ["--threads", "1"], [])
    logs = Path(tempfile.mkdtemp(prefix="edgespec-bench-policy-"))
    report = {"date": time.strftime("%Y-%m-%d"), "tiny": args.tiny, "max_new_tokens": args.max_new_tokens,
              "prompts": regimes, "configs": configs, "results": []}
    with LocalCluster(logs, verifier_args=models[0], drafter_args=models[1],
                      coordinator_args=[*models[2], "--window", "auto", "--auto-policy", "goodput"],
                      link=LinkProfile(), verifier_cpus="1", edge_cpus="0") as cluster:
        proxy = cluster.proxies[0]
        coordinators = {"goodput": cluster.coordinator.address}
        for policy in ADAPTIVE[1:]:
            service = start_service("services.coordinator", [
                "--verifier", proxy.address, "--drafter", cluster.drafter.address, *models[2], "--window", "auto",
                "--auto-policy", policy], logs, f"coordinator-{policy}", cpus="0")
            cluster.services.append(service)
            coordinators[policy] = service.address
        for address in coordinators.values():
            run(address, ["warm up"], 4, -1, not args.tiny)
        profile = None
        generations = len(rtts) * (len(fixed) + len(adaptive)) * sum(len(p) for p in regimes.values())
        with progress(generations, "bench-policy") as bar:
            for rtt in rtts:
                proxy.set_profile(LinkProfile(rtt_ms=rtt))
                measured = statistics.median(asyncio.run(grpc_health_rtt_ms(proxy.address, 10)))
                rows: dict = {}
                for regime, prompts in regimes.items():
                    rows[regime] = {}
                    for k in fixed:
                        rows[regime][k] = run(coordinators["goodput"], prompts, args.max_new_tokens, k, not args.tiny,
                                              bar)
                    for policy in adaptive:
                        rows[regime][policy] = run(coordinators[policy], prompts, args.max_new_tokens, -1, not args.tiny,
                                                   bar)
                    line = ", ".join(f"{name}={r['tok_s']:.2f}" for name, r in rows[regime].items())
                    print(f"rtt {rtt:g} ms (measured {measured:.1f}) {regime}: {line}", flush=True)
                if profile is None and fidelity:
                    profile = calibrate(rows, measured)
                    report["profile"] = profile
                    print(f"calibrated: {json.dumps(profile)}", flush=True)
                for regime in rows if fidelity else ():
                    for k in FIXED:
                        predicted = simulate(profile, profile["alpha"][regime], measured, k, len(regimes[regime]),
                                             args.max_new_tokens)
                        real = rows[regime][k]
                        real["sim_tok_s"], real["sim_round_ms"] = predicted["tok_s"], predicted["round_ms"]
                        real["tok_s_error"] = predicted["tok_s"] / real["tok_s"] - 1
                        real["round_ms_error"] = predicted["round_ms"] / real["round_ms"] - 1
                report["results"].append({"rtt_ms": rtt, "measured_rtt_ms": measured,
                                          "rows": {regime: {str(name): r for name, r in rows[regime].items()}
                                                   for regime in rows}})
    write_report(report, markdown(report), args.json)
    print(f"plot: {plot_policy(report, args.json.with_suffix('.png'))}")


def markdown(report: dict) -> str:
    names = report.get("configs") or [str(k) for k in FIXED] + list(ADAPTIVE)
    out = ["| RTT ms | regime | " + " | ".join(f"k={n}" if n.isdigit() else n for n in names) +
           " | best adaptive vs best fixed |", "|---" * (len(names) + 3) + "|"]
    errors = []
    for result in report["results"]:
        for regime, rows in result["rows"].items():
            best_fixed = max(rows[n]["tok_s"] for n in names if n.isdigit())
            cells = [f"{rows[n]['tok_s']:.2f} ({rows[n]['itl_p50_ms']:.0f}/{rows[n]['itl_p99_ms']:.0f})" for n in names]
            gains = ", ".join(f"{p} {rows[p]['tok_s'] / best_fixed - 1:+.0%}" for p in names if not p.isdigit())
            out.append(f"| {result['rtt_ms']:g} | {regime} | " + " | ".join(cells) + f" | {gains} |")
            errors += [(result["rtt_ms"], regime, n, rows[n]) for n in names if n.isdigit() and "tok_s_error" in rows[n]]
    out += ["", "tokens/s (ITL p50/p99 ms). Simulator error (DSD-Sim with the profile calibrated at RTT 0):", "",
            "| RTT ms | regime | k | real tok/s | sim tok/s | tok/s error | real round ms | sim round ms | round error |",
            "|---|---|---|---|---|---|---|---|---|"]
    for rtt, regime, k, r in errors:
        out.append(f"| {rtt:g} | {regime} | {k} | {r['tok_s']:.2f} | {r['sim_tok_s']:.2f} | {r['tok_s_error']:+.1%} | "
                   f"{r['round_ms']:.0f} | {r['sim_round_ms']:.0f} | {r['round_ms_error']:+.1%} |")
    if errors:
        mean_abs = statistics.mean(abs(r["tok_s_error"]) for *_, r in errors)
        worst = max(abs(r["tok_s_error"]) for *_, r in errors)
        out += ["", f"mean |tok/s error| {mean_abs:.1%}, worst {worst:.1%}"]
    return "\n".join(out)


if __name__ == "__main__":
    main()
