"""The `edgespec` command.

    edgespec serve verifier|drafter|coordinator ...   run a service
    edgespec generate "prompt"     stream from a running coordinator (needs only grpcio and protobuf)
    edgespec demo                  start a local cluster with the default real pair and generate
    edgespec bench SUITE ...       benchmarks (`edgespec bench --help` lists the suites)
    edgespec sim SCENARIO.json     simulate many devices and verifiers (DSD-Sim)
    edgespec train awc|relaxed     retrain the shipped weights
    edgespec prepare-models / export-onnx / dev-certs   operator commands

What each runs, and what it needs, is in edge_client/commands.py. `edgespec --help` lists the commands this
installation can run and says what the others need: an extra (`pip install 'edgespec[serve]'`, `[sim]`,
`[bench]`) or, for the demo, the benchmarks and the training, a source checkout.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

import grpc

from edge_client.client import RECONNECT_SECONDS, RELAXED_HELP
from edge_client.commands import COMMANDS, DEPRECATED, GENERATE_HELP, Group, Tool, listing, missing, source_checkout
from edgespec.net.transport import ClientSecurity, read_token


def run_tool(name: str, tool: Tool, args: list[str]) -> int:
    why = missing(tool)
    if why:
        print(f"edgespec {name}: {why}", file=sys.stderr)
        return 2
    env = dict(os.environ)
    if tool.checkout:   # bench/ and training/ import from the checkout
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(source_checkout()), env.get("PYTHONPATH", "")) if p)
    os.execve(sys.executable, [sys.executable, "-m", tool.module, *args], env)


def run_group(name: str, group: Group, args: list[str]) -> int:
    """`edgespec NAME MEMBER ARGS`: the member's tool; no member or --help lists them."""
    if args and args[0] in group.tools:
        return run_tool(f"{name} {args[0]}", group.tools[args[0]], args[1:])
    if name == "bench" and args and args[0].startswith("-") and args[0] not in ("-h", "--help"):
        return deprecated("bench", ("bench", "speed"), args)    # the old `edgespec bench --json ...`
    text = (f"usage: edgespec {name} {{{','.join(group.tools)}}} ...\n\n{group.help}\n\n"
            + listing(group.tools, f"{group.noun}s (each takes --help):"))
    if args and args[0] not in ("-h", "--help"):
        print(f"{text}\n\nedgespec {name}: no {group.noun} {args[0]!r}", file=sys.stderr)
        return 2
    print(text, file=sys.stdout if args else sys.stderr)
    return 0 if args else 2


def deprecated(old: str, new: tuple[str, str], args: list[str]) -> int:
    print(f"edgespec {old} is deprecated and goes in the next release: use edgespec {' '.join(new)}", file=sys.stderr)
    return run_group(new[0], COMMANDS[new[0]], [new[1], *args])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in DEPRECATED:
        return deprecated(argv[0], DEPRECATED[argv[0]], argv[1:])
    if argv and isinstance(COMMANDS.get(argv[0]), Group):
        return run_group(argv[0], COMMANDS[argv[0]], argv[1:])
    if argv and isinstance(COMMANDS.get(argv[0]), Tool):
        return run_tool(argv[0], COMMANDS[argv[0]], argv[1:])
    parser = argparse.ArgumentParser(prog="edgespec", description="edgespec: distributed speculative decoding, edge + cloud.",
                                     epilog=listing(COMMANDS, "commands (each takes --help):"),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(COMMANDS) + "}")
    for name in COMMANDS:   # listed once, in the epilog; here so that argparse names them all in its errors
        if name != "generate":
            sub.add_parser(name, add_help=False)
    gen = sub.add_parser("generate", description=GENERATE_HELP)
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
            elif event.HasField("plan"):   # how the session speculates; said where the coordinator turned off a part
                for note in event.plan.notes:
                    sys.stderr.write(f"[{note}]\n")
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
