"""A transformers causal LM with per-session KV caches that crop to a position.

One mechanism serves the verifier, the drafter and target-only decoding:
``KVState`` remembers exactly which tokens its cache holds, and ``logits`` syncs
the cache to a requested sequence by keeping the longest common prefix and feeding
the rest. Rollback is therefore "ask for a shorter sequence" — never an undo log —
and a cache can never silently disagree with the tokens it claims to hold.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from transformers import AutoModelForCausalLM, DynamicCache, PretrainedConfig

from edgespec.backends.incremental import IncrementalLM
from edgespec.verification import common_prefix_length

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str | None) -> torch.device:
    """``None``/"auto" picks the GPU when one is present, else the CPU."""
    if device in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available")
    return resolved


def resolve_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {name!r}") from None


def quantize_int8(model: torch.nn.Module) -> torch.nn.Module:
    """Dynamic int8 quantization of the Linear layers (weights int8, activations float)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao's eager API warns about its move to torchao
        return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)


@dataclass(slots=True)
class KVState:
    """A KV cache and the exact tokens whose keys/values it holds."""
    cache: DynamicCache = field(default_factory=DynamicCache)
    tokens: list[int] = field(default_factory=list)


class TorchCausalLM(IncrementalLM):
    """Greedy scoring with KV caches; one forward at a time (callers serialize)."""

    def __init__(self, model: torch.nn.Module, name: str, device: torch.device):
        self.model = model.eval()
        self.name = name
        self.device = device
        self.dtype = next(model.parameters()).dtype
        self.vocab_size = int(model.config.vocab_size)
        self.quantized = "none"

    @classmethod
    def from_pretrained(cls, path: str | Path, device: str | None = None, dtype: str = "float32",
                        quantize: str = "none") -> "TorchCausalLM":
        """Load a model directory. ``quantize="int8"`` applies dynamic int8 quantization
        to every Linear layer (CPU only): ~2.4x faster drafting here, at some acceptance cost."""
        started = time.perf_counter()
        dev = resolve_device(device)
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=resolve_dtype(dtype)).to(dev)
        if quantize == "int8":
            if dev.type != "cpu" or dtype != "float32":
                raise ValueError("int8 dynamic quantization needs device cpu and dtype float32")
            model = quantize_int8(model)
        elif quantize != "none":
            raise ValueError(f"quantize must be 'none' or 'int8', got {quantize!r}")
        lm = cls(model, str(path), dev)
        lm.quantized = quantize
        log.info("loaded %s on %s (%s, quantize %s) in %.1fs", path, dev, dtype, quantize, time.perf_counter() - started)
        return lm

    @classmethod
    def from_config(cls, config: PretrainedConfig, seed: int, name: str = "tiny-random") -> "TorchCausalLM":
        """A random-weight model for fast tests; the same seed gives the same weights."""
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        return cls(model, name, torch.device("cpu"))

    @property
    def placement(self) -> str:
        quant = "" if self.quantized == "none" else f" ({self.quantized} dynamic)"
        return f"{self.device} {str(self.dtype).removeprefix('torch.')}{quant}"

    def new_state(self) -> KVState:
        return KVState()

    def crop(self, state: KVState, length: int) -> None:
        """Keep the first ``length`` cached positions (no-op if already shorter)."""
        drop = len(state.tokens) - length
        if drop > 0:
            state.cache.crop(-drop)  # transformers 5: negative = drop the last n
            del state.tokens[length:]

    @torch.inference_mode()
    def logits(self, state: KVState, seq: Sequence[int]) -> torch.Tensor:
        """Logits after each newly fed token of ``seq``: [m, vocab], m >= 1.

        The cache is cropped to the longest prefix it shares with ``seq`` (leaving
        at least the last token to feed), then the rest of ``seq`` is fed. Row i of
        the result scores the token that follows seq[len(seq) - m + i].
        """
        if not seq:
            raise ValueError("seq must hold at least one token")
        keep = min(common_prefix_length(state.tokens, seq), len(seq) - 1)
        self.crop(state, keep)
        feed = list(seq[keep:])
        ids = torch.tensor([feed], dtype=torch.long, device=self.device)
        positions = torch.arange(keep, keep + len(feed), device=self.device).unsqueeze(0)
        try:
            out = self.model(input_ids=ids, position_ids=positions, cache=state.cache, use_cache=True)
        except BaseException:
            # A failed forward may have half-written the cache: forget it rather than trust it.
            state.cache, state.tokens = DynamicCache(), []
            raise
        state.tokens.extend(feed)
        return out.logits[0].float()

    def _numpy(self, rows: torch.Tensor) -> np.ndarray:
        return rows.cpu().numpy()
