"""Is edgespec on llama.cpp llama.cpp's own greedy output? Every prompt, every window, many sessions at once.

    edgespec bench exactness [--exact on|off] [--prompts 12] [--tokens 64] [--sessions 16] [--json PATH]

The reference is llama.cpp target-only greedy decoding, one session alone in its own context: the prompt in
one batch, then one token per llama_decode, with the verifier's llama.cpp settings (printed as llama.cpp
flags, so llama-completion or llama-cli reproduces it). Then the real services on loopback (verifier and
drafter --backend llamacpp, the default pair as shipped) generate the same prompts at window 0, the
adaptive window and fixed windows with the model drafter, with the n-gram drafter, and with --sessions
generations at once (each prompt several times, so batches mix sessions at different positions). Each output
is compared with its reference token for token; a divergence is reported with its first position and the
reference's top-2 logit margin there.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from bench.bench_llamacpp import compare, greedy_runs
from harness.cluster import LocalCluster
from bench.prompts import PROMPTS
from edge_client.client import collect


def references(prompt_ids: list[list[int]], tokens: int, threads: int, exact: bool) -> list[dict]:
    from edgespec.backends import llamacpp

    lm = llamacpp.load("target", threads=threads, ctx_tokens=8192, max_sequences=1,
                       exact=llamacpp.exact_settings("on" if exact else "off", threads, llamacpp.PREFILL_CHUNK))
    out = greedy_runs(lm, prompt_ids, tokens)
    settings = {"describe": lm.exact.describe(), "llama_cpp_flags": lm.exact.cli(threads)}
    lm.close()
    return out, settings


def cli_check(texts: list[str], refs: list[dict], tokens: int, flags: str, tokenizer) -> list[dict]:
    """llama.cpp's own llama-completion (built from the same vendored sources with the same flags) on the same
    templated prompts with the printed settings: its text against the reference's."""
    import shlex
    import subprocess

    from bench.llamacpp_tools import completion_text, ensure_tools
    from edgespec.backends.assets import ensure_gguf

    tool = ensure_tools()["llama-completion"]
    env_flags = [f for f in shlex.split(flags) if "=" in f and not f.startswith("-")]
    args = [f for f in shlex.split(flags) if f not in env_flags]
    env = {**os.environ, **dict(f.split("=", 1) for f in env_flags)}
    out = []
    for text, ref in zip(texts, refs):
        templated = tokenizer.hf.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                     tokenize=False)
        result = subprocess.run([str(tool), "-m", str(ensure_gguf("target")), *args, "-c", "4096", "-b", "2048",
                                 "-n", str(tokens), "--temp", "0", "-no-cnv", "--no-display-prompt", "-p", templated],
                                capture_output=True, text=True, env=env, timeout=1800)
        got = completion_text(result.stdout)
        expected = tokenizer.hf.decode([t for t in ref["tokens"]], skip_special_tokens=True).rstrip("\n")
        out.append({"identical": got == expected, "llama_completion": got, "reference": expected})
    return out


async def one(address: str, text: str, tokens: int, window: int) -> tuple[list[int], object]:
    run = await collect(address, text, tokens, window, chat=True, timeout_seconds=3600)
    return run.tokens, run.stats


async def many(address: str, texts: list[str], tokens: int, window: int) -> list[tuple[list[int], object]]:
    return await asyncio.gather(*(one(address, text, tokens, window) for text in texts))


