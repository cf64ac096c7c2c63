"""`edgespec bench llamacpp`: edgespec on llama.cpp against llama.cpp itself, on this CPU, one run.

    edgespec bench llamacpp --json out.json --md out.md [--prompts 6] [--tokens 64] [--rtts 0,20]

Anchors (llama.cpp's own tools, built from the sources the pinned llama-cpp-python vendors:
bench/llamacpp_tools.py): `llama-bench` target-only decode speed on 2 threads and on one core, the cost
curve c(n) of one pass over n tokens, the draft's speed, and `llama-speculative-simple` (llama.cpp's own
speculative decoding with the same draft GGUF) at a few draft lengths, as a user would tune it.

edgespec on llama.cpp (verifier and drafter `--backend llamacpp`, the packaged GGUF files as shipped):
1. shared cores, loopback: target-only serving through edgespec (window 0), the adaptive window, fixed k;
2. edge and cloud on separate cores (verifier pinned to core 1 with one thread; drafter and coordinator to
   core 0), over an emulated link at each RTT: adaptive and fixed windows, against llama.cpp target-only on
   the cloud core alone.
Every greedy output is compared with llama.cpp target-only greedy on the same backend (one token per
llama_decode, in this process, in a context of the verifiers' settings); divergences are counted with the
first position and the target's top-2 logit margin there. Speed is decode tokens/s (generation time minus
the verifier prefill), as ratios.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import re
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from harness.cluster import LocalCluster
from bench.llamacpp_tools import ensure_tools
from bench.prompts import PROMPTS
from bench.report import progress, write_report
from edgespec.loop.session import acceptance, latency_ms
from harness.link import LinkProfile
from edge_client.client import collect
from edgespec.control.goodput import best_rate

log = logging.getLogger("edgespec.bench_llamacpp")
# The verifiers' llama.cpp context here and in the reference: llama.cpp's numerics depend on the context's
# settings (a context of 4096 cells and 2 sequences diverged from one of 16384 and 64 at near-ties).
CTX_TOKENS, MAX_SEQUENCES = 16384, 64


# -- anchors: llama.cpp's own tools ----------------------------------------------------------------------

def llama_bench(tool: Path, model: Path, threads: int, cpus: str | None, prompt_sizes: str = "", tokens: int = 64,
                repetitions: int = 3) -> list[dict]:
    pin = ["taskset", "-c", cpus] if cpus else []
    args = [*pin, str(tool), "-m", str(model), "-t", str(threads), "-r", str(repetitions), "-o", "json"]
    args += ["-p", prompt_sizes, "-n", "0"] if prompt_sizes else ["-p", "0", "-n", str(tokens)]
    out = subprocess.run(args, capture_output=True, text=True, check=True, timeout=1800).stdout
    return json.loads(out)


def decode_speed(rows: list[dict]) -> float:
    return float(rows[0]["avg_ts"])


def cost_curve(rows: list[dict]) -> dict[int, float]:
    """c(n): seconds of one pass over n tokens relative to one token (from llama-bench prompt runs)."""
    seconds = {int(r["n_prompt"]): int(r["n_prompt"]) / float(r["avg_ts"]) for r in rows}
    return {n: s / seconds[1] for n, s in sorted(seconds.items())}


def speculative_simple(tool: Path, target: Path, draft: Path, prompt_text: str, tokens: int, n_max: int,
                       threads: int) -> dict:
    args = [str(tool), "-m", str(target), "-md", str(draft), "--spec-type", "draft-simple", "--spec-draft-n-max",
            str(n_max), "-n", str(tokens), "--temp", "0", "-t", str(threads), "-c", "4096", "-p", prompt_text]
    done = subprocess.run(args, capture_output=True, text=True, timeout=1800)
    text = done.stdout + done.stderr
    speed = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s", text)
    accept = re.search(r"accept\s+=\s+([\d.]+)%", text)
    if done.returncode != 0 or speed is None:
        raise RuntimeError(f"llama-speculative-simple failed ({done.returncode}):\n{text[-2000:]}")
    return {"tokens": int(speed[1]), "seconds": float(speed[2]), "tokens_per_second": float(speed[3]),
            "acceptance": float(accept[1]) / 100 if accept else None}


# -- edgespec on llama.cpp --------------------------------------------------------------------------------

async def run_edgespec(address: str, prompt: str, tokens: int, window: int) -> tuple[list[int], object]:
    run = await collect(address, prompt, tokens, window, chat=True, timeout_seconds=1800)
    return run.tokens, run.stats


def references(prompts: list[list[int]], tokens: int, threads: int) -> list[dict]:
    """llama.cpp target-only greedy on the same backend (greedy_runs), llama.cpp's default settings."""
    from edgespec.backends import llamacpp

    lm = llamacpp.load("target", threads=threads, ctx_tokens=CTX_TOKENS, max_sequences=MAX_SEQUENCES)
    try:
        return greedy_runs(lm, prompts, tokens)
    finally:
        lm.close()


