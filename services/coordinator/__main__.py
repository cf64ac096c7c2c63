"""Coordinator service: drives draft -> verify -> commit rounds for each Generate call.

    python -m services.coordinator --drafter 127.0.0.1:50062 --verifier 127.0.0.1:50061,127.0.0.1:50063
"""
from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass

from edgespec.loop.config import AUTO_POLICIES, SpeculationConfig
from edgespec.loop.generation import GenerationConfig
from edgespec.observe import logs
from edgespec.net import rpc
from edgespec.net.security import ServerSecurity
from edgespec.net.flags import (ObservabilityConfig, ServiceArgumentParser, add_observability_flags,
                                    add_security_flags, observability_config, optional_port, security_config)
from edgespec.net.transport import ClientSecurity, read_token

log = logging.getLogger("edgespec.coordinator")


@dataclass(frozen=True, slots=True)
class CoordinatorConfig:
    host: str                  # interface to bind
    port: int                  # TCP port (0 = any free port)
    drafters: dict[str, str]   # drafter name -> host:port; more than one = the router picks per request
    verifiers: tuple[str, ...] # verifier pool, host:port each
    tokenizer: str             # "target"/"draft" (packaged pair), "bytes" (tiny test models) or a directory
    generation: GenerationConfig  # windows, limits, pipelining, on verifier loss (edgespec.loop.generation)
    q_ids: int                 # sampling: ids of q sent per draft token (0 = deterministic drafting)
    deadline_seconds: float    # deadline on every drafter / verifier call, seconds
    failover_deadline_seconds: float  # how long to look for a verifier before on_verifier_loss applies
    ban_seconds: float         # first ban of a failed verifier; doubles per consecutive failure
    max_ban_seconds: float     # ban cap
    grace_seconds: float       # drain time on shutdown, seconds
    security: ServerSecurity   # TLS, auth and per-client limits of our own port
    upstream: ClientSecurity   # how we reach the drafter and the verifiers
    observability: ObservabilityConfig  # metrics endpoint, OTLP export, log format
    router_weights: str = ""   # router weights JSON; "" = the shipped ones
    http: "HttpConfig | None" = None  # the OpenAI-compatible HTTP API (--http-port); None = off
    free_drafts: str = "suffix"  # drafts that cost nothing, asked every adaptive-window round: "suffix" | "off"
    free_drafts_store: int = 0   # tokens of earlier outputs the suffix drafter keeps per coordinator (0 = none)


def window_arg(text: str) -> int:
    if text == "auto":
        return -1
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("window must be 'auto' or >= 0")
    return value