def run(cluster: LocalCluster, label: str, texts: list[str], refs: list[dict], tokens: int, window: int,
        sessions: int = 1, rounds: int = 1) -> dict:
    """Each prompt alone (sessions 1), or ``rounds`` times ``sessions`` generations at once (prompts in turn)."""
    started = time.perf_counter()
    if sessions == 1:
        results = [asyncio.run(one(cluster.coordinator.address, text, tokens, window)) for text in texts]
        indexes = list(range(len(texts)))
    else:
        indexes, results = [], []
        for r in range(rounds):
            batch = [(r * sessions + i) % len(texts) for i in range(sessions)]
            indexes += batch
            results += asyncio.run(many(cluster.coordinator.address, [texts[i] for i in batch], tokens, window))
    rows = [compare(got, refs[i]) | {"prompt": i, "accepted": stats.accepted_tokens, "drafted": stats.drafted_tokens}
            for i, (got, stats) in zip(indexes, results)]
    summary = {"mode": label, "window": window, "sessions": sessions, "identical": sum(r["identical"] for r in rows),
               "outputs": len(rows), "seconds": time.perf_counter() - started,
               "divergences": [r for r in rows if not r["identical"]]}
    print(f"{label}: {summary['identical']}/{summary['outputs']} identical", file=sys.stderr, flush=True)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(prog="edgespec bench exactness", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--exact", choices=["on", "off"], default="on", help="the verifier's --exact (default %(default)s)")
    parser.add_argument("--prompts", type=int, default=12, help="bench prompts (default %(default)s, all)")
    parser.add_argument("--prompts-file", type=Path, help="first turns of a JSONL file of questions instead "
                        "(Spec-Bench's question.jsonl: {\"category\", \"turns\"}); --per-category of each category")
    parser.add_argument("--per-category", type=int, default=2, help="with --prompts-file (default %(default)s)")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens each (default %(default)s)")
    parser.add_argument("--sessions", type=int, default=16, help="concurrent generations (default %(default)s)")
    parser.add_argument("--session-rounds", type=int, default=6,
                        help="times --sessions generations run at once, with each drafter (default %(default)s)")
    parser.add_argument("--windows", default="0,-1,3,6", help="windows with the model drafter (-1: auto)")
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1), help="verifier threads")
    parser.add_argument("--cli", type=int, default=4, help="prompts also run with llama-completion (default %(default)s)")
    parser.add_argument("--json", type=Path, default=Path("bench-results/llama-exactness.json"))
    args = parser.parse_args()

    from edgespec.backends.tokenizer import load_tokenizer

    texts = [text for _, text in PROMPTS[:args.prompts]]
    if args.prompts_file:
        texts, taken = [], {}
        for line in args.prompts_file.read_text().splitlines():
            question = json.loads(line)
            if taken.get(question["category"], 0) < args.per_category:
                taken[question["category"]] = taken.get(question["category"], 0) + 1
                texts.append(question["turns"][0])
    tokenizer = load_tokenizer("draft")
    prompt_ids = [tokenizer.encode(text, True) for text in texts]
    refs, settings = references(prompt_ids, args.tokens, args.threads, args.exact == "on")
    cli = cli_check(texts[:args.cli], refs, args.tokens, settings["llama_cpp_flags"], tokenizer) if args.cli else []
    print(f"llama-completion {settings['llama_cpp_flags']}: {sum(c['identical'] for c in cli)}/{len(cli)} identical "
          f"texts", file=sys.stderr, flush=True)
    llama = ["--backend", "llamacpp"]   # the services' default context (16 sessions fit either way)
    verifier = [*llama, "--threads", str(args.threads), "--exact", args.exact]
    modes = []
    drafters = {"draft model": [*llama, "--threads", "1"], "n-gram": ["--backend", "ngram", "--vocab-size", "151936"]}
    with tempfile.TemporaryDirectory(prefix="edgespec-exactness-") as logs:
        for name, drafter in drafters.items():
            windows = [int(w) for w in args.windows.split(",")] if name == "draft model" else [-1, 6]
            with LocalCluster(Path(logs) / name.replace(" ", "-"), verifier_args=verifier,
                              drafter_args=drafter) as cluster:
                for window in windows:
                    modes.append(run(cluster, f"{name}, window {'auto' if window < 0 else window}", texts, refs,
                                     args.tokens, window))
                modes.append(run(cluster, f"{name}, {args.sessions} sessions x {args.session_rounds}, auto", texts,
                                 refs, args.tokens, -1, args.sessions, args.session_rounds))
    result = {"exact": args.exact, "settings": settings, "tokens": args.tokens, "llama_completion": cli, "modes": modes}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))
    print(json.dumps({"llama-completion": f"{sum(c['identical'] for c in cli)}/{len(cli)}"} |
                     {m["mode"]: f"{m['identical']}/{m['outputs']}" for m in modes}))


if __name__ == "__main__":
    main()
