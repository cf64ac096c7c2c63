"""`edgespec demo`: a local cluster on loopback with the default real pair.

Starts the verifier (Qwen2.5-Coder-1.5B-Instruct), the drafter
(Qwen2.5-Coder-0.5B-Instruct) and the coordinator as separate processes, streams a
speculative generation, then runs the same prompt target-only (window 0, through
the same verifier, so the target is loaded once) and prints both speeds.

Backends: `llamacpp` (default) runs the GGUF files as shipped in llama.cpp, the engine
people run these models with on a CPU: ~4x faster than float32 PyTorch here and 1.7 GB
for the target instead of 7 GB. On two CPUs its verifier runs one thread, so `--exact auto`
makes every window's rows what llama.cpp's one-token decodes compute: the output is
llama.cpp's own target-only greedy output with the settings the verifier logs
(docs/llamacpp-exactness.md). `torch` runs the pair dequantised to float32 in PyTorch,
the bit-exact reference (a few minutes of conversion on the first run). With llama.cpp on a machine of two or more CPUs the cluster is split as edge and
cloud would be: the verifier on the last CPUs, the drafter and coordinator on the
others, and target-only is that same verifier on its CPUs. Where drafting cannot pay
on this hardware (measured: with this pair on one core each it does not), the
window policy says so by choosing target-only rounds.
"""
from __future__ import annotations

import argparse
import asyncio
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import grpc

from edge_client.client import collect
from harness.cluster import REPO_ROOT, LocalCluster, ServiceFailed

# Two prompts, as users send them: one whose answer repeats the prompt (an edit: free drafts copy it), and one
# open-ended (nothing to copy: the floor, target-only speed).
GROUNDED_PROMPT = """Add type hints to this function. Reply with the whole function only.

def moving_average(values, window):
    if window <= 0:
        raise ValueError("window must be positive")
    averages = []
    total = 0.0
    for index, value in enumerate(values):
        total += value
        if index >= window:
            total -= values[index - window]
        if index >= window - 1:
            averages.append(total / window)
    return averages
"""
OPEN_PROMPT = "Write a Python function that checks whether a number is prime, with a docstring."
FLOOR = 0.98   # below this ratio to target-only, the demo says the floor failed


