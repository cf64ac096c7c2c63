"""`edgespec bench floor`: the default against the same services at window 0, prompt by prompt, per category.

The demo's cluster (llama.cpp verifier, drafter and coordinator on loopback; edge and cloud on separate CPUs
where there are two or more) serves Spec-Bench first turns (``--per-category`` of each of its 13 categories,
shipped in data/), three of our code edits and the demo's two prompts. Each prompt runs at window 0 (target-only through the services)
and with the default adaptive window (free drafts, then the window policy), one right after the other and in
alternating order, so that both see the same machine. Reported per category: TTFT, the decode rate after the
first token and end-to-end time as ratios to window 0 (geometric means), free drafts accepted / sent, and
whether the outputs are identical. A row below ``--floor`` is marked.

Outputs: a markdown table on stdout, JSON rows and the table with ``--out``.
"""
from __future__ import annotations

import asyncio
import logging
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from bench.cluster import LocalCluster
from bench.demo import cluster_layout
from bench.report import track
from bench.spec_bench import bench_prompts, check_prompt_args, geomean, prompt_parser, write

log = logging.getLogger("bench.floor")


async def timed(address: str, prompt: str, tokens: int, window: int) -> dict:
    """One generation through the coordinator: its tokens, TTFT, decode rate after the first chunk, stats."""
    from edge_client.client import generate

    started = time.perf_counter()
    first = last = None
    out, first_tokens, stats = [], 0, None
    async for event in generate(address, prompt, tokens, window, chat=True, timeout_seconds=1800):
        if event.HasField("chunk"):
            if event.chunk.token_ids:
                last = time.perf_counter()
                if first is None:
                    first, first_tokens = last, len(event.chunk.token_ids)
            out.extend(event.chunk.token_ids)
        else:
            stats = event.stats
    decode_tokens = len(out) - first_tokens
    return {"tokens": out, "ttft": first - started, "e2e": last - started,
            "decode_tps": decode_tokens / (last - first) if decode_tokens and last > first else float("nan"),
            "rounds": stats.rounds, "free_rounds": stats.free_rounds, "free_drafted": stats.free_drafted_tokens,
            "free_accepted": stats.free_accepted_tokens, "drafted": stats.drafted_tokens,
            "accepted": stats.accepted_tokens}


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
        row["below_floor"] = row["decode"] < floor or row["e2e"] < floor
        table.append(row)
    return table


def markdown(result: dict) -> str:
    lines = [f"# The floor: default vs window 0 through the same services ({result['date']})", "",
             f"Machine: {result['machine']}. {result['layout']}. {result['args']['tokens']} new tokens, greedy, "
             "chat template; each prompt at window 0 and at the default, back to back.", "",
             "| category | prompts | decode rate | end-to-end speed | TTFT | free drafts accepted / sent | identical |",
             "|---|---|---|---|---|---|---|"]
    for row in result["table"]:
        mark = " (below the floor)" if row["below_floor"] else ""
        lines.append(f"| {row['category']} | {row['prompts']} | {row['decode']:.2f}x{mark} | {row['e2e']:.2f}x | "
                     f"{row['ttft']:.2f}x | {row['free_accepted']}/{row['free_drafted']} | "
                     f"{row['identical']}/{row['prompts']} |")
    lines += ["", "Ratios are the default's over window 0's (TTFT: the default's time over window 0's, lower is "
              "better).", f"Rerun: `{result['command']}`", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = prompt_parser("edgespec bench floor", __doc__, per_category=1)
    parser.add_argument("--floor", type=float, default=0.98, help="ratio below which a row is marked (default %(default)s)")
    args = parser.parse_args(argv)
    check_prompt_args(parser, args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    texts = bench_prompts(args.prompts_file, args.per_category)
    layout = cluster_layout("llamacpp", "auto")
    rows = []
    with tempfile.TemporaryDirectory(prefix="edgespec-floor-") as logs, LocalCluster(Path(logs), **layout) as cluster:
        address = cluster.coordinator.address
        asyncio.run(timed(address, "warm up", 4, -1))
        for i, (category, text) in enumerate(track(texts, "prompts")):
            order = (0, -1) if i % 2 == 0 else (-1, 0)
            runs = {window: asyncio.run(timed(address, text, args.tokens, window)) for window in order}
            base, auto = runs[0], runs[-1]
            rows.append({"category": category, "prompt": text[:80], "identical": auto["tokens"] == base["tokens"],
                         "window0": {k: v for k, v in base.items() if k != "tokens"},
                         "auto": {k: v for k, v in auto.items() if k != "tokens"}})
            log.info("%s: decode %.2fx, end-to-end %.2fx, free %d/%d, identical %s", category,
                     auto["decode_tps"] / base["decode_tps"], base["e2e"] / auto["e2e"], auto["free_accepted"],
                     auto["free_drafted"], rows[-1]["identical"])
    where = (f"verifier on CPU {layout['verifier_cpus']}, drafter and coordinator on CPU {layout['edge_cpus']}"
             if "verifier_cpus" in layout else "all services on the same CPUs")
    result = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.processor() or platform.machine()}, "
              f"{len(os.sched_getaffinity(0))} CPUs", "layout": f"llama.cpp services, {where}",
              "args": {k: str(v) for k, v in vars(args).items()}, "rows": rows, "table": summarise(rows, args.floor),
              "command": "edgespec bench floor " + " ".join(argv if argv is not None else sys.argv[1:])}
    write(result, markdown(result), args.out)


if __name__ == "__main__":
    main()
