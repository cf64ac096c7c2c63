"""`edgespec bench vllm`: the verifier on vLLM against vLLM itself and the torch verifier, on this machine, one run.

    bash scripts/vllm_env.sh        # the vLLM environment (.venv-vllm), once
    edgespec bench vllm --json out.json --md out.md [--prompts 6] [--tokens 64]

Anchors, run in the vLLM environment (bench/vllm_reference.py): vLLM target-only greedy on the bench prompts
(the engine core in process, as the verifier runs it, and in processes of its own, vLLM's default), and
vLLM's own speculative decoding with the same draft model (method draft_model) at a few draft lengths, as a
user would tune it. Decode speed leaves each prompt's prefill out (timed alone first).

edgespec, all services on the same cores, loopback: the verifier on vLLM (the default target, --dtype of the
anchors) with the edge drafter (the default draft, torch int8), at windows 0 (target-only serving through
edgespec), auto and fixed k; then the torch verifier (float32, the bit-exact reference) at the windows of
--torch-windows. Each verifier's forward profile c(n) (its Info, measured at its start) is reported. Every vLLM
row's greedy output is compared with vLLM target-only; torch rows with the torch verifier's window-0 output.
"""
from __future__ import annotations

import argparse
import logging
import os
import platform
import shlex
import tempfile
from pathlib import Path

import grpc
import numpy as np

from bench.bench_llamacpp import aggregate, run_mode
from harness.cluster import LocalCluster
from bench.prompts import PROMPTS
from bench.report import progress, write_report
from bench.vllm_jobs import VLLM_PYTHON, run as vllm_run
from harness.link import LinkProfile

log = logging.getLogger("edgespec.bench_vllm")


def anchor(model: Path, dtype: str, prompts: list[list[int]], tokens: int, speculative: dict | None = None,
           compile: bool = False, in_process: bool = True) -> dict:
    """vLLM alone on the prompts: outputs, decode tokens/s (the first token comes with the prefill). In process:
    the engine core in the caller's process, as the vLLM verifier runs it; else vLLM's default (`vllm serve`),
    the engine core and its worker in processes of their own."""
    job = dict(model=str(model), dtype=dtype, prompts=prompts, max_new=tokens, decode_only=True,
               max_model_len=4096, kv_cache_gb=2, speculative=speculative, enforce_eager=not compile,
               in_process=in_process)
    out = vllm_run("bench.vllm_reference", job, timeout=3600)
    decode = sum(s - p for s, p in zip(out["seconds"], out["prefill_seconds"]))
    return {"outputs": out["outputs"], "tokens_per_second": sum(len(o) - 1 for o in out["outputs"]) / decode,
            "start_seconds": out["start_seconds"]}


