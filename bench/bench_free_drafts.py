"""`edgespec bench free-drafts`: what free drafts (the coordinator's suffix drafter) give on this machine, per
Spec-Bench category, from the default target's own outputs.

1. Records llama.cpp target-only greedy outputs (in process, one token per decode) for the first turns of
   Spec-Bench questions (``--per-category`` of each of its 13 categories), three of our code edits and the
   demo's two prompts, through the chat template.
2. Measures the target's forward cost c(n) for n = 1..9 tokens here, as the verifier does at its start, with
   the verifier's settings by ``--exact`` and ``--threads``.
3. Replays each output through the coordinator's own decision (edgespec.loop.rounds.pick_free_draft over the
   shipped SuffixDrafter, one drafter for all prompts as in a coordinator, costed by that c(n)): the passes it
   takes, the free windows, and the modelled decode speedup over target-only, tokens / sum of c(window + 1)
   over the passes. Beside it the ceiling of the same proposals: every one's accepted prefix sent, nothing
   rejected.

Modelled, not timed: it says what the decision can reach from measured costs and real outputs, in minutes and
with no services. The services' own speed, wire and scheduling included, is the demo's and `bench llamacpp`'s.
Outputs: JSON rows and a markdown table (``--out``).
"""
from __future__ import annotations

import logging
import os
import platform
import sys
import time

from bench.report import track, write_report
from bench.spec_bench import bench_prompts, check_prompt_args, geomean, prompt_parser

log = logging.getLogger("bench.bench_free_drafts")

def replay(prompt: list[int], output: list[int], drafter, profile: dict[int, float], eos_ids, limit: int) -> dict:
    """One output through pick_free_draft, and the ceiling of the same proposals. Steps are c(n) / c(1)."""
    from edgespec.control.telemetry import Telemetry
    from edgespec.loop.rounds import pick_free_draft

    telemetry = Telemetry(profile=dict(profile))
    step = lambda tokens: profile[tokens] / profile[1]   # noqa: E731
    session = drafter.session()
    position = passes = free = drafted = accepted = stored = 0
    steps = 0.0
    while position < len(output):
        remaining = len(output) - position - 1
        picked = pick_free_draft(session, prompt + output[:position], eos_ids, telemetry, min(limit, remaining)) \
            if remaining else None
        n = 0
        if picked is not None and picked.tokens:
            n = _matching(picked.tokens, output[position:])
            session.observe(picked, n)
            free, drafted, accepted = free + 1, drafted + len(picked.tokens), accepted + n
            stored += sum(picked.stored[:n])
        steps += step(len(picked.tokens) + 1 if picked else 1)
        passes += 1
        position += n + 1
    ceiling = len(output) / ceiling_steps(prompt, output, drafter, profile, eos_ids)   # before the output is stored
    drafter.absorb(session, output)
    return {"tokens": len(output), "passes": passes, "free_windows": free, "free_drafted": drafted,
            "free_accepted": accepted, "stored_accepted": stored, "speedup": len(output) / steps, "ceiling": ceiling}


def ceiling_steps(prompt: list[int], output: list[int], drafter, profile: dict[int, float], eos_ids) -> float:
    """Steps if of every proposal just its right tokens were sent (the prefix of them that commits the most per
    step) and nothing wrong ever was: the most the decision could reach with these proposals and this c(n)."""
    session, position, steps = drafter.session(), 0, 0.0
    while position < len(output):
        remaining = len(output) - position - 1
        raw = session.propose(prompt + output[:position], min(remaining, max(profile) - 1)) if remaining else None
        tokens = raw.tokens if raw else ()
        usable = next((i for i, token in enumerate(tokens) if token in eos_ids), len(tokens))
        right = _matching(tokens[:usable], output[position:])
        # the prefix of the right tokens that commits the most per step (all of them, unless c(n) is steep)
        n = max(range(right + 1), key=lambda m: (m + 1) * profile[1] / profile[m + 1])
        steps += profile[n + 1] / profile[1]
        position += n + 1
    return steps


def _matching(draft, output) -> int:
    n = 0
    while n < len(draft) and n < len(output) and draft[n] == output[n]:
        n += 1
    return n


def summarise(rows: list[dict]) -> list[dict]:
    categories = list(dict.fromkeys(row["category"] for row in rows))
    table = []
    for category in categories + ["all"]:
        mine = [r for r in rows if category in ("all", r["category"])]
        table.append({"category": category, "prompts": len(mine), "tokens": sum(r["tokens"] for r in mine),
                      "passes": sum(r["passes"] for r in mine), "free_windows": sum(r["free_windows"] for r in mine),
                      "free_accepted": sum(r["free_accepted"] for r in mine),
                      "free_drafted": sum(r["free_drafted"] for r in mine),
                      "stored_accepted": sum(r.get("stored_accepted", 0) for r in mine),
                      "speedup": geomean([r["speedup"] for r in mine]),
                      "ceiling": geomean([r["ceiling"] for r in mine])})
    return table


