"""`edgespec bench soak`: many sessions opening and closing for minutes; failed requests, and memory over time.

    edgespec bench soak --minutes 10 --clients 16 --json bench-results/soak.json

Starts verifier, drafter and coordinator on loopback (default: the real pair)
and runs --clients client loops through the edge client for --minutes: each loop
picks a prompt (90-prompt set, chat template) and a max_new_tokens in
[--min-tokens, --max-tokens], generates greedily, and starts over, so sessions
open and close all the time. Every call ends in a gRPC status: OK, or
RESOURCE_EXHAUSTED while an --overload-clients burst runs (deliberate overload),
or else it is a failure.
Greedy output depends only on the prompt, so each output must be a prefix of
(or extend) the longest output seen for its prompt; a divergence is a failure.

Every --sample-seconds the VmRSS of each service process is read from /proc.
Reported per service: RSS at the first sample after warm-up (every client has
finished one generation), at the end, its maximum, and the least-squares slope
after warm-up (MiB per minute). The generations' p50/p99 latency is also kept per
sampling interval (by when they ended), and --json draws both over time beside the
report (.png). Exit status 1 on any failure, divergence or service that exited.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import shlex
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from edge_client.client import collect
from edgespec.net.rpc import RETRY_AFTER_KEY
from bench.report import process_memory_mib
from harness.cluster import LocalCluster, Service
from bench.prompt_set import PROMPT_SET
from bench.plots import plot_soak
from bench.report import progress
from edgespec.loop.session import percentile

OVERLOAD = grpc.StatusCode.RESOURCE_EXHAUSTED


@dataclass(slots=True)
class Tally:
    """Outcomes of every generation call, shared by the client loops."""
    statuses: Counter = field(default_factory=Counter)        # gRPC status name -> calls
    overloaded: int = 0                     # RESOURCE_EXHAUSTED while the overload burst was running (deliberate)
    bursting: int = 0                       # overload loops running now
    tokens: int = 0
    seconds: list[float] = field(default_factory=list)        # wall time of each OK call
    longest: dict[str, list[int]] = field(default_factory=dict)  # prompt -> longest output seen
    divergences: list[dict] = field(default_factory=list)
    first_finished: dict[int, float] = field(default_factory=dict)  # client loop -> monotonic time of its first OK
    finished: list[tuple[float, float]] = field(default_factory=list)  # per OK call: (monotonic end, wall seconds)

    def failures(self) -> int:
        return sum(n for name, n in self.statuses.items() if name != "OK") - self.overloaded


def check_consistent(tally: Tally, prompt: str, tokens: list[int]) -> None:
    """Greedy output is a function of the prompt: the shorter of two outputs must prefix the longer."""
    known = tally.longest.get(prompt, [])
    shorter, longer = sorted((known, tokens), key=len)
    if longer[:len(shorter)] != shorter:
        at = next(i for i, (a, b) in enumerate(zip(shorter, longer)) if a != b)
        tally.divergences.append({"prompt": prompt[:60], "position": at, "got": tokens[at:at + 4],
                                  "earlier": known[at:at + 4]})
        print(f"!!! DIVERGENCE: {prompt[:40]!r} at token {at}: got {tokens[at:at + 4]}, earlier {known[at:at + 4]}",
              file=sys.stderr, flush=True)
    elif len(tokens) > len(known):
        tally.longest[prompt] = tokens


def retry_after_seconds(error: grpc.aio.AioRpcError) -> float:
    for key, value in error.trailing_metadata() or ():
        if key == RETRY_AFTER_KEY:
            return int(value) / 1000
    return 0.1


async def generate_once(address: str, prompt: str, max_new: int, timeout: float) -> list[int]:
    return (await collect(address, prompt, max_new, chat=True, timeout_seconds=timeout)).tokens


async def client_loop(index: int, address: str, config: argparse.Namespace, tally: Tally, until: float) -> None:
    """Generate from random prompts until ``until`` (monotonic seconds)."""
    rng = random.Random(f"{config.seed}/{index}")
    while time.monotonic() < until:
        prompt = rng.choice(PROMPT_SET)[1]
        began = time.perf_counter()
        try:
            tokens = await generate_once(address, prompt, rng.randint(config.min_tokens, config.max_tokens),
                                         config.request_timeout)
        except grpc.aio.AioRpcError as error:
            tally.statuses[error.code().name] += 1
            deliberate = error.code() == OVERLOAD and tally.bursting > 0
            tally.overloaded += deliberate
            if not deliberate:
                print(f"!!! client {index}: {error.code().name}: {error.details()}", file=sys.stderr, flush=True)
            await asyncio.sleep(retry_after_seconds(error) if error.code() == OVERLOAD else 0.5)
            continue
        tally.statuses["OK"] += 1
        tally.tokens += len(tokens)
        tally.seconds.append(time.perf_counter() - began)
        tally.first_finished.setdefault(index, time.monotonic())
        tally.finished.append((time.monotonic(), tally.seconds[-1]))
        check_consistent(tally, prompt, tokens)


async def overload_loop(index: int, address: str, config: argparse.Namespace, tally: Tally, start: float,
                        until: float) -> None:
    """A client loop from ``start`` to ``until``; while any runs, RESOURCE_EXHAUSTED is deliberate overload."""
    await asyncio.sleep(max(0.0, start - time.monotonic()))
    tally.bursting += 1
    try:
        await client_loop(index, address, config, tally, until)
    finally:
        tally.bursting -= 1


async def sample_memory(services: list[Service], every: float, samples: list[dict], began: float) -> None:
    """Append {"t": seconds since start, service name: RSS MiB, ...} every ``every`` seconds until cancelled."""
    while True:
        samples.append(memory_sample(services, began))
        await asyncio.sleep(every)


def memory_sample(services: list[Service], began: float) -> dict:
    return {"t": round(time.monotonic() - began, 1),
            **{s.name: process_memory_mib(s.process.pid)["rss_mib"] for s in services if s.process.poll() is None}}


def slope_per_minute(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, MiB) points, in MiB per minute."""
    if len(points) < 2:
        return None
    mean_t = sum(t for t, _ in points) / len(points)
    mean_m = sum(m for _, m in points) / len(points)
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    return round(60 * sum((t - mean_t) * (m - mean_m) for t, m in points) / spread, 3) if spread else None


