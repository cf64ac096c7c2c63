"""`edgespec bench wan`: blocking vs pipelined speculation over an emulated edge-cloud link.

    edgespec bench wan --json docs/bench/wan.json --md docs/bench/wan.md

One cluster with the default real pair; the verifier sits behind a WAN delay
proxy (harness.link) whose profile changes between settings, and its RTT
is measured with gRPC health checks before each one. Two coordinators share the
drafter and the verifier: one blocking, one pipelined. The "cloud" (verifier) and
the "edge" (drafter, coordinators) are pinned to different cores with one model
thread each, so drafting ahead does not steal the verifier's compute as it
would on one shared core pair. --backend llamacpp runs both models as the GGUF
files in llama.cpp (the engine people run on CPUs) instead of PyTorch.

Cloud-only decoding (the target generates in the cloud and streams to the edge)
pays the link once, not per token: it is measured as target-only decoding at
RTT 0 plus one RTT. Speeds are tokens/s over all prompts; ITL (inter-token
latency) is the time between output tokens at the client (chunk inter-arrival /
tokens in the chunk), percentiles over all tokens. TPOT, in the other benches, is
one request's decode time per output token.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from edge_client.client import generate
from harness.cluster import REPO_ROOT, LocalCluster, start_service
from bench.prompts import PROMPTS
from bench.plots import plot_wan
from bench.report import progress, write_report
from edgespec.loop.session import latency_ms
from harness.link import LinkProfile, grpc_health_rtt_ms


async def timed_generation(address: str, prompt: str, max_new_tokens: int, window: int):
    """(tokens, seconds, per-token gaps, stats) as the edge client sees them."""
    tokens, gaps, stats = [], [], None
    started = last = time.perf_counter()
    async for event in generate(address, prompt, max_new_tokens, window, chat=True, timeout_seconds=900):
        now = time.perf_counter()
        if event.HasField("chunk") and event.chunk.token_ids:
            n = len(event.chunk.token_ids)
            gaps += [(now - last) / n] * n
            tokens += event.chunk.token_ids
            last = now
        elif event.HasField("stats"):
            stats = event.stats
    return tokens, time.perf_counter() - started, gaps, stats



def run_config(address: str, prompts, max_new: int, window: int, bar=None) -> dict:
    total_tokens, total_seconds, gaps, outputs, hits, sent = 0, 0.0, [], [], 0, 0
    for _, prompt in prompts:
        tokens, seconds, token_gaps, stats = asyncio.run(timed_generation(address, prompt, max_new, window))
        if bar is not None:
            bar.update(1)
        total_tokens += len(tokens)
        total_seconds += seconds
        gaps += token_gaps
        outputs.append(tokens)
        hits += stats.optimistic_hits
        sent += stats.optimistic_windows
    return {"tokens": total_tokens, "seconds": total_seconds, "tok_s": total_tokens / total_seconds,
            **latency_ms("itl", gaps),
            "optimistic_windows": sent, "optimistic_hits": hits, "outputs": outputs}


def settings(rtts: list[float], lossy: bool) -> list[tuple[str, LinkProfile]]:
    out = [(f"rtt {rtt:g} ms", LinkProfile(rtt_ms=rtt)) for rtt in rtts]
    if lossy:
        out.append(("rtt 50 ms, jitter 5 ms, loss 0.5%", LinkProfile(rtt_ms=50, jitter_ms=5, loss=0.005, seed=1)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="edgespec bench wan", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rtts", default="0,20,50,100", help="link RTTs to test, ms (default %(default)s)")
    parser.add_argument("--no-lossy", action="store_true", help="skip the jitter + 0.5%% loss setting")
    parser.add_argument("--windows", default="2,4", help="windows to try per mode; the best is reported (default %(default)s)")
    parser.add_argument("--per-category", type=int, default=1, help="prompts per category (default %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=40, help="tokens per generation (default %(default)s)")
    parser.add_argument("--backend", default="torch", choices=["torch", "llamacpp"],
                        help="engine of the verifier and the drafter (default %(default)s)")
    parser.add_argument("--quantize", default="auto", choices=["auto", "none", "int8"],
                        help="drafter quantization (default %(default)s: int8 on CPU). int8's dynamic activation "
                             "scales make drafts depend on how the cache was fed, a confound between modes")
    parser.add_argument("--json", type=Path, default=Path("bench-results/wan.json"),
                        help="results (default %(default)s), and beside them (.png) tokens/s against RTT per mode")
    parser.add_argument("--md", type=Path, default=Path("bench-results/wan.md"))
    args = parser.parse_args()
    windows = [int(w) for w in args.windows.split(",")]
    prompts = []
    for category in ("code", "qa", "chat"):
        prompts += [(category, p) for c, p in PROMPTS if c == category][:args.per_category]

    subprocess.run([sys.executable, "-m", "edgespec.ops.prepare"], cwd=REPO_ROOT, check=True)
    logs = Path(tempfile.mkdtemp(prefix="edgespec-bench-wan-"))
    print(f"== cluster ({args.backend}): verifier on cpu 1, drafter + coordinators on cpu 0, one model thread each "
          f"(logs {logs})", flush=True)
    results: list[dict] = []
    if args.backend == "llamacpp":
        verifier_args = ["--backend", "llamacpp", "--model", "target", "--threads", "1"]
        drafter_args = ["--backend", "llamacpp", "--model", "draft", "--threads", "1"]
    else:
        verifier_args, drafter_args = ["--threads", "1"], ["--threads", "1", "--quantize", args.quantize]
    with LocalCluster(logs, verifier_args=verifier_args, drafter_args=drafter_args,
                      coordinator_args=["--pipeline", "off"], link=LinkProfile(),
                      verifier_cpus="1", edge_cpus="0") as cluster:
        proxy = cluster.proxies[0]
        piped = start_service("services.coordinator", ["--verifier", proxy.address, "--drafter",
                                                       cluster.drafter.address, "--pipeline", "on"],
                              logs, "coordinator-pipelined", cpus="0")
        cluster.services.append(piped)
        modes = {"blocking": cluster.coordinator.address, "pipelined": piped.address}
        for address in modes.values():
            asyncio.run(timed_generation(address, "warm up", 4, 2))
        links = settings([float(r) for r in args.rtts.split(",")], not args.no_lossy)
        with progress(len(prompts) * (1 + len(links) * len(modes) * len(windows)), "bench-wan") as bar:
            print("== cloud-only baseline: target-only decoding at RTT 0", flush=True)
            cloud = run_config(modes["blocking"], prompts, args.max_new_tokens, 0, bar)
            reference = cloud["outputs"]
            for name, profile in links:
                proxy.set_profile(profile)
                rtts = asyncio.run(grpc_health_rtt_ms(proxy.address, 10))
                measured = statistics.median(rtts)
                print(f"== {name}: measured gRPC RTT p50 {measured:.1f} ms", flush=True)
                row = {"setting": name, "rtt_ms": profile.rtt_ms, "measured_rtt_ms": measured,
                       "cloud_only": {"tok_s": cloud["tokens"] / (cloud["seconds"] + len(prompts) * measured / 1000),
                                      "itl_p50_ms": cloud["itl_p50_ms"], "itl_p99_ms": cloud["itl_p99_ms"]}}
                for mode, address in modes.items():
                    tried = {}
                    for window in windows:
                        result = run_config(address, prompts, args.max_new_tokens, window, bar)
                        result["identical"] = result.pop("outputs") == reference
                        tried[window] = result
                        print(f"   {mode:9} k={window}: {result['tok_s']:.2f} tok/s, ITL p50 {result['itl_p50_ms']:.0f} "
                              f"p99 {result['itl_p99_ms']:.0f} ms, identical {result['identical']}, optimistic "
                              f"{result['optimistic_hits']}/{result['optimistic_windows']}", flush=True)
                    best = max(tried, key=lambda w: tried[w]["tok_s"])
                    row[mode] = {"best_window": best, **tried[best], "all": tried}
                row["pipelined_over_blocking"] = row["pipelined"]["tok_s"] / row["blocking"]["tok_s"]
                results.append(row)
    report = {"date": time.strftime("%Y-%m-%d"), "max_new_tokens": args.max_new_tokens, "backend": args.backend,
              "quantize": args.quantize if args.backend == "torch" else None,
              "prompts": [c for c, _ in prompts], "windows": windows, "results": results}
    write_report(report, markdown(report), args.json, args.md)
    print(f"plot: {plot_wan(report, args.json.with_suffix('.png'))}")


def markdown(report: dict) -> str:
    lines = ["| link (measured RTT) | cloud-only tok/s | blocking tok/s (k) | pipelined tok/s (k) | pipelined / blocking | "
             "ITL p50/p99 ms: cloud-only | blocking | pipelined | optimistic hits | identical |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["results"]:
        b, p, c = r["blocking"], r["pipelined"], r["cloud_only"]
        lines.append(
            f"| {r['setting']} ({r['measured_rtt_ms']:.0f} ms) | {c['tok_s']:.2f} | {b['tok_s']:.2f} ({b['best_window']}) | "
            f"{p['tok_s']:.2f} ({p['best_window']}) | {r['pipelined_over_blocking']:.2f}x | "
            f"{c['itl_p50_ms']:.0f}/{c['itl_p99_ms']:.0f} | {b['itl_p50_ms']:.0f}/{b['itl_p99_ms']:.0f} | "
            f"{p['itl_p50_ms']:.0f}/{p['itl_p99_ms']:.0f} | {p['optimistic_hits']}/{p['optimistic_windows']} | "
            f"{'yes' if b['identical'] and p['identical'] else 'NO'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
