"""`edgespec bench gpu-torch`: bad input is refused in one line, and its measuring parts run (on the CPU here)
over the real SmolLM2-135M model, through the verifier's own profiler and backend."""
import json
import subprocess
import sys

import pytest
import torch

from harness.cluster import REPO_ROOT


def bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench.gpu_torch", *args], capture_output=True, text=True,
                          cwd=REPO_ROOT, timeout=900)


@pytest.mark.parametrize("args, message", [
    (["--parts", "bogus"], "--parts takes costs, numerics and serve"),
    (["--parts", "numerics"], "numerics and serve need --model"),
    (["--random-shapes", "3b", "--parts", "costs"], "--random-shapes takes 1.5b, 7b (or ''), got 3b"),
    (["--model", "/nonexistent", "--parts", "costs"], "not a Hugging Face model directory"),
    (["--tokens", "0", "--parts", "costs"], "--tokens must be at least 1"),
])
def test_bad_input_is_refused_in_one_line_and_writes_nothing(tmp_path, args, message):
    result = bench(*args, "--device", "cpu", "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a host without CUDA")
def test_without_a_gpu_it_says_so(tmp_path):
    result = bench("--parts", "costs", "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and "no CUDA device" in result.stderr and "--device cpu" in result.stderr


def test_costs_and_numerics_of_the_real_model(tmp_path):
    from edgespec.backends.convert import ensure_model_dir

    model = ensure_model_dir("smollm2")
    result = bench("--model", str(model), "--device", "cpu", "--parts", "costs,numerics", "--random-shapes", "",
                   "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    costs = json.loads((tmp_path / "costs.json").read_text())["served"]
    assert sorted(map(int, costs["c"])) == list(range(1, 18)) and all(v > 0 for v in costs["c"].values())
    assert costs["steps"]["1"] == 1.0 and set(costs["batched"]) == {f"B={b},n={n}" for b in (1, 4, 16) for n in (1, 5)}
    numerics = json.loads((tmp_path / "numerics.json").read_text())
    assert set(numerics) == {"bfloat16", "float32"}
    for rows in numerics.values():
        assert sorted(map(int, rows)) == list(range(2, 13))
        assert all(row["max_abs_diff"] >= 0 and isinstance(row["identical"], bool) for row in rows.values())
    assert "c(n) in steps, served" in (tmp_path / "summary.md").read_text()
