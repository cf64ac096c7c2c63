"""Flags shared by the two model services (verifier, drafter), read in one place.

Every flag also reads ``<ENV_PREFIX>_<FLAG>`` from the environment, so compose
files and Helm charts configure the services without command lines.
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from edgespec.logs import FORMATS as LOG_FORMATS
from edgespec.security import ServerSecurity


@dataclass(frozen=True, slots=True)
class ObservabilityConfig:
    metrics_port: int | None    # Prometheus /metrics port (0 = any free port, logged); None = no endpoint
    otlp_endpoint: str | None   # OTLP gRPC collector for spans and metrics, e.g. http://127.0.0.1:4317; None = off
    log_format: str             # "text" (one line per record) | "json" (one object per line, with ids)


@dataclass(frozen=True, slots=True)
class ModelServiceConfig:
    host: str                # interface to bind
    port: int                # TCP port (0 = any free port)
    model: str               # "target", "draft", "tiny:SEED[~NOISE]" or a model directory
    device: str              # "auto" (GPU if present), "cpu", "cuda", "cuda:N"
    dtype: str               # float32 | bfloat16 | float16
    threads: int             # torch CPU threads (0 = torch default)
    max_window: int          # largest draft window handled, tokens
    max_session_tokens: int  # largest committed length of a session, tokens
    grace_seconds: float     # drain time on shutdown, seconds
    security: ServerSecurity # TLS, auth, per-client limits
    observability: ObservabilityConfig  # metrics endpoint, OTLP export, log format


class EnvDefaults:
    """Default values that an environment variable may override."""

    def __init__(self, prefix: str):
        self.prefix = prefix

    def __call__(self, flag: str, default: str) -> str:
        return os.environ.get(f"{self.prefix}_{flag.upper().replace('-', '_')}", default)


def model_service_parser(prog: str, description: str, env_prefix: str, port: int, model: str, model_help: str,
                         device: str) -> argparse.ArgumentParser:
    env = EnvDefaults(env_prefix)
    parser = argparse.ArgumentParser(prog=prog, description=f"{description} Every flag also reads "
                                     f"{env_prefix}_<FLAG> (e.g. {env_prefix}_PORT).")
    parser.add_argument("--host", default=env("host", "127.0.0.1"), help="bind address (default %(default)s)")
    parser.add_argument("--port", type=int, default=int(env("port", str(port))), help="port, 0 = any free (default %(default)s)")
    parser.add_argument("--model", default=env("model", model), help=f"{model_help} (default %(default)s)")
    parser.add_argument("--device", default=env("device", device), help="auto (GPU if present) | cpu | cuda | cuda:N (default %(default)s)")
    parser.add_argument("--dtype", default=env("dtype", "float32"), choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--threads", type=int, default=int(env("threads", "0")), help="torch CPU threads, 0 = torch default")
    parser.add_argument("--max-window", type=int, default=int(env("max-window", "16")), help="largest window, tokens (default %(default)s)")
    parser.add_argument("--max-session-tokens", type=int, default=int(env("max-session-tokens", "8192")),
                        help="largest committed length of a session, tokens (default %(default)s)")
    parser.add_argument("--grace", type=float, default=float(env("grace", "5")), help="shutdown drain, seconds (default %(default)s)")
    add_security_flags(parser, env)
    add_observability_flags(parser, env)
    return parser


def add_security_flags(parser: argparse.ArgumentParser, env: EnvDefaults) -> None:
    """The server-side security flags every service takes."""
    group = parser.add_argument_group("security", "TLS, mutual TLS, bearer tokens and per-client limits. Health and "
                                      "reflection stay open (probes); every other call is checked.")
    group.add_argument("--tls-cert", default=env("tls-cert", "") or None, help="PEM certificate chain: serve TLS only")
    group.add_argument("--tls-key", default=env("tls-key", "") or None, help="PEM private key of --tls-cert")
    group.add_argument("--tls-client-ca", default=env("tls-client-ca", "") or None,
                       help="PEM CA: require client certificates it signed (mutual TLS); without --auth-tokens the "
                            "certificate's common name is the client identity")
    group.add_argument("--auth-tokens", default=env("auth-tokens", "") or None,
                       help="file of 'IDENTITY TOKEN' lines: every call must carry 'authorization: Bearer TOKEN', and "
                            "sessions are bound to the identity that opened them")
    group.add_argument("--max-sessions-per-client", type=int, default=int(env("max-sessions-per-client", "64")),
                       help="open sessions per client identity (default %(default)s)")
    group.add_argument("--rate-limit", type=float, default=float(env("rate-limit", "0")),
                       help="calls per second per client identity, 0 = unlimited; over it: RESOURCE_EXHAUSTED with a "
                            "retry-after-ms hint (default %(default)s)")
    group.add_argument("--rate-burst", type=int, default=int(env("rate-burst", "0")),
                       help="calls a client may make at once, 0 = twice the rate (default %(default)s)")
    group.add_argument("--max-message-bytes", type=int, default=int(env("max-message-bytes", str(4 << 20))),
                       help="largest gRPC message, bytes (default %(default)s)")


def add_observability_flags(parser: argparse.ArgumentParser, env: EnvDefaults) -> None:
    """Metrics, traces and log format: the same flags on every service."""
    group = parser.add_argument_group("observability", "Prometheus metrics, OpenTelemetry traces and metrics over "
                                      "OTLP, structured logs (README.md, Observability)")
    group.add_argument("--metrics-port", type=int, default=_optional_int(env("metrics-port", "")),
                       help="serve Prometheus metrics on http://HOST:PORT/metrics (HOST = --host); 0 = any free port, "
                            "logged as 'metrics on http://...'; unset = no endpoint (default)")
    group.add_argument("--otlp-endpoint", default=env("otlp-endpoint", os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "")),
                       help="export spans and metrics to this OTLP gRPC collector, e.g. http://127.0.0.1:4317 "
                            "(plaintext) or https://HOST:4317 (TLS); also read from OTEL_EXPORTER_OTLP_ENDPOINT; "
                            "OTEL_BSP_SCHEDULE_DELAY and OTEL_METRIC_EXPORT_INTERVAL set how often (default: off)")
    group.add_argument("--log-format", default=env("log-format", "text"), choices=LOG_FORMATS,
                       help="text: one line per record; json: one object per line with time, level, logger, message "
                            "and the session_id, request_id, trace_id and span_id of the call (default %(default)s)")


def _optional_int(text: str) -> int | None:
    return int(text) if text.strip() else None


def observability_config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> ObservabilityConfig:
    if args.metrics_port is not None and not 0 <= args.metrics_port <= 65535:
        parser.error(f"--metrics-port must be 0..65535 (0 = any free port), got {args.metrics_port}")
    return ObservabilityConfig(args.metrics_port, args.otlp_endpoint or None, args.log_format)


def security_config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> ServerSecurity:
    try:
        return ServerSecurity(args.tls_cert, args.tls_key, args.tls_client_ca, args.auth_tokens,
                              args.max_sessions_per_client, args.rate_limit, args.rate_burst, args.max_message_bytes)
    except ValueError as error:
        parser.error(str(error))


def model_service_config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> ModelServiceConfig:
    return ModelServiceConfig(args.host, args.port, args.model, args.device, args.dtype, args.threads,
                              args.max_window, args.max_session_tokens, args.grace, security_config(parser, args),
                              observability_config(parser, args))
