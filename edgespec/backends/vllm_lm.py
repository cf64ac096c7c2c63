"""The target inside vLLM (services.verifier --backend vllm): one engine, one request per session.

Runs only in the vLLM environment (scripts/vllm_env.sh: vLLM pins its own transformers). The engine core runs
in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so the verifier reaches its scheduler between steps:

- a session is a vLLM request over its tokens, kept alive between windows (its KV stays in vLLM's paged cache,
  shared with other sessions through automatic prefix caching);
- a window's draft tokens are set as the request's speculative tokens before a step, and vLLM's own
  speculative decoding verifies them in that step (greedy: while they equal the argmax; sampling: the one-hot
  rule of n-gram drafting, which is lossless for any drafter);
- only requests with a window run in a step: the others are held out of the scheduler's running list for it
  (vLLM keeps an unscheduled request's state and KV, as it does when a step's token budget runs out).

vLLM asks a speculative proposer for drafts after every step; ``NoProposer`` proposes none, so the windows
set here are the only drafts it verifies.
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

log = logging.getLogger(__name__)

PROPOSER = "edgespec.backends.vllm_lm.NoProposer"


class NoProposer:
    """vLLM's custom_class speculative proposer that proposes nothing (the windows come from edgespec)."""

    def __init__(self, vllm_config) -> None:
        pass

    def load_model(self, target_model) -> None:
        """The CPU model runner calls this on every drafter (there is no draft model here)."""

    def propose(self, sampled_token_ids, *args, **kwargs) -> list[list[int]]:
        return [[] for _ in range(len(sampled_token_ids))]


@dataclass(frozen=True, slots=True)
class VllmOptions:
    """What the verifier passes through to vLLM's engine arguments."""
    dtype: str = "auto"                  # vLLM's --dtype (auto: the checkpoint's; bfloat16 on a CPU)
    max_model_len: int = 4096            # longest session, tokens (prompt + generated + one window)
    tensor_parallel_size: int = 1        # GPUs one copy of the target is split across
    pipeline_parallel_size: int = 1      # pipeline stages (GPUs or nodes)
    gpu_memory_utilization: float = 0.9  # share of each GPU's memory vLLM may take (weights + KV)
    quantization: str | None = None      # vLLM's --quantization (None: the checkpoint's, if any)
    kv_cache_gb: float = 2.0             # CPU only: the KV cache (VLLM_CPU_KVCACHE_SPACE), GiB
    enforce_eager: bool = True           # no CUDA graphs / torch.compile: starts in seconds, runs slower on a GPU
    max_num_seqs: int = 64               # requests (sessions) one step may carry
    seed: int = 0


@dataclass(slots=True)
class StepOutput:
    tokens: list[int]     # the tokens this step appended to the request (accepted drafts, then one of its own)
    finished: bool        # vLLM ended the request (its length limit): the session needs a new one


