"""Drafters alone and the router, per category, on 90 prompts: acceptance, tokens per round, tokens/s.

    edgespec bench drafters --json out.json [--onnx-dir DIR] [--tokens 32]

Greedy speculative decoding commits exactly the target's greedy tokens, so a
drafter's rounds can be replayed against the target's reference output: at
position t the drafter proposes k tokens after prompt + reference[:t]; the
verifier would accept their common prefix n with reference[t:] and commit n + 1.
This gives each drafter's real acceptance and accepted length on every prompt
with one target run per prompt (the references, made by edgespec's own engines
and cached) instead of one per drafter. Drafting time is measured as it happens;
the verifier's time per window is measured on the target (forward of k + 1 tokens
after a warm cache); tokens/s = tokens / (draft time + rounds · t_verify(k)).
So tokens/s is modelled from measured parts (no wire, no second process; the
real-service benchmarks measure those); acceptance and accepted length are exact.

The router is evaluated by 2-fold cross-fitting: its regression is trained on the
per-prompt outcomes of one half of the prompts and replayed (choice per request,
online switching per session) on the other half, and vice versa.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from pathlib import Path

import numpy as np

from edgespec.control.categories import CATEGORIES
from edgespec.control.router import Arm, Router, SessionRouting, request_features
from bench.prompt_set import PROMPT_SET
from bench.report import progress, track, write_report
from edgespec.verify.greedy import common_prefix_length
from edgespec.loop.session import acceptance

log = logging.getLogger("edgespec.bench_drafters")


def make_references(target, draft, prompts: list[list[int]], max_new: int, eos: list[int]) -> list[list[int]]:
    """Target greedy continuations, made by speculative decoding in process (identical to target-only)."""
    from edgespec.engines.drafter import DrafterEngine
    from harness.inprocess import InProcessDrafter, InProcessVerifier
    from edgespec.verify.sampling import SamplingParams
    from edgespec.loop.session import SessionLog
    from edgespec.loop.speculation import speculate
    from edgespec.engines.verifier import VerifierEngine
    from edgespec.control.window import FixedWindow

    verifier, drafter = VerifierEngine(target, eos), DrafterEngine(draft)
    out = []
    for i, prompt in enumerate(track(prompts, "bench-drafters references")):
        session = SessionLog(prompt, max_new, frozenset(eos))

        async def go():
            verifier.open("ref", prompt, SamplingParams())
            async for _ in speculate(session, "ref", InProcessDrafter(drafter), InProcessVerifier(verifier),
                                     FixedWindow(3)):
                pass
            verifier.close("ref")
            drafter.close("ref")

        asyncio.run(go())
        out.append(session.generated)
        print(f"reference {i + 1}/{len(prompts)}: {len(session.generated)} tokens", flush=True)
    return out


def verify_costs(target, prompt: list[int], max_k: int, repeats: int = 3) -> dict[int, float]:
    """Seconds for one verify pass of a k-token window (k + 1 positions) after a cached prefix."""
    costs = {}
    for k in range(1, max_k + 1):
        samples = []
        for _ in range(repeats):
            state = target.new_state()
            target.logits_rows(state, prompt, 1)
            started = time.perf_counter()
            target.logits_rows(state, prompt + [prompt[-1]] * (k + 1), k + 1)
            samples.append(time.perf_counter() - started)
        costs[k] = float(np.median(samples))
    return costs


def replay(model, prompt: list[int], reference: list[int], k: int, start: int = 0, state=None,
           routing: SessionRouting | None = None, models: dict | None = None, name: str = "") -> dict:
    """Rounds of one drafter (or a routed session) against the reference; measured draft time."""
    states = {}
    t, rounds, drafted, accepted, seconds, used = start, 0, 0, 0, 0.0, [name]
    while t < len(reference):
        current = routing.current if routing else name
        drafter = models[current] if models else model
        if current not in states:
            states[current] = drafter.new_state()
            drafter.prefill(states[current], prompt + reference[:t])
        window = min(k, len(reference) - t - 1)
        if window <= 0:
            t += 1
            rounds += 1
            continue
        began = time.perf_counter()
        proposal = drafter.greedy_draft(states[current], prompt + reference[:t], window)
        spent = time.perf_counter() - began
        n = common_prefix_length(proposal, reference[t:t + window])
        rounds, drafted, accepted, seconds = rounds + 1, drafted + window, accepted + n, seconds + spent
        t += n + 1
        if routing:
            routing.observe(current, window, n, spent)
            if routing.maybe_switch() is not None:
                used.append(routing.current)
    return {"tokens": len(reference), "rounds": rounds, "drafted": drafted, "accepted": accepted,
            "draft_seconds": seconds, "used": used}


def summarize(rows: list[dict], verify: float) -> dict:
    tokens = sum(r["tokens"] for r in rows)
    rounds = sum(r["rounds"] for r in rows)
    return {"prompts": len(rows),
            "acceptance": acceptance(sum(r["accepted"] for r in rows), sum(r["drafted"] for r in rows)),
            "tokens_per_round": tokens / max(1, rounds),
            "tokens_per_second": tokens / (sum(r["draft_seconds"] for r in rows) + rounds * verify),
            "draft_ms_per_token": 1000 * sum(r["draft_seconds"] for r in rows) / max(1, sum(r["drafted"] for r in rows))}


def alpha_of(row: dict) -> float:
    """Per-token acceptance: accepted / (accepted + rounds), i.e. the rejections counted once per round
    (slightly low when a round was fully accepted; the same for every drafter)."""
    return row["accepted"] / max(1, row["accepted"] + row["rounds"])


def train_arms(names: list[str], rows: dict[str, list[dict]], texts: list[str], indices: list[int],
               costs: dict[str, float]) -> list[Arm]:
    arms = []
    for name in names:
        arm = Arm(name, costs[name])
        for i in indices:
            arm.update(request_features(texts[i]), alpha_of(rows[name][i]))
        arms.append(arm)
    return arms


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="edgespec bench drafters", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", default="bench-results/drafters.json")
    parser.add_argument("--tokens", type=int, default=32, help="target tokens per prompt (default %(default)s)")
    parser.add_argument("--window", type=int, default=4, help="draft window k (default %(default)s)")
    parser.add_argument("--references", default=str(Path.home() / ".cache/edgespec/bench-drafters-references.json"))
    parser.add_argument("--onnx-dir", default="", help="ONNX int8 export of the draft (edgespec export-onnx --int8)")
    parser.add_argument("--onnx-fp32-dir", default="", help="ONNX fp32 export of the draft: measures int8's acceptance loss")
    parser.add_argument("--no-smollm2", action="store_true", help="skip the cross-tokenizer SmolLM2 drafter")
    parser.add_argument("--weights-out", default="", help="also write router weights trained on all prompts")
    parser.add_argument("--limit", type=int, default=0, help="only the first N prompts of each category (smoke runs)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    import torch

    from edgespec.backends.ngram import NgramDrafter
    from edgespec.backends.registry import eos_ids, load_lm
    from edgespec.backends.tokenizer import load_tokenizer

    torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer("draft")
    prompt_set = ([p for c in CATEGORIES for p in [q for q in PROMPT_SET if q[0] == c][: args.limit]]
                  if args.limit else PROMPT_SET)
    texts = [text for _, text in prompt_set]
    prompts = [tokenizer.encode(text, True) for text in texts]
    draft = load_lm("draft", device="cpu", quantize="int8")
    ref_path = Path(args.references)
    cached = json.loads(ref_path.read_text()) if ref_path.exists() else {}
    target = load_lm("target", device="cpu")
    if cached.get("tokens") == args.tokens and len(cached.get("references", [])) == len(prompts):
        refs = cached["references"]
    else:
        refs = make_references(target, draft, prompts, args.tokens, eos_ids(target))
        ref_path.parent.mkdir(parents=True, exist_ok=True)
        ref_path.write_text(json.dumps({"tokens": args.tokens, "references": refs}))
    verify = verify_costs(target, prompts[0], max(args.window, 4))
    print("verify seconds by window:", {k: round(v, 3) for k, v in verify.items()}, flush=True)
    vocab = target.vocab_size
    del target   # the drafters need the memory more
    models = {"draft-int8": draft, "ngram": NgramDrafter(vocab)}
    from edgespec.backends.onnx_lm import OnnxCausalLM
    if args.onnx_fp32_dir:
        models["onnx-fp32"] = OnnxCausalLM(args.onnx_fp32_dir, threads=args.threads)
    if args.onnx_dir:
        models["onnx-int8"] = OnnxCausalLM(args.onnx_dir, threads=args.threads)
    if not args.no_smollm2:
        from edgespec.backends.cross_tokenizer import wrap_for_target
        models["smollm2-int8"] = wrap_for_target(load_lm("smollm2", device="cpu", quantize="int8"), "smollm2", "draft")
    names = list(models)
    rows: dict[str, list[dict]] = {}
    with progress((len(models) + 1) * len(prompts), "bench-drafters replay") as bar:
        for name, model in models.items():
            rows[name] = []
            for i, (prompt, ref) in enumerate(zip(prompts, refs)):
                rows[name].append(replay(model, prompt, ref, args.window, name=name))
                bar.update(1)
            print(f"{name}: {summarize(rows[name], verify[args.window])}", flush=True)
        costs = {name: sum(r["draft_seconds"] for r in rows[name]) / max(1, sum(r["drafted"] for r in rows[name]))
                 for name in names}
        # The router, cross-fitted: train on one half, replay on the other.
        router_rows: list[dict | None] = [None] * len(prompts)
        halves = [list(range(0, len(prompts), 2)), list(range(1, len(prompts), 2))]
        for train, test in ((halves[0], halves[1]), (halves[1], halves[0])):
            router = Router(train_arms(names, rows, texts, train, costs), verify_wall_seconds=verify[args.window], explore=0.0)
            for i in test:
                x = request_features(prompt_set[i][1])
                decision = router.choose(x)
                routing = SessionRouting(router, x, decision.drafter)
                row = replay(None, prompts[i], refs[i], args.window, routing=routing, models=models, name=decision.drafter)
                routing.finish()
                router_rows[i] = row
                bar.update(1)
    rows["router"] = router_rows
    table = {}
    for name in [*names, "router"]:
        table[name] = {cat: summarize([r for r, (c, _) in zip(rows[name], prompt_set) if c == cat], verify[args.window])
                       for cat in CATEGORIES}
        table[name]["all"] = summarize(rows[name], verify[args.window])
    picks = {}
    for r, (cat, _) in zip(rows["router"], prompt_set):
        key = f"{cat}: {'>'.join(r['used'])}"
        picks[key] = picks.get(key, 0) + 1
    result = {"window": args.window, "tokens": args.tokens, "verify_compute_seconds": verify, "draft_cost": costs,
              "table": table, "router_picks": picks, "rows": rows}
    write_report(result, markdown(table), args.json)
    print("router picks:", json.dumps(picks, indent=1))
    if args.weights_out:
        router = Router(train_arms(names, rows, texts, list(range(len(prompts))), costs), verify_wall_seconds=verify[args.window])
        weights = router.to_json() | {"meta": {"trained": time.strftime("%Y-%m-%d"), "prompts": len(prompts),
                                               "window": args.window, "tokens": args.tokens,
                                               "source": "edgespec bench drafters --weights-out"}}
        Path(args.weights_out).write_text(json.dumps(weights, indent=1) + "\n")
        print(f"wrote {args.weights_out}")
    return 0


def markdown(table: dict) -> str:
    lines = ["| drafter | " + " | ".join(f"{c} acc / tok/round / tok/s" for c in [*CATEGORIES, "all"]) + " |",
             "|---|" + "---|" * (len(CATEGORIES) + 1)]
    for name, by_cat in table.items():
        cells = [f"{s['acceptance']:.1%} / {s['tokens_per_round']:.2f} / {s['tokens_per_second']:.2f}"
                 for s in (by_cat[c] for c in [*CATEGORIES, "all"])]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
