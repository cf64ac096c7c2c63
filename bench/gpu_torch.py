"""`edgespec bench gpu-torch`: edgespec's torch verifier on a GPU, measured against what a user runs there.

    edgespec bench gpu-torch --model DIR [--dtype float32] [--tokens 128] [--per-category 2] [--out DIR]

Made for a GPU host that has PyTorch and transformers but no package registry and no vLLM (bench/gpu_torch.sh
prepares it). Parts, each written to --out as it ends (nothing is lost if a later part fails):

1. costs.json: c(n), the seconds of one verifier forward feeding n tokens after a context (the verifier's own
   start-up profile, edgespec.engines.profile.forward_profile, through TorchCausalLM's batched path), n = 1..17,
   in bfloat16, for the served model (--model) and for random-weight models of the default target's
   architecture (Qwen2.5-1.5B) and of a 7B one (Qwen2.5-7B): the cost of verifying k = n - 1 drafted tokens, in
   steps (c(n) / c(1)). The cost does not depend on the weights. Beside it B sessions in one forward
   (B = 1, 4, 16; n = 1 and 5).
2. numerics.json: for the served model in bfloat16 and float32, the logits of one forward over n rows against
   n forwards of one row (the same prefix and tokens): bit-identical or not, the largest difference, and
   whether every row's argmax agrees. Greedy speculation is exact where they agree.
3. serve.json: the real services on loopback (verifier: torch on the GPU in --dtype; drafter: the model-free
   n-gram backend; coordinator: its default adaptive window with free drafts), one prompt at a time, systems
   interleaved prompt by prompt: edgespec at window 0 (target-only through the services), edgespec's default,
   transformers' own greedy generate (target-only, what a PyTorch user runs) and its prompt-lookup decoding
   (prompt_lookup_num_tokens=10), in the same --dtype. TTFT and the decode rate apart, the outputs compared
   with window 0's.

Prompts: Spec-Bench first turns (--per-category of each of its 13 categories), our code edits and the demo's
two prompts, through the model's chat template. Greedy; each stops at EOS or --tokens.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import platform
import time
from pathlib import Path

log = logging.getLogger("bench.gpu_torch")

# Architectures timed with random weights (the cost of a forward does not depend on the weights).
QWEN25_1_5B = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                   num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, tie_word_embeddings=True)
QWEN25_7B = dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                 num_key_value_heads=4, vocab_size=152064, max_position_embeddings=32768, tie_word_embeddings=False)


def random_lm(shape: dict, name: str, device: str):
    """A random-weight Qwen2 model of ``shape`` in bfloat16 on ``device``, as TorchCausalLM."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from edgespec.backends.torch_lm import TorchCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(Qwen2Config(**shape), dtype=torch.bfloat16)
    return TorchCausalLM(model, name, torch.device(device))


def batched_cost(lm, sessions: int, n: int, context: int = 512, repeats: int = 3) -> float:
    """Seconds of one forward feeding ``n`` tokens to each of ``sessions`` sessions (logits_rows_batch)."""
    prompt = [(11 + 7 * i) % lm.vocab_size for i in range(context)]
    states = [lm.new_state() for _ in range(sessions)]
    for state in states:
        lm.prefill(state, prompt)
    seq = prompt + [prompt[(3 * i) % context] for i in range(n - 1)]
    times = []
    for _ in range(repeats + 1):
        for state in states:
            lm.crop(state, context - 1)
        started = time.perf_counter()
        lm.logits_rows_batch(states, [seq] * sessions, [n] * sessions)
        times.append(time.perf_counter() - started)
    return min(times[1:])


def costs(lms: dict, largest: int, context: int) -> dict:
    from edgespec.engines.profile import forward_profile

    out = {}
    for name, lm in lms.items():
        curve = forward_profile(lm, largest, context=context, repeats=3)
        batched = {f"B={b},n={n}": batched_cost(lm, b, n, context) for b in (1, 4, 16) for n in (1, 5)}
        out[name] = {"c": {n: curve[n] for n in curve}, "steps": {n: curve[n] / curve[1] for n in curve},
                     "batched": batched}
        log.info("%s: c(1) %.2f ms, steps by n: %s; batched %s", name, 1000 * curve[1],
                 " ".join(f"{n}:{curve[n] / curve[1]:.2f}" for n in curve),
                 " ".join(f"{k}:{1000 * v:.2f}ms" for k, v in batched.items()))
    return out


