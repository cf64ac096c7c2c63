"""`edgespec bench capacity`: what one cloud verifier serves to N users, with edge drafting and without.

    edgespec bench capacity --sessions 1,4,16 --rtt 0,50 --json bench-results/capacity.json --plot capacity.png

One verifier (its own process, pinned to --verifier-cpus) serves N concurrent sessions. Each session is an
emulated edge device running the coordinator's round loop (edgespec.loop.speculate, blocking or pipelined,
through bench.devices, with the coordinator's own verifier client): only its drafter is emulated. It returns the real draft model's proposals for the session's prefix,
recorded once per prompt by running the draft model over the target's own greedy output (one pass gives the
draft's greedy choice after every prefix; a window of k from position p is those choices at p..p+k-1, which
the verifier accepts exactly as far as it would accept the draft's own greedy chain, because the chain agrees
with the reference up to its first miss), and it answers after k times the draft model's measured seconds
per token on one core (--draft-ms overrides). Between the devices and the verifier sits an emulated link
(harness.link's DelayProxy: real sockets, RTT added) when --rtt is not 0. The target's greedy output comes from
the verifier itself, one session at a time with empty windows, and is cached in --references.

Modes, all on the same verifier in one run, interleaved per N so that drift on a shared machine hits them
alike:
  ar      autoregressive serving of the same users: every round a target-only step (window 0), batched
          across sessions like every other mode — the cloud-only deployment edge drafting must beat
  k=K     edge drafting with a fixed window of K tokens
  auto    the coordinator's default window policy (GoodputWindow on the session's own telemetry), which
          charges a window for the other sessions' windows it slows in a shared forward (load-aware)
  auto-blind  the same policy without the verdicts' batch reports: what it chose before it knew the load
  awc     the learned window controller (AwcWindow)
  pipe=K  edge drafting with a fixed window of K in the coordinator's pipelined loop (--pipeline on): while a
          window is in flight the device drafts the bonus guess and the next window assuming a full accept
          (only what fits in the window's measured round trip) and sends it at once as an optimistic window;
          if the verdict agrees it is already verified or on its way, else the verifier discards it unscored

Reported per (RTT, N, mode): committed tokens/s over the decode phase, per-user TPOT p50/p99 (a session's
decode wall / its tokens), the ratio to ar at the same RTT and N, acceptance and tokens per round, verifier
CPU seconds per 1,000 tokens (/proc), mean windows per verifier forward (its Prometheus batch histogram) and
`limit`: the capacity ceiling of edge drafting over ar at that N from the verifier's measured costs,
max over fixed k of E(k) / c_N(k+1), with E(k) the tokens per round measured at k and c_N(k+1) the
verifier's measured forward time for those windows over its forward time for ar windows (same N, same RTT):
drafting free, the link ignored. `limit_with_link` adds what each session waits for in a round, RTT and
k times the draft time: max over k of E(k) (RTT + T_ar) / (RTT + k d + T_k). The auto policy starts each
session from the costs that earlier sessions at that RTT measured and from what they accepted, as a coordinator
does (Telemetry.start_from; a warm-up session per RTT measures them first). Every output is checked against the
target's greedy output; a difference is printed and counted, and the run exits 1.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from bench.bench_load import (BATCH_METRIC, batch_sizes, ensure_references, first_difference, ordered_prompts,
                              reference_key, running_verifier, scrape_batch_histogram, unknown_flags, verifier_help)
from bench.devices import RUN_FAILURES, Device, DeviceRun, failure, verifier_info
from bench.report import progress
from harness.link import DelayProxy, LinkProfile
from edgespec.control.telemetry import Telemetry
from edgespec.control.policies import window_policy
from edgespec.loop.session import RoundStats, latency_ms

MAX_K = 8   # the largest fixed window and the auto policy's largest


def parse_mode(mode: str) -> int | None:
    """ar -> 0, k=K and pipe=K -> K, the adaptive policies (auto, auto-blind, awc) -> None; ValueError for
    anything else."""
    if mode == "ar":
        return 0
    if mode in ("auto", "auto-blind", "awc"):
        return None
    for prefix in ("k=", "pipe="):
        value = mode.removeprefix(prefix)
        if mode.startswith(prefix) and value.isdigit() and 1 <= int(value) <= MAX_K:
            return int(value)
    raise ValueError(f"mode {mode!r}: expected ar, auto, auto-blind, awc, k=1..k={MAX_K} or pipe=1..pipe={MAX_K}")


def policy_for(mode: str, costs: Telemetry):
    """The window policy of ``mode`` (edgespec.control.policies); the adaptive ones start from ``costs`` (what
    earlier sessions measured), as the coordinator's sessions do (edgespec.loop.generation: Telemetry.start_from)."""
    k = parse_mode(mode)
    if k is not None:
        return window_policy(f"fixed:{k}", costs, MAX_K)
    telemetry = Telemetry(max_k=MAX_K)
    telemetry.start_from(costs)
    return window_policy("awc" if mode == "awc" else "goodput", telemetry, MAX_K)


