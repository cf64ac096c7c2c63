"""The ONNX Runtime drafter on the tiny random model: parity with torch, rollback, sampling, int8."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgespec.backends.onnx_lm import OnnxCausalLM
from edgespec.engines.drafter import DrafterEngine
from edgespec.verify.sampling import SamplingParams
from edgespec.ops.export_onnx import export
from services.drafter.__main__ import load_model, parse_args as drafter_args
from tests.tiny import tiny

ROOT = Path(__file__).resolve().parents[2]
SPEC = "tiny:1"
PROMPTS = [list(b"def hello():"), list(b"The capital of France is"), list(b"x"),
           list(b"for i in range(10):\n    print(i)")]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("onnx")
    export(SPEC, out / "fp32")
    export(SPEC, out / "int8", int8=True)
    return out


@pytest.fixture(scope="module")
def ort(exported):
    return OnnxCausalLM(exported / "fp32", threads=1)


def test_manifest_describes_the_graph(ort):
    assert (ort.vocab_size, ort.layers, ort.kv_heads, ort.head_dim) == (320, 2, 2, 16)
    assert ort.eos_token_ids == [256] and ort.placement == "cpu float32"


@pytest.mark.parametrize("k", [1, 4, 9])
def test_greedy_drafts_match_torch(ort, k):
    torch_lm = tiny(SPEC)
    for prompt in PROMPTS:
        ort_state, torch_state = ort.new_state(), torch_lm.new_state()
        ort.prefill(ort_state, prompt)
        torch_lm.prefill(torch_state, prompt)
        assert ort.greedy_draft(ort_state, prompt, k) == torch_lm.greedy_draft(torch_state, prompt, k), prompt


def test_logits_match_torch_prefill_and_decode(ort):
    torch_lm = tiny(SPEC)
    seq = PROMPTS[3]
    ort_state, torch_state = ort.new_state(), torch_lm.new_state()
    for end in (10, 11, 12, len(seq)):   # a prefill of 10, two single steps, then the rest at once
        got, want = ort.logits(ort_state, seq[:end]), torch_lm.logits(torch_state, seq[:end]).numpy()
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=1e-3, rtol=0)
    assert ort_state.tokens == seq and ort_state.keys[0].shape == (1, 2, len(seq), 16)


def test_rollback_equals_fresh_session(ort):
    prompt = PROMPTS[0]
    state = ort.new_state()
    ort.prefill(state, prompt)
    first = ort.greedy_draft(state, prompt, 8)
    # The verifier accepted 3 draft tokens and corrected the 4th: committed is shorter than the cache.
    committed = prompt + first[:3] + [(first[3] + 1) % 256]
    again = ort.greedy_draft(state, committed, 6)
    fresh = ort.new_state()
    assert again == ort.greedy_draft(fresh, committed, 6)
    assert state.tokens == fresh.tokens == committed + again[:5]
    np.testing.assert_allclose(state.keys[1], fresh.keys[1], atol=1e-4)   # fed in other chunks: rounding differs
    # A rollback into the prompt itself.
    assert ort.greedy_draft(state, prompt[:5], 4) == ort.greedy_draft(ort.new_state(), prompt[:5], 4)


def test_sampling_through_the_engine_matches_torch(ort):
    params = SamplingParams(temperature=0.8, top_k=50, top_p=0.95, seed=7)
    proposals = []
    for model in (ort, tiny(SPEC)):
        engine = DrafterEngine(model)
        engine.open("s", PROMPTS[1], params, q_ids=8)
        first = engine.draft("s", len(PROMPTS[1]), [], 5)
        second = engine.draft("s", len(PROMPTS[1]) + 2, first.tokens[:2], 5)   # after a rollback
        proposals.append((first, second))
    (ort_first, ort_second), (torch_first, torch_second) = proposals
    assert ort_first.tokens == torch_first.tokens and ort_second.tokens == torch_second.tokens
    for got, want in zip(ort_first.q + ort_second.q, torch_first.q + torch_second.q):
        assert list(got.ids) == list(want.ids)
        np.testing.assert_allclose(got.weights, want.weights, atol=1e-4)


def test_int8_export_loads_and_drafts(exported):
    int8 = OnnxCausalLM(exported / "int8", threads=1)
    assert int8.placement == "cpu float32 (int8 dynamic)"
    assert int8.manifest["quantization"].startswith("int8")
    draft = int8.greedy_draft(int8.new_state(), PROMPTS[0], 6)
    assert len(draft) == 6 and all(0 <= t < 320 for t in draft)


def test_runs_without_torch(exported):
    """An edge device has onnxruntime and numpy but no torch or transformers."""
    code = ("import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None\n"
            "from edgespec.backends.onnx_lm import OnnxCausalLM\n"
            f"lm = OnnxCausalLM({str(exported / 'fp32')!r})\n"
            "print(lm.greedy_draft(lm.new_state(), list(b'def hello():'), 3))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout.strip() == str(tiny(SPEC).greedy_draft(tiny(SPEC).new_state(), PROMPTS[0], 3))


def test_drafter_service_loads_the_onnx_backend(exported):
    config = drafter_args(["--backend", "onnx", "--onnx-dir", str(exported / "int8"), "--threads", "1"])
    model = load_model(config)
    assert isinstance(model, OnnxCausalLM) and model.vocab_size == 320 and model.name == "tiny:1 (onnx)"


def test_drafter_service_onnx_backend_needs_a_directory():
    with pytest.raises(SystemExit):
        drafter_args(["--backend", "onnx"])


def test_drafter_service_serves_onnx_without_torch_and_output_stays_exact(exported, tmp_path):
    """The whole edge side of an ONNX drafter — the drafter service process — with torch and
    transformers unimportable; a generation through it equals target-only greedy."""
    import asyncio

    from edge_client.client import generate
    from harness.cluster import LocalCluster
    from tests.tiny import target_only_greedy

    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text("import sys\nsys.modules['torch'] = None\nsys.modules['transformers'] = None\n")
    with LocalCluster(tmp_path / "logs", verifier_args=["--model", SPEC],
                      drafter_args=["--backend", "onnx", "--onnx-dir", str(exported / "fp32")],
                      coordinator_args=["--tokenizer", "bytes", "--window", "3"],
                      drafter_env={"PYTHONPATH": f"{shim}{os.pathsep}{ROOT}"}) as cluster:
        async def go():
            tokens = []
            async for event in generate(cluster.coordinator.address, "def hello():", 24, 3, chat=False, timeout_seconds=60):
                if event.HasField("chunk"):
                    tokens += event.chunk.token_ids
            return tokens
        assert asyncio.run(go()) == target_only_greedy(SPEC, PROMPTS[0], 24)
        assert "loading onnx draft model" in (tmp_path / "logs" / "drafter.log").read_text()
