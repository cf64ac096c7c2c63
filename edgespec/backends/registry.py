"""Turn a model spec from the command line into a loaded model.

Specs:  "target" / "draft"  the default packaged pair (assembled on first use)
        "smollm2"           SmolLM2-135M-Instruct, packaged too; another tokenizer, so it drafts
                            through edgespec.backends.cross_tokenizer
        "tiny:SEED"         a tiny random-weight Qwen2 model for tests (vocab 320)
        "tiny:SEED~NOISE"   tiny:SEED with every weight perturbed by 4% noise (seeded by
                            NOISE): a draft that agrees with tiny:SEED about half the time
        PATH                any Hugging Face model directory (a .gguf file: the llama.cpp backend)
        ORG/NAME            a Hugging Face id, loaded from the local Hugging Face cache (HF_HUB_CACHE, HF_HOME;
                            never downloaded: a missing one is a ModelNotFoundError naming the cache)

dtype "auto" is the checkpoint's own (config.json), except that a CPU without native bfloat16 computes in
float32 (bfloat16 and float16 are emulated there, several times slower), and tiny models are float32.
"""
from __future__ import annotations

import json
import logging
import platform
from pathlib import Path

import torch
from transformers import Qwen2Config

from edgespec.backends.assets import PACKAGED, ModelNotFoundError, is_hf_id, local_model
from edgespec.backends.convert import ensure_model_dir
from edgespec.backends.torch_lm import TorchCausalLM, quantize_int8

TINY_VOCAB = 320   # bytes 0..255, EOS 256, the rest unused (see edgespec/backends/tokenizer.py)
TINY_EOS = 256

log = logging.getLogger(__name__)


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
    """Where the model ``spec`` names lives: a packaged model's directory (converted on first use), a path, or a
    Hugging Face id's snapshot in the local Hugging Face cache (ModelNotFoundError when it is not there)."""
    return ensure_model_dir(spec) if spec in PACKAGED else local_model(spec)


def cpu_native_bf16() -> bool:
    """The CPU computes bfloat16 natively (x86: AVX512-BF16 or AMX; Arm: the BF16 extension)."""
    cpu = getattr(torch, "cpu", None)
    for probe in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        check = getattr(cpu, probe, None)
        try:
            if check is not None and check():
                return True
        except RuntimeError:
            pass
    if platform.machine().lower() in ("aarch64", "arm64"):
        try:
            with open("/proc/cpuinfo") as info:
                return any(line.startswith("Features") and " bf16" in line for line in info)
        except OSError:
            return False
    return False


def checkpoint_dtype(path: Path) -> str | None:
    """The dtype a model directory's config.json declares ("dtype", formerly "torch_dtype"), if any."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    value = config.get("dtype") or config.get("torch_dtype")
    return value.removeprefix("torch.") if isinstance(value, str) else None


def model_dtype(spec: str, device: str | None, dtype: str) -> str:
    """The dtype to load ``spec`` in: ``dtype`` itself, or for "auto" the checkpoint's where the device computes
    it natively, else float32 (said in the log)."""
    if dtype != "auto":
        return dtype
    if spec.startswith("tiny:"):
        return "float32"
    declared = checkpoint_dtype(model_path(spec)) or "float32"
    if declared not in ("float32", "bfloat16", "float16"):
        log.info("--dtype auto: %s declares %s; loading float32", spec, declared)
        return "float32"
    on_gpu = torch.cuda.is_available() if device in (None, "", "auto") else torch.device(device).type == "cuda"
    if on_gpu:
        if declared == "bfloat16" and not torch.cuda.is_bf16_supported():
            log.info("--dtype auto: %s is bfloat16, which this GPU lacks: float16", spec)
            return "float16"
        return declared
    if declared == "float32" or (declared == "bfloat16" and cpu_native_bf16()):
        return declared
    log.info("--dtype auto: %s is %s, but this CPU has no native %s (emulated, several times slower): "
             "float32", spec, declared, declared)
    return "float32"


def load_lm(spec: str, device: str | None = None, dtype: str = "float32", quantize: str = "none") -> TorchCausalLM:
    dtype = model_dtype(spec, device, dtype)
    if spec.startswith("tiny:"):
        lm = tiny_lm(spec)
        if quantize == "int8":
            lm = TorchCausalLM(quantize_int8(lm.model), spec, lm.device)
            lm.quantized = "int8"
        return lm
    path = model_path(spec)
    if path.is_file() and path.suffix == ".gguf":
        raise ModelNotFoundError(f"model {spec!r} is a GGUF file: run it with --backend llamacpp (the torch "
                                 f"backend loads model directories)")
    if not (path / "config.json").exists():
        ggufs = sorted(p.name for p in path.glob("*.gguf")) if path.is_dir() else []
        hint = (f"; it holds GGUF files ({', '.join(ggufs[:3])}): run one with --backend llamacpp and "
                f"--model {path}/FILE.gguf" if ggufs else "")
        raise ModelNotFoundError(f"model {spec!r}: {path} is not a Hugging Face model directory (no config.json)"
                                 f"{hint}")
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise ModelNotFoundError(f"model {spec!r}: {path} has a config.json but no weights (*.safetensors or "
                                 f"*.bin){' (a partial download: fetch the whole repository)' if is_hf_id(spec) else ''}")
    lm = TorchCausalLM.from_pretrained(path, device=device, dtype=dtype, quantize=quantize)
    if is_hf_id(spec):
        lm.name = spec     # the id, not the snapshot's hashed path, in Info and the logs
    return lm


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