def draft_choices(lm, prompt: list[int], reference: list[int]) -> list[int]:
    """The draft model's greedy choice after prompt + reference[:p], for every p < len(reference): one pass
    over a fresh state of ``lm`` (a llama.cpp model)."""
    return lm.next_tokens(lm.new_state(), [*prompt, *reference[:-1]], len(reference))


def draft_seconds_per_token(draft: str, threads: int, prompt: list[int], tokens: int = 16) -> float:
    """The draft model's decode time per token on ``threads`` threads, after a prompt (one token per decode)."""
    from edgespec.backends import llamacpp

    lm = llamacpp.load(draft, threads, ctx_tokens=4096, max_sequences=1)
    try:
        state = lm.new_state()
        lm.prefill(state, prompt)
        seq = list(prompt)
        lm.next_tokens(state, seq, 1)      # the prompt's last token: not a draft step
        began = time.perf_counter()
        for _ in range(tokens):
            seq.append(lm.next_tokens(state, seq, 1)[0])
        return (time.perf_counter() - began) / tokens
    finally:
        lm.close()


def ensure_drafts(cache_path: Path, draft: str, threads: int, prompts: list[list[int]],
                  references: list[list[int]]) -> list[list[int]]:
    """Draft choices per prompt, from the cache or recorded now (keyed by the draft and the reference)."""
    cache = json.loads(cache_path.read_text()) if cache_path.exists() else {}
    keys = [f"{draft}|" + hashlib.sha256(json.dumps([p, r]).encode()).hexdigest()[:16]
            for p, r in zip(prompts, references)]
    missing = [i for i, key in enumerate(keys) if key not in cache]
    if missing:
        from edgespec.backends import llamacpp

        lm = llamacpp.load(draft, threads, ctx_tokens=4096, max_sequences=1)   # once, for every missing prompt
        try:
            for count, i in enumerate(missing, 1):
                cache[keys[i]] = draft_choices(lm, prompts[i], references[i])
                print(f"draft choices {count}/{len(missing)}", flush=True)
        finally:
            lm.close()
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        cache_path.write_text(json.dumps(cache))
    return [cache[key] for key in keys]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run_sessions(address: str, prompts: list[list[int]], references: list[list[int]],
                       choices: list[list[int]], n: int, mode: str, draft_seconds: float, costs: Telemetry,
                       eos: frozenset[int], label: str, pid: int, metrics_url: str | None,
                       deadline_seconds: float = 900) -> dict:
    """N devices at once, prompts round-robin: open all, decode all (timed), close all; one summary row.

    Each device runs the shipped round loop (bench.devices): the mode's window policy, blocking or pipelined
    (pipe=K), its drafter proposing the draft model's recorded choices after k times ``draft_seconds``. The
    adaptive policies start from ``costs`` (what earlier sessions measured) and add what they measure to it."""
    picks = [i % len(prompts) for i in range(n)]
    devices = [Device(address, f"{label}-{i}", prompts[p], len(references[p]), eos, deadline_seconds)
               for i, p in enumerate(picks)]
    try:
        await asyncio.gather(*(device.open() for device in devices))
        before, cpu_before = scrape_batch_histogram(metrics_url), cpu_seconds(pid)
        began = time.perf_counter()
        sessions = await asyncio.gather(*(decode(device, references[p], choices[p], mode, draft_seconds, costs)
                                          for device, p in zip(devices, picks)))
        wall = time.perf_counter() - began
        cpu, after = cpu_seconds(pid) - cpu_before, scrape_batch_histogram(metrics_url)
    finally:
        await asyncio.gather(*(device.close() for device in devices), return_exceptions=True)
    return summarize(mode, n, list(sessions), [references[p] for p in picks], wall, cpu, batch_sizes(before, after))


