"""llama.cpp's own command-line tools, the anchors edgespec is measured against on a CPU.

    python -m bench.llamacpp_tools            # build (once) and print where the binaries are

`llama-bench` (target-only speed), `llama-speculative-simple` (llama.cpp's own speculative decoding
with a draft model), `llama-completion` (its greedy text) and `llama-server` (its OpenAI-compatible server:
continuous batching over `-np` slots, speculative decoding with `-md`) are built from the llama.cpp sources
that the pinned llama-cpp-python sdist vendors, so they are the same llama.cpp that edgespec's llama.cpp backend runs, built with the same CMake flags as the
wheel installed here (edgespec.ops.llama_build: the variant that passed its self-test on this CPU). The build
(cmake + ninja, a few minutes on 2 cores) lands in $EDGESPEC_CACHE/llama.cpp-tools/<version>-<variant>-<key>/ and
is reused.
"""
from __future__ import annotations

import logging
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from edgespec.backends.assets import cache_root
from edgespec.ops.llama_build import VERSION, chosen

log = logging.getLogger("edgespec.llamacpp_tools")

TOOLS = ("llama-bench", "llama-speculative-simple", "llama-completion", "llama-server")


def tools_dir() -> Path:
    build = chosen()
    return cache_root() / "llama.cpp-tools" / f"{VERSION}-{build.variant}-{build.key}"


def ensure_tools(names: tuple[str, ...] = TOOLS) -> dict[str, Path]:
    """Paths of the tools ``names``, building the missing ones first (a tool added later builds alone)."""
    out = tools_dir()
    found = {name: out / name for name in names}
    missing = [name for name, path in found.items() if not path.is_file()]
    if not missing:
        return found
    with tempfile.TemporaryDirectory(prefix="llama-tools-") as work:
        build = build_tools(vendored_source(Path(work)), Path(work) / "build", missing, chosen().args)
        out.mkdir(parents=True, exist_ok=True)
        for name in missing:
            shutil.copy2(build / "bin" / name, out / name)
    return found


def completion_text(stdout: str) -> str:
    """The generated text in what llama-completion prints (--no-display-prompt): without the " [end of text]"
    it adds at an end of generation and the newlines it ends with."""
    return re.sub(r"(?: \[end of text\])?\n*\Z", "", stdout)


def vendored_source(work: Path) -> Path:
    """The llama.cpp sources the pinned llama-cpp-python sdist vendors, downloaded and unpacked under ``work``."""
    log.info("downloading the llama-cpp-python %s sdist (its vendor/llama.cpp)", VERSION)
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                    f"llama-cpp-python=={VERSION}", "-d", str(work)], check=True)
    archive = next(work.glob("llama_cpp_python-*.tar.gz"))
    with tarfile.open(archive) as tar:
        tar.extractall(work, filter="data")
    return next(work.glob("llama_cpp_python-*/vendor/llama.cpp"))


def build_tools(source: Path, build: Path, targets: list[str], args: list[str]) -> Path:
    """Configure (Release, static, no tests, then ``args``) and build ``targets`` with ninja; the build folder."""
    log.info("building %s from %s (cmake + ninja; minutes)", ", ".join(targets), source)
    subprocess.run(["cmake", "-S", str(source), "-B", str(build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                    "-DLLAMA_BUILD_TESTS=OFF", "-DBUILD_SHARED_LIBS=OFF", *args], check=True)
    subprocess.run(["cmake", "--build", str(build), "--target", *targets, "-j", "2"], check=True)
    return build


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name, path in ensure_tools().items():
        print(f"{name}: {path}")