def numerics(model_dir: str, device: str, largest: int, context: int = 64) -> dict:
    """One forward over n rows against n forwards of one row, per dtype and n."""
    import numpy as np
    import torch

    from edgespec.backends.torch_lm import TorchCausalLM

    out = {}
    for dtype in ("bfloat16", "float32"):
        lm = TorchCausalLM.from_pretrained(model_dir, device=device, dtype=dtype)
        prompt = [(11 + 7 * i) % lm.vocab_size for i in range(context)]
        rows = {}
        for n in range(2, largest + 1):
            seq = prompt + [prompt[(5 * i + 3) % context] for i in range(n - 1)]
            state = lm.new_state()
            lm.prefill(state, prompt)
            together = lm.logits_rows_batch([state], [seq], [n])[0]
            state = lm.new_state()      # target-only decoding: the same tokens fed one per forward
            lm.prefill(state, prompt)
            alone = np.stack([lm.logits_rows_batch([state], [seq[:context + i]], [1])[0][-1] for i in range(n)])
            rows[n] = {"identical": bool(np.array_equal(together, alone)),
                       "max_abs_diff": float(np.max(np.abs(together - alone))),
                       "argmax_agree": bool((together.argmax(-1) == alone.argmax(-1)).all())}
        out[dtype] = rows
        log.info("numerics %s: rows identical for n = %s; argmax agrees for n = %s", dtype,
                 [n for n, r in rows.items() if r["identical"]], [n for n, r in rows.items() if r["argmax_agree"]])
        del lm
    return out


async def _edgespec_one(address: str, prompt: str, tokens: int, window: int) -> dict:
    from edge_client.client import collect

    run = await collect(address, prompt, tokens, window, chat=True, timeout_seconds=600)
    stats = run.stats
    return {"tokens": run.tokens, "ttft": run.ttft, "decode_tps": run.decode_tps,
            "rounds": stats.rounds, "acceptance": stats.acceptance_rate,
            "tokens_per_round": stats.mean_accepted_length}


def _hf_one(model, prompt_ids: list[int], tokens: int, eos: list[int], lookup: int) -> dict:
    import torch

    ids = torch.tensor([prompt_ids], device=model.device)
    extra = {"prompt_lookup_num_tokens": lookup} if lookup else {}
    common = dict(do_sample=False, eos_token_id=eos, pad_token_id=eos[0], **extra)

    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)

    def timed(limit: int):
        sync()
        started = time.perf_counter()
        out = model.generate(ids, max_new_tokens=limit, **common)
        sync()
        return time.perf_counter() - started, out[0, len(prompt_ids):].tolist()

    ttft, _ = timed(1)
    total, out = timed(tokens)
    decode = (len(out) - 1) / (total - ttft) if len(out) > 1 and total > ttft else float("nan")
    return {"tokens": out, "ttft": ttft, "decode_tps": decode}


def serve(model_dir: str, device: str, dtype: str, prompts: list[tuple[str, str]], tokens: int, log_dir: Path) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from harness.cluster import LocalCluster
    from edgespec.backends.tokenizer import HFTokenizer

    tokenizer = HFTokenizer(model_dir)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(device).eval()
    eos = hf.generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos or [tokenizer.hf.eos_token_id])
    rows = []
    with LocalCluster(log_dir, verifier_args=["--model", model_dir, "--device", device, "--dtype", dtype],
                      drafter_args=["--backend", "ngram", "--vocab-size", str(hf.config.vocab_size)],
                      coordinator_args=["--tokenizer", model_dir]) as cluster:
        address = cluster.coordinator.address
        for warm in prompts[:2]:     # first calls pay one-time costs (CUDA kernels, caches)
            asyncio.run(_edgespec_one(address, warm[1], 16, 0))
            _hf_one(hf, tokenizer.encode(warm[1], chat=True), 16, eos, 0)
        for index, (category, prompt) in enumerate(prompts):
            ids = tokenizer.encode(prompt, chat=True)
            systems = [("edgespec-w0", lambda: asyncio.run(_edgespec_one(address, prompt, tokens, 0))),
                       ("edgespec", lambda: asyncio.run(_edgespec_one(address, prompt, tokens, -1))),
                       ("hf", lambda: _hf_one(hf, ids, tokens, eos, 0)),
                       ("hf-prompt-lookup", lambda: _hf_one(hf, ids, tokens, eos, 10))]
            if index % 2:
                systems.reverse()    # drift on the machine hits every system alike
            row = {"category": category, "prompt_tokens": len(ids)}
            for name, run in systems:
                row[name] = run()
            reference = row["edgespec-w0"]["tokens"]
            for name, _ in systems:
                row[name]["same_as_w0"] = row[name]["tokens"] == reference
            rows.append(row)
            log.info("%2d %-14s %s", index, category, "  ".join(
                f"{name} {row[name]['decode_tps']:.0f} tok/s{'' if row[name]['same_as_w0'] else ' (differs)'}"
                for name, _ in systems))
    return {"rows": rows, "summary": summary(rows)}