async def decode(device: Device, reference: list[int], choices: list[int], mode: str, draft_seconds: float,
                 costs: Telemetry) -> DeviceRun:
    """One device in ``mode``. Once its output departs from the reference (llama.cpp's numerics differ between
    batch shapes; counted as a mismatch) it goes on target-only (bench.devices.ReplayDrafter)."""
    policy = policy_for(mode, costs)
    telemetry = getattr(policy, "telemetry", None)   # the adaptive policies' own
    run = await device.decode(lambda position, k: choices[position:position + k], draft_seconds, policy,
                              reference=reference, telemetry=telemetry, pipeline=mode.startswith("pipe="),
                              blind=mode == "auto-blind")
    if telemetry is not None and telemetry.rounds:
        costs.absorb(telemetry)
    return run


def summarize(mode: str, n: int, sessions: list[DeviceRun], references: list[list[int]], wall: float,
              cpu: float, batch: dict | None) -> dict:
    tokens = sum(len(s.generated) for s in sessions)
    rounds = sum(len(s.samples) for s in sessions)
    stats = RoundStats.merged(s.stats for s in sessions)
    tpot = [s.seconds / len(s.generated) for s in sessions if s.generated]
    compute = [r.verify_compute_seconds for s in sessions for r in s.samples]
    mismatches = []
    for i, (session, reference) in enumerate(zip(sessions, references)):
        at = first_difference(session.generated, reference)
        if at is not None:
            mismatches.append({"session": i, "position": at, "got": session.generated[at:at + 4],
                               "want": reference[at:at + 4]})
    windows = {}
    for s in sessions:
        for r in s.samples:
            windows[str(r.k)] = windows.get(str(r.k), 0) + 1
    forwards = {}   # "windows,tokens" -> [forwards, mean ms]: the verifier's cost curve, each forward once
    for w, t, seconds in set().union(*(s.forwards for s in sessions)):
        count, mean = forwards.get(f"{w},{t}", (0, 0.0))
        forwards[f"{w},{t}"] = [count + 1, mean + (1000 * seconds - mean) / (count + 1)]
    return {"mode": mode, "sessions": n, "tokens": tokens, "seconds": round(wall, 3),
            "tokens_per_second": round(tokens / wall, 3),
            **latency_ms("tpot", tpot),
            "rounds": rounds, "tokens_per_round": round(tokens / rounds, 3) if rounds else None,
            "acceptance": round(stats.acceptance_rate, 3) if stats.drafted else None,
            "forward_ms_mean": round(1000 * sum(compute) / len(compute), 2) if compute else None,
            "verifier_cpu_seconds_per_1k_tokens": round(1000 * cpu / tokens, 2) if tokens else None,
            "batch_windows_mean": batch["mean"] if batch else None, "windows": windows,
            "forwards": {key: [c, round(ms, 2)] for key, (c, ms) in sorted(forwards.items())},
            "mismatches": len(mismatches), "mismatch_details": mismatches, "error": None} | lookahead_stats(sessions)


def lookahead_stats(sessions: list[DeviceRun]) -> dict:
    """pipe=K rows: look-aheads sent per committed round, and the share whose assumption held."""
    stats = RoundStats.merged(s.stats for s in sessions)
    if not stats.optimistic_windows:
        return {}
    rounds = sum(len(s.samples) for s in sessions)
    return {"lookaheads_per_round": round(stats.optimistic_windows / rounds, 3),
            "lookahead_hit_rate": round(stats.optimistic_hits / stats.optimistic_windows, 3)}


