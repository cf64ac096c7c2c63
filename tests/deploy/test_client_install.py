"""`pip install edgespec` with no extras is the edge client: `edgespec generate` works without torch.

The package is installed from a copy of the source tree into a fresh virtual environment (grpcio and
protobuf come from the package index, or pip's cache), and the client in it talks to a real cluster of tiny
models started from this checkout.
"""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cluster import REPO_ROOT, LocalCluster
from tests.tiny import target_only_greedy

PACKAGE_PARTS = ["pyproject.toml", "README.md", "edgespec", "services", "edge_client"]


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory):
    root = tmp_path_factory.mktemp("client-install")
    source = root / "src"
    source.mkdir()
    for part in PACKAGE_PARTS:
        origin = REPO_ROOT / part
        if origin.is_dir():
            shutil.copytree(origin, source / part, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy(origin, source / part)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # Exactly what a user runs: `pip install .` (setuptools for the build, grpcio and protobuf at run time).
    subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check", str(source)],
                   check=True, timeout=600)
    return venv


def run(venv: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    # From a neutral directory: the checkout must not be importable, only what pip installed.
    return subprocess.run([str(venv / "bin" / "edgespec"), *args], capture_output=True, text=True, timeout=timeout,
                          cwd=venv)


def test_no_extras_install_has_no_model_stack(client_venv):
    python = str(client_venv / "bin" / "python")
    probe = "import importlib.util as u; print([m for m in ('torch', 'transformers', 'numpy', 'simpy') if u.find_spec(m)])"
    assert subprocess.run([python, "-c", probe], capture_output=True, text=True, check=True, cwd=client_venv
                          ).stdout.strip() == "[]"


def test_help_lists_generate_and_says_what_the_other_commands_need(client_venv):
    shown = run(client_venv, "--help")
    assert shown.returncode == 0, shown.stderr
    assert "generate" in shown.stdout
    assert "pip install 'edgespec[serve]'" in shown.stdout and "needs a source checkout" in shown.stdout
    refused = run(client_venv, "prepare-models")
    assert refused.returncode == 2 and "pip install 'edgespec[serve]'" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_generate_streams_from_a_cluster_without_torch(client_venv, tmp_path):
    with LocalCluster(tmp_path, verifier_args=["--model", "tiny:7"], drafter_args=["--model", "tiny:7~1"],
                      coordinator_args=["--tokenizer", "bytes", "--window", "2"]) as cluster:
        result = run(client_venv, "generate", "def add(a, b):", "--raw", "--max-new-tokens", "16",
                     "--coordinator", cluster.coordinator.address)
    assert result.returncode == 0, result.stderr
    expected = target_only_greedy("tiny:7", list(b"def add(a, b):"), 16)
    text = bytes(t for t in expected if t < 256).decode("utf-8", errors="replace")
    assert result.stdout.rstrip("\n") == text.rstrip("\n")
    assert "tokens in" in result.stderr and "acceptance" in result.stderr