def forward_profile(address: str) -> list[float]:
    from edgespec.v1 import verifier_pb2, verifier_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        return list(verifier_pb2_grpc.VerifierStub(channel).Info(verifier_pb2.InfoRequest(), timeout=30).forward_seconds)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="edgespec bench vllm", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=6, help="bench prompts used, spread over code/QA/chat (default %(default)s)")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per generation (default %(default)s)")
    parser.add_argument("--target", default="target", help="the target: a packaged name or a Hugging Face model "
                        "directory or id (default %(default)s)")
    parser.add_argument("--draft", default="draft", help="the draft model, same tokenizer (default %(default)s)")
    parser.add_argument("--dtype", default="bfloat16", help="vLLM's dtype, anchors and verifier (default %(default)s)")
    parser.add_argument("--rtts", default="0", help="emulated edge-cloud RTTs for the vLLM verifier rows, ms "
                        "(default %(default)s)")
    parser.add_argument("--compile", action="store_true", help="vLLM with torch.compile and CUDA graphs (anchors "
                        "and verifier's --vllm-compile): what a GPU deployment runs; off = eager, as on a CPU")
    parser.add_argument("--verifier-args", default="", help="more vLLM verifier flags, e.g. '--vllm-compile "
                        "--gpu-memory-utilization 0.8' on a GPU")
    parser.add_argument("--windows", default="3", help="fixed windows beside 0 and auto, vLLM verifier (default %(default)s)")
    parser.add_argument("--torch-windows", default="0,auto",
                        help="windows for the torch verifier rows (float32 target); '' = none (default %(default)s)")
    parser.add_argument("--spec-tokens", default="2,4", help="vLLM's own speculative decoding, draft lengths (default %(default)s)")
    parser.add_argument("--json", default=None, help="write every row and the summary here")
    parser.add_argument("--md", default=None, help="write the markdown tables here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not VLLM_PYTHON.exists():
        parser.error(f"{VLLM_PYTHON} is missing: run `bash scripts/vllm_env.sh` first")

    from edgespec.backends.registry import model_path
    from edgespec.backends.tokenizer import load_tokenizer

    target, draft = model_path(args.target), model_path(args.draft)
    tokenizer = load_tokenizer(args.draft)
    picked = [PROMPTS[i] for i in np.linspace(0, len(PROMPTS) - 1, args.prompts).round().astype(int)]
    texts = [text for _, text in picked]
    prompt_ids = [tokenizer.encode(text, True) for text in texts]
    windows = [int(w) for w in args.windows.split(",") if w]
    torch_windows = [-1 if w == "auto" else int(w) for w in args.torch_windows.split(",") if w]
    result: dict = {"machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
                    "args": vars(args)}

    anchors = {"target_only": anchor(target, args.dtype, prompt_ids, args.tokens, compile=args.compile),
               "target_only_multiprocess": anchor(target, args.dtype, prompt_ids, args.tokens, compile=args.compile,
                                                  in_process=False)}
    for name in ("target_only", "target_only_multiprocess"):
        log.info("vLLM %s: %.2f tok/s (engine start %.0f s)", name, anchors[name]["tokens_per_second"],
                 anchors[name]["start_seconds"])
    anchors["target_only_multiprocess"]["identical"] = sum(
        a == b for a, b in zip(anchors["target_only_multiprocess"]["outputs"], anchors["target_only"]["outputs"]))
    for n in (int(n) for n in args.spec_tokens.split(",") if n):
        spec = anchor(target, args.dtype, prompt_ids, args.tokens,
                      {"method": "draft_model", "model": str(draft), "num_speculative_tokens": n}, args.compile)
        spec["identical"] = sum(a == b for a, b in zip(spec["outputs"], anchors["target_only"]["outputs"]))
        anchors[f"speculative n={n}"] = spec
        log.info("vLLM speculative decoding, draft model, n=%d: %.2f tok/s", n, spec["tokens_per_second"])
    refs = [{"tokens": out, "margins": []} for out in anchors["target_only"]["outputs"]]

    rtts = [float(r) for r in args.rtts.split(",") if r]
    modes = len(texts) * (len(rtts) * (2 + len(windows)) + len(torch_windows))
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-vllm-") as logs, progress(modes, "bench-vllm (edgespec rows)") as bar:
        logs = Path(logs)
        vllm = ["--backend", "vllm", "--model", str(target), "--dtype", args.dtype, "--max-window", "8",
                "--vllm-kv-cache-gb", "2", *(["--vllm-compile"] if args.compile else []),
                *shlex.split(args.verifier_args)]
        for rtt in rtts:
            with LocalCluster(logs / f"vllm-{rtt:g}", verifier_args=vllm, verifier_python=str(VLLM_PYTHON),
                              drafter_args=["--model", str(draft)], coordinator_args=["--tokenizer", args.draft],
                              link=LinkProfile(rtt_ms=rtt) if rtt else None) as cluster:
                result["vllm_forward_seconds"] = forward_profile(cluster.verifier.address)
                where = f" rtt={rtt:g}" if len(rtts) > 1 or rtt else ""
                for label, k in [("k=0", 0), ("auto", -1), *((f"k={k}", k) for k in windows)]:
                    rows += run_mode(cluster, f"vLLM verifier{where} {label}", texts, refs, args.tokens, k, bar=bar,
                                     verifier="vllm", rtt_ms=rtt)
        if torch_windows:
            with LocalCluster(logs / "torch", verifier_args=["--model", str(target), "--max-window", "8"],
                              drafter_args=["--model", str(draft)], coordinator_args=["--tokenizer", args.draft]) as cluster:
                result["torch_forward_seconds"] = forward_profile(cluster.verifier.address)
                torch_refs = None
                for k in torch_windows:
                    label = "auto" if k == -1 else f"k={k}"
                    got = run_mode(cluster, f"torch verifier {label}", texts, torch_refs or refs, args.tokens, k,
                                   bar=bar, keep_tokens=True, verifier="torch")
                    if torch_refs is None and k == 0:   # the torch rows are compared with torch target-only
                        torch_refs = [{"tokens": r["tokens"], "margins": []} for r in got]
                        for row in got:
                            row.update(identical=True)
                            row.pop("first_divergence", None), row.pop("reference_top2_margin", None)
                    rows += got
    for row in rows:
        row.pop("tokens", None)
    result["anchors"] = {name: {k: v for k, v in a.items() if k != "outputs"} for name, a in anchors.items()}
    result["rows"] = rows
    result["summary"] = summarise(rows, result["anchors"])
    write_report(result, markdown(result), args.json, args.md)


def summarise(rows: list[dict], anchors: dict) -> dict:
    modes: dict[str, list[dict]] = {}
    for row in rows:
        modes.setdefault(row["mode"], []).append(row)
    base = anchors["target_only"]["tokens_per_second"]
    best_spec = max((a["tokens_per_second"] for name, a in anchors.items() if name.startswith("speculative")),
                    default=None)
    out = {}
    for mode, mode_rows in modes.items():
        agg = aggregate(mode_rows)
        agg["vs_vllm_target_only"] = agg["tokens_per_second"] / base
        agg["vs_vllm_speculative"] = agg["tokens_per_second"] / best_spec if best_spec else None
        agg["tokens_per_round"] = float(np.mean([r["tokens_per_round"] for r in mode_rows]))
        out[mode] = agg
    return out


def markdown(result: dict) -> str:
    a = result["anchors"]
    base = a["target_only"]["tokens_per_second"]
    lines = [f"Machine: {result['machine']['cpu']}, {result['machine']['cores']} cores; vLLM dtype "
             f"{result['args']['dtype']}", "", "| vLLM alone | tokens/s | vs vLLM target-only | identical greedy |",
             "|---|---|---|---|", f"| target-only, engine core in process (as the verifier runs it) | {base:.2f} "
             f"| 1.00x | reference |"]
    multi = a.get("target_only_multiprocess")
    if multi:
        lines.append(f"| target-only, engine core and worker in their own processes (vLLM's default) "
                     f"| {multi['tokens_per_second']:.2f} | {multi['tokens_per_second'] / base:.2f}x "
                     f"| {multi['identical']}/{result['args']['prompts']} |")
    for name, v in a.items():
        if name.startswith("speculative"):
            lines.append(f"| its speculative decoding, draft model, {name.split()[1]} | {v['tokens_per_second']:.2f} "
                         f"| {v['tokens_per_second'] / base:.2f}x | {v['identical']}/{result['args']['prompts']} |")
    for who in ("vllm", "torch"):
        curve = result.get(f"{who}_forward_seconds")
        if curve:
            lines.append("")
            lines.append(f"c(n) of the {who} verifier (one pass over n tokens / one token, its Info): "
                         + ", ".join(f"{n}: {c / curve[0]:.2f}" for n, c in enumerate(curve, 1))
                         + f"; one token {1000 * curve[0]:.0f} ms")
    lines += ["", "| edgespec | tokens/s | vs vLLM target-only | vs vLLM speculative | acceptance | tokens/round "
              "| TPOT p50 / p99 ms | identical greedy |", "|---|---|---|---|---|---|---|---|"]
    for mode, s in result["summary"].items():
        spec = "" if s["vs_vllm_speculative"] is None else f"{s['vs_vllm_speculative']:.2f}x"
        acc = "" if s["acceptance"] is None else f"{s['acceptance']:.0%}"
        lines.append(f"| {mode} | {s['tokens_per_second']:.2f} | {s['vs_vllm_target_only']:.2f}x | {spec} | {acc} "
                     f"| {s['tokens_per_round']:.2f} | {s['tpot_p50_ms']:.0f} / {s['tpot_p99_ms']:.0f} "
                     f"| {s['identical']}/{s['prompts']} |")
    lines += ["", "vLLM rows are compared with vLLM target-only greedy; torch rows with the torch verifier's own "
              "window-0 output (float32 and bfloat16 differ)."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