def add_limits_and_ratios(rows: list[dict], draft_seconds: float) -> None:
    """Per (RTT, N): each row's tokens/s over ar's, and two ceilings of edge drafting over ar from the measured
    costs of the fixed-k rows (E(k) tokens per round, T(k) the verifier's mean forward with those windows):
      limit           max_k E(k) T(ar) / T(k): the verifier-bound ceiling (drafting free, the link ignored)
      limit_with_link max_k E(k) (RTT + T(ar)) / (RTT + k d + T(k)): sessions that wait for their own rounds,
                      with the edge's draft time d per token
    pipe=K rows also get vs_blocking (over k=K's tokens/s) and pipeline_limit,
    (RTT + K d + T(K)) / max(T(K), (K + 1) d): what pipelining could give over blocking if every look-ahead held
    (draft and round trip hidden; a window per forward, or per look-ahead draft when drafting is slower)."""
    good = [r for r in rows if not r["error"]]
    for r in good:
        group = [g for g in good if g["rtt_ms"] == r["rtt_ms"] and g["sessions"] == r["sessions"]]
        ar = next((g for g in group if g["mode"] == "ar" and g["forward_ms_mean"]), None)
        r["vs_ar"] = round(r["tokens_per_second"] / ar["tokens_per_second"], 3) if ar else None
        fixed = [g for g in group if g["mode"].startswith("k=") and g["forward_ms_mean"]]
        blocking = next((g for g in fixed if r["mode"].startswith("pipe=") and g["mode"] == "k=" + r["mode"][5:]),
                        None)
        if blocking is not None:
            # Pipelining against blocking at the same K, and what it could give if every look-ahead held: the
            # draft and the round trip hidden, a window per forward or per draft of K + 1 tokens, whichever is
            # slower, instead of one per RTT + K d + T(K).
            r["vs_blocking"] = round(r["tokens_per_second"] / blocking["tokens_per_second"], 3)
            rtt, t_k, k = r["rtt_ms"] / 1000, blocking["forward_ms_mean"] / 1000, parse_mode(r["mode"])
            r["pipeline_limit"] = round((rtt + k * draft_seconds + t_k) / max(t_k, (k + 1) * draft_seconds), 3)
        if not ar or not fixed:
            r["limit"] = r["limit_with_link"] = None
            continue
        rtt, t_ar = r["rtt_ms"] / 1000, ar["forward_ms_mean"] / 1000
        r["limit"] = round(max(g["tokens_per_round"] * t_ar / (g["forward_ms_mean"] / 1000) for g in fixed), 3)
        r["limit_with_link"] = round(max(
            g["tokens_per_round"] * (rtt + t_ar)
            / (rtt + parse_mode(g["mode"]) * draft_seconds + g["forward_ms_mean"] / 1000) for g in fixed), 3)


def report_mismatches(row: dict) -> None:
    for m in row["mismatch_details"]:
        print(f"!!! MISMATCH ({row['mode']}, N={row['sessions']}, RTT {row['rtt_ms']} ms): session {m['session']} "
              f"differs from the target's greedy output at token {m['position']}: got {m['got']}, want {m['want']}",
              file=sys.stderr, flush=True)