def parse_args(argv: list[str] | None = None) -> CoordinatorConfig:
    parser = ServiceArgumentParser(
        prog="python -m services.coordinator", env_prefix="EDGESPEC_COORDINATOR",
        description="edgespec coordinator: serves Generate, drafting on the drafter and verifying on the "
                    "verifier, and streams the committed tokens. Every flag also reads EDGESPEC_COORDINATOR_<FLAG> "
                    "(e.g. EDGESPEC_COORDINATOR_PORT), checked as the flag is; the command line wins.")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default %(default)s)")
    parser.add_argument("--port", type=int, default=50051, help="port, 0 = any free (default %(default)s)")
    parser.add_argument("--drafter", default="127.0.0.1:50062",
                        help="drafter address, or several as NAME=HOST:PORT,...: then a router (DASD) picks one per "
                             "request from the prompt and learns from the acceptance each session observes, switching "
                             "a session's drafter once if another is clearly faster (default %(default)s)")
    parser.add_argument("--router-weights", default="",
                        help="router weights JSON (written by `edgespec bench drafters --weights-out FILE`); "
                             "default: the shipped ones")
    parser.add_argument("--verifier", default="127.0.0.1:50061",
                        help="verifier pool: comma-separated host:port list. Each session lives on one verifier and "
                             "is re-opened on another (with its committed prefix) if that one fails (default %(default)s)")
    parser.add_argument("--tokenizer", default="draft",
                        help="'draft'/'target' (the packaged pair's tokenizer), 'bytes' (tiny test models), a directory, "
                             "or a Hugging Face id ORG/NAME from the local Hugging Face cache (the verifier's --model; "
                             "never downloaded) (default %(default)s)")
    parser.add_argument("--window", type=window_arg, default=-1,
                        help="default draft window: 'auto' (goodput policy: the k maximising expected tokens/s from "
                             "measured acceptance, draft and verify times), or a fixed k; 0 = target-only (default auto)")
    parser.add_argument("--auto-max-window", type=int, default=4,
                        help="largest k the auto policy considers (default %(default)s)")
    parser.add_argument("--auto-policy", default="goodput",
                        choices=AUTO_POLICIES,
                        help="the auto window policy: goodput (expected tokens/s from measured costs), heuristic "
                             "(+2 after a fully accepted window, -1 otherwise) or awc (the learned adaptive window "
                             "control: an MLP over RTT, acceptance, queue and cost telemetry, smoothed and held by "
                             "hysteresis; weights in edgespec/control/awc_weights.json). Measured against the best "
                             "fixed window (torch, 2 CPUs, RTT 0-100 ms, code and chat): goodput 0-15%% behind, "
                             "heuristic 7-35%%, awc 35-52%% (docs/benchmarks.md) (default %(default)s)")
    parser.add_argument("--first-token", default="alone", choices=["alone", "drafted"],
                        help="alone = a session's first round is a target-only step whatever the window: the "
                             "verifier has the first token from the prompt, and a draft would only delay it "
                             "(measured: 170 ms more TTFT at one session on 2 CPUs); drafted = the window policy "
                             "and free drafts from the first round (default %(default)s)")
    parser.add_argument("--free-drafts", default="suffix", choices=["suffix", "off"],
                        help="adaptive-window requests (greedy or lossless sampling, blocking rounds): before each "
                             "round, look up what the text so far continues (the longest earlier occurrence of its "
                             "last tokens, in the prompt and the output: summaries, RAG, extraction, code edits copy "
                             "them) and send those tokens for verification when, by their measured acceptance and "
                             "the verifier's cost per window, they pay; else the window policy's round. Costs "
                             "microseconds and no model. off = the window policy's rounds only (default %(default)s)")
    parser.add_argument("--free-drafts-store", type=int, default=32768, metavar="TOKENS",
                        help="with --free-drafts suffix: keep up to TOKENS tokens of finished generations' outputs "
                             "(about 2 KB of memory each; the least recently matched dropped first) and draft from a "
                             "tenant's own earlier outputs too, where they match more of the text than the session's "
                             "own does: repeated questions, templated answers, agent loops. A tenant is the end "
                             "user a service calls for, else the calling identity. 0 = off (default %(default)s)")
    parser.add_argument("--max-window", type=int, default=16, help="tokens (default %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=2048, help="largest request, tokens (default %(default)s)")
    parser.add_argument("--max-prompt-tokens", type=int, default=4096, help="tokens (default %(default)s)")
    parser.add_argument("--q-ids", type=int, default=16,
                        help="when sampling: the drafter samples from its top-Q distribution and sends those Q ids "
                             "and weights per token; 0 = deterministic drafting, token ids only (default %(default)s)")
    parser.add_argument("--deadline", type=float, default=60.0, help="per-call deadline, seconds (default %(default)s)")
    parser.add_argument("--pipeline", default="off", choices=["on", "off"],
                        help="on: while a window is being verified, draft the next one assuming full acceptance and "
                             "send it at once (hides the link RTT); off: one window at a time (default %(default)s)")
    parser.add_argument("--tree-depth", type=tree_depth, default=0,
                        help="lossless requests (greedy or sampled), blocking rounds: draft token trees — the window's chain plus the draft "
                             "model's runner-up at each of its first N positions — and verify all of it in one target "
                             "pass, accepting the longest path the target takes (torch verifier; with a verifier or "
                             "drafter that cannot, chains); 0..4, 0 = chains; auto = per round, 0..2 runner-ups, "
                             "from the verifier's measured forward time by tokens fed and how often the target took "
                             "a runner-up (default %(default)s)")
    parser.add_argument("--cloud-draft", default="off", choices=["off", "fallback", "on"],
                        help="speculation without the edge drafter: the verifier drafts for itself (Progressive Tree "
                             "Drafting: guesses from an n-gram pool of the text and of its own outputs, grown by the "
                             "target's choices, verified in one pass; torch verifier, lossless requests, blocking "
                             "rounds). fallback = while the edge drafter is down or refusing (instead of target-only "
                             "rounds); on = every round (requests with window 0 stay target-only). Each pass feeds "
                             "the verifier's --self-draft-nodes + 1 tokens: it pays where such a pass costs about "
                             "one step (GPUs), rarely on a CPU: measured 0.72x target-only on 2 CPUs "
                             "(docs/benchmarks.md) (default %(default)s)")
    parser.add_argument("--on-verifier-loss", default="fail",
                        choices=["fail", "draft-only"],
                        help="when no verifier is reachable for --failover-deadline: fail the request (UNAVAILABLE), "
                             "or stream the drafter's tokens flagged unverified until one is back (default %(default)s)")
    parser.add_argument("--max-unverified-tokens", type=int, default=256,
                        help="draft-only: unverified tokens that may run ahead of the verified output before waiting "
                             "for a verifier again (default %(default)s)")
    parser.add_argument("--failover-deadline", type=float, default=30.0,
                        help="seconds to keep looking for a usable verifier for a session (default %(default)s)")
    parser.add_argument("--ban", type=float, default=0.5,
                        help="seconds a failed verifier is skipped; doubles per consecutive failure (default %(default)s)")
    parser.add_argument("--max-ban", type=float, default=30.0,
                        help="cap on the ban, seconds (default %(default)s)")
    parser.add_argument("--grace", type=float, default=5.0, help="shutdown drain, seconds")
    http = parser.add_argument_group(
        "OpenAI-compatible HTTP API", "POST /v1/chat/completions and /v1/completions (stream: true = Server-Sent "
        "Events), GET /v1/models and /health, on the same generation path as Generate, with the same TLS, bearer "
        "tokens and per-client limits (docs/openai-api.md)")
    http.add_argument("--http-port", type=optional_port, default=None,
                      help="serve the OpenAI-compatible API on this port; 0 = any free port, logged as "
                           "'OpenAI-compatible API on http://...'; unset = no HTTP API (default)")
    http.add_argument("--http-host", default="",
                      help="bind address of the HTTP API (default: --host)")
    http.add_argument("--sse-ping-seconds", type=float, default=0.0,
                      help="send an SSE comment on a stream every this many seconds, for proxies that close idle "
                           "connections; 0 = never, as vLLM's and llama.cpp's servers (vLLM's "
                           "benchmark client drops every event after such a comment) (default %(default)s)")
    http.add_argument("--served-model-name", default="",
                      help="the model id /v1/models lists and responses carry (default: the verifier's model name)")
    add_security_flags(parser)
    add_observability_flags(parser)
    upstream = parser.add_argument_group("upstream security", "how the coordinator reaches the drafter and the verifiers")
    for flag, help_ in (("upstream-tls-ca", "PEM CA: connect with TLS, trusting this CA (default: plaintext)"),
                        ("upstream-tls-cert", "PEM certificate presented to them (mutual TLS)"),
                        ("upstream-tls-key", "PEM private key of --upstream-tls-cert"),
                        ("upstream-token-file", "file holding the bearer token sent to them (only over TLS or loopback)")):
        upstream.add_argument(f"--{flag}", help=help_)
    a = parser.parse_args(argv)
    try:
        upstream_security = ClientSecurity(a.upstream_tls_ca or None, a.upstream_tls_cert or None,
                                           a.upstream_tls_key or None, read_token(a.upstream_token_file or None))
    except (OSError, ValueError) as error:
        parser.error(f"upstream security: {error}")
    verifiers = tuple(v.strip() for v in a.verifier.split(",") if v.strip())
    if not verifiers or len(set(verifiers)) != len(verifiers):
        parser.error(f"--verifier: need one or more distinct host:port addresses, got {a.verifier!r}")
    drafters = parse_drafters(parser, a.drafter)
    http = None
    if a.http_port is not None:
        if a.sse_ping_seconds < 0:
            parser.error(f"--sse-ping-seconds must be >= 0, got {a.sse_ping_seconds}")
        if not 0 <= a.http_port <= 65535:
            parser.error(f"--http-port must be 0..65535 (0 = any free port), got {a.http_port}")
        from services.coordinator.http_api import HttpConfig

        http = HttpConfig(a.http_host or a.host, a.http_port, a.served_model_name, a.sse_ping_seconds)
    try:
        speculation = SpeculationConfig(window=a.window, max_window=a.max_window, auto_max_window=a.auto_max_window,
                                        auto_policy=a.auto_policy, pipeline=a.pipeline == "on",
                                        on_verifier_loss=a.on_verifier_loss, max_unverified=a.max_unverified_tokens,
                                        tree_depth=a.tree_depth, cloud_draft=a.cloud_draft,
                                        first_token_alone=a.first_token == "alone")
    except ValueError as error:   # the flags' names, spelt as the settings': --max-window is max_window
        parser.error(f"speculation settings: {error}")
    if a.free_drafts_store < 0:
        parser.error(f"--free-drafts-store must be >= 0 tokens (0 = off), got {a.free_drafts_store}")
    generation = GenerationConfig(max_new_tokens=a.max_new_tokens, max_prompt_tokens=a.max_prompt_tokens,
                                  speculation=speculation)
    return CoordinatorConfig(a.host, a.port, drafters, verifiers, a.tokenizer, generation, a.q_ids, a.deadline,
                             a.failover_deadline, a.ban, a.max_ban, a.grace, security_config(parser, a),
                             upstream_security, observability_config(parser, a), a.router_weights, http,
                             a.free_drafts, a.free_drafts_store)


def tenant() -> str:
    """Whose earlier outputs a generation drafts from (--free-drafts-store): the end user a service calls for,
    else the calling identity, as authenticated (the OpenAI ``user`` field is not: anyone may send any)."""
    from edgespec.net.security import current_caller

    caller = current_caller()
    return caller.end_user_name() or caller.identity


def tree_depth(text: str) -> int:
    """--tree-depth: 0..4, or "auto" (-1)."""
    if text.strip() == "auto":
        return -1
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 4:
        raise argparse.ArgumentTypeError(f"expected 0..4 or auto, got {text!r}")
    return value


def parse_drafters(parser, value: str) -> dict[str, str]:
    """"HOST:PORT" -> {"draft": it}; "a=HOST:PORT,b=HOST:PORT" -> named drafters."""
    items = [item.strip() for item in value.split(",") if item.strip()]
    if len(items) == 1 and "=" not in items[0]:
        return {"draft": items[0]}
    drafters = {}
    for item in items:
        name, _, address = item.partition("=")
        if not name or not address or name in drafters:
            parser.error(f"--drafter: expected HOST:PORT or distinct NAME=HOST:PORT,..., got {value!r}")
        drafters[name] = address
    if not drafters:
        parser.error("--drafter: need at least one drafter")
    return drafters


async def main(config: CoordinatorConfig) -> None:
    import asyncio

    from edgespec.observe import exporters
    from edgespec.loop.failover import FailoverVerifier
    from edgespec.observe.metrics import CoordinatorMetrics
    from edgespec.loop.pool import VerifierPool
    from edgespec.net.security import SessionOwners, server_parts
    from edgespec.backends.assets import resolve_spec
    from edgespec.backends.suffix import SuffixDrafter
    from edgespec.backends.tokenizer import load_tokenizer
    from edgespec.v1 import coordinator_pb2
    from services.coordinator.chat_template import ChatTemplateTokenizer
    from services.coordinator.clients import GrpcDrafter, GrpcVerifier
    from services.coordinator.readiness import check_vocabularies, follow_verifier_health
    from services.coordinator.servicer import CoordinatorServicer, register

    exports = exporters.setup("edgespec-coordinator", config.observability.metrics_port,
                              config.observability.otlp_endpoint, config.host, prometheus=config.http is not None)
    metrics = CoordinatorMetrics()
    # A Hugging Face id as its snapshot in the local cache; chat turns go through the tokenizer's template.
    tokenizer = ChatTemplateTokenizer(load_tokenizer(resolve_spec(config.tokenizer)))
    drafters = {name: GrpcDrafter(address, config.deadline_seconds, config.q_ids, config.upstream)
                for name, address in config.drafters.items()}
    router = None
    if len(drafters) > 1:
        from edgespec.control.router import Router, load_router_weights

        router = Router(Router.arms_from_json(load_router_weights(config.router_weights or None), list(drafters)))
    endpoints = {address: GrpcVerifier(address, config.deadline_seconds, config.upstream)
                 for address in config.verifiers}
    pool = VerifierPool(config.verifiers, config.ban_seconds, config.max_ban_seconds)
    verifier = FailoverVerifier(pool, endpoints, config.failover_deadline_seconds, metrics)

    verifiers_changed = asyncio.Event()   # wakes the follower of our own health (services/coordinator/readiness.py)

    def health_changed(address: str, serving: bool) -> None:
        if pool.endpoints[address].serving != serving:
            log.info("verifier %s is %s", address, "SERVING" if serving else "not serving")
        pool.set_serving(address, serving)
        verifiers_changed.set()

    watchers = [asyncio.ensure_future(e.watch_health(health_changed)) for e in endpoints.values()]
    owners = SessionOwners.for_security(config.security)   # generations in progress per client identity
    free_drafter = SuffixDrafter(store_tokens=config.free_drafts_store, tenant=tenant) \
        if config.free_drafts == "suffix" else None
    servicer = CoordinatorServicer(config.generation, tokenizer, drafters, verifier, owners, router, metrics,
                                   free_drafter)
    # logs a tokenizer mismatch; each drafter's measured cost goes to the window policy's first rounds
    watchers.append(asyncio.ensure_future(check_vocabularies(endpoints, drafters, servicer.generations.drafter_info,
                                                             servicer.generations.verifier_placement)))
    credentials, interceptors = server_parts(config.security, owners)
    server, port, health = rpc.create_server(config.host, config.port, register(servicer),
                                             config.security.max_message_bytes, credentials, interceptors)
    speculation = config.generation.speculation
    log.info("drafters %s, verifiers %s, default window %s, free drafts %s, pipelining %s, on verifier loss: %s",
             ", ".join(f"{name}={address}" for name, address in config.drafters.items()),
             ", ".join(config.verifiers), "auto" if speculation.window < 0 else speculation.window,
             config.free_drafts, "on" if speculation.pipeline else "off", speculation.on_verifier_loss)
    if speculation.on_verifier_loss == "fail":   # draft-only still serves (unverified text) without a verifier
        watchers.append(asyncio.ensure_future(follow_verifier_health(
            health, [coordinator_pb2.DESCRIPTOR.services_by_name["Coordinator"].full_name, ""], pool,
            verifiers_changed)))
    if config.http is None:
        await rpc.serve(server, health, "coordinator", f"{config.host}:{port}", config.grace_seconds)
    else:   # the HTTP API in this process and event loop, on the same generation path
        from services.coordinator import http_api

        api = http_api.OpenAIApp(servicer.generations, interceptors[0] if interceptors else None, config.http,
                                 draft_only=speculation.on_verifier_loss == "draft-only",
                                 metrics=lambda: exporters.prometheus_text(exports.registry))
        await http_api.serve(server, health, f"{config.host}:{port}", config.grace_seconds, api, config.security)
    for watcher in watchers:
        watcher.cancel()
    for drafter in drafters.values():
        await drafter.aclose()
    for endpoint in endpoints.values():
        await endpoint.aclose()
    exports.shutdown()


if __name__ == "__main__":
    from edgespec.backends.assets import ModelAssetError

    config = parse_args()
    logs.configure(config.observability.log_format, config.observability.log_level)
    rpc.run(main(config), "coordinator", fatal=(ModelAssetError,))
