"""The main job, `edgespec demo` (what `bash scripts/demo.sh` runs after installing): the default real pair on
llama.cpp, the services on loopback, both default prompts streamed and compared with target-only on the same
verifier. Its bad flags are refused before anything starts, and a request the coordinator refuses ends in one
line, not a traceback."""
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is installed by scripts/install.sh")

from harness.cluster import REPO_ROOT  # noqa: E402

DEMO = [sys.executable, "-m", "edge_client.cli", "demo"]


def demo(*args: str, timeout: float = 1200) -> subprocess.CompletedProcess:
    return subprocess.run([*DEMO, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT)


def test_demo_streams_both_prompts_and_matches_target_only():
    shown = demo("--max-new-tokens", "12")
    assert shown.returncode == 0, shown.stderr[-3000:]
    out = shown.stdout
    # each prompt: the speculative run, target-only, and the ratio of decode rates with the end-to-end one
    assert out.count("== edgespec, window auto:") == 2
    assert len(re.findall(r"^(edgespec|target-only): +12 tokens in [\d.]+s: first after [\d.]+s \(prefill\), "
                          r"then [\d.]+ tok/s", out, re.M)) == 4, out
    ratios = re.findall(r"^speedup [\d.]+x in decode rate.*, [\d.]+x end to end; output identical to "
                        r"target-only: (\w+)$", out, re.M)
    assert ratios == ["yes", "yes"], out
    if len(os.sched_getaffinity(0)) >= 2:   # edge and cloud apart; the client with the edge
        assert re.search(r"verifier on CPU [\d,]+, drafter, coordinator and this client on CPU [\d,]+", out), out


@pytest.mark.parametrize("flags, message", [
    (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1, got 0"),
    (["--window", "-2"], "--window must be -1 (auto) or >= 0, got -2"),
    (["--prompt", " "], "--prompt must not be empty"),
    (["--backend", "onnx"], "invalid choice: 'onnx'"),
])
def test_demo_refuses_bad_flags_before_starting_anything(flags, message):
    shown = demo(*flags, timeout=120)
    assert shown.returncode == 2 and message in shown.stderr, shown.stderr
    assert "preparing" not in shown.stdout   # nothing prepared, started or run


def test_demo_reports_a_refused_request_in_one_line():
    shown = demo("--window", "1000", "--max-new-tokens", "2", "--prompt", "Hi", "--no-compare")
    assert shown.returncode == 1, shown.stderr[-3000:]
    last = shown.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the coordinator refused the request: window: must be"), shown.stderr[-3000:]
    assert "Traceback" not in shown.stderr