def memory_summary(samples: list[dict], name: str, warm_at: float | None) -> dict:
    """RSS of one service at the first sample after warm-up, at the end, the maximum and the slope after warm-up."""
    mine = [s for s in samples if name in s]
    after = [s for s in mine if warm_at is not None and s["t"] >= warm_at] or mine[-1:]
    return {"start_mib": after[0][name], "end_mib": mine[-1][name], "max_mib": max(s[name] for s in mine),
            "slope_mib_per_minute": slope_per_minute([(s["t"], s[name]) for s in after])}


def latency_over_time(tally: Tally, began: float, every: float) -> list[dict]:
    """The OK generations' wall time by when they ended, in intervals of ``every`` seconds: per interval its end
    (seconds since the start), the generations that ended in it and their p50/p99 seconds."""
    bins: dict[int, list[float]] = {}
    for ended, seconds in tally.finished:
        bins.setdefault(int((ended - began) // every), []).append(seconds)
    return [{"t": round((i + 1) * every, 1), "generations": len(values),
             "p50_seconds": round(percentile(values, 0.5), 3), "p99_seconds": round(percentile(values, 0.99), 3)}
            for i, values in sorted(bins.items())]


async def show_progress(bar, tally: Tally, began: float) -> None:
    """Move ``bar`` (seconds of the run) once a second, with the generations so far, until cancelled."""
    while True:
        await asyncio.sleep(1)
        bar.update(min(bar.total, time.monotonic() - began) - bar.n)
        bar.set_postfix(generations=sum(tally.statuses.values()), failures=tally.failures(), refresh=False)


def warm_up_seconds(tally: Tally, clients: int, began: float) -> float | None:
    """Seconds from the start until every regular client loop had finished a generation; None if one never did."""
    firsts = [tally.first_finished.get(i) for i in range(clients)]
    return None if None in firsts else round(max(firsts) - began, 1)


async def soak(cluster: LocalCluster, config: argparse.Namespace, bar=None) -> dict:
    tally, samples = Tally(), []
    began = time.monotonic()
    until = began + 60 * config.minutes
    sampler = asyncio.ensure_future(sample_memory(cluster.services, config.sample_seconds, samples, began))
    shower = asyncio.ensure_future(show_progress(bar, tally, began)) if bar is not None and not bar.disable else None
    burst = (began + 20 * config.minutes, began + 40 * config.minutes)   # the middle third of the run
    loops = [client_loop(i, cluster.coordinator.address, config, tally, until) for i in range(config.clients)]
    loops += [overload_loop(config.clients + i, cluster.coordinator.address, config, tally, *burst)
              for i in range(config.overload_clients)]
    await asyncio.gather(*loops)
    wall = time.monotonic() - began
    sampler.cancel()
    if shower is not None:
        shower.cancel()
    samples.append(memory_sample(cluster.services, began))
    warm_at = warm_up_seconds(tally, config.clients, began)
    exited = [s.name for s in cluster.services if s.process.poll() is not None]
    return {"minutes": config.minutes, "clients": config.clients, "overload_clients": config.overload_clients,
            "generations": sum(tally.statuses.values()), "statuses": dict(tally.statuses),
            "failures": tally.failures(), "overloaded": tally.overloaded,
            "divergences": tally.divergences, "tokens": tally.tokens, "seconds": round(wall, 1),
            "tokens_per_second": round(tally.tokens / wall, 3),
            "generation_seconds_p50": round(percentile(tally.seconds, 0.5), 3),
            "generation_seconds_p99": round(percentile(tally.seconds, 0.99), 3),
            "warm_up_seconds": warm_at, "exited_services": exited,
            "memory": {s.name: memory_summary(samples, s.name, warm_at) for s in cluster.services},
            "memory_samples": samples,
            "latency_over_time": latency_over_time(tally, began, config.sample_seconds)}


def print_report(report: dict) -> None:
    print(f"{report['generations']} generations in {report['seconds']}s ({report['clients']} clients"
          f"{' + ' + str(report['overload_clients']) + ' overload' if report['overload_clients'] else ''}): "
          f"{report['tokens']} tokens, {report['tokens_per_second']} tok/s; statuses {report['statuses']}; "
          f"failures {report['failures']}, divergences {len(report['divergences'])}; warm-up "
          f"{report['warm_up_seconds']}s" + (f"; EXITED: {report['exited_services']}" if report["exited_services"] else ""))
    print("| service | RSS start MiB | end | max | slope MiB/min |\n|---|---|---|---|---|")
    for name, m in report["memory"].items():
        print(f"| {name} | {m['start_mib']:.0f} | {m['end_mib']:.0f} | {m['max_mib']:.0f} | {m['slope_mib_per_minute']} |")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="edgespec bench soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10, help="how long the client loops run (default %(default)s)")
    parser.add_argument("--clients", type=int, default=16, help="concurrent client loops (default %(default)s)")
    parser.add_argument("--min-tokens", type=int, default=8, help="smallest max_new_tokens (default %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=48, help="largest max_new_tokens (default %(default)s)")
    parser.add_argument("--overload-clients", type=int, default=0, help="extra client loops during the middle third "
                        "of the run, to push past the services' limits on purpose; RESOURCE_EXHAUSTED answers (to any "
                        "client) while they run count as overload, not failures. The loops are anonymous callers, by default a "
                        "service identity without a per-client limit: to hit one, give the coordinator "
                        "'--service-identities= --max-sessions-per-client N' (default %(default)s)")
    parser.add_argument("--verifier-args", default="", help="verifier flags, e.g. '--model tiny:3 --max-queue 16'")
    parser.add_argument("--drafter-args", default="", help="drafter flags, e.g. '--model tiny:3~1'")
    parser.add_argument("--coordinator-args", default="", help="coordinator flags, e.g. '--tokenizer bytes'")
    parser.add_argument("--sample-seconds", type=float, default=10, help="RSS sampling interval (default %(default)s)")
    parser.add_argument("--request-timeout", type=float, default=300, help="deadline of one generation, seconds "
                        "(default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the prompt and length choices (default %(default)s)")
    parser.add_argument("--json", type=Path, default=None, help="write the report here, and beside it (.png) each "
                        "service's RSS and the p50/p99 generation latency over time")
    parser.add_argument("--log-dir", type=Path, default=None, help="service logs (default: a temporary directory)")
    args = parser.parse_args(argv)
    if args.clients < 1 or args.minutes <= 0 or not 1 <= args.min_tokens <= args.max_tokens:
        parser.error("need --clients >= 1, --minutes > 0 and 1 <= --min-tokens <= --max-tokens")
    return args


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    log_dir = config.log_dir or Path(tempfile.mkdtemp(prefix="edgespec-soak-"))
    print(f"service logs: {log_dir}", flush=True)
    with LocalCluster(log_dir, verifier_args=shlex.split(config.verifier_args),
                      drafter_args=shlex.split(config.drafter_args),
                      coordinator_args=shlex.split(config.coordinator_args)) as cluster:
        with progress(round(60 * config.minutes), "soak", unit="s",
                      bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} s [{elapsed}<{remaining}{postfix}]") as bar:
            report = asyncio.run(soak(cluster, config, bar))
    print_report(report)
    if config.json:
        config.json.parent.mkdir(parents=True, exist_ok=True)
        config.json.write_text(json.dumps(report, indent=1))
        print(f"plot: {plot_soak(report, config.json.with_suffix('.png'))}")
    return 1 if report["failures"] or report["divergences"] or report["exited_services"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
