"""`edgespec bench floor`: the default against the same services at window 0, and window 0 against the engine
alone, prompt by prompt, per category.

The demo's cluster (llama.cpp verifier, drafter and coordinator on loopback; edge and cloud on separate CPUs
where there are two or more; ``--layout one-host``: the verifier on every CPU in exact mode, the drafter on one
thread beside it, as `edgespec bench serve` places them) serves Spec-Bench first turns (``--per-category`` of
each of its 13 categories, shipped in data/), three of our code edits and the demo's two prompts. Each prompt
runs at window 0 (target-only through the services) and with the default adaptive window (free drafts, then
the window policy), one right after the other and in alternating order, so that both see the same machine.
Reported per category: TTFT, the decode rate after the first token and end-to-end time as ratios to window 0
(geometric means), free drafts accepted / sent, and whether the outputs are identical. A row below ``--floor``
is marked.

The engine alone (``--engine``, on by default) is what a user runs instead: llama.cpp target-only greedy in a process
of its own, on the verifier's CPUs with its threads and settings (the same GGUF, the same chat-templated prompt
tokens), run right before each prompt's pair. Its rows give window 0's decode rate, end-to-end time and TTFT as
ratios to the engine's, and whether window 0's text is the engine's own.

Outputs: a markdown table on stdout, JSON rows and the table with ``--out``.
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.cluster import REPO_ROOT, LocalCluster
from bench.demo import cluster_layout
from bench.report import track, write_report
from bench.spec_bench import bench_prompts, check_prompt_args, geomean, prompt_parser

log = logging.getLogger("bench.floor")


async def timed(address: str, prompt: str, tokens: int, window: int) -> dict:
    """One generation through the coordinator: its tokens, TTFT, decode rate after the first chunk, stats."""
    from edge_client.client import collect

    run = await collect(address, prompt, tokens, window, chat=True, timeout_seconds=1800)
    stats = run.stats
    return {"tokens": run.tokens, "ttft": run.ttft, "e2e": run.seconds, "decode_tps": run.decode_tps,
            "rounds": stats.rounds, "free_rounds": stats.free_rounds, "free_drafted": stats.free_drafted_tokens,
            "free_accepted": stats.free_accepted_tokens, "drafted": stats.drafted_tokens,
            "accepted": stats.accepted_tokens}


ENGINE = """
import json, sys, time
import numpy as np
from edgespec.backends import llamacpp
threads, mode = int(sys.argv[1]), sys.argv[2]
exact = llamacpp.exact_settings(mode, threads, llamacpp.PREFILL_CHUNK)   # the verifier's settings
lm = llamacpp.load("target", threads=threads, max_sequences=2, exact=exact)
eos = set(lm.eos_ids())
print(json.dumps({"settings": lm.exact.describe()}), flush=True)
for line in sys.stdin:
    prompt, tokens = json.loads(line)
    state, seq, out = lm.new_state(), list(prompt), []
    started = time.perf_counter()
    first = None
    for _ in range(tokens):
        token = int(np.argmax(lm.logits_rows(state, seq, 1)[0]))
        out.append(token)
        first = first or time.perf_counter()
        if token in eos:
            break
        seq.append(token)
    last = time.perf_counter()
    del state
    print(json.dumps({"tokens": out, "ttft": first - started, "e2e": last - started,
                      "decode_tps": (len(out) - 1) / (last - first) if len(out) > 1 else float("nan")}), flush=True)
