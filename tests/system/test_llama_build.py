"""The llama.cpp build as the install runs it: a variant that dies by a signal in its self-test is replaced by
the next one, and a service whose engine dies by a signal is reported in one line. Real wheels (built once per
CPU and flags into the cache), real subprocesses, real signals."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is installed by scripts/install.sh")

from harness.cluster import start_service, stop_service  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def ensure(target: Path, fault: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "EDGESPEC_LLAMA_SELFTEST_FAULT": fault}
    env.pop("EDGESPEC_LLAMA_BUILD", None)
    return subprocess.run([sys.executable, "-m", "edgespec.ops.llama_build", "ensure", "--target", str(target)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800)


def recorded_self_tests() -> dict:
    show = subprocess.run([sys.executable, "-m", "edgespec.ops.llama_build", "show"], capture_output=True, text=True,
                          cwd=ROOT, check=True).stdout
    return {variant: entry["self_test"] for variant, entry in json.loads(show)["variants"].items()}


@pytest.mark.timeout(2400)
def test_native_build_dying_in_its_self_test_falls_back_to_portable(tmp_path):
    before = recorded_self_tests()
    result = ensure(tmp_path / "site", "native")
    assert result.returncode == 0, result.stderr
    assert re.search(r"native .*died by SIGSEGV in its self-test", result.stderr), result.stderr
    assert "llama.cpp build portable passed its self-test" in result.stderr
    marker = json.loads((tmp_path / "site" / "edgespec-llama-build.json").read_text())
    assert marker["variant"] == "portable"
    assert not [a for a in marker["cmake_args"] if a.startswith("-DGGML_AMX") and a.endswith("=ON")]
    assert (tmp_path / "site" / "llama_cpp" / "__init__.py").is_file()
    # the injected fault is not recorded against this CPU: a real install still tries native first
    assert recorded_self_tests()["native"] == before["native"]


@pytest.mark.timeout(2400)
def test_no_variant_surviving_is_one_clear_error(tmp_path):
    result = ensure(tmp_path / "site", "native,portable")
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: no llama.cpp build runs on this CPU") and "EDGESPEC_LLAMA_BUILD=portable" in last
    assert "Traceback" not in result.stderr


def test_a_llamacpp_service_dying_by_a_signal_is_one_line(tmp_path):
    service = start_service("services.verifier", ["--backend", "llamacpp", "--model", "smollm2", "--threads", "1",
                                                  "--ctx-tokens", "1024"], tmp_path, "verifier")
    try:
        os.kill(service.process.pid, signal.SIGSEGV)   # what a crashing kernel does to the process
        service.process.wait(60)
        note = service.exit_note()
    finally:
        stop_service(service)
    assert "\n" not in note
    assert note.startswith("verifier died by SIGSEGV in llama.cpp (build ")
    assert "EDGESPEC_LLAMA_BUILD=portable" in note and str(service.log_path) in note
    for _ in range(50):   # faulthandler left the Python stack it died in
        if "Fatal Python error: Segmentation fault" in service.log_path.read_text(errors="replace"):
            break
        time.sleep(0.1)
    assert "Fatal Python error: Segmentation fault" in service.log_path.read_text(errors="replace")
