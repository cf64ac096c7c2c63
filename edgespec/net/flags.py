"""Flags shared by the services, read in one place.

Every flag also reads ``<ENV_PREFIX>_<FLAG>`` from the environment, so compose
files and Helm charts configure the services without command lines. A variable is
checked exactly as the flag would be (ServiceArgumentParser): a bad value is a
usage error naming it, and the command line wins over it.
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from edgespec.observe.logs import FORMATS as LOG_FORMATS, LEVELS as LOG_LEVELS
from edgespec.net.security import ANONYMOUS, END_USER_KEY, ServerSecurity, parse_identities


@dataclass(frozen=True, slots=True)
class ObservabilityConfig:
    metrics_port: int | None    # Prometheus /metrics port (0 = any free port, logged); None = no endpoint
    otlp_endpoint: str | None   # OTLP gRPC collector for spans and metrics, e.g. http://127.0.0.1:4317; None = off
    log_format: str             # "text" (one line per record) | "json" (one object per line, with ids)
    log_level: str = "info"     # "debug" | "info" | "warning" | "error": least severe records written


@dataclass(frozen=True, slots=True)
class ModelServiceConfig:
    host: str                # interface to bind
    port: int                # TCP port (0 = any free port)
    model: str               # "target", "draft", "tiny:SEED[~NOISE]", a model directory, a .gguf file or ORG/NAME
    device: str              # "auto" (GPU if present), "cpu", "cuda", "cuda:N"
    dtype: str               # float32 | bfloat16 | float16 | auto (the checkpoint's; float32 on CPUs without bf16)
    threads: int             # CPU threads of the model backend (0 = the backend's default)
    max_window: int          # largest draft window handled, tokens
    max_session_tokens: int  # largest committed length of a session, tokens
    grace_seconds: float     # drain time on shutdown, seconds
    security: ServerSecurity # TLS, auth, per-client limits
    observability: ObservabilityConfig  # metrics endpoint, OTLP export, log format and level
    llamacpp: "LlamaCppConfig"  # the llama.cpp backend's context (used with --backend llamacpp)
    prefix_cache_bytes: int = 0  # torch backend: KV blocks of prompts kept for later sessions, bytes (0 = off)


@dataclass(frozen=True, slots=True)
class LlamaCppConfig:
    ctx_tokens: int | None     # KV cells of the llama.cpp context, tokens (None: llamacpp.context_size's default)
    max_sequences: int | None  # sessions that can hold a KV cache at once (one llama.cpp sequence each)
    share_prefixes: bool = False  # a new session takes the cells of a prefix another session holds
    exact: str = "auto"  # batch-invariant settings ("on", "off", "auto": on with one thread; llamacpp.exact_settings)


class ServiceArgumentParser(argparse.ArgumentParser):
    """An argument parser whose every ``--flag`` also reads ``<env_prefix>_<FLAG>`` from the environment.

    A set variable is parsed exactly as ``--flag=VALUE`` on the command line would be (type, choices; a bad
    value is a usage error naming the variable, exit 2; "" is the value "", as ``--flag ""`` is) and becomes
    that flag's default, so the command line still wins. ``--help`` names each flag's variable.
    """

    def __init__(self, *args, env_prefix: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.env_prefix = env_prefix
        self._reading: str | None = None   # the variable being parsed, for error messages

    def env_name(self, option: str) -> str:
        """``--max-window`` -> ``<PREFIX>_MAX_WINDOW``."""
        return f"{self.env_prefix}_{option.lstrip('-').upper().replace('-', '_')}"

    def _env_actions(self):
        for action in self._actions:
            long = next((o for o in action.option_strings if o.startswith("--")), None)
            if long is not None and not isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
                yield long, action

    def parse_known_args(self, args=None, namespace=None):
        self._apply_environment()
        return super().parse_known_args(args, namespace)

    def _apply_environment(self) -> None:
        defaults = {}
        for long, action in self._env_actions():
            name = self.env_name(long)
            value = os.environ.get(name)
            if value is None:
                continue
            if action.nargs == 0:   # an on/off flag (store_true and kin)
                if value.lower() in ("0", "false", "no", "off"):
                    continue
                argv = [long] if value.lower() in ("1", "true", "yes", "on") else [f"{long}={value}"]
            else:
                argv = [f"{long}={value}"]    # one token: a value starting with "-" stays a value
            self._reading = f"{name}={value!r}"
            try:
                parsed = super().parse_known_args(argv, argparse.Namespace())[0]
            finally:
                self._reading = None
            defaults[action.dest] = getattr(parsed, action.dest)
        self.set_defaults(**defaults)

    def error(self, message: str):
        if self._reading is not None:
            message = f"environment {self._reading}: {message}"
        super().error(message)

    def format_help(self) -> str:
        for long, action in self._env_actions():
            if action.help is not argparse.SUPPRESS and "[env " not in (action.help or ""):
                action.help = f"{action.help or ''} [env {self.env_name(long)}]".strip()
        return super().format_help()


def model_service_parser(prog: str, description: str, env_prefix: str, port: int, model: str, model_help: str,
                         device: str) -> ServiceArgumentParser:
    parser = ServiceArgumentParser(prog=prog, env_prefix=env_prefix, description=f"{description} Every flag also "
                                   f"reads {env_prefix}_<FLAG> (e.g. {env_prefix}_PORT), checked as the flag is; "
                                   "the command line wins.")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default %(default)s)")
    parser.add_argument("--port", type=int, default=port, help="port, 0 = any free (default %(default)s)")
    parser.add_argument("--model", default=model, help=f"{model_help} (default %(default)s)")
    parser.add_argument("--device", default=device, help="auto (GPU if present) | cpu | cuda | cuda:N (default %(default)s)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16", "auto"],
                        help="torch backend: weights and compute dtype. float32 is the bit-exact reference; auto = "
                             "the checkpoint's own (its config.json), except float32 on a CPU without native "
                             "bfloat16 (said in the log) (default %(default)s)")
    parser.add_argument("--threads", type=int, default=0,
                        help="CPU threads of the model backend (torch, ONNX Runtime, llama.cpp); 0 = its default")
    parser.add_argument("--max-window", type=int, default=16, help="largest window, tokens (default %(default)s)")
    parser.add_argument("--max-session-tokens", type=int, default=8192,
                        help="largest committed length of a session, tokens (default %(default)s)")
    parser.add_argument("--grace", type=float, default=5.0, help="shutdown drain, seconds (default %(default)s)")
    parser.add_argument("--prefix-cache-mb", type=float, default=256.0,
                        help="torch backend: keep the KV cache of prompts prefilled before, in blocks of 16 tokens, "
                             "up to this many MiB (least recently used dropped), and start a session whose prompt "
                             "begins with a stored prefix (a system prompt, a retried request, a re-opened "
                             "session) from it instead of computing it again; 0 = off (default %(default)s). "
                             "The llama.cpp backend shares live sessions' cells instead (--share-prefixes)")
    group = parser.add_argument_group("llama.cpp backend", "With --backend llamacpp: the GGUF model runs in one "
                                      "llama.cpp context; each session is a sequence of its KV cache (one unified "
                                      "cache, or with --exact on a stream of cells each), and windows of several "
                                      "sessions share one decode batch.")
    group.add_argument("--ctx-tokens", type=int, default=None,
                       help="KV cells of the context, tokens: shared by all sessions, or with --exact on split into "
                            "a stream of --ctx-tokens / --max-sequences cells per session, as llama-server splits -c "
                            "over its slots (default 16384 shared, or 2048 per session with --exact on)")
    group.add_argument("--max-sequences", type=int, default=None,
                       help="sessions holding a KV cache at once, 1..256 (default 64, or 16 with --exact on)")
    group.add_argument("--share-prefixes", action="store_true",
                       help="a session that opens with a prefix of 16+ tokens another session holds (a system "
                            "prompt, a chat template, a retried request) takes that session's KV cells instead of "
                            "computing them: prefill up to 5x faster for a shared prompt. Closed sessions' cells are "
                            "kept for it too (a quarter of --max-sequences at most, given back first when the "
                            "context is full). The cells were computed in "
                            "the other session's batch, so greedy output may differ from one-session decoding at "
                            "a near-tie (measured in docs/benchmarks.md); off by default")
    group.add_argument("--exact", choices=["auto", "on", "off"], default="auto",
                       help="on: llama.cpp settings under which a batch of any rows, of any sessions, computes "
                            "each row as a one-token decode would (llama.cpp's defaults; windows in decodes of at "
                            "most 3 rows, checked at load; past 240 positions, where llama.cpp's own run splits a "
                            "token's attention over its threads, each row decoded alone; a KV stream per session), "
                            "so greedy output is llama.cpp's own one-session target-only output with those settings "
                            "at every window (the log prints them as llama.cpp flags). auto: on where the model runs "
                            "on one thread, where it costs little (measured: decode 0.99x on short contexts, 0.89x "
                            "past 800 tokens, prompts as fast); with more threads a window past 240 positions costs "
                            "as many decodes as rows, so drafting saves nothing there and concurrent sessions share "
                            "no decodes: auto leaves it off there (docs/llamacpp-exactness.md) "
                            "(default %(default)s)")
    add_security_flags(parser)
    add_observability_flags(parser)
    return parser


def add_security_flags(parser: argparse.ArgumentParser) -> None:
    """The server-side security flags every service takes."""
    group = parser.add_argument_group("security", "TLS, mutual TLS, bearer tokens and per-client limits. Health and "
                                      "reflection stay open (probes); every other call is checked.")
    group.add_argument("--tls-cert", help="PEM certificate chain: serve TLS only")
    group.add_argument("--tls-key", help="PEM private key of --tls-cert")
    group.add_argument("--tls-client-ca",
                       help="PEM CA: require client certificates it signed (mutual TLS); without --auth-tokens the "
                            "certificate's common name is the client identity")
    group.add_argument("--auth-tokens",
                       help="file of 'IDENTITY TOKEN' lines: every call must carry 'authorization: Bearer TOKEN', and "
                            "sessions are bound to the identity that opened them")
    group.add_argument("--max-sessions-per-client", type=int, default=64,
                       help="open sessions per client identity (default %(default)s)")
    group.add_argument("--service-identities", default=ANONYMOUS,
                       help="comma-separated identities that are infrastructure, not end users (e.g. the "
                            "coordinator's: 'coordinator' or 'cert:coordinator'): their sessions count against "
                            "--max-sessions-per-service, and they may name the end user they call for in "
                            f"'{END_USER_KEY}' metadata (read from nobody else), whose --max-sessions-per-client "
                            "then applies too. 'anonymous' (the default) covers every caller of a server without "
                            "--auth-tokens or mutual TLS; '' = none (default %(default)s)")
    group.add_argument("--max-sessions-per-service", type=int, default=4096,
                       help="open sessions per service identity, all the end users it names together; over it: "
                            "RESOURCE_EXHAUSTED with a retry-after-ms hint (default %(default)s)")
    group.add_argument("--rate-limit", type=float, default=0.0,
                       help="calls per second per client identity, 0 = unlimited; over it: RESOURCE_EXHAUSTED with a "
                            "retry-after-ms hint (default %(default)s)")
    group.add_argument("--rate-burst", type=int, default=0,
                       help="calls a client may make at once, 0 = twice the rate (default %(default)s)")
    group.add_argument("--max-message-bytes", type=int, default=4 << 20,
                       help="largest gRPC message, bytes (default %(default)s)")


def add_observability_flags(parser: argparse.ArgumentParser) -> None:
    """Metrics, traces, log format and level: the same flags on every service."""
    group = parser.add_argument_group("observability", "Prometheus metrics, OpenTelemetry traces and metrics over "
                                      "OTLP, structured logs (README.md, Observability)")
    group.add_argument("--metrics-port", type=optional_port, default=None,
                       help="serve Prometheus metrics on http://HOST:PORT/metrics (HOST = --host); 0 = any free port, "
                            "logged as 'metrics on http://...'; unset = no endpoint (default)")
    group.add_argument("--otlp-endpoint", default=os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", ""),
                       help="export spans and metrics to this OTLP gRPC collector, e.g. http://127.0.0.1:4317 "
                            "(plaintext) or https://HOST:4317 (TLS); also read from OTEL_EXPORTER_OTLP_ENDPOINT; "
                            "OTEL_BSP_SCHEDULE_DELAY and OTEL_METRIC_EXPORT_INTERVAL set how often (default: off)")
    group.add_argument("--log-format", default="text", choices=LOG_FORMATS,
                       help="text: one line per record; json: one object per line with time, level, logger, message "
                            "and the session_id, request_id, trace_id and span_id of the call (default %(default)s)")
    group.add_argument("--log-level", default="info", choices=LOG_LEVELS,
                       help="least severe records written (default %(default)s)")


def optional_port(text: str) -> int | None:
    """A port number, or "" for none (so an empty environment variable turns the endpoint off)."""
    if not text.strip():
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number or '' (none), got {text!r}") from None


def observability_config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> ObservabilityConfig:
    if args.metrics_port is not None and not 0 <= args.metrics_port <= 65535:
        parser.error(f"--metrics-port must be 0..65535 (0 = any free port), got {args.metrics_port}")
    return ObservabilityConfig(args.metrics_port, args.otlp_endpoint or None, args.log_format, args.log_level)


def security_config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> ServerSecurity:
    try:
        # "" (an empty flag or environment variable) is no file, as unset is.
        return ServerSecurity(args.tls_cert or None, args.tls_key or None, args.tls_client_ca or None,
                              args.auth_tokens or None,
                              args.max_sessions_per_client, args.rate_limit, args.rate_burst, args.max_message_bytes,
                              parse_identities(args.service_identities), args.max_sessions_per_service)
    except ValueError as error:
        parser.error(str(error))


def model_service_config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> ModelServiceConfig:
    if args.ctx_tokens is not None and args.ctx_tokens < 256:
        parser.error(f"--ctx-tokens must be >= 256, got {args.ctx_tokens}")
    if args.max_sequences is not None and not 1 <= args.max_sequences <= 256:
        parser.error(f"--max-sequences must be in 1..256, got {args.max_sequences}")
    if args.prefix_cache_mb < 0:
        parser.error(f"--prefix-cache-mb must be >= 0 (0 = off), got {args.prefix_cache_mb}")
    return ModelServiceConfig(args.host, args.port, args.model, args.device, args.dtype, args.threads,
                              args.max_window, args.max_session_tokens, args.grace, security_config(parser, args),
                              observability_config(parser, args), LlamaCppConfig(
                                  args.ctx_tokens, args.max_sequences, args.share_prefixes, args.exact),
                              round(args.prefix_cache_mb * 2**20))
