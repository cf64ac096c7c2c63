"""Fault injection around a LocalCluster, and `edgespec bench chaos`.

    edgespec bench chaos --faults kill,stall,reset,partition --trials 10 --json docs/bench/chaos.json

Each trial streams a greedy generation and, once a random number of tokens has
arrived, hits the verifier serving it: SIGKILL (then restart), SIGSTOP past the
deadline (then SIGCONT), an RST of every connection, or a 3 s cut of its link.
Every trial's stream must equal the fault-free output, each verified token
exactly once.
Reported: failures (must be 0), coordinator recovery time (detection to
re-opened session) and the longest gap the client saw, p50/p99.
Tiny random-weight models keep trials short; the recovery path is the same code.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import tempfile
import time
from pathlib import Path
from typing import Callable

from edge_client.client import generate, generate_resilient
from harness.cluster import LocalCluster, Service
from edgespec.loop.session import percentile
from harness.link import LinkProfile


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
                   resilient: bool = False, chat: bool = False, **kwargs) -> tuple[list, object, float]:
    """Generate; call ``fault()`` in a thread once ``at_tokens`` tokens have streamed.

    kwargs go to the client's generate (window, sampling settings).
    Returns (chunks, stats, longest gap between chunks in seconds).
    """
    async def go():
        chunks, stats, faulted, gap = [], None, None, 0.0
        last = time.perf_counter()
        stream = generate_resilient if resilient else generate
        async for event in stream(address, prompt, max_new, chat=chat, timeout_seconds=900, **kwargs):
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



class Fault:
    """One fault of a trial, aimed at the verifier serving the session; ``heal`` undoes it afterwards."""

    def __init__(self, kind: str, cluster: LocalCluster, opened_before: list[int]):
        self.kind, self.cluster, self.opened_before = kind, cluster, opened_before
        self.victim: Service | None = None

    def inject(self) -> None:
        cluster = self.cluster
        if self.kind == "reset":                      # every connection, both verifiers
            for proxy in cluster.proxies:
                proxy.reset_connections()
            return
        self.victim = serving_verifier(cluster, self.opened_before)
        if self.kind == "kill":
            cluster.kill(self.victim)
        elif self.kind == "stall":                    # alive but silent past the coordinator's deadline
            cluster.kill(self.victim, signal.SIGSTOP)
        elif self.kind == "partition":                # its link only, longer than the deadline
            cluster.proxies[cluster.verifiers.index(self.victim)].partition(3.0)

    def heal(self) -> None:
        if self.victim is None:
            return
        if self.kind == "kill":
            self.cluster.restart(self.victim)
        elif self.kind == "stall":
            self.cluster.kill(self.victim, signal.SIGCONT)


FAULTS = ("kill", "stall", "reset", "partition")


def main() -> None:
    parser = argparse.ArgumentParser(prog="edgespec bench chaos", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20, help="trials per fault kind and mode (default %(default)s)")
    parser.add_argument("--faults", default="kill", help=f"comma-separated fault kinds from {','.join(FAULTS)} "
                        "(default %(default)s): kill = SIGKILL + restart, stall = SIGSTOP past the deadline, "
                        "reset = RST every connection, partition = cut the serving verifier's link for 3 s")
    parser.add_argument("--seed", type=int, default=0, help="seed for the fault points")
    parser.add_argument("--json", type=Path, default=Path("bench-results/chaos.json"))
    args = parser.parse_args()
    faults = [f for f in args.faults.split(",") if f]
    unknown = set(faults) - set(FAULTS)
    if unknown:
        parser.error(f"unknown fault kinds: {sorted(unknown)}")
    target, draft, prompt, max_new = "tiny:12", "tiny:12~1", "Once upon a time", 300
    rng = random.Random(args.seed)
    report = {"date": time.strftime("%Y-%m-%d"), "models": [target, draft], "max_new_tokens": max_new, "results": []}
    for mode in ("blocking", "pipelined"):
        logs = Path(tempfile.mkdtemp(prefix=f"edgespec-chaos-{mode}-"))
        with chaos_cluster(logs, target, draft, "--pipeline", "on" if mode == "pipelined" else "off") as cluster:
            expected = client_view(run_with_fault(cluster.coordinator.address, prompt, max_new, lambda: None, 10**9)[0])
            for kind in faults:
                failures, recoveries, gaps, failovers = 0, [], [], 0
                for trial in range(args.trials):
                    at = rng.randint(1, max_new - 20)
                    fault = Fault(kind, cluster, [opened_count(v) for v in cluster.verifiers])
                    try:
                        chunks, stats, gap = run_with_fault(cluster.coordinator.address, prompt, max_new,
                                                            fault.inject, at)
                    finally:
                        fault.heal()
                    ok = exactly_once(chunks, expected)
                    failures += not ok
                    failovers += stats.failovers
                    recoveries.append(stats.recovery_seconds)
                    gaps.append(gap)
                    print(f"{mode} {kind} trial {trial}: at {at} tokens, identical {ok}, failovers {stats.failovers}, "
                          f"recovery {stats.recovery_seconds * 1000:.0f} ms, longest client gap {gap * 1000:.0f} ms",
                          flush=True)
                report["results"].append({
                    "mode": mode, "fault": kind, "trials": args.trials, "failures": failures, "failovers": failovers,
                    "recovery_ms_p50": 1000 * percentile(recoveries, 0.5),
                    "recovery_ms_p99": 1000 * percentile(recoveries, 0.99),
                    "client_gap_ms_p50": 1000 * percentile(gaps, 0.5), "client_gap_ms_p99": 1000 * percentile(gaps, 0.99)})
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
