"""`edgespec bench load`: one verifier under N concurrent sessions, cross-session batching on vs off.

    edgespec bench load --sessions 1,2,4,8,16,32 --tokens 32 --json bench-results/load.json

Only the verifier runs: no drafter service and no coordinator, so the cores measure
the verifier alone. Each simulated edge session runs the coordinator's round loop
(edgespec.loop.speculate, through bench.devices) and drafts from a reference, the target's
greedy continuation of its prompt (made once through the verifier itself, with
empty windows, one session at a time, and cached in --references): a window
holds the next k reference tokens, each replaced by another id with probability
1 - acceptance (seeded; a window's expected accepted length is then
a + a^2 + ... + a^k, so the measured acceptance, accepted / drafted, is below a),
and goes over a real VerifyStream, sent by the coordinator's own client. A session whose
output departs from its reference drafts nothing from there. Greedy verification is exact, so every session must reproduce its reference: any
difference is a correctness failure, printed and counted (exit status 1).

For each mode (verifier flags per mode; the target loads once per mode) and each
N: N sessions on prompts drawn round-robin across code, QA and chat open, then
all decode at once (the timed part) until each has --tokens tokens (or EOS),
then close. Reported per (mode, N): committed tokens/s over the timed wall,
time per output token per session (its decode wall / its tokens) p50/p99,
window latency p50/p99, acceptance, Verdict.queue_depth, verifier RSS after the
run and peak (VmHWM), and the batch size distribution from the verifier's
Prometheus histogram edgespec_verifier_batch_size (when the verifier takes
--metrics-port; otherwise reported as unavailable).
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import platform
import random
import re
import shlex
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from harness.cluster import REPO_ROOT, Service, start_service, stop_service
from bench.devices import RUN_FAILURES, Device, DeviceRun, failure, verifier_info
from bench.plots import plot_load
from bench.prompt_set import PROMPT_SET
from bench.report import process_memory_mib, progress
from edgespec.control.categories import CATEGORIES
from edgespec.control.window import FixedWindow
from edgespec.loop.session import RoundStats, latency_ms, percentile

BATCH_METRIC = "edgespec_verifier_batch_size"
METRICS_URL = re.compile(r"metrics on (http://\S+/metrics)")
DEFAULT_MODE_ARGS = {"on": "--max-batch 32", "off": "--max-batch 1"}


@dataclass(slots=True)
class LoadRun:
    """N sessions decoding at once."""
    sessions: list[DeviceRun]
    references: list[list[int]]
    wall_seconds: float                 # the decode phase, all sessions
    open_seconds: float                 # opening (prefilling) all sessions, before the timed part
    batch_before: dict | None           # the verifier's batch histogram around the decode phase
    batch_after: dict | None


def ordered_prompts() -> list[str]:
    """The 90-prompt set interleaved code, QA, chat, code, ... so any N mixes the three."""
    by_category = [[text for category, text in PROMPT_SET if category == name] for name in CATEGORIES]
    return [text for group in zip(*by_category) for text in group]


def propose(reference: list[int], position: int, k: int, acceptance: float, rng: random.Random,
            vocab: int) -> list[int]:
    """The next k reference tokens, each replaced by another id with probability 1 - acceptance."""
    return [token if rng.random() < acceptance else (token + 1 + rng.randrange(vocab - 1)) % vocab
            for token in reference[position:position + k]]


async def make_reference(address: str, session_id: str, prompt: list[int], length: int, eos: frozenset[int],
                         timeout: float) -> list[int]:
    """The target's greedy continuation: target-only rounds of one token each, through the shipped loop."""
    device = Device(address, session_id, prompt, length, eos, timeout)
    try:
        await device.open()
        return (await device.decode(lambda position, k: [], 0.0, FixedWindow(0))).generated
    finally:
        await device.close()


def reference_key(model: str, verifier_args: str, length: int, prompt: list[int]) -> str:
    digest = hashlib.sha256(json.dumps(prompt).encode()).hexdigest()[:16]
    return f"{model}|{verifier_args}|{length}|{digest}"