TABLE_HEADER = ("| RTT ms | N | mode | tok/s | vs ar | limit / with link | TPOT p50 / p99 ms | acceptance | "
                "tokens/round | "
                "forward ms | verifier CPU s / 1k tokens | windows / forward | mismatches |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def table_line(row: dict) -> str:
    if row["error"]:
        return f"| {row['rtt_ms']} | {row['sessions']} | {row['mode']} | failed: {row['error']} |"

    def show(value, spec=""):
        return "" if value is None else format(value, spec)
    mode = row["mode"] + (f" (look-ahead held {row['lookahead_hit_rate']:.0%})" if "lookahead_hit_rate" in row else "")
    return (f"| {row['rtt_ms']} | {row['sessions']} | {mode} | {row['tokens_per_second']:.2f} | "
            f"{show(row.get('vs_ar'), '.2f')}{'x' if row.get('vs_ar') is not None else ''} | "
            f"{show(row.get('limit'), '.2f')}{' / ' if row.get('limit') is not None else ''}"
            f"{show(row.get('limit_with_link'), '.2f')} | "
            f"{row['tpot_p50_ms']:.0f} / {row['tpot_p99_ms']:.0f} | {show(row['acceptance'], '.0%')} | "
            f"{show(row['tokens_per_round'], '.2f')} | {show(row['forward_ms_mean'], '.0f')} | "
            f"{show(row['verifier_cpu_seconds_per_1k_tokens'], '.1f')} | {show(row['batch_windows_mean'])} | "
            f"{row['mismatches']} |")


def plot(rows: list[dict], path: Path) -> None:
    """tokens/s and TPOT p50 against N, one line per mode, one column per RTT."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    good = [r for r in rows if not r["error"]]
    rtts = sorted({r["rtt_ms"] for r in good})
    modes = list(dict.fromkeys(r["mode"] for r in good))
    ns_all = sorted({r["sessions"] for r in good})
    figure, axes = plt.subplots(2, len(rtts), figsize=(5 * len(rtts), 7), squeeze=False)
    for column, rtt in enumerate(rtts):
        for mode in modes:
            points = sorted((r["sessions"], r["tokens_per_second"], r["tpot_p50_ms"]) for r in good
                            if r["rtt_ms"] == rtt and r["mode"] == mode)
            if not points:
                continue
            ns, speed, tpot = zip(*points)
            style = {"linewidth": 2.5, "color": "black"} if mode == "ar" else {}
            axes[0][column].plot(ns, speed, marker="o", label=mode, **style)
            axes[1][column].plot(ns, tpot, marker="o", label=mode, **style)
        axes[0][column].set_title(f"RTT {rtt:g} ms")
        axes[0][column].set_ylabel("committed tokens/s (all users)")
        axes[1][column].set_ylabel("TPOT p50 per user, ms")
        for axis in (axes[0][column], axes[1][column]):
            axis.set_xscale("log", base=2)
            axis.set_xticks(ns_all, [str(n) for n in ns_all])
            axis.set_xlabel("concurrent sessions N")
            axis.grid(alpha=0.3)
        axes[0][column].legend()
    figure.suptitle("One verifier: edge drafting (k=K fixed, pipe=K pipelined, auto) vs autoregressive serving (ar)")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def prompt_records(references: list[list[int]], choices: list[list[int]]) -> list[dict]:
    """Per prompt, what a simulator needs to replay its sessions: tokens generated and, per position, whether
    the draft's choice there is the target's ("1") or not ("0")."""
    return [{"tokens": len(reference), "matches": "".join("1" if c == r else "0" for c, r in zip(choice, reference))}
            for reference, choice in zip(references, choices)]


async def measure(service, metrics_url: str | None, config: argparse.Namespace, prompts: list[list[int]],
                  keys: list[str]) -> tuple[list[dict], float, list[dict]]:
    eos = frozenset((await verifier_info(service.address)).eos_token_ids)
    references = await ensure_references(service.address, config.references, keys, prompts, config.tokens, eos,
                                         config.timeout)
    choices = ensure_drafts(config.drafts, config.draft, 1, prompts, references)
    draft_seconds = (config.draft_ms / 1000 if config.draft_ms is not None else
                     draft_seconds_per_token(config.draft, 1, prompts[0]))
    print(f"draft time per token (the edge device, one core): {1000 * draft_seconds:.1f} ms", flush=True)
    rows = []
    runs = len(config.rtt) * len(config.modes) * sum(config.sessions)
    with progress(runs, "bench-capacity", unit="session") as bar:
        for rtt in config.rtt:
            proxy = DelayProxy(service.address, LinkProfile(rtt_ms=rtt)).start() if rtt else None
            address = proxy.address if proxy else service.address
            # One edge's coordinator per auto mode: its costs carry over between its sessions.
            costs = {mode: Telemetry(max_k=MAX_K) for mode in ("ar", "auto", "auto-blind", *config.modes)}
            try:
                for mode in ("ar", *(m for m in config.modes if m.startswith("auto"))):   # warm-up; auto's costs
                    await asyncio.wait_for(run_sessions(address, prompts, references, choices, 1, mode, draft_seconds,
                                                        costs[mode], eos, f"warmup-{rtt}-{mode}", service.process.pid,
                                                        None, config.timeout), config.timeout)
                for n in config.sessions:
                    for mode in config.modes:
                        try:
                            row = await asyncio.wait_for(run_sessions(
                                address, prompts, references, choices, n, mode, draft_seconds, costs[mode], eos,
                                f"cap-{rtt}-{n}-{mode}", service.process.pid, metrics_url, config.timeout), config.timeout)
                        except RUN_FAILURES as error:
                            row = {"mode": mode, "sessions": n, "error": failure(error, config.timeout),
                                   "mismatches": 0}
                        row |= {"rtt_ms": rtt, "backend": config.backend}
                        rows.append(row)
                        if not row["error"]:
                            report_mismatches(row)
                        print(table_line(row), flush=True)
                        bar.update(n)
            finally:
                if proxy:
                    proxy.stop()
    return rows, draft_seconds, prompt_records(references, choices)


def parse_list(parser: argparse.ArgumentParser, flag: str, text: str, kind=int) -> list:
    try:
        values = [kind(item) for item in text.split(",")]
    except ValueError:
        parser.error(f"{flag} {text!r}: expected comma-separated numbers")
    if not values or min(values) < 0:
        parser.error(f"{flag} {text!r}: expected numbers >= 0")
    return values


def add_device_flags(parser: argparse.ArgumentParser, modes: str) -> None:
    """The flags of a bench that serves emulated edge devices from one verifier (this one and bench-regimes)."""
    parser.add_argument("--modes", default=modes, help=f"of ar, k=1..k={MAX_K}, pipe=1..pipe={MAX_K}, auto, "
                        "auto-blind, awc "
                        "(default %(default)s)")
    parser.add_argument("--model", default="target", help="the verifier's --model (default %(default)s)")
    parser.add_argument("--backend", default="llamacpp", choices=["llamacpp", "torch", "vllm"],
                        help="the verifier's --backend; vllm runs it with the vLLM environment's Python "
                             "(bash scripts/vllm_env.sh) (default %(default)s)")
    parser.add_argument("--draft", default="draft", help="the draft model, a GGUF run in llama.cpp on one core: "
                        "'draft', 'smollm2', 'target' or a .gguf file (default %(default)s)")
    parser.add_argument("--draft-ms", type=float, default=None, help="the edge device's draft time per token, ms "
                        "(default: measured here, one core)")
    parser.add_argument("--tokenizer", default="", help="tokenizer for the prompts (default: --draft)")
    parser.add_argument("--tokens", type=int, default=32, help="tokens each session generates, fewer at EOS "
                        "(default %(default)s)")
    parser.add_argument("--verifier-cpus", default="auto", help="taskset CPU list for the verifier; auto = the "
                        "last core when there are several, none = unpinned (default %(default)s)")
    parser.add_argument("--verifier-args", default="", help="more verifier flags, e.g. '--max-batch 32'")
    parser.add_argument("--references", type=Path, default=Path.home() / ".cache/edgespec/bench-load-references.json",
                        help="cache of the target's greedy continuations (default %(default)s)")
    parser.add_argument("--drafts", type=Path, default=Path.home() / ".cache/edgespec/bench-capacity-drafts.json",
                        help="cache of the draft model's choices along them (default %(default)s)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds one run of N sessions may take "
                        "(default %(default)s)")
    parser.add_argument("--log-dir", type=Path, default=None, help="verifier logs (default: a temporary directory)")


def check_device_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse bad values of add_device_flags' flags (exit 2 before anything starts); fill in the defaults."""
    args.modes = args.modes.split(",")
    for mode in args.modes:
        try:
            parse_mode(mode)
        except ValueError as error:
            parser.error(f"--modes: {error}")
    if args.tokens < 2:
        parser.error("--tokens must be >= 2")
    if args.draft_ms is not None and args.draft_ms < 0:
        parser.error("--draft-ms must be >= 0")
    if args.verifier_cpus == "auto":
        args.verifier_cpus = str(os.cpu_count() - 1) if (os.cpu_count() or 1) > 1 else "none"
    args.tokenizer = args.tokenizer or args.draft


def verifier_command(config: argparse.Namespace, prog: str) -> list[str] | None:
    """The verifier's flags (one thread: it is pinned to its cores), or None after saying which it lacks."""
    args = ["--model", config.model, "--backend", config.backend, "--threads", "1", *shlex.split(config.verifier_args)]
    unknown = unknown_flags(args, verifier_help())
    if unknown:
        print(f"{prog}: the verifier does not take {', '.join(unknown)}", file=sys.stderr)
        return None
    return args


def verifier_batch(args: list[str]) -> dict:
    """The verifier's batching settings for these flags (its own parser's defaults): for a simulator."""
    from services.verifier.__main__ import parse_args as verifier_args

    # the batching flags mean the same on every backend; this Python may lack vLLM, so read them as torch's
    args = [("torch" if i and args[i - 1] == "--backend" else a) for i, a in enumerate(args)]
    batch = verifier_args(args).batch
    return {"max_batch": batch.max_batch, "batch_wait_ms": 1000 * batch.wait_seconds,
            "wait_fraction": batch.wait_fraction}


@contextmanager
def pinned_devices(config: argparse.Namespace) -> Iterator[str | None]:
    """The verifier's taskset CPU list (None: unpinned); while it is in use this process, the devices, moves off
    those cores, and back afterwards: a caller in the same process (the tests) keeps its CPUs. Left pinned, the
    test process and every service it started later ran on one core, and a test that pins services apart found
    a single CPU to pin them to."""
    pin = None if config.verifier_cpus == "none" else config.verifier_cpus
    before = os.sched_getaffinity(0) if hasattr(os, "sched_setaffinity") else None
    others = (before or set()) - {int(c) for c in (pin or "").split(",") if c.isdigit()}
    try:
        if pin and before is not None and others:
            os.sched_setaffinity(0, others)
        yield pin
    finally:
        if before is not None:
            os.sched_setaffinity(0, before)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="edgespec bench capacity", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", default="1,2,4,8,16,32", help="concurrent sessions N (default %(default)s)")
    parser.add_argument("--rtt", default="0,50,100", help="edge-cloud round trips, ms (default %(default)s)")
    add_device_flags(parser, "ar,k=1,k=2,k=4,auto,auto-blind")
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    parser.add_argument("--plot", type=Path, default=None, help="draw tokens/s and TPOT against N here (PNG)")
    args = parser.parse_args(argv)
    args.sessions = parse_list(parser, "--sessions", args.sessions)
    args.rtt = parse_list(parser, "--rtt", args.rtt, float)
    if min(args.sessions) < 1:
        parser.error("--sessions: every N must be >= 1")
    check_device_flags(parser, args)
    return args


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    from edgespec.backends.tokenizer import load_tokenizer

    verifier_args = verifier_command(config, "edgespec bench capacity")
    if verifier_args is None:
        return 2
    tokenizer = load_tokenizer(config.tokenizer)
    prompts = [tokenizer.encode(text, True) for text in ordered_prompts()[:max(config.sessions)]]
    keys = [reference_key(config.model, shlex.join(verifier_args), config.tokens, prompt) for prompt in prompts]
    log_dir = config.log_dir or Path(tempfile.mkdtemp(prefix="edgespec-bench-capacity-"))
    print(f"verifier logs: {log_dir}", flush=True)
    python = None
    if config.backend == "vllm":
        from bench.vllm_jobs import VLLM_PYTHON
        python = str(VLLM_PYTHON)
    with pinned_devices(config) as pin, \
            running_verifier(verifier_args, log_dir, "verifier", True, cpus=pin, python=python) as (service, metrics_url):
        print(f"verifier {service.address} (cpus {pin or 'all'}), batch sizes from {BATCH_METRIC} at {metrics_url}",
              flush=True)
        rows, draft_seconds, prompt_info = asyncio.run(measure(service, metrics_url, config, prompts, keys))
    add_limits_and_ratios(rows, draft_seconds)
    mismatches = sum(row["mismatches"] for row in rows)
    print("\n" + TABLE_HEADER + "\n" + "\n".join(table_line(row) for row in rows))
    print(f"\nmismatches against the target's greedy output: {mismatches}" +
          ("  <-- CORRECTNESS FAILURE" if mismatches else ""))
    if config.plot:
        plot(rows, config.plot)
        print(f"plot: {config.plot}")
    if config.json:
        config.json.parent.mkdir(parents=True, exist_ok=True)
        config.json.write_text(json.dumps({
            "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()},
            "model": config.model, "backend": config.backend, "draft": config.draft, "tokens": config.tokens,
            "draft_ms_per_token": round(1000 * draft_seconds, 2), "verifier_args": shlex.join(verifier_args),
            "verifier_cpus": pin, "verifier_batch": verifier_batch(verifier_args), "prompts": prompt_info,
            "rows": rows, "mismatches": mismatches}, indent=1))
    return 1 if mismatches or any(row["error"] for row in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