def summary(rows: list[dict]) -> dict:
    from bench.spec_bench import geomean as spec_geomean

    def geomean(values):   # a prompt whose decode rate is unmeasured (one token) is left out
        return spec_geomean([v for v in values if v == v and v > 0])

    names = ["edgespec-w0", "edgespec", "hf", "hf-prompt-lookup"]
    out = {}
    for name in names:
        out[name] = {
            "decode_vs_w0": geomean([r[name]["decode_tps"] / r["edgespec-w0"]["decode_tps"] for r in rows]),
            "decode_vs_hf": geomean([r[name]["decode_tps"] / r["hf"]["decode_tps"] for r in rows]),
            "ttft_median_ms": 1000 * sorted(r[name]["ttft"] for r in rows)[len(rows) // 2],
            "same_as_w0": sum(r[name]["same_as_w0"] for r in rows), "prompts": len(rows)}
    return out


def markdown(result: dict) -> str:
    lines = [f"# edgespec's torch verifier on {result.get('gpu', '?')}", ""]
    for name, part in result.get("costs", {}).items():
        steps = part["steps"]
        lines.append(f"- c(n) in steps, {name} (c(1) = {1000 * part['c'][1]:.2f} ms): " +
                     ", ".join(f"{n}: {s:.2f}" for n, s in steps.items()))
    for dtype, rows in result.get("numerics", {}).items():
        lines.append(f"- {dtype}: n rows in one forward bit-identical to one row at a time for n = "
                     f"{[n for n, r in rows.items() if r['identical']]}; argmax agrees for n = "
                     f"{[n for n, r in rows.items() if r['argmax_agree']]}")
    if "serve" in result:
        lines += ["", "| system | decode vs window 0 | decode vs HF generate | TTFT p50 ms | outputs = window 0 |",
                  "| --- | --- | --- | --- | --- |"]
        for name, s in result["serve"]["summary"].items():
            lines.append(f"| {name} | {s['decode_vs_w0']:.2f}x | {s['decode_vs_hf']:.2f}x | "
                         f"{s['ttft_median_ms']:.1f} | {s['same_as_w0']}/{s['prompts']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from bench.spec_bench import SPEC_BENCH, bench_prompts

    parser = argparse.ArgumentParser(prog="edgespec bench gpu-torch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="",
                        help="a Hugging Face model directory: the served target (numerics and serve need it)")
    parser.add_argument("--device", default="cuda", help="torch device (default %(default)s; cpu: a smoke run)")
    parser.add_argument("--tokens", type=int, default=128, help="new tokens per prompt at most (default %(default)s)")
    parser.add_argument("--per-category", type=int, default=2,
                        help="Spec-Bench questions per category (default %(default)s)")
    parser.add_argument("--dtype", default="float32", choices=["bfloat16", "float32"],
                        help="the served model's dtype in serve, the verifier's and transformers' (default %(default)s, "
                             "the torch verifier's: in bfloat16 on a GPU, windows change the greedy text)")
    parser.add_argument("--parts", default="costs,numerics,serve", help="which parts (default %(default)s)")
    parser.add_argument("--random-shapes", default="1.5b,7b",
                        help="random-weight architectures to time besides --model (default %(default)s; '' = none)")
    parser.add_argument("--out", type=Path, default=Path("bench-results/gpu-torch"), help="results folder")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    import torch

    from edgespec.backends.torch_lm import TorchCausalLM

    parts = set(args.parts.split(","))
    if parts - {"costs", "numerics", "serve"} or (not args.model and parts & {"numerics", "serve"}):
        parser.error(f"--parts takes costs, numerics and serve (numerics and serve need --model), got {args.parts!r}")
    shapes = {"1.5b": QWEN25_1_5B, "7b": QWEN25_7B}
    unknown = set(filter(None, args.random_shapes.split(","))) - set(shapes)
    if unknown:
        parser.error(f"--random-shapes takes {', '.join(shapes)} (or ''), got {', '.join(sorted(unknown))}")
    if args.model and not (Path(args.model) / "config.json").exists():
        parser.error(f"--model {args.model}: not a Hugging Face model directory (no config.json)")
    if args.tokens < 1 or args.per_category < 0:
        parser.error("--tokens must be at least 1 and --per-category at least 0")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("no CUDA device: this benchmark is for a GPU host (--device cpu for a smoke run)")
    args.out.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else platform.processor() or "cpu"
    result: dict = {"gpu": gpu, "torch": torch.__version__, "python": platform.python_version()}

    def save(name: str, value) -> None:
        result[name] = value
        (args.out / f"{name}.json").write_text(json.dumps(value, indent=1))
        (args.out / "summary.md").write_text(markdown(result))

    if "costs" in parts:
        lms = {"served": TorchCausalLM.from_pretrained(args.model, device=args.device, dtype="bfloat16")} \
            if args.model else {}
        for key in filter(None, args.random_shapes.split(",")):
            lms[f"qwen2.5-{key}-random"] = random_lm(shapes[key], f"qwen2.5-{key}", args.device)
        save("costs", costs(lms, 17, 512))
        del lms
    if "numerics" in parts:
        save("numerics", numerics(args.model, args.device, 12))
    if "serve" in parts:
        prompts = bench_prompts(SPEC_BENCH, args.per_category)
        save("serve", serve(args.model, args.device, args.dtype, prompts, args.tokens, args.out / "logs"))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