async def ensure_references(address: str, cache_path: Path, keys: list[str], prompts: list[list[int]], length: int,
                            eos: frozenset[int], timeout: float) -> list[list[int]]:
    """References for ``prompts`` from the cache, making (one session at a time: never batched) the missing ones
    on the verifier at ``address``."""
    cache = json.loads(cache_path.read_text()) if cache_path.exists() else {}
    missing = [i for i, key in enumerate(keys) if key not in cache]
    for count, i in enumerate(missing, 1):
        cache[keys[i]] = await asyncio.wait_for(make_reference(address, f"reference-{i}", prompts[i], length, eos,
                                                               timeout), timeout)
        print(f"reference {count}/{len(missing)}: {len(cache[keys[i]])} tokens", flush=True)
    if missing:
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        cache_path.write_text(json.dumps(cache))
    return [cache[key] for key in keys]


def read_histogram(text: str, name: str) -> dict | None:
    """A Prometheus text-format histogram: cumulative bucket counts by "le", and its sum and count,
    each summed over any other labels. None when ``name`` is not in the text."""
    found = {"buckets": {}, "sum": 0.0, "count": 0.0}
    pattern = re.compile(rf"^{re.escape(name)}_(bucket|sum|count)(?:\{{(.*)\}})?\s+(\S+)")
    seen = False
    for line in text.splitlines():
        match = pattern.match(line)
        if not match:
            continue
        seen = True
        kind, labels, value = match.group(1), match.group(2) or "", float(match.group(3))
        if kind == "bucket":
            le = re.search(r'le="([^"]+)"', labels).group(1)
            found["buckets"][le] = found["buckets"].get(le, 0.0) + value
        else:
            found[kind] += value
    return found if seen else None


def scrape_batch_histogram(url: str | None) -> dict | None:
    if url is None:
        return None
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return read_histogram(response.read().decode(), BATCH_METRIC)
    except (urllib.error.URLError, OSError):
        return None


def batch_sizes(before: dict | None, after: dict | None) -> dict | None:
    """Forwards, mean windows per forward and forwards per batch-size bucket between two scrapes."""
    if before is None or after is None:
        return None
    forwards = after["count"] - before["count"]
    bounds = sorted(after["buckets"], key=float)
    cumulative = [after["buckets"][le] - before["buckets"].get(le, 0.0) for le in bounds]
    counts = [c - (cumulative[i - 1] if i else 0.0) for i, c in enumerate(cumulative)]
    return {"forwards": int(forwards), "mean": round((after["sum"] - before["sum"]) / forwards, 2) if forwards else None,
            "buckets": {f"<={le}": int(c) for le, c in zip(bounds, counts) if c}}


async def run_load(address: str, prompts: list[list[int]], references: list[list[int]], n: int,
                   config: argparse.Namespace, eos: frozenset[int], vocab: int, label: str,
                   metrics_url: str | None) -> LoadRun:
    """N sessions, prompts round-robin: open all, decode all at once (timed), close all. Each runs the shipped
    round loop (bench.devices) with a fixed window of --window, its drafts the reference's tokens, each replaced
    with probability 1 - --acceptance, and costing no time."""
    picks = [i % len(prompts) for i in range(n)]
    devices = [Device(address, f"{label}-{i}", prompts[p], len(references[p]), eos, config.timeout)
               for i, p in enumerate(picks)]
    try:
        began = time.perf_counter()
        await asyncio.gather(*(device.open() for device in devices))
        opened = time.perf_counter() - began
        before = scrape_batch_histogram(metrics_url)
        began = time.perf_counter()
        sessions = await asyncio.gather(*(
            device.decode(proposer(references[p], config.acceptance, random.Random(f"{config.seed}/{i}"), vocab), 0.0,
                          FixedWindow(config.window), reference=references[p])
            for i, (device, p) in enumerate(zip(devices, picks))))
        wall = time.perf_counter() - began
        after = scrape_batch_histogram(metrics_url)
    finally:
        await asyncio.gather(*(device.close() for device in devices), return_exceptions=True)
    return LoadRun(list(sessions), [references[p] for p in picks], wall, opened, before, after)


def proposer(reference: list[int], acceptance: float, rng: random.Random, vocab: int) -> Callable[[int, int], list[int]]:
    return lambda position, k: propose(reference, position, k, acceptance, rng, vocab)