def greedy_runs(lm, prompts: list[list[int]], tokens: int) -> list[dict]:
    """Target-only greedy on a loaded llama.cpp model, one token per decode, each prompt in a state of its own:
    the tokens, the top-2 logit margins and the decode seconds (after the prompt's prefill: the engine's own
    speed on these prompts, through no service)."""
    eos, out = set(lm.eos_ids()), []
    for prompt in prompts:
        state, seq, generated, margins = lm.new_state(), list(prompt), [], []
        started = None
        for _ in range(tokens):
            row = lm.logits_rows(state, seq, 1)[0]
            started = started or time.perf_counter()   # the prefill is not decoding
            top2 = np.partition(row, -2)[-2:]
            token = int(np.argmax(row))
            generated.append(token)
            margins.append(float(top2[1] - top2[0]))
            if token in eos:
                break
            seq.append(token)
        out.append({"tokens": generated, "margins": margins, "decode_seconds": time.perf_counter() - started})
        del state
    return out


def compare(tokens: list[int], reference: dict) -> dict:
    expected = reference["tokens"]
    if tokens == expected:
        return {"identical": True}
    first = next(i for i, (a, b) in enumerate(zip(tokens + [-1], expected + [-2])) if a != b)
    margin = reference["margins"][first] if first < len(reference["margins"]) else None
    return {"identical": False, "first_divergence": first, "reference_top2_margin": margin}


def run_mode(cluster: LocalCluster, label: str, texts: list[str], refs: list[dict], tokens: int, window: int,
             bar=None, keep_tokens: bool = False, **extra) -> list[dict]:
    rows = []
    for index, (text, ref) in enumerate(zip(texts, refs)):
        got, stats = asyncio.run(run_edgespec(cluster.coordinator.address, text, tokens, window))
        if bar is not None:
            bar.update(1)
        decode = max(1e-9, stats.seconds - stats.prefill_seconds)
        rows.append({"mode": label, "prompt": index, "new_tokens": len(got), "decode_seconds": decode,
                     "tokens_per_second": len(got) / decode, "acceptance": stats.acceptance_rate,
                     "tokens_per_round": stats.mean_accepted_length, "drafted": stats.drafted_tokens,
                     "accepted": stats.accepted_tokens,
                     **compare(got, ref), **extra, **({"tokens": got} if keep_tokens else {})})
        log.info("%s prompt %d: %.2f tok/s, acceptance %.2f, identical %s", label, index,
                 rows[-1]["tokens_per_second"], stats.acceptance_rate, rows[-1]["identical"])
    return rows


def aggregate(rows: list[dict]) -> dict:
    tokens = sum(r["new_tokens"] for r in rows)
    seconds = sum(r["decode_seconds"] for r in rows)
    tpot = [r["decode_seconds"] / r["new_tokens"] for r in rows if r["new_tokens"]]   # per request, as vLLM reports
    drafted, accepted = sum(r["drafted"] for r in rows), sum(r["accepted"] for r in rows)
    return {"tokens_per_second": tokens / seconds, "identical": sum(r["identical"] for r in rows),
            **latency_ms("tpot", tpot),
            "prompts": len(rows), "acceptance": acceptance(accepted, drafted) if drafted else None}


