"""Fault injection around a LocalCluster, and `edgespec bench-chaos`.

    edgespec bench-chaos --trials 30 --json docs/bench/chaos.json

Each trial streams a greedy generation and SIGKILLs the verifier serving it
once a random number of tokens has arrived, then restarts it. Every trial's
stream must equal the fault-free output, with each verified token exactly once.
Reported: failures (must be 0), coordinator recovery time (detection to
re-opened session) and the longest gap the client saw, p50/p99.
Tiny random-weight models keep trials short; the recovery path is the same code.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Callable

from edge_client.client import generate, generate_resilient
from edgespec.tools.cluster import LocalCluster, Service
from edgespec.tools.wan import LinkProfile


def opened_count(verifier: Service) -> int:
    """Sessions this verifier has opened so far (from its log)."""
    return verifier.log_path.read_text(errors="replace").count(" opened: ")


def serving_verifier(cluster: LocalCluster, opened_before: list[int]) -> Service:
    """The verifier that opened a session since ``opened_before`` (opened_count per verifier)."""
    for verifier, before in zip(cluster.verifiers, opened_before):
        if opened_count(verifier) > before:
            return verifier
    raise RuntimeError("no verifier opened the session")


def run_with_fault(address: str, prompt: str, max_new: int, fault: Callable[[], None], at_tokens: int,
                   resilient: bool = False) -> tuple[list, object, float]:
    """Generate; call ``fault()`` in a thread once ``at_tokens`` tokens have streamed.

    Returns (chunks, stats, longest gap between chunks in seconds).
    """
    async def go():
        chunks, stats, faulted, gap = [], None, None, 0.0
        last = time.perf_counter()
        stream = generate_resilient if resilient else generate
        async for event in stream(address, prompt, max_new, chat=False, timeout_seconds=120):
            now = time.perf_counter()
            if event.HasField("chunk"):
                gap, last = max(gap, now - last), now
                chunks.append(event.chunk)
                if faulted is None and sum(len(c.token_ids) for c in chunks) >= at_tokens:
                    faulted = asyncio.ensure_future(asyncio.to_thread(fault))
            else:
                stats = event.stats
        if faulted is not None:
            await faulted
        return chunks, stats, gap
    return asyncio.run(go())


def client_view(chunks) -> list[int]:
    """What a client shows: a chunk at position P replaces (unverified) tokens from P on."""
    view: list[int] = []
    for chunk in chunks:
        if chunk.token_ids:
            del view[chunk.position:]
            view += chunk.token_ids
    return view


def exactly_once(chunks, expected: list[int]) -> bool:
    """The client's view equals ``expected`` and verified chunks tile it without overlap."""
    verified = [c for c in chunks if c.token_ids and not c.unverified]
    positions = [c.position for c in verified]
    return (client_view(chunks) == expected and positions == sorted(set(positions))
            and sum(len(c.token_ids) for c in verified) == len(expected))


def chaos_cluster(log_dir: Path, target: str, draft: str, *coordinator_args: str, verifiers: int = 2) -> LocalCluster:
    """Verifiers behind (zero-delay) proxies, so links can also be reset or partitioned."""
    return LocalCluster(log_dir, verifier_count=verifiers, link=LinkProfile(),
                        verifier_args=["--model", target, "--max-window", "8"],
                        drafter_args=["--model", draft, "--max-window", "9"],
                        coordinator_args=["--tokenizer", "bytes", "--window", "3", "--max-window", "8",
                                          "--max-new-tokens", "400", "--deadline", "2", "--ban", "0.2",
                                          "--failover-deadline", "20", *coordinator_args])


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(prog="edgespec bench-chaos", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=30, help="SIGKILL trials per mode (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed for the kill points")
    parser.add_argument("--json", type=Path, default=Path("bench-results/chaos.json"))
    args = parser.parse_args()
    target, draft, prompt, max_new = "tiny:12", "tiny:12~1", "Once upon a time", 300
    rng = random.Random(args.seed)
    report = {"date": time.strftime("%Y-%m-%d"), "models": [target, draft], "max_new_tokens": max_new, "modes": {}}
    for mode in ("blocking", "pipelined"):
        logs = Path(tempfile.mkdtemp(prefix=f"edgespec-chaos-{mode}-"))
        with chaos_cluster(logs, target, draft, "--pipeline", "on" if mode == "pipelined" else "off") as cluster:
            expected = client_view(run_with_fault(cluster.coordinator.address, prompt, max_new, lambda: None, 10**9)[0])
            failures, recoveries, gaps, failovers = 0, [], [], 0
            for trial in range(args.trials):
                at = rng.randint(1, max_new - 20)
                before = [opened_count(v) for v in cluster.verifiers]
                killed: list[Service] = []

                def kill():
                    killed.append(serving_verifier(cluster, before))
                    cluster.kill(killed[0])

                chunks, stats, gap = run_with_fault(cluster.coordinator.address, prompt, max_new, kill, at)
                ok = exactly_once(chunks, expected)
                failures += not ok
                failovers += stats.failovers
                recoveries.append(stats.recovery_seconds)
                gaps.append(gap)
                print(f"{mode} trial {trial}: kill at {at} tokens, identical {ok}, failovers {stats.failovers}, "
                      f"recovery {stats.recovery_seconds * 1000:.0f} ms, longest client gap {gap * 1000:.0f} ms", flush=True)
                for service in killed:
                    cluster.restart(service)
            report["modes"][mode] = {
                "trials": args.trials, "failures": failures, "failovers": failovers,
                "recovery_ms_p50": 1000 * percentile(recoveries, 0.5), "recovery_ms_p99": 1000 * percentile(recoveries, 0.99),
                "client_gap_ms_p50": 1000 * percentile(gaps, 0.5), "client_gap_ms_p99": 1000 * percentile(gaps, 0.99)}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