def markdown(result: dict) -> str:
    curve = result["cost_curve"]
    given = result["args"]["cost_curve"]
    lines = [f"# Free drafts, modelled from real outputs ({result['date']})", "",
             f"Machine: {result['machine']}. Target: {result['target']}, {result['args']['threads']} thread(s), "
             f"{result['settings']}. {result['args']['tokens']} new tokens per prompt, greedy, chat template.", "",
             f"c(n), a pass over n tokens in one-token steps ({'given' if given else 'measured here'}): "
             + ", ".join(f"{n}: {s / curve['1']:.2f}" for n, s in curve.items()), "",
             f"Earlier outputs kept for free drafts: {result['args'].get('store', '0')} tokens (accepted tokens from them "
             "in their own column).", "",
             "| category | prompts | tokens/pass | free windows | accepted / drafted | from earlier outputs | "
             "modelled decode speedup | without the store | ceiling |",
             "|---|---|---|---|---|---|---|---|---|"]
    alone = {row["category"]: row for row in result.get("table_without_store", ())}
    for row in result["table"]:
        lines.append(f"| {row['category']} | {row['prompts']} | {row['tokens'] / row['passes']:.2f} | "
                     f"{row['free_windows']} | {row['free_accepted']}/{row['free_drafted']} | {row['stored_accepted']} | "
                     f"{row['speedup']:.2f}x | "
                     + (f"{alone[row['category']]['speedup']:.2f}x" if row["category"] in alone else "-")
                     + f" | {row['ceiling']:.2f}x |")
    lines += ["", f"Rerun: `{result['command']}`", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = prompt_parser("edgespec bench free-drafts", __doc__, per_category=2)
    parser.add_argument("--threads", type=int, default=1, help="llama.cpp threads (default %(default)s)")
    parser.add_argument("--cost-curve", default="",
                        help="c(1),c(2),...: a pass over n tokens in one-token steps, to model another machine's "
                             "verifier instead of measuring this one's (e.g. 1,1.53,1.86,1.67,2.13 as a Sapphire Rapids "
                             "VM measured it); at least two values, c(1) = 1")
    parser.add_argument("--profile-context", type=int, default=32, metavar="TOKENS",
                        help="tokens before the measured passes (default %(default)s, as the verifier's profile). Past "
                             "240 with --exact on and --threads 2 or more, a one-token pass runs on one thread and a "
                             "window's rows on all: a long prompt's costs (docs/benchmarks.md, \"Free drafts\")")
    parser.add_argument("--exact", default="auto", choices=["auto", "on", "off"],
                        help="llama.cpp exact mode, as the verifier's --exact (default %(default)s)")
    parser.add_argument("--store", type=int, default=32768, metavar="TOKENS",
                        help="tokens of earlier outputs kept for free drafts, as the coordinator's "
                             "--free-drafts-store: the prompts replay in order, one tenant (default %(default)s)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="replay the prompts this many times over, as a workload that asks again (default 1)")
    args = parser.parse_args(argv)
    check_prompt_args(parser, args)
    if args.threads < 1:
        parser.error("--threads must be >= 1")
    if args.store < 0 or args.repeats < 1:
        parser.error("--store must be >= 0 and --repeats >= 1")
    if not 2 <= args.profile_context <= 1024:
        parser.error(f"--profile-context must be in 2..1024, got {args.profile_context}")
    try:
        curve = [float(x) for x in args.cost_curve.split(",")] if args.cost_curve else []
    except ValueError:
        parser.error(f"--cost-curve: expected numbers separated by commas, got {args.cost_curve!r}")
    if curve and (len(curve) < 2 or curve[0] != 1.0 or min(curve) <= 0):
        parser.error(f"--cost-curve: need c(1) = 1 and at least c(2), all positive; got {args.cost_curve!r}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from bench.bench_llamacpp import references
    from edgespec.backends import llamacpp
    from edgespec.backends.assets import resolve_spec
    from edgespec.backends.suffix import SuffixDrafter
    from edgespec.backends.tokenizer import load_tokenizer
    from edgespec.engines.profile import describe, forward_profile
    from services.coordinator.chat_template import ChatTemplateTokenizer

    texts = bench_prompts(args.prompts_file, args.per_category)
    tokenizer = ChatTemplateTokenizer(load_tokenizer(resolve_spec("target")))
    prompts = [tokenizer.encode(text, True) for _, text in texts]
    exact = llamacpp.exact_settings(args.exact, args.threads, llamacpp.PREFILL_CHUNK)   # as the verifier runs
    lm = llamacpp.load("target", threads=args.threads, exact=exact)
    profile = ({n: seconds for n, seconds in enumerate(curve, 1)} if curve
               else forward_profile(lm, 9, context=args.profile_context))
    eos_ids = frozenset(lm.eos_ids())
    settings = (exact or llamacpp.LlamaExact()).describe()
    lm.close()
    log.info("forward cost by tokens fed (%s): %s", "as given" if curve else "measured", describe(profile))
    log.info("recording target-only outputs of %d prompts (%d tokens each)", len(prompts), args.tokens)
    started = time.perf_counter()
    refs = references(prompts, args.tokens, args.threads)
    log.info("recorded in %.0f s", time.perf_counter() - started)

    def replayed(store: int) -> list[dict]:
        drafter, rows = SuffixDrafter(store_tokens=store), []
        for (category, text), prompt, ref in track(list(zip(texts, prompts, refs)) * args.repeats, "replaying"):
            row = replay(prompt, ref["tokens"], drafter, profile, eos_ids, limit=16)
            rows.append({"category": category, "prompt": text[:80], **row})
        return rows

    rows = replayed(args.store)
    without = replayed(0) if args.store else []   # the same outputs, the store off: what it adds
    result = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.processor() or platform.machine()}, "
              f"{len(os.sched_getaffinity(0))} CPUs", "target": "Qwen2.5-Coder-1.5B-Instruct Q4_K_M",
              "settings": settings, "args": {k: str(v) for k, v in vars(args).items()},
              "cost_curve": {str(n): s for n, s in profile.items()}, "rows": rows, "table": summarise(rows),
              "table_without_store": summarise(without) if without else [], "rows_without_store": without,
              "command": "edgespec bench free-drafts " + " ".join(argv if argv is not None else sys.argv[1:])}
    write_report(result, markdown(result), args.out)


if __name__ == "__main__":
    main()
