"""The llama.cpp build: one that runs on the CPU it is installed on, and uses that CPU's best kernels.

    python -m edgespec.ops.llama_build wheel      # build (once) the wheel to install; print its folder
    python -m edgespec.ops.llama_build ensure     # install it into this Python, self-test it, fall back if it dies
    python -m edgespec.ops.llama_build show       # what is installed, and what each variant would be built with

llama-cpp-python is an sdist that compiles llama.cpp. Built as llama.cpp builds by default (``GGML_NATIVE=ON``), it
uses every instruction the build machine reports; on a Sapphire Rapids VM that reports AMX, its AMX kernel died
by SIGSEGV in the first forward. So the build is tried in variants, best first, each *self-tested*: a subprocess
loads the default target and decodes the batch shapes the services use (a prompt, 1, 4 and 16 rows). A variant
whose self-test dies by a signal is recorded as bad for this CPU and the next one is built:

- ``native``: ``GGML_NATIVE=ON``, every kernel this CPU has (AMX included);
- ``portable``: ``GGML_NATIVE=OFF`` with the instruction sets this CPU reports named one by one, and no AMX
  (x86-64); elsewhere llama.cpp's generic build for the architecture.

``EDGESPEC_LLAMA_BUILD=native|portable`` picks a variant instead of ``auto``. Wheels are cached under
``$EDGESPEC_CACHE/wheels/`` in a folder named by a hash of what they were built from: the llama-cpp-python
version, the CMake flags, the compiler, the Python ABI and, for ``native``, the CPU itself. A wheel built on one
CPU is never installed on another by mistake. ``EDGESPEC_LLAMA_SELFTEST_FAULT=VARIANT[,VARIANT]`` makes those
variants' self-tests die by SIGSEGV, so the fallback path can be tested on any machine: no self-test is recorded
then, and none recorded before is read (a variant that really died here is tried again, with the fault).

Standard library only: it runs before the rest of edgespec's dependencies are installed.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import signal
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

VERSION = "0.3.36"   # llama-cpp-python, as pinned in pyproject.toml
VARIANTS = ("native", "portable")
ENV_VARIANT = "EDGESPEC_LLAMA_BUILD"
ENV_FAULT = "EDGESPEC_LLAMA_SELFTEST_FAULT"
SELFTEST_SECONDS = 300

# /proc/cpuinfo flag -> the ggml CMake option that turns its kernels on (x86-64). AMX is left out on purpose.
X86_OPTIONS = (("avx", "GGML_AVX"), ("avx2", "GGML_AVX2"), ("bmi2", "GGML_BMI2"), ("fma", "GGML_FMA"),
               ("f16c", "GGML_F16C"), ("avx_vnni", "GGML_AVX_VNNI"), ("avx512f", "GGML_AVX512"),
               ("avx512vbmi", "GGML_AVX512_VBMI"), ("avx512_vnni", "GGML_AVX512_VNNI"),
               ("avx512_bf16", "GGML_AVX512_BF16"))
AMX_OPTIONS = ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")


class BuildError(RuntimeError):
    """No variant of the llama.cpp build could be built or survived its self-test; the message says what to do."""


def cache_root() -> Path:
    """$EDGESPEC_CACHE, else ~/.cache/edgespec (the models' cache too: edgespec.backends.assets.cache_root)."""
    return Path(os.environ.get("EDGESPEC_CACHE", Path.home() / ".cache" / "edgespec"))


@dataclass(frozen=True, slots=True)
class Cpu:
    machine: str            # platform.machine(): x86_64, aarch64, ...
    model: str              # the CPU's model name, "" if unknown
    flags: frozenset[str]   # instruction-set flags (/proc/cpuinfo "flags" or "Features")

    @property
    def key(self) -> str:
        """Identifies this kind of CPU: what a native build and a self-test result are valid for."""
        text = "\n".join([self.machine, self.model, " ".join(sorted(self.flags))])
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def this_cpu(cpuinfo: str | None = None) -> Cpu:
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            cpuinfo = ""
    model = re.search(r"^(?:model name|Model|CPU part)\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
    flags = re.search(r"^(?:flags|Features)\s*:\s*(.*)$", cpuinfo, re.MULTILINE)
    return Cpu(platform.machine(), model.group(1).strip() if model else "",
               frozenset(flags.group(1).split()) if flags else frozenset())


def cmake_args(variant: str, cpu: Cpu) -> list[str]:
    """The CMake flags of a variant on this CPU. OpenMP stays on (llama.cpp's default): its barrier spins a
    bounded time and then sleeps, where ggml's own thread pool spins without yielding (with more threads than
    free cores, services beside each other on two cores, the suite took 85 min without OpenMP, ~50 with it)."""
    common = ["-DLLAMA_CURL=OFF"]
    if variant == "native":
        return ["-DGGML_NATIVE=ON", *common]
    if variant != "portable":
        raise ValueError(f"unknown llama.cpp build variant {variant!r} (one of {', '.join(VARIANTS)})")
    args = ["-DGGML_NATIVE=OFF", *common]
    if cpu.machine in ("x86_64", "AMD64", "i686"):
        args += [f"-D{option}={'ON' if flag in cpu.flags else 'OFF'}" for flag, option in X86_OPTIONS]
        args += [f"-D{option}=OFF" for option in AMX_OPTIONS]
    return args


def compiler() -> str:
    """The first line of the C compiler's --version (part of what a wheel was built with)."""
    for cc in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if not cc:
            continue
        try:
            out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out:
            return out.splitlines()[0].strip()
    return ""


@dataclass(frozen=True, slots=True)
class Build:
    variant: str
    args: tuple[str, ...]   # CMake flags
    key: str                # hash of everything the wheel is built from

    @property
    def wheel_dir(self) -> Path:
        return cache_root() / "wheels" / f"llama-cpp-python-{VERSION}-{self.variant}-{self.key}"

    def wheel(self) -> Path | None:
        found = sorted(self.wheel_dir.glob(f"llama_cpp_python-{VERSION}-*.whl"))
        return found[0] if found else None


def plan(variant: str, cpu: Cpu, cc: str | None = None) -> Build:
    args = cmake_args(variant, cpu)
    parts = [VERSION, variant, " ".join(args), cc if cc is not None else compiler(), cpu.machine,
             sysconfig.get_config_var("SOABI") or sys.version, cpu.key if variant == "native" else ""]
    return Build(variant, tuple(args), hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16])


def variants() -> list[str]:
    choice = os.environ.get(ENV_VARIANT, "auto").strip() or "auto"
    if choice == "auto":
        return list(VARIANTS)
    if choice not in VARIANTS:
        raise BuildError(f"{ENV_VARIANT}={choice!r}: expected auto, {' or '.join(VARIANTS)}")
    return [choice]


def build_wheel(build: Build, python: str = sys.executable) -> Path:
    """The variant's wheel, compiled once (minutes on 2 cores) into its cache folder."""
    wheel = build.wheel()
    if wheel:
        return wheel
    build.wheel_dir.mkdir(parents=True, exist_ok=True)
    say(f"building llama-cpp-python {VERSION}, variant {build.variant} ({' '.join(build.args)}); cached in "
        f"{build.wheel_dir}")
    env = {**os.environ, "CMAKE_ARGS": " ".join(build.args), "FORCE_CMAKE": "1",
           "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)}
    result = subprocess.run([python, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check", "--no-deps",
                             "--no-cache-dir", "-w", str(build.wheel_dir), f"llama-cpp-python=={VERSION}"], env=env)
    wheel = build.wheel()
    if result.returncode != 0 or wheel is None:
        raise BuildError(f"building llama-cpp-python {VERSION} (variant {build.variant}) failed (pip exit "
                         f"{result.returncode}); it needs a C/C++ compiler and cmake (apt-get install build-essential "
                         f"cmake)")
    return wheel


# ---- which variant this CPU runs: records next to the wheels --------------------------------------------------

def record_path(build: Build, cpu: Cpu) -> Path:
    return build.wheel_dir / f"selftest-{cpu.key}.json"


def recorded(build: Build, cpu: Cpu) -> dict | None:
    try:
        return json.loads(record_path(build, cpu).read_text())
    except (OSError, ValueError):
        return None


def installed_marker(prefix: Path) -> Path:
    return prefix / "edgespec-llama-build.json"


def installed(prefix: Path = Path(sys.prefix)) -> dict | None:
    try:
        return json.loads(installed_marker(prefix).read_text())
    except (OSError, ValueError):
        return None


# ---- the self-test: a real decode of the default target in a subprocess --------------------------------------

SELFTEST_CODE = r"""
import os, signal, sys
import llama_cpp as llama
from llama_cpp import _logger
_logger.set_verbose(False)
path, fault = sys.argv[1], sys.argv[2] == "1"
llama.llama_backend_init()
mp = llama.llama_model_default_params()
model = llama.llama_model_load_from_file(path.encode(), mp)
assert model, "model did not load"
cp = llama.llama_context_default_params()
cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = 512, 128, 128, 2
cp.n_threads = cp.n_threads_batch = min(4, os.cpu_count() or 1)
ctx = llama.llama_init_from_model(model, cp)
assert ctx, "context not created"
vocab = llama.llama_model_get_vocab(model)
n_vocab = llama.llama_vocab_n_tokens(vocab)
if fault:
    os.kill(os.getpid(), signal.SIGSEGV)
batch = llama.llama_batch_init(128, 0, 1)
pos = 0
for rows in (64, 1, 4, 16, 1):   # a prompt, then the shapes of target-only and of windows
    for i in range(rows):
        batch.token[i] = (pos * 7919 + 11) % n_vocab
        batch.pos[i] = pos
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = 0
        batch.logits[i] = i == rows - 1
        pos += 1
    batch.n_tokens = rows
    status = llama.llama_decode(ctx, batch)
    assert status == 0, f"llama_decode returned {status}"
    row = llama.llama_get_logits_ith(ctx, -1)
    assert all(abs(row[j]) < 1e30 for j in range(0, n_vocab, 997)), "logits not finite"
print("self-test ok:", llama.llama_print_system_info().decode().strip())
"""


def selftest_model() -> Path:
    """The GGUF the self-test decodes: the default target (the model the crash was seen with)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from edgespec.backends.assets import ensure_gguf
    return ensure_gguf("target")


def selftest(python: str, model: Path, variant: str, pythonpath: str | None = None) -> tuple[bool, str]:
    """(passed, what happened): decode in a subprocess of ``python`` that imports the installed llama_cpp."""
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    fault = "1" if variant in os.environ.get(ENV_FAULT, "").split(",") else "0"
    try:
        result = subprocess.run([python, "-c", SELFTEST_CODE, str(model), fault], capture_output=True, text=True,
                                env=env, timeout=SELFTEST_SECONDS)
    except subprocess.TimeoutExpired:
        return False, f"no answer within {SELFTEST_SECONDS}s"
    if result.returncode == 0:
        return True, result.stdout.strip().splitlines()[-1] if result.stdout.strip() else "ok"
    return False, describe_exit(result.returncode, result.stderr)


def describe_exit(code: int, stderr: str = "") -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"died by {name}"
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    return f"exited with {code}" + (f": {lines[-1]}" if lines else "")


def pip_install(python: str, wheel: Path, target: Path | None) -> None:
    where = ["--target", str(target), "--upgrade"] if target else []
    command = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
               "--force-reinstall", *where, str(wheel)]
    if subprocess.run(command).returncode != 0:
        raise BuildError(f"installing {wheel} failed")


def ensure(target: Path | None = None, python: str = sys.executable) -> Build:
    """Install a variant that passes its self-test on this CPU (best first), into this Python's environment or
    into ``target`` (a folder put first on PYTHONPATH). Returns the build installed."""
    cpu = this_cpu()
    model = selftest_model()
    failures = []
    injected = bool(os.environ.get(ENV_FAULT))   # a test of the fallback path: no record read or written
    for variant in variants():
        build = plan(variant, cpu)
        record = None if injected else recorded(build, cpu)
        if record and not record["passed"]:
            failures.append(f"{variant}: {record['result']} (recorded {record['when']})")
            say(f"variant {variant} {record['result']} in its self-test on this CPU before; skipping it "
                f"(delete {record_path(build, cpu)} to try again)")
            continue
        wheel = build_wheel(build, python)
        prefix = target if target else Path(sys.prefix)
        if target or (installed(prefix) or {}).get("key") != build.key:
            pip_install(python, wheel, target)
            installed_marker(prefix).parent.mkdir(parents=True, exist_ok=True)
            installed_marker(prefix).write_text(json.dumps({"variant": variant, "key": build.key,
                                                            "cmake_args": list(build.args), "wheel": str(wheel)}))
        if record and record["passed"]:
            say(f"llama.cpp build {variant} ({build.key}) installed; it passed its self-test on this CPU")
            return build
        started = time.monotonic()
        passed, result = selftest(python, model, variant, str(target) if target else None)
        if not injected:   # an injected fault says nothing about this CPU
            record_path(build, cpu).write_text(json.dumps({"passed": passed, "result": result, "cpu": cpu.model,
                                                           "when": time.strftime("%Y-%m-%d %H:%M:%S")}))
        if passed:
            say(f"llama.cpp build {variant} passed its self-test in {time.monotonic() - started:.0f}s ({result})")
            return build
        failures.append(f"{variant}: {result}")
        say(f"llama.cpp build {variant} {result} in its self-test on this CPU ({cpu.model or cpu.machine}); "
            f"trying the next variant")
    raise BuildError("no llama.cpp build runs on this CPU (" + "; ".join(failures) + "). Set "
                     f"{ENV_VARIANT}=portable, or report the CPU (lscpu) with the self-test's output")


def chosen(cpu: Cpu | None = None) -> Build:
    """The build that runs here: the one installed into this Python if it records one, else the first variant
    not recorded as bad on this CPU (what `ensure` would pick). llama.cpp's own tools are built the same way."""
    cpu = cpu or this_cpu()
    marker = installed()
    for variant in variants():
        build = plan(variant, cpu)
        if marker and marker.get("key") == build.key:
            return build
    for variant in variants():
        build = plan(variant, cpu)
        record = recorded(build, cpu)
        if not record or record["passed"]:
            return build
    return plan(variants()[-1], cpu)


def say(message: str) -> None:
    print(f"== {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edgespec.ops.llama_build", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("wheel", help="build (once) the wheel of the variant to install; print its folder")
    install = sub.add_parser("ensure", help="install a variant that passes its self-test here (best first)")
    install.add_argument("--target", type=Path, help="install into this folder instead of the environment")
    sub.add_parser("show", help="print this CPU, the installed build and each variant's flags")
    args = parser.parse_args(argv)
    try:
        if args.command == "wheel":
            print(build_wheel(chosen()).parent)
        elif args.command == "ensure":
            ensure(args.target)
        else:
            cpu = this_cpu()
            print(json.dumps({"cpu": cpu.model, "machine": cpu.machine, "cpu_key": cpu.key, "installed": installed(),
                              "variants": {v: {"key": (b := plan(v, cpu)).key, "cmake_args": list(b.args),
                                               "self_test": recorded(b, cpu)} for v in VARIANTS}}, indent=2))
    except BuildError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
