"""Turn a model spec from the command line into a loaded model.

Specs:  "target" / "draft"  the default packaged pair (assembled on first use)
        "smollm2"           SmolLM2-135M-Instruct, packaged too; another tokenizer, so it drafts
                            through edgespec.backends.cross_tokenizer
        "tiny:SEED"         a tiny random-weight Qwen2 model for tests (vocab 320)
        "tiny:SEED~NOISE"   tiny:SEED with every weight perturbed by 4% noise (seeded by
                            NOISE): a draft that agrees with tiny:SEED about half the time
        PATH                any Hugging Face model directory
"""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import Qwen2Config

from edgespec.backends.assets import PACKAGED
from edgespec.backends.convert import ensure_model_dir
from edgespec.backends.torch_lm import TorchCausalLM, quantize_int8

TINY_VOCAB = 320   # bytes 0..255, EOS 256, the rest unused (see edgespec/backends/tokenizer.py)
TINY_EOS = 256


def tiny_config() -> Qwen2Config:
    # A wide initializer spreads the logits, so greedy choices are far from ties
    # and identical across batched and one-token forwards.
    return Qwen2Config(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                       initializer_range=0.5, tie_word_embeddings=False, eos_token_id=TINY_EOS)


def tiny_lm(spec: str) -> TorchCausalLM:
    seed, _, noise = spec.removeprefix("tiny:").partition("~")
    lm = TorchCausalLM.from_config(tiny_config(), seed=int(seed), name=spec)
    if noise:
        generator = torch.Generator().manual_seed(int(noise))
        with torch.no_grad():
            for weight in lm.model.parameters():
                weight.add_(torch.randn(weight.shape, generator=generator) * 0.04 * weight.std())
    return lm


def model_path(spec: str) -> Path:
    return ensure_model_dir(spec) if spec in PACKAGED else Path(spec)


def load_lm(spec: str, device: str | None = None, dtype: str = "float32", quantize: str = "none") -> TorchCausalLM:
    if spec.startswith("tiny:"):
        lm = tiny_lm(spec)
        if quantize == "int8":
            lm = TorchCausalLM(quantize_int8(lm.model), spec, lm.device)
            lm.quantized = "int8"
        return lm
    path = model_path(spec)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"model {spec!r}: {path} is not a Hugging Face model directory "
                                f"(expected 'target', 'draft', 'tiny:SEED' or a directory with config.json)")
    return TorchCausalLM.from_pretrained(path, device=device, dtype=dtype, quantize=quantize)


def eos_ids(lm) -> list[int]:
    """EOS ids: what the backend knows (llama.cpp: its end-of-generation tokens), else the generation config
    (chat models stop on several), else the model config."""
    if hasattr(lm, "eos_ids"):
        return lm.eos_ids()
    ids: set[int] = set()
    for cfg in (getattr(lm.model, "generation_config", None), lm.model.config):
        value = getattr(cfg, "eos_token_id", None) if cfg is not None else None
        if value is not None:
            ids.update([value] if isinstance(value, int) else value)
    return sorted(ids)
