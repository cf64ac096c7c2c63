"""Run a module of the vLLM environment (.venv-vllm, scripts/vllm_env.sh) from edgespec's: JSON in, JSON out."""
from __future__ import annotations

import json
import subprocess

from harness.cluster import REPO_ROOT

VLLM_PYTHON = REPO_ROOT / ".venv-vllm" / "bin" / "python"


def run(module: str, job: dict, timeout: float = 1800) -> dict:
    """``VLLM_PYTHON -m module`` with ``job`` on stdin; the last JSON line it printed (its answer)."""
    if not VLLM_PYTHON.exists():
        raise FileNotFoundError(f"{VLLM_PYTHON} is missing: run `bash scripts/vllm_env.sh` first")
    done = subprocess.run([str(VLLM_PYTHON), "-m", module], input=json.dumps(job), capture_output=True, text=True,
                          cwd=REPO_ROOT, timeout=timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{module} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])