def first_difference(generated: list[int], reference: list[int]) -> int | None:
    for i, (got, want) in enumerate(zip(generated, reference)):
        if got != want:
            return i
    return None if len(generated) == len(reference) else min(len(generated), len(reference))


def summarize(mode: str, n: int, load: LoadRun, memory: dict) -> dict:
    sessions = load.sessions
    tokens = sum(len(s.generated) for s in sessions)
    windows = [r.verify_wall_seconds for s in sessions for r in s.samples]
    depths = [r.queue_depth for s in sessions for r in s.samples]
    tpot = [s.seconds / len(s.generated) for s in sessions if s.generated]
    stats = RoundStats.merged(s.stats for s in sessions)
    mismatches = []
    for i, (session, reference) in enumerate(zip(sessions, load.references)):
        at = first_difference(session.generated, reference)
        if at is not None:
            mismatches.append({"session": i, "position": at, "got": session.generated[at:at + 4],
                               "want": reference[at:at + 4]})
    return {"mode": mode, "sessions": n, "tokens": tokens, "seconds": round(load.wall_seconds, 3),
            "tokens_per_second": round(tokens / load.wall_seconds, 3),
            **latency_ms("tpot", tpot), **latency_ms("window", windows),
            "rounds": len(windows), "drafted": stats.drafted, "accepted": stats.accepted,
            "acceptance": round(stats.acceptance_rate, 3) if stats.drafted else None,
            "queue_depth": {"mean": round(sum(depths) / len(depths), 2) if depths else None,
                            "p50": percentile(depths, 0.5), "p99": percentile(depths, 0.99), "max": max(depths, default=0)},
            "batch_size": batch_sizes(load.batch_before, load.batch_after),
            "open_seconds": round(load.open_seconds, 3), "verifier_memory": memory,
            "mismatches": len(mismatches), "mismatch_details": mismatches, "error": None}


def report_mismatches(row: dict) -> None:
    for m in row["mismatch_details"]:
        print(f"!!! MISMATCH ({row['mode']}, N={row['sessions']}): session {m['session']} differs from the target's "
              f"greedy output at token {m['position']}: got {m['got']}, want {m['want']}", file=sys.stderr, flush=True)


async def measure_mode(mode: str, address: str, pid: int, metrics_url: str | None, config: argparse.Namespace,
                       prompts: list[list[int]], keys: list[str], bar=None) -> list[dict]:
    """Every N of one mode; ``bar`` (a progress bar counting sessions) advances by N after each run."""
    info = await verifier_info(address)
    eos = frozenset(info.eos_token_ids)
    references = await ensure_references(address, config.references, keys, prompts, config.tokens, eos,
                                         config.timeout)
    await asyncio.wait_for(run_load(address, prompts, references, 1, config, eos, info.vocab_size, f"warmup-{mode}",
                                    None), config.timeout)
    rows = []
    for n in config.sessions:
        try:
            load = await asyncio.wait_for(run_load(address, prompts, references, n, config, eos, info.vocab_size,
                                                   f"load-{mode}-{n}", metrics_url), config.timeout)
        except RUN_FAILURES as error:
            reason = failure(error, config.timeout)
            print(f"!!! {mode}, N={n}: {reason}; skipping larger N in this mode", file=sys.stderr, flush=True)
            rows.append({"mode": mode, "sessions": n, "error": reason, "mismatches": 0})
            if bar is not None:
                bar.update(sum(config.sessions[config.sessions.index(n):]))   # skipped: counted as done
            break
        if bar is not None:
            bar.update(n)
        rows.append(summarize(mode, n, load, process_memory_mib(pid)))
        report_mismatches(rows[-1])
        print(table_line(rows[-1]), flush=True)
    return rows


def verifier_help() -> str:
    return subprocess.run([sys.executable, "-m", "services.verifier", "--help"], cwd=REPO_ROOT, capture_output=True,
                          text=True, check=True).stdout


def unknown_flags(args: list[str], help_text: str) -> list[str]:
    return [arg.split("=")[0] for arg in args
            if arg.startswith("--") and not re.search(rf"{re.escape(arg.split('=')[0])}\b", help_text)]