"""


class Engine:
    """llama.cpp target-only greedy in a process of its own, pinned to ``cpus``: one prompt's tokens in, the
    generated tokens and their times out (a JSON line each way)."""

    def __init__(self, threads: int, exact: str, cpus: str | None):
        command = [sys.executable, "-c", ENGINE, str(threads), exact]
        if cpus:
            command = ["taskset", "-c", cpus, *command]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                        cwd=REPO_ROOT)
        self.settings = json.loads(self._line())["settings"]

    def _line(self) -> str:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the llama.cpp engine process ended ({self.process.wait()})")
        return line

    def run(self, prompt: list[int], tokens: int) -> dict:
        self.process.stdin.write(json.dumps([prompt, tokens]) + "\n")
        self.process.stdin.flush()
        return json.loads(self._line())

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)


def summarise(rows: list[dict], floor: float) -> list[dict]:
    table = []
    for category in list(dict.fromkeys(r["category"] for r in rows)) + ["all"]:
        mine = [r for r in rows if category in ("all", r["category"])]
        ratio = lambda key: geomean([r["auto"][key] / r["window0"][key] for r in mine   # noqa: E731
                                     if not math.isnan(r["auto"][key]) and not math.isnan(r["window0"][key])])
        row = {"category": category, "prompts": len(mine), "decode": ratio("decode_tps"),
               "e2e": 1 / ratio("e2e"), "ttft": ratio("ttft"),
               "free_accepted": sum(r["auto"]["free_accepted"] for r in mine),
               "free_drafted": sum(r["auto"]["free_drafted"] for r in mine),
               "identical": sum(r["identical"] for r in mine)}
        row["below_floor"] = [key for key in ("decode", "e2e") if row[key] < floor]   # which ratios fell below
        engine = [r for r in mine if "engine" in r]
        if engine:   # window 0 over the engine alone
            over = lambda key: geomean([r["window0"][key] / r["engine"][key] for r in engine   # noqa: E731
                                        if not math.isnan(r["window0"][key]) and not math.isnan(r["engine"][key])])
            row.update(engine_decode=over("decode_tps"), engine_e2e=1 / over("e2e"), engine_ttft=over("ttft"),
                       engine_identical=sum(r["engine_identical"] for r in engine))
        table.append(row)
    return table


def markdown(result: dict) -> str:
    lines = [f"# The floor: default vs window 0 through the same services ({result['date']})", "",
             f"Machine: {result['machine']}. {result['layout']}. {result['args']['tokens']} new tokens, greedy, "
             "chat template; each prompt at window 0 and at the default, back to back.", "",
             "| category | prompts | decode rate | end-to-end speed | TTFT | free drafts accepted / sent | identical |",
             "|---|---|---|---|---|---|---|"]
    for row in result["table"]:
        decode, e2e = (f"{row[key]:.3f}x (below the floor)" if key in row["below_floor"] else f"{row[key]:.2f}x"
                       for key in ("decode", "e2e"))
        lines.append(f"| {row['category']} | {row['prompts']} | {decode} | {e2e} | "
                     f"{row['ttft']:.2f}x | {row['free_accepted']}/{row['free_drafted']} | "
                     f"{row['identical']}/{row['prompts']} |")
    lines += ["", "Ratios are the default's over window 0's (TTFT: the default's time over window 0's, lower is "
              "better)."]
    if "engine_decode" in result["table"][-1]:
        lines += ["", f"Window 0 through the services against the engine alone ({result['engine']}):", "",
                  "| category | decode rate | end-to-end speed | TTFT | identical to the engine's text |",
                  "|---|---|---|---|---|"]
        for row in result["table"]:
            lines.append(f"| {row['category']} | {row['engine_decode']:.2f}x | {row['engine_e2e']:.2f}x | "
                         f"{row['engine_ttft']:.2f}x | {row['engine_identical']}/{row['prompts']} |")
        lines += ["", "Ratios are window 0's over the engine's (TTFT: window 0's time over the engine's)."]
    lines += [f"Rerun: `{result['command']}`", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = prompt_parser("edgespec bench floor", __doc__, per_category=1)
    parser.add_argument("--floor", type=float, default=0.98, help="ratio below which a row is marked (default %(default)s)")
    parser.add_argument("--engine", choices=["on", "off"], default="on",
                        help="also run llama.cpp target-only alone on the verifier's CPUs, before each prompt's pair, "
                             "and compare window 0 with it (default %(default)s)")
    parser.add_argument("--layout", choices=["split", "one-host"], default="split",
                        help="the services on the CPUs: split = the demo's edge and cloud halves; one-host = the "
                             "verifier on every CPU (--exact on), the drafter on one thread beside it "
                             "(default %(default)s)")
    args = parser.parse_args(argv)
    check_prompt_args(parser, args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    texts = bench_prompts(args.prompts_file, args.per_category)
    layout = cluster_layout("llamacpp", "auto", one_host=args.layout == "one-host")
    flags = layout.get("verifier_args", [])
    flag = lambda name, default: flags[flags.index(name) + 1] if name in flags else default   # noqa: E731
    threads, exact = int(flag("--threads", len(os.sched_getaffinity(0)))), flag("--exact", "auto")
    engine, encode = None, None
    if args.engine == "on":
        from edgespec.backends.assets import resolve_spec
        from edgespec.backends.tokenizer import load_tokenizer
        from services.coordinator.chat_template import ChatTemplateTokenizer
        encode = ChatTemplateTokenizer(load_tokenizer(resolve_spec("target"))).encode
        engine = Engine(threads, exact, layout.get("verifier_cpus"))
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="edgespec-floor-") as logs, \
                LocalCluster(Path(logs), **layout) as cluster:
            address = cluster.coordinator.address
            asyncio.run(timed(address, "warm up", 4, -1))
            for i, (category, text) in enumerate(track(texts, "prompts")):
                alone = engine.run(encode(text, True), args.tokens) if engine else None
                order = (0, -1) if i % 2 == 0 else (-1, 0)
                runs = {window: asyncio.run(timed(address, text, args.tokens, window)) for window in order}
                base, auto = runs[0], runs[-1]
                row = {"category": category, "prompt": text[:80], "identical": auto["tokens"] == base["tokens"],
                       "window0": {k: v for k, v in base.items() if k != "tokens"},
                       "auto": {k: v for k, v in auto.items() if k != "tokens"}}
                if alone is not None:
                    row.update(engine={k: v for k, v in alone.items() if k != "tokens"},
                               engine_identical=alone["tokens"] == base["tokens"])
                rows.append(row)
                log.info("%s: decode %.2fx, end-to-end %.2fx, free %d/%d, identical %s%s", category,
                         auto["decode_tps"] / base["decode_tps"], base["e2e"] / auto["e2e"], auto["free_accepted"],
                         auto["free_drafted"], row["identical"], "" if alone is None else
                         f"; window 0 over the engine alone: decode {base['decode_tps'] / alone['decode_tps']:.2f}x,"
                         f" identical {row['engine_identical']}")
    finally:
        if engine is not None:
            engine.close()
    where = (f"verifier on CPU {layout['verifier_cpus']}, drafter and coordinator on CPU {layout['edge_cpus']}"
             if "verifier_cpus" in layout else "all services on the same CPUs")
    result = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.processor() or platform.machine()}, "
              f"{len(os.sched_getaffinity(0))} CPUs",
              "layout": f"llama.cpp services, {where} (verifier {' '.join(flags)})",
              "engine": f"llama.cpp in process, {threads} thread(s), {engine.settings}" if engine else None,
              "args": {k: str(v) for k, v in vars(args).items()}, "rows": rows, "table": summarise(rows, args.floor),
              "command": "edgespec bench floor " + " ".join(argv if argv is not None else sys.argv[1:])}
    write_report(result, markdown(result), args.out)


if __name__ == "__main__":
    main()