class VllmTarget:
    """A vLLM engine seen as the verifier's target: requests added, drafts set, steps taken, requests ended."""

    def __init__(self, engine, model: str, options: VllmOptions):
        self.engine = engine
        self.options = options
        self.name = Path(model).name
        self._scheduler = engine.engine_core.engine_core.scheduler
        model_config = engine.model_config
        self.vocab_size = model_config.get_vocab_size()
        self.dtype = str(model_config.dtype).removeprefix("torch.")
        self.device = engine.vllm_config.device_config.device_type
        self.placement = f"vLLM on {self.device} (tp {options.tensor_parallel_size}, pp {options.pipeline_parallel_size})"
        parallel = engine.vllm_config.parallel_config
        layers = model_config.get_num_layers(parallel)
        heads = model_config.get_num_kv_heads(parallel)
        element = 2 if self.dtype in ("bfloat16", "float16") else 4
        self.kv_bytes_per_token = 2 * layers * heads * model_config.get_head_size() * element
        self._seq = 0
        self._internal: dict[str, str] = {}   # the id a request was added with -> the scheduler's id for it

    # -- requests -------------------------------------------------------------------------------------------
    def add(self, tokens: Sequence[int], temperature: float, top_k: int, top_p: float, seed: int | None) -> str:
        """A request over ``tokens`` that vLLM will prefill on the next step it runs in; its id."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        self._seq += 1
        params = SamplingParams(temperature=temperature, top_k=top_k or 0, top_p=top_p, seed=seed,
                                max_tokens=max(1, self.options.max_model_len - len(tokens)), ignore_eos=True,
                                detokenize=False, output_kind=RequestOutputKind.DELTA)
        external = f"s{self._seq}"
        request_id = self.engine.add_request(external, {"prompt_token_ids": list(tokens)}, params)
        self._internal[external] = request_id
        return request_id

    def abort(self, request_id: str) -> None:
        self._internal.pop(request_id.rsplit("-", 1)[0], None)
        self.engine.abort_request([request_id], internal=True)

    def cached_tokens(self, request_id: str) -> int:
        """Prompt positions vLLM took from its prefix cache (known once the request was scheduled)."""
        request = self._scheduler.requests.get(request_id)
        return max(0, getattr(request, "num_cached_tokens", 0) or 0) if request is not None else 0

    def step(self, drafts: dict[str, Sequence[int]]) -> dict[str, StepOutput]:
        """One engine step over exactly these requests, each with its draft tokens (may be empty); what each
        appended. A request vLLM could not schedule this time (memory) appends nothing and is left out."""
        scheduler = self._scheduler
        for request_id, draft in drafts.items():
            scheduler.requests[request_id].spec_token_ids = list(draft)
        held = [r for r in scheduler.running if r.request_id not in drafts]
        scheduler.running[:] = [r for r in scheduler.running if r.request_id in drafts]
        try:
            outputs = self.engine.step()
        finally:
            scheduler.running.extend(held)
            for request_id in drafts:   # drafts vLLM did not schedule must not run in a later step
                request = scheduler.requests.get(request_id)
                if request is not None:
                    request.spec_token_ids = []
        result: dict[str, StepOutput] = {}
        for output in outputs:   # vLLM reports a request by the id it was added with
            request_id = self._internal.get(output.request_id)
            if request_id is None:
                continue
            if output.finished:
                del self._internal[output.request_id]
            result[request_id] = StepOutput(list(output.outputs[0].token_ids), output.finished)
        return result


def _expand(output, input, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None, **_):
    """vLLM's expand kernel (a per-request value repeated over the request's draft positions), in torch."""
    import torch

    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1, dtype=torch.long))
    values = torch.where(input == replace_from, torch.as_tensor(replace_to, dtype=input.dtype), input)
    output.copy_(torch.repeat_interleave(values, counts, output_size=output.shape[0]))


def repair_expand() -> bool:
    """vllm-cpu 0.32.0's CPU expand kernel writes into an int64 copy of its output, so the per-position
    temperatures (float32) and top-k values (int32) it should fill stay uninitialized: sampled speculative
    decoding then draws from garbage (measured: a draft with p = 0.95 accepted 3 times in 10, recovered tokens
    near uniform). Greedy requests never use it. Checks the kernel, installs the torch one if it is wrong;
    whether it had to."""
    import torch
    from vllm.triton_utils.dispatcher import register_kernels
    from vllm.v1.sample import rejection_sampler

    def works() -> bool:
        got = rejection_sampler.expand_batch_to_tokens(torch.tensor([0.5, 2.0]), torch.tensor([1, 3], dtype=torch.int32),
                                                       3, replace_from=-1, replace_to=1)
        return got.tolist() == [0.5, 2.0, 2.0]
    if works():
        return False
    register_kernels({"vllm.v1.sample.rejection_sampler.expand_kernel": _expand})
    if not works():
        raise RuntimeError("vLLM's expand kernel is wrong and could not be replaced: sampled windows would not be "
                           "verified losslessly")
    log.warning("vLLM's CPU expand kernel is wrong (it fills a copy of its output): replaced by a torch one, "
                "so that sampled windows are verified from the right distribution")
    return True


def load(model: str, options: VllmOptions, max_window: int) -> VllmTarget:
    """Start vLLM on ``model`` (a Hugging Face model directory), its engine core in this process."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"   # the scheduler must be reachable from here
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{options.kv_cache_gb:g}")
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    started = time.perf_counter()
    args = EngineArgs(model=model, dtype=options.dtype, max_model_len=options.max_model_len,
                      tensor_parallel_size=options.tensor_parallel_size,
                      pipeline_parallel_size=options.pipeline_parallel_size,
                      gpu_memory_utilization=options.gpu_memory_utilization, quantization=options.quantization,
                      enable_prefix_caching=True, enforce_eager=options.enforce_eager, seed=options.seed,
                      max_num_seqs=options.max_num_seqs, async_scheduling=False,
                      speculative_config={"method": "custom_class", "model": PROPOSER,
                                          "num_speculative_tokens": max_window})
    engine = LLMEngine.from_engine_args(args)
    repair_expand()
    log.info("vLLM engine up in %.1fs", time.perf_counter() - started)
    return VllmTarget(engine, model, options)


def model_dir(spec: str) -> Path:
    """The Hugging Face model directory vLLM loads for ``spec``: a packaged model's converted directory (made by
    `edgespec prepare-models NAME` in edgespec's own environment: converting needs its transformers), a path,
    or a Hugging Face id in the local cache. ModelNotFoundError, saying what to run, otherwise."""
    from edgespec.backends.assets import PACKAGED, ModelNotFoundError, cache_root, local_model

    if spec in PACKAGED:
        path = cache_root() / "models" / PACKAGED[spec].name
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"model {spec!r} is not prepared at {path}: run `.venv/bin/edgespec "
                                     f"prepare-models {spec}` (edgespec's environment converts it once)")
        return path
    path = local_model(spec)
    if not (path.is_dir() and (path / "config.json").is_file()):
        raise ModelNotFoundError(f"model {spec!r}: the vLLM backend takes a Hugging Face model directory (with "
                                 f"config.json), and {path} is not one")
    return path


def available() -> bool:
    """Whether this Python has vLLM (the vLLM environment does; edgespec's own does not)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def eos_ids(model: str | Path) -> list[int]:
    """The model's end-of-sequence ids: its generation_config.json, else its config.json."""
    ids: set[int] = set()
    for name in ("generation_config.json", "config.json"):
        path = Path(model) / name
        if path.is_file():
            value = json.loads(path.read_text()).get("eos_token_id")
            ids.update(value if isinstance(value, list) else [value] if value is not None else [])
            if ids:
                break
    return sorted(ids)