@contextmanager
def running_verifier(args: list[str], log_dir: Path, name: str, metrics: bool,
                     cpus: str | None = None, python: str | None = None) -> Iterator[tuple[Service, str | None]]:
    """The verifier process (pinned to the taskset list ``cpus``, if given; on the interpreter ``python``, if
    given) and, with ``metrics``, its /metrics URL (--metrics-port 0: it logs the port it took)."""
    service = start_service("services.verifier", [*args, *(["--metrics-port", "0"] if metrics else [])], log_dir, name,
                            cpus=cpus, python=python)
    try:
        found = METRICS_URL.search(service.log_path.read_text(errors="replace")) if metrics else None
        yield service, found.group(1) if found else None
    finally:
        stop_service(service)


TABLE_HEADER = ("| mode | N | tokens | tok/s | TPOT p50 / p99 ms | window p50 / p99 ms | acceptance | "
                "queue mean / max | batch mean | RSS / peak MiB | mismatches |\n|---|---|---|---|---|---|---|---|---|---|---|")


def table_line(row: dict) -> str:
    if row["error"]:
        return f"| {row['mode']} | {row['sessions']} | failed: {row['error']} |"
    batch = row["batch_size"]
    memory = row["verifier_memory"]
    return (f"| {row['mode']} | {row['sessions']} | {row['tokens']} | {row['tokens_per_second']:.2f} | "
            f"{row['tpot_p50_ms']:.1f} / {row['tpot_p99_ms']:.1f} | {row['window_p50_ms']:.1f} / "
            f"{row['window_p99_ms']:.1f} | {row['acceptance']:.1%} | {row['queue_depth']['mean']} / "
            f"{row['queue_depth']['max']} | {batch['mean'] if batch else 'n/a'} | "
            f"{memory['rss_mib']:.0f} / {memory['hwm_mib']:.0f} | {row['mismatches']} |")


