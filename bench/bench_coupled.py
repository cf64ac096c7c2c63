"""The coupled sampler's acceptance cost: standard vs coupled speculative sampling on the bench prompts.

    edgespec bench coupled [--window 4] [--temperature 0.8] [--seeds 3] [--tokens 48] [--json out.json]

Both samplers are lossless; they differ in how often the target keeps a draft token.
The standard rule accepts x with probability min(1, p(x)/q(x)) against the draft's
sparse top-Q distribution (per position: sum of min(p, q)); the coupled rule accepts
only when the draft's and the target's Gumbel argmaxes agree. Every generation runs
edgespec's own round loop over the real engines in this process (the default pair,
fixed window, same prompts and seeds for both samplers); acceptance and tokens per
round are exact counts, tokens/s is wall time in this process (no wire).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from collections import defaultdict

from bench.prompts import PROMPTS
from bench.report import progress
from edgespec.loop.session import acceptance

log = logging.getLogger("edgespec.bench_coupled")


def run_one(verifier, drafter, prompt: list[int], max_new: int, window: int, params, q_ids: int) -> dict:
    from harness.inprocess import InProcessDrafter, InProcessVerifier
    from edgespec.loop.session import SessionLog
    from edgespec.loop.speculation import speculate
    from edgespec.control.window import FixedWindow

    session = SessionLog(prompt, max_new, verifier.eos_ids)

    async def go():
        verifier.open("bench", prompt, params)
        async for _ in speculate(session, "bench", InProcessDrafter(drafter, q_ids), InProcessVerifier(verifier),
                                 FixedWindow(window), params):
            pass
        verifier.close("bench")
        drafter.close("bench")

    started = time.perf_counter()
    asyncio.run(go())
    seconds = time.perf_counter() - started
    stats = session.stats
    return dict(new_tokens=len(session.generated), rounds=stats.rounds, drafted=stats.drafted,
                accepted=stats.accepted, seconds=seconds)


def summarise(rows: list[dict]) -> dict:
    drafted, accepted = sum(r["drafted"] for r in rows), sum(r["accepted"] for r in rows)
    tokens, rounds, seconds = (sum(r[key] for r in rows) for key in ("new_tokens", "rounds", "seconds"))
    return dict(acceptance=acceptance(accepted, drafted), tokens_per_round=tokens / rounds if rounds else 0.0,
                tokens_per_second=tokens / seconds if seconds else 0.0, generations=len(rows))


def markdown(summary: dict, args) -> str:
    lines = [f"window {args.window}, temperature {args.temperature}, top-k {args.top_k}, {args.seeds} seeds x "
             f"{len(PROMPTS)} prompts, {args.tokens} tokens each; standard sampler with q_ids {args.q_ids}", "",
             "| prompts | sampler | acceptance | tokens/round | tok/s (in process) |", "|---|---|---|---|---|"]
    for category, by_sampler in summary.items():
        for sampler, s in by_sampler.items():
            lines.append(f"| {category} | {sampler} | {s['acceptance']:.1%} | {s['tokens_per_round']:.2f} | "
                         f"{s['tokens_per_second']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="edgespec bench coupled", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--window", type=int, default=4, help="fixed draft window k (default %(default)s)")
    parser.add_argument("--temperature", type=float, default=0.8, help="sampling temperature (default %(default)s)")
    parser.add_argument("--top-k", type=int, default=0, help="top-k warp for both models, 0 = all (default %(default)s)")
    parser.add_argument("--q-ids", type=int, default=16,
                        help="the standard sampler's sparse q: ids kept per position (default %(default)s)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per prompt (default %(default)s)")
    parser.add_argument("--tokens", type=int, default=48, help="new tokens per generation (default %(default)s)")
    parser.add_argument("--json", default=None, help="write rows and the summary here")
    parser.add_argument("--md", default=None, help="write the markdown table here")
    args = parser.parse_args(argv)
    if args.window < 1 or args.temperature <= 0 or args.seeds < 1 or args.tokens < 1 or args.q_ids < 1:
        parser.error("--window, --seeds, --tokens and --q-ids must be >= 1 and --temperature > 0")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from edgespec.backends.registry import eos_ids, load_lm
    from edgespec.engines.drafter import DrafterEngine
    from edgespec.verify.sampling import SamplingParams
    from edgespec.backends.tokenizer import HFTokenizer
    from edgespec.backends.registry import model_path
    from edgespec.engines.verifier import VerifierEngine

    tokenizer = HFTokenizer(str(model_path("draft")))
    target, draft = load_lm("target", device="cpu"), load_lm("draft", device="cpu")
    verifier, drafter = VerifierEngine(target, eos_ids(target)), DrafterEngine(draft)
    rows = []
    total = len(PROMPTS) * args.seeds * 2
    with progress(total, "bench-coupled", unit="generation") as bar:
        for index, (category, text) in enumerate(PROMPTS):
            prompt = tokenizer.encode(text, True)
            for seed in range(args.seeds):
                for sampler in ("standard", "coupled"):
                    params = SamplingParams(temperature=args.temperature, top_k=args.top_k, seed=seed,
                                            coupled=sampler == "coupled")
                    row = run_one(verifier, drafter, prompt, args.tokens, args.window, params, args.q_ids)
                    rows.append(dict(category=category, prompt=index, seed=seed, sampler=sampler, **row))
                    log.info("%d/%d %s prompt %d seed %d %s: acceptance %.2f, %.2f tokens/round", len(rows), total,
                             category, index, seed, sampler, acceptance(row["accepted"], row["drafted"]),
                             row["new_tokens"] / max(1, row["rounds"]))
                    bar.update(1)
    groups: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        groups[row["category"]][row["sampler"]].append(row)
        groups["all"][row["sampler"]].append(row)
    summary = {category: {sampler: summarise(r) for sampler, r in by.items()} for category, by in groups.items()}
    table = markdown(summary, args)
    print(table)
    if args.json:
        with open(args.json, "w") as sink:
            json.dump(dict(args=vars(args), rows=rows, summary=summary), sink, indent=1)
    if args.md:
        with open(args.md, "w") as sink:
            sink.write(table + "\n")


if __name__ == "__main__":
    main()