async def stream(address: str, prompt: str, max_new_tokens: int, window: int, echo: bool):
    def show(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()
    return await collect(address, prompt, max_new_tokens, window, show if echo else None, chat=True,
                         timeout_seconds=1800)


def cluster_layout(backend: str, quantize: str, one_host: bool = False) -> dict:
    """LocalCluster arguments: llama.cpp services split over the CPUs as edge and cloud (the first half of
    the CPUs for drafter and coordinator, the rest for the verifier: one each on two); torch services share
    the machine. ``one_host``: llama.cpp services as one machine serving runs them, the verifier on every CPU
    (exact, so its one-token decodes still run on one thread) and the drafter on one thread beside it: it only
    competes for a CPU while it drafts, which its cost model stops where drafting cannot pay."""
    if backend == "torch":
        return {"drafter_args": ["--quantize", quantize]}
    cpus = sorted(os.sched_getaffinity(0))
    llama = ["--backend", "llamacpp", "--max-sequences", "8"]   # the cells by --exact: 2048 a session, or shared
    if len(cpus) < 2:
        return {"verifier_args": llama, "drafter_args": llama}
    if one_host:
        return {"verifier_args": [*llama, "--threads", str(len(cpus)), "--exact", "on"],
                "drafter_args": [*llama, "--threads", "1"]}
    edge, cloud = cpus[:len(cpus) // 2], cpus[len(cpus) // 2:]
    return {"verifier_args": [*llama, "--threads", str(len(cloud))], "drafter_args": [*llama, "--threads", str(len(edge))],
            "verifier_cpus": ",".join(map(str, cloud)), "edge_cpus": ",".join(map(str, edge))}


def main() -> None:
    parser = argparse.ArgumentParser(prog="edgespec demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt", action="append", default=None,
                        help="prompt (chat template applied); repeat for several (default: an edit whose answer "
                             "repeats the prompt, and an open-ended question)")
    parser.add_argument("--max-new-tokens", type=int, default=160, help="tokens to generate (default %(default)s)")
    parser.add_argument("--window", type=int, default=-1,
                        help="draft window k, or -1 = auto: the coordinator's goodput policy picks k each round from "
                             "the costs it measures on this machine (default %(default)s). A fixed k tuned on one CPU "
                             "can lose on another: on an AMD EPYC host a 3-token target pass cost 3x a 1-token one "
                             "(MKL's small-matrix path), so k = 2 ran at 0.86x target-only while auto chose k = 4 (1.7x)")
    parser.add_argument("--backend", default="llamacpp", choices=["llamacpp", "torch"],
                        help="model backend of verifier and drafter: llamacpp (the GGUF files as shipped, ~4x faster "
                             "here) or torch (float32, the bit-exact reference) (default %(default)s)")
    parser.add_argument("--quantize", default="auto", choices=["auto", "none", "int8"],
                        help="drafter quantization (backend torch)")
    parser.add_argument("--no-compare", action="store_true", help="skip the target-only comparison run")
    args = parser.parse_args()
    if args.max_new_tokens < 1:
        parser.error(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.window < -1:
        parser.error(f"--window must be -1 (auto) or >= 0, got {args.window}")
    if args.prompt is not None and not all(p.strip() for p in args.prompt):
        parser.error("--prompt must not be empty")

    gguf = args.backend == "llamacpp"
    print("== preparing the default models (first run: " + ("joins the GGUF chunks" if gguf else
          "assembles and converts them, a few minutes") + ")", flush=True)
    subprocess.run([sys.executable, "-m", "edgespec.ops.prepare", *(["--gguf"] if gguf else [])], cwd=REPO_ROOT,
                   check=True)
    logs = Path(tempfile.mkdtemp(prefix="edgespec-demo-"))
    print(f"== starting verifier, drafter and coordinator on loopback (logs in {logs})", flush=True)
    try:
        with LocalCluster(logs, **cluster_layout(args.backend, args.quantize)) as cluster:
            try:
                run(cluster, args)
            except Exception:
                if notes := cluster.exit_notes():   # a service died under us: say which and how, in one line each
                    raise ServiceFailed("; ".join(notes)) from None
                raise
    except ServiceFailed as error:
        sys.exit(f"error: {error}")
    except grpc.RpcError as error:   # the coordinator refused the request (a window past its maximum, ...)
        sys.exit(f"error: the coordinator refused the request: {error.details()}")


def run(cluster: LocalCluster, args: argparse.Namespace) -> None:
    print(f"   verifier {cluster.verifier.address}  drafter {cluster.drafter.address}  "
          f"coordinator {cluster.coordinator.address}", flush=True)
    if cluster.verifier_cpus:
        print(f"   {args.backend}: verifier on CPU {cluster.verifier_cpus}, drafter, coordinator and this client on "
              f"CPU {cluster.edge_cpus} (edge and cloud)", flush=True)
        os.sched_setaffinity(0, {int(cpu) for cpu in cluster.edge_cpus.split(",")})   # the user is at the edge
    asyncio.run(stream(cluster.coordinator.address, "warm up", 4, args.window, echo=False))
    for prompt in args.prompt or [GROUNDED_PROMPT, OPEN_PROMPT]:
        show(cluster.coordinator.address, prompt, args)


def show(address: str, prompt: str, args: argparse.Namespace) -> None:
    """One prompt: the speculative generation streamed, then (unless --no-compare) target-only on the same
    verifier, the ratio and why. The ratio is of the decode rates after the first token, which is what
    speculation changes; the time to the first token (the prompt's prefill, the same work in both runs) is
    shown apart, and the end-to-end ratio beside it."""
    print(f"== edgespec, window {'auto' if args.window < 0 else args.window}: {prompt.strip()}\n", flush=True)
    run = asyncio.run(stream(address, prompt, args.max_new_tokens, args.window, True))
    s = run.stats
    print("\n")
    print(f"edgespec:     {speed(run)} | {s.rounds} target passes, {s.new_tokens / max(1, s.rounds):.2f} tokens "
          f"each | finish {s.finish_reason}")
    print(f"  why: {why(s)}")
    if args.no_compare:
        return
    print("== the same prompt, target-only (window 0: one target step per token on the same verifier)", flush=True)
    base = asyncio.run(stream(address, prompt, args.max_new_tokens, 0, False))
    print(f"target-only:  {speed(base)}")
    ratio = run.decode_tps / base.decode_tps
    if math.isnan(ratio):   # one chunk each: nothing decoded after the first token
        print(f"{base.seconds / run.seconds:.2f}x end to end; output identical to target-only: "
              f"{'yes' if run.tokens == base.tokens else 'NO'}\n", flush=True)
        return
    floor = "" if round(ratio, 2) >= FLOOR else f" (below the {FLOOR}x floor: " + (
        "speculation cost more than it saved here)" if s.drafted_tokens else
        f"nothing was drafted, so both ran the same {s.rounds} target-only passes through the same services: "
        "the gap is this machine's noise between two runs of the same work)")
    print(f"speedup {ratio:.2f}x in decode rate{floor}, {base.seconds / run.seconds:.2f}x end to end; output "
          f"identical to target-only: {'yes' if run.tokens == base.tokens else 'NO'}\n", flush=True)


def speed(run) -> str:
    """A generation's speed in one line: the first token's wait, then the decode rate after it."""
    return (f"{len(run.tokens)} tokens in {run.seconds:.2f}s: first after {run.ttft:.2f}s (prefill), then "
            f"{run.decode_tps:.2f} tok/s")


def why(s) -> str:
    """Which drafter drafted and how it went, in one line."""
    model_drafted = s.drafted_tokens - s.free_drafted_tokens
    model_accepted = s.accepted_tokens - s.free_accepted_tokens
    parts = []
    if s.free_rounds:
        parts.append(f"free drafts (copied from the prompt and output) in {s.free_rounds} passes, "
                     f"{s.free_accepted_tokens}/{s.free_drafted_tokens} tokens accepted")
    if model_drafted:
        parts.append(f"draft model {s.drafter!r}: {model_accepted}/{model_drafted} tokens accepted")
    if s.free_declined:
        parts.append(f"copied text found in {s.free_declined} passes but not sent: by the measured costs (the "
                     "verifier's time for a pass by its tokens, the copy's odds) it could not pay")
    if not parts:
        return ("nothing drafted: the text had nothing to copy, and by the measured costs the draft model "
                "cannot pay on this machine, so every pass was a target-only step")
    return "; ".join(parts)


if __name__ == "__main__":
    main()