def on_off_ratios(rows: list[dict]) -> dict[str, float]:
    """tokens/s with batching on / off, per N where both ran."""
    speed = {(r["mode"], r["sessions"]): r["tokens_per_second"] for r in rows if not r["error"]}
    return {str(n): round(speed["on", n] / speed["off", n], 3) for mode, n in speed
            if mode == "on" and ("off", n) in speed}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="edgespec bench load", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="target", help="the verifier's --model (default %(default)s; tests: tiny:SEED)")
    parser.add_argument("--tokenizer", default="", help="tokenizer for the prompts: 'bytes', 'target', 'draft' or a "
                        "directory (default: 'bytes' for tiny:SEED models, else --model)")
    parser.add_argument("--sessions", default="1,2,4,8,16,32", help="concurrent sessions N, one run each "
                        "(default %(default)s)")
    parser.add_argument("--tokens", type=int, default=32, help="tokens each session generates, fewer at EOS "
                        "(default %(default)s)")
    parser.add_argument("--window", type=int, default=4, help="draft tokens per window, k (default %(default)s)")
    parser.add_argument("--acceptance", type=float, default=0.8, help="probability a drafted token is the "
                        "target's (default %(default)s, the default pair's measured agreement)")
    parser.add_argument("--modes", default="on,off", help="verifier configurations to run, of on,off (default %(default)s)")
    parser.add_argument("--verifier-args", default="", help="verifier flags for every mode, e.g. '--threads 2' "
                        "(part of the reference cache key)")
    parser.add_argument("--verifier-args-on", default=DEFAULT_MODE_ARGS["on"],
                        help="verifier flags for batching on (default '%(default)s')")
    parser.add_argument("--verifier-args-off", default=DEFAULT_MODE_ARGS["off"],
                        help="verifier flags for batching off (default '%(default)s')")
    parser.add_argument("--references", type=Path, default=Path.home() / ".cache/edgespec/bench-load-references.json",
                        help="cache of the target's greedy continuations (default %(default)s)")
    parser.add_argument("--json", type=Path, default=None, help="write the results here, and beside them (.png) "
                        "tokens/s and TPOT against N, batching on vs off")
    parser.add_argument("--seed", type=int, default=0, help="seeds the draft corruption (default %(default)s)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds one (mode, N) run may take; past it the "
                        "run fails and larger N of that mode are skipped (default %(default)s)")
    parser.add_argument("--log-dir", type=Path, default=None, help="verifier logs (default: a temporary directory)")
    args = parser.parse_args(argv)
    try:
        args.sessions = [int(n) for n in args.sessions.split(",")]
    except ValueError:
        parser.error(f"--sessions {args.sessions!r}: expected comma-separated integers")
    args.modes = args.modes.split(",")
    if not args.modes or any(mode not in DEFAULT_MODE_ARGS for mode in args.modes):
        parser.error(f"--modes {','.join(args.modes)!r}: expected on, off or on,off")
    if min(args.sessions) < 1 or args.tokens < 1 or args.window < 0 or not 0 <= args.acceptance <= 1:
        parser.error("need --sessions >= 1, --tokens >= 1, --window >= 0 and 0 <= --acceptance <= 1")
    args.tokenizer = args.tokenizer or ("bytes" if args.model.startswith("tiny:") else args.model)
    return args


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    from edgespec.backends.tokenizer import load_tokenizer

    help_text = verifier_help()
    mode_args = {mode: ["--model", config.model, *shlex.split(config.verifier_args),
                        *shlex.split(getattr(config, f"verifier_args_{mode}"))] for mode in config.modes}
    for mode, args in mode_args.items():
        if unknown_flags(args, help_text):
            print(f"edgespec bench load: the verifier does not take {', '.join(unknown_flags(args, help_text))} "
                  f"(mode {mode}: {shlex.join(args)}); see `python -m services.verifier --help` and set "
                  f"--verifier-args-{mode}", file=sys.stderr)
            return 2
    tokenizer = load_tokenizer(config.tokenizer)
    prompts = [tokenizer.encode(text, True) for text in ordered_prompts()[:max(config.sessions)]]
    keys = [reference_key(config.model, config.verifier_args, config.tokens, prompt) for prompt in prompts]
    log_dir = config.log_dir or Path(tempfile.mkdtemp(prefix="edgespec-bench-load-"))
    print(f"verifier logs: {log_dir}", flush=True)
    rows, batch_source = [], {}
    with progress(len(mode_args) * sum(config.sessions), "bench-load", unit="session") as bar:
        for mode, args in mode_args.items():
            with running_verifier(args, log_dir, f"verifier-{mode}", "--metrics-port" in help_text) as (service,
                                                                                                      metrics_url):
                batch_source[mode] = (f"{BATCH_METRIC} at {metrics_url}" if metrics_url else
                                      "unavailable: the verifier serves no /metrics (no --metrics-port)")
                print(f"{mode}: batch sizes {batch_source[mode]}", flush=True)
                rows += asyncio.run(measure_mode(mode, service.address, service.process.pid, metrics_url, config,
                                                 prompts, keys, bar))
    ratios = on_off_ratios(rows)
    mismatches = sum(row["mismatches"] for row in rows)
    print("\n" + TABLE_HEADER + "\n" + "\n".join(table_line(row) for row in rows))
    print(f"\ntokens/s batching on / off, by N: {ratios or 'n/a (needs both modes)'}")
    print(f"mismatches against the target's greedy output: {mismatches}" + ("  <-- CORRECTNESS FAILURE" if mismatches else ""))
    if config.json:
        config.json.parent.mkdir(parents=True, exist_ok=True)
        report = {
            "machine": {"platform": platform.platform(), "python": platform.python_version(),
                        "cpus": os.cpu_count()},
            "model": config.model, "tokens": config.tokens, "window": config.window, "acceptance": config.acceptance,
            "seed": config.seed, "verifier_args": {mode: shlex.join(args) for mode, args in mode_args.items()},
            "batch_size_source": batch_source,
            "rows": rows, "ratios_on_off": ratios, "mismatches": mismatches}
        config.json.write_text(json.dumps(report, indent=1))
        print(f"plot: {plot_load(report, config.json.with_suffix('.png'))}")
    return 1 if mismatches or any(row["error"] for row in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
