"""llama.cpp's portable build for aarch64, cross-compiled here and run under emulation: does it decode?

    apt-get install g++-aarch64-linux-gnu qemu-user    # the cross compiler and the emulator (Debian names)
    edgespec bench aarch64 [--tokens 16] [--models smollm2,target] [--json PATH]

No aarch64 machine is at hand, so this is the check the README's CPU table names for aarch64: the vendored
llama.cpp of the pinned llama-cpp-python, configured with the flags the install's portable variant takes on an
aarch64 CPU (edgespec.ops.llama_build.cmake_args: llama.cpp's generic build, GGML_NATIVE=OFF), cross-compiled
with aarch64-linux-gnu-g++, its llama-completion run under qemu-aarch64 (user mode, the emulator's default CPU)
on each model's packaged GGUF: greedy, one thread, a chat-templated prompt. Beside it the x86-64 build of the
same sources (bench/llamacpp_tools.py, this machine's variant) decodes the same prompt with the same flags.

Reported per model: tokens decoded, the emulated decode rate (emulation speed, not an aarch64 CPU's), and
whether the two texts are identical (each architecture's own kernels round differently, so a near-tie may
part them: a difference is a finding to read, not a failure). What this does not check: the Python wheel
(scripts/install.sh on aarch64), its self-test and the services; they need an aarch64 machine.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.llamacpp_tools import build_tools, completion_text, ensure_tools, vendored_source
from edgespec.backends.assets import PACKAGED, cache_root, ensure_gguf
from edgespec.ops.llama_build import VERSION, Cpu, cmake_args

log = logging.getLogger("edgespec.cross_aarch64")

CROSS = "aarch64-linux-gnu"
SYSROOT = Path("/usr") / CROSS          # where Debian's cross packages put the aarch64 libc and libstdc++
PROMPT = "Write a Python function that returns the n-th Fibonacci number."
NEEDED = {f"{CROSS}-gcc": "g++-aarch64-linux-gnu", f"{CROSS}-g++": "g++-aarch64-linux-gnu", "qemu-aarch64": "qemu-user"}


def toolchain_args() -> list[str]:
    """CMake flags of the cross build: the aarch64 compilers, then the portable variant's flags on aarch64."""
    return ["-DCMAKE_SYSTEM_NAME=Linux", "-DCMAKE_SYSTEM_PROCESSOR=aarch64",
            f"-DCMAKE_C_COMPILER={CROSS}-gcc", f"-DCMAKE_CXX_COMPILER={CROSS}-g++",
            *cmake_args("portable", Cpu("aarch64", "", frozenset()))]


def cross_tool() -> Path:
    """The aarch64 llama-completion, built once per version and flags into $EDGESPEC_CACHE/llama.cpp-tools/."""
    args = toolchain_args()
    key = hashlib.sha256(" ".join(args).encode()).hexdigest()[:12]
    out = cache_root() / "llama.cpp-tools" / f"{VERSION}-aarch64-portable-{key}" / "llama-completion"
    if not out.is_file():
        with tempfile.TemporaryDirectory(prefix="llama-aarch64-") as work:
            build = build_tools(vendored_source(Path(work)), Path(work) / "build", ["llama-completion"], args)
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(build / "bin" / "llama-completion", out)
    return out


def complete(command: list[str], model: Path, prompt: str, tokens: int) -> dict:
    """One greedy llama-completion run (``command`` runs the binary): its text, and its decode rate as it says."""
    started = time.perf_counter()
    result = subprocess.run([*command, "-m", str(model), "-t", "1", "-c", "2048", "-n", str(tokens), "--temp", "0",
                             "-no-cnv", "--no-display-prompt", "-p", prompt], capture_output=True, text=True,
                            timeout=3600)
    if result.returncode != 0:
        raise SystemExit(f"{command[-1]} exited with {result.returncode}:\n{result.stderr[-2000:]}")
    rate = re.search(r"eval time =.*?/\s*(\d+) runs.*?([\d.]+) tokens per second\)", result.stderr)
    return {"text": completion_text(result.stdout),
            "decode_tokens_per_second": float(rate.group(2)) if rate else None,
            "seconds": round(time.perf_counter() - started, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(prog="edgespec bench aarch64", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=16, help="tokens to decode per model (default %(default)s)")
    parser.add_argument("--models", default="smollm2,target", help="packaged models, comma-separated (default "
                        "%(default)s; the target takes minutes under emulation)")
    parser.add_argument("--json", type=Path, default=Path("bench-results/cross-aarch64.json"))
    args = parser.parse_args()
    if args.tokens < 1:
        parser.error(f"--tokens must be at least 1, got {args.tokens}")
    models = args.models.split(",")
    unknown = [m for m in models if m not in PACKAGED]
    if unknown:
        parser.error(f"--models: unknown {', '.join(unknown)} (one of {', '.join(PACKAGED)})")
    missing = sorted({package for tool, package in NEEDED.items() if shutil.which(tool) is None})
    if missing:
        parser.error(f"needs {', '.join(NEEDED)}: apt-get install {' '.join(missing)}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from edgespec.backends.tokenizer import load_tokenizer

    arm = cross_tool()
    x86 = ensure_tools(("llama-completion",))["llama-completion"]
    kind = subprocess.run(["file", "-b", str(arm)], capture_output=True, text=True).stdout.strip() \
        if shutil.which("file") else ""
    rows = []
    for name in models:
        tokenizer = load_tokenizer(name)
        prompt = tokenizer.hf.apply_chat_template([{"role": "user", "content": PROMPT}],
                                                  add_generation_prompt=True, tokenize=False)
        model = ensure_gguf(name)
        emulated = complete(["qemu-aarch64", "-L", str(SYSROOT), str(arm)], model, prompt, args.tokens)
        native = complete([str(x86)], model, prompt, args.tokens)
        rows.append({"model": name, "aarch64": emulated, "x86_64": native,
                     "identical": emulated["text"] == native["text"]})
        print(f"{name}: aarch64 (emulated, {emulated['decode_tokens_per_second']} tok/s) "
              f"{'identical to' if rows[-1]['identical'] else 'differs from'} x86-64: {emulated['text']!r}",
              flush=True)
    result = {"binary": kind, "cmake_args": toolchain_args(), "tokens": args.tokens, "prompt": PROMPT, "rows": rows}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
