"""A draft model on ONNX Runtime: numpy KV caches that crop to a position.

Runs a directory written by `edgespec export-onnx` with onnxruntime and numpy
alone (no torch, no transformers), so an edge device needs neither. The cache
semantics are TorchCausalLM's: ``OnnxKV`` remembers exactly which tokens its
arrays hold, and ``logits`` keeps the longest common prefix with the requested
sequence and feeds the rest. Rollback is asking for a shorter sequence.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import onnxruntime as ort

from edgespec.backends.incremental import IncrementalLM
from edgespec.verify.greedy import common_prefix_length

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"   # written by edgespec.ops.export_onnx


@dataclass(slots=True)
class OnnxKV:
    """Per-layer key/value arrays [1, kv_heads, len(tokens), head_dim] and the exact tokens they hold."""
    keys: list[np.ndarray]
    values: list[np.ndarray]
    tokens: list[int] = field(default_factory=list)


class OnnxCausalLM(IncrementalLM):
    """Greedy drafting and logits on an exported graph; one run at a time (callers serialize)."""

    def __init__(self, model_dir: str | Path, threads: int = 0):
        """``threads``: ONNX Runtime intra-op threads, 0 = its default (one per physical core)."""
        started = time.perf_counter()
        model_dir = Path(model_dir)
        try:
            self.manifest = json.loads((model_dir / MANIFEST).read_text())
        except FileNotFoundError:
            raise FileNotFoundError(f"{model_dir} has no {MANIFEST}: write it with "
                                    f"`edgespec export-onnx MODEL {model_dir}`") from None
        m = self.manifest
        self.layers, self.kv_heads, self.head_dim = m["num_layers"], m["num_kv_heads"], m["head_dim"]
        self.vocab_size = int(m["vocab_size"])
        self.eos_token_ids = list(m["eos_token_ids"])
        self.name = f"{m['source']} (onnx)"
        self.device = "cpu"
        self.quantized = "int8" if m["quantization"] != "none" else "none"
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        self.session = ort.InferenceSession(str(model_dir / m["graph"]), options, providers=["CPUExecutionProvider"])
        self._past = [f"past.{i}.{kind}" for i in range(self.layers) for kind in ("key", "value")]
        log.info("loaded %s (%s) in %.1fs", model_dir, m["quantization"], time.perf_counter() - started)

    @property
    def placement(self) -> str:
        quant = "" if self.quantized == "none" else f" ({self.quantized} dynamic)"
        return f"{self.device} {self.manifest['dtype']}{quant}"

    def new_state(self) -> OnnxKV:
        empty = np.zeros((1, self.kv_heads, 0, self.head_dim), dtype=np.float32)
        return OnnxKV([empty] * self.layers, [empty] * self.layers)

    def crop(self, state: OnnxKV, length: int) -> None:
        """Keep the first ``length`` cached positions (no-op if already shorter)."""
        if len(state.tokens) > length:
            # Copies: ONNX Runtime wants C-contiguous inputs, and a slice along the length axis is not.
            state.keys = [np.ascontiguousarray(k[:, :, :length]) for k in state.keys]
            state.values = [np.ascontiguousarray(v[:, :, :length]) for v in state.values]
            del state.tokens[length:]

    def logits(self, state: OnnxKV, seq: Sequence[int]) -> np.ndarray:
        """Logits after each newly fed token of ``seq``: float32 [m, vocab], m >= 1.

        The cache is cropped to the longest prefix it shares with ``seq`` (leaving
        at least the last token to feed), then the rest of ``seq`` is fed. Row i of
        the result scores the token that follows seq[len(seq) - m + i].
        """
        if not seq:
            raise ValueError("seq must hold at least one token")
        keep = min(common_prefix_length(state.tokens, seq), len(seq) - 1)
        self.crop(state, keep)
        feed = list(seq[keep:])
        inputs = {"input_ids": np.array([feed], dtype=np.int64),
                  "position_ids": np.arange(keep, keep + len(feed), dtype=np.int64)[None]}
        for i in range(self.layers):
            inputs[self._past[2 * i]], inputs[self._past[2 * i + 1]] = state.keys[i], state.values[i]
        logits, *present = self.session.run(None, inputs)   # a failed run leaves the state as cropped: still true
        state.keys, state.values = present[0::2], present[1::2]
        state.tokens.extend(feed)
        return logits[0]
