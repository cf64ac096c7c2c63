"""The aarch64 cross-check's flags and its refusals. The build and the emulated run take minutes and a cross
compiler, so they are run by hand (docs/benchmarks.md); here: what it would configure, and bad input."""
from __future__ import annotations

import subprocess
import sys

from bench.cross_aarch64 import toolchain_args
from edgespec.ops.llama_build import Cpu, cmake_args
from harness.cluster import REPO_ROOT


def run(*args: str, path: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench.cross_aarch64", *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120, env={"PATH": path, "PYTHONPATH": str(REPO_ROOT)})


def test_it_configures_the_install_s_portable_aarch64_flags_for_the_cross_compiler():
    args = toolchain_args()
    assert "-DCMAKE_SYSTEM_PROCESSOR=aarch64" in args and "-DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++" in args
    portable = cmake_args("portable", Cpu("aarch64", "", frozenset()))
    assert args[-len(portable):] == portable and "-DGGML_NATIVE=OFF" in portable
    assert not any("AVX" in a or "AMX" in a for a in args)   # no x86 instruction set leaks into it


def test_without_the_cross_compiler_it_names_the_packages_and_builds_nothing(tmp_path):
    result = run("--json", str(tmp_path / "out.json"), path=str(tmp_path))   # nothing on PATH
    assert result.returncode == 2
    assert "apt-get install g++-aarch64-linux-gnu qemu-user" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "out.json").exists()


def test_bad_flags_are_refused_before_anything_runs(tmp_path):
    result = run("--tokens", "0", path=str(tmp_path))
    assert result.returncode == 2 and "--tokens must be at least 1, got 0" in result.stderr
    result = run("--models", "smollm2,nonesuch", path=str(tmp_path))
    assert result.returncode == 2 and "--models: unknown nonesuch" in result.stderr