def ceiling(curve: dict[int, float], draft_per_step: float, alpha: float, rtt_steps: float, max_k: int = 8) -> float:
    """Best E(k) / (k * t_draft + RTT + c(k + 1)) in target steps, drafting on other cores (blocking round): the
    goodput model (edgespec.control.goodput) with acceptance ``alpha`` at every position, over the windows whose
    pass ``curve`` measured (c(1) = 1)."""
    top = 0
    while top < max_k and top + 2 in curve:
        top += 1
    return best_rate([alpha] * top, draft_per_step, rtt_steps, lambda k: curve[k + 1], top)[1]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="edgespec bench llamacpp", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=6, help="bench prompts used, spread over code/QA/chat (default %(default)s)")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per generation (default %(default)s)")
    parser.add_argument("--rtts", default="0,20", help="link RTTs for the separate-cores runs, ms (default %(default)s)")
    parser.add_argument("--windows", default="1,2,4", help="fixed windows to run beside the adaptive one (default %(default)s)")
    parser.add_argument("--spec-draft-n", default="2,4,6", help="llama-speculative-simple draft lengths (default %(default)s)")
    parser.add_argument("--json", default=None, help="write every row and the summary here")
    parser.add_argument("--md", default=None, help="write the markdown tables here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if (os.cpu_count() or 1) < 2:
        parser.error("this benchmark pins edge and cloud to separate cores: it needs at least 2")

    from edgespec.backends.assets import ensure_gguf
    from edgespec.backends.tokenizer import load_tokenizer

    target, draft = ensure_gguf("target"), ensure_gguf("draft")
    tokenizer = load_tokenizer("draft")
    picked = [PROMPTS[i] for i in np.linspace(0, len(PROMPTS) - 1, args.prompts).round().astype(int)]
    texts = [text for _, text in picked]
    prompt_ids = [tokenizer.encode(text, True) for text in texts]
    windows = [int(w) for w in args.windows.split(",") if w]
    result: dict = {"machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                                "flags": _cpu_flags()}, "args": vars(args), "rows": []}

    tools = ensure_tools()
    anchors = {
        "target_tps_2threads": decode_speed(llama_bench(tools["llama-bench"], target, 2, None, tokens=args.tokens)),
        "target_tps_1core": decode_speed(llama_bench(tools["llama-bench"], target, 1, "1", tokens=args.tokens)),
        "draft_tps_2threads": decode_speed(llama_bench(tools["llama-bench"], draft, 2, None, tokens=args.tokens)),
        "draft_tps_1core": decode_speed(llama_bench(tools["llama-bench"], draft, 1, "0", tokens=args.tokens)),
        "cost_curve_2threads": cost_curve(llama_bench(tools["llama-bench"], target, 2, None, "1,2,3,4,5,8,16")),
        "cost_curve_1core": cost_curve(llama_bench(tools["llama-bench"], target, 1, "1", "1,2,3,4,5,8")),
    }
    hf = tokenizer.hf
    templated = [hf.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False)
                 for t in texts]
    spec = {}
    for n_max in (int(n) for n in args.spec_draft_n.split(",") if n):
        runs = [speculative_simple(tools["llama-speculative-simple"], target, draft, t, args.tokens, n_max, 2)
                for t in templated]
        spec[n_max] = {"tokens_per_second": sum(r["tokens"] for r in runs) / sum(r["seconds"] for r in runs),
                       "acceptance": float(np.mean([r["acceptance"] for r in runs if r["acceptance"] is not None]))}
        log.info("llama-speculative-simple n_max %d: %.2f tok/s, acceptance %.2f", n_max,
                 spec[n_max]["tokens_per_second"], spec[n_max]["acceptance"])
    anchors["speculative_simple"] = spec
    result["anchors"] = anchors
    log.info("anchors: %s", json.dumps({k: v for k, v in anchors.items() if "curve" not in k}))

    refs = references(prompt_ids, args.tokens, threads=2)
    # the first token comes with the prefill, so len - 1 tokens were decoded in decode_seconds
    anchors["target_tps_same_prompts_2threads"] = (sum(len(r["tokens"]) - 1 for r in refs)
                                                   / sum(r["decode_seconds"] for r in refs))
    rtts = [float(r) for r in args.rtts.split(",") if r]
    generations = len(texts) * (2 + len(windows) + len(rtts) * (1 + len(windows)))
    with tempfile.TemporaryDirectory(prefix="bench-llamacpp-") as logs, \
            progress(generations, "bench-llamacpp (edgespec rows)") as bar:
        logs = Path(logs)
        llama = ["--backend", "llamacpp"]   # the services' default context for their --exact mode
        with LocalCluster(logs / "shared", verifier_args=[*llama, "--model", "target", "--threads", "2"],
                          drafter_args=[*llama, "--model", "draft", "--threads", "2"],
                          coordinator_args=["--tokenizer", "draft"]) as cluster:
            rows = run_mode(cluster, "shared k=0", texts, refs, args.tokens, 0, bar=bar, cores="shared", rtt_ms=0)
            rows += run_mode(cluster, "shared auto", texts, refs, args.tokens, -1, bar=bar, cores="shared", rtt_ms=0)
            for k in windows:
                rows += run_mode(cluster, f"shared k={k}", texts, refs, args.tokens, k, bar=bar, cores="shared", rtt_ms=0)
            rss = _rss_mib(cluster.verifier.process.pid)
        for rtt in rtts:
            with LocalCluster(logs / f"split-{rtt:g}", verifier_args=[*llama, "--model", "target", "--threads", "1"],
                              drafter_args=[*llama, "--model", "draft", "--threads", "1"],
                              coordinator_args=["--tokenizer", "draft"], verifier_cpus="1", edge_cpus="0",
                              link=LinkProfile(rtt_ms=rtt) if rtt else None) as cluster:
                rows += run_mode(cluster, f"split rtt={rtt:g} auto", texts, refs, args.tokens, -1, bar=bar, cores="split",
                                 rtt_ms=rtt)
                for k in windows:
                    rows += run_mode(cluster, f"split rtt={rtt:g} k={k}", texts, refs, args.tokens, k,
                                     bar=bar, cores="split", rtt_ms=rtt)
    result["rows"] = rows
    result["verifier_rss_mib"] = rss
    result["summary"] = summarise(rows, anchors, args)
    write_report(result, markdown(result), args.json, args.md)


def summarise(rows: list[dict], anchors: dict, args) -> dict:
    modes: dict[str, list[dict]] = {}
    for row in rows:
        modes.setdefault(row["mode"], []).append(row)
    out = {}
    best_spec = max(v["tokens_per_second"] for v in anchors["speculative_simple"].values())
    for mode, mode_rows in modes.items():
        agg = aggregate(mode_rows)
        split = mode_rows[0]["cores"] == "split"
        base = anchors["target_tps_1core" if split else "target_tps_2threads"]
        agg["vs_llamacpp_target_only"] = agg["tokens_per_second"] / base
        agg["vs_llamacpp_speculative"] = None if split else agg["tokens_per_second"] / best_spec
        if not split and "target_tps_same_prompts_2threads" in anchors:
            agg["vs_same_prompts_in_process"] = agg["tokens_per_second"] / anchors["target_tps_same_prompts_2threads"]
        if split:
            curve, step = anchors["cost_curve_1core"], 1.0 / base
            alpha = agg["acceptance"] or 0.0
            agg["limit"] = ceiling(curve, (1.0 / anchors["draft_tps_1core"]) / step, alpha,
                                   mode_rows[0]["rtt_ms"] / 1000 / step)
        out[mode] = agg
    return out


def markdown(result: dict) -> str:
    a = result["anchors"]
    lines = [f"Machine: {result['machine']['cpu']}, {result['machine']['cores']} cores, flags {result['machine']['flags']}",
             "", "| llama.cpp anchor | tokens/s |", "|---|---|",
             f"| target-only, 2 threads | {a['target_tps_2threads']:.1f} |",
             f"| target-only, one core | {a['target_tps_1core']:.1f} |",
             f"| target-only on the bench prompts, 2 threads, in process (llama-cpp-python, one token per decode) "
             f"| {a.get('target_tps_same_prompts_2threads', float('nan')):.1f} |",
             f"| draft alone, 2 threads / one core | {a['draft_tps_2threads']:.1f} / {a['draft_tps_1core']:.1f} |"]
    for n, v in a["speculative_simple"].items():
        lines.append(f"| llama-speculative-simple, draft n_max {n} | {v['tokens_per_second']:.1f} "
                     f"(acceptance {v['acceptance']:.0%}) |")
    lines += ["", "c(n), one pass over n tokens / one token: 2 threads "
              + ", ".join(f"{n}: {c:.2f}" for n, c in a["cost_curve_2threads"].items()) + "; one core "
              + ", ".join(f"{n}: {c:.2f}" for n, c in a["cost_curve_1core"].items()), "",
              "| edgespec on llama.cpp | tokens/s | vs llama.cpp target-only | vs in process, same prompts "
              "| vs llama.cpp speculative | acceptance | TPOT p50 / p99 ms | identical greedy | limit |",
              "|---|---|---|---|---|---|---|---|---|"]
    for mode, s in result["summary"].items():
        spec = "" if s["vs_llamacpp_speculative"] is None else f"{s['vs_llamacpp_speculative']:.2f}x"
        acc = "" if s["acceptance"] is None else f"{s['acceptance']:.0%}"
        limit = f"{s['limit']:.2f}x" if "limit" in s else ""
        same = f"{s['vs_same_prompts_in_process']:.2f}x" if "vs_same_prompts_in_process" in s else ""
        tpot = f"{s['tpot_p50_ms']:.0f} / {s['tpot_p99_ms']:.0f}" if "tpot_p50_ms" in s else ""
        lines.append(f"| {mode} | {s['tokens_per_second']:.1f} | {s['vs_llamacpp_target_only']:.2f}x | {same} | {spec} | {acc} "
                     f"| {tpot} | {s['identical']}/{s['prompts']} | {limit} |")
    lines += ["", f"Verifier resident memory (llama.cpp, default target): {result['verifier_rss_mib']:.0f} MiB"]
    return "\n".join(lines)


def _cpu_flags() -> str:
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return ""
    return " ".join(f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile") if f" {f}" in flags)


def _rss_mib(pid: int) -> float:
    from bench.report import process_memory_mib
    return process_memory_mib(pid)["rss_mib"]


if __name__ == "__main__":
    main()
