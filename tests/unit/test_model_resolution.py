"""--model as the user has it: a directory, a GGUF file, or a Hugging Face id resolved from the local Hugging Face
cache (HF_HUB_CACHE / HF_HOME, offline, never downloaded); a missing one is one clear line. --dtype auto.

The cache is a fake one in a temporary directory: a tiny random Qwen2 saved where huggingface_hub keeps a
downloaded snapshot (models--ORG--NAME/snapshots/COMMIT, refs/main naming the commit).
"""
from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from edgespec.backends import registry
from edgespec.backends.assets import (ModelAssetError, ModelNotFoundError, gguf_spec, hf_hub_cache, is_hf_id,
                                      local_model, resolve_spec)
from edgespec.backends.registry import load_lm, model_dtype, model_path, tiny_config

COMMIT = "0123456789abcdef0123456789abcdef01234567"
REPO = "acme/tiny-qwen"


def fake_hub(cache: Path, repo_id: str = REPO, dtype: torch.dtype = torch.float32, seed: int = 3) -> Path:
    """Save a tiny random Qwen2 (tests/tiny.py's config) into ``cache`` as a snapshot of ``repo_id``."""
    org, name = repo_id.split("/")
    repo = cache / f"models--{org}--{name}"
    snapshot = repo / "snapshots" / COMMIT
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(tiny_config(), dtype=dtype).save_pretrained(snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    return snapshot


@pytest.fixture
def hub(tmp_path, monkeypatch) -> Path:
    """An empty Hugging Face cache that HF_HUB_CACHE points to, offline."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a connection fails the test: nothing may be downloaded."""
    def refuse(*args, **kwargs):
        raise AssertionError("a network connection was attempted")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_a_hugging_face_id_loads_from_the_local_cache(hub, no_network):
    snapshot = fake_hub(hub)
    assert model_path(REPO) == snapshot
    lm = load_lm(REPO, device="cpu")
    assert lm.name == REPO                 # the id, not the hashed snapshot path, in Info and the logs
    assert lm.vocab_size == registry.TINY_VOCAB and lm.dtype == torch.float32
    torch.manual_seed(3)
    reference = AutoModelForCausalLM.from_config(tiny_config(), dtype=torch.float32)
    for (name, mine), theirs in zip(lm.model.state_dict().items(), reference.state_dict().values()):
        assert torch.equal(mine, theirs), name


def test_hf_home_is_respected_when_hf_hub_cache_is_unset(tmp_path, monkeypatch, no_network):
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert hf_hub_cache() == tmp_path / "home" / "hub"
    snapshot = fake_hub(tmp_path / "home" / "hub")
    assert model_path(REPO) == snapshot


def test_a_missing_id_is_one_line_naming_the_id_the_cache_and_the_fix(hub, no_network):
    with pytest.raises(ModelNotFoundError) as caught:
        load_lm("acme/absent-model", device="cpu")
    message = str(caught.value)
    assert "acme/absent-model" in message and str(hub) in message and "hf download acme/absent-model" in message
    assert "\n" not in message
    # A ModelAssetError (the services end with this one line, exit 1) and still a FileNotFoundError for callers.
    assert isinstance(caught.value, ModelAssetError) and isinstance(caught.value, FileNotFoundError)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_what_is_an_id_and_what_is_a_path(tmp_path, monkeypatch):
    assert is_hf_id("Qwen/Qwen2.5-0.5B-Instruct") and is_hf_id("acme/tiny_qwen.v2")
    for spec in ("target", "tiny:3", "/abs/model", "a/b/c", "./model", "org/", "/org/name"):
        assert not is_hf_id(spec), spec
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "name").mkdir(parents=True)
    assert not is_hf_id("org/name")            # a directory on disk wins over an id of the same spelling
    assert local_model("org/name") == Path("org/name")
    with pytest.raises(ModelNotFoundError, match="no such file or directory"):
        local_model("no/such/directory")
    assert resolve_spec("bytes") == "bytes" and resolve_spec("draft") == "draft"


def test_an_id_resolves_for_tokenizer_loaders(hub):
    snapshot = fake_hub(hub)
    assert resolve_spec(REPO) == str(snapshot)


def test_a_gguf_only_repository_points_to_the_llamacpp_backend(hub):
    snapshot = hub / "models--acme--gguf-only" / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (snapshot / "model-q4_k_m.gguf").write_bytes(b"GGUF")
    (hub / "models--acme--gguf-only" / "refs").mkdir()
    (hub / "models--acme--gguf-only" / "refs" / "main").write_text(COMMIT)
    with pytest.raises(ModelNotFoundError, match="--backend llamacpp") as caught:
        load_lm("acme/gguf-only", device="cpu")
    assert "model-q4_k_m.gguf" in str(caught.value)
    with pytest.raises(ModelNotFoundError, match="GGUF file: run it with --backend llamacpp"):
        load_lm(str(snapshot / "model-q4_k_m.gguf"), device="cpu")
    # --backend llamacpp: the id's one .gguf file; with several, the user picks (the error lists them).
    assert gguf_spec("acme/gguf-only") == str(snapshot / "model-q4_k_m.gguf")
    assert gguf_spec("draft") == "draft"
    (snapshot / "model-q8_0.gguf").write_bytes(b"GGUF")
    with pytest.raises(ModelNotFoundError, match="2 .gguf files .*model-q4_k_m.gguf, model-q8_0.gguf"):
        gguf_spec("acme/gguf-only")
    with pytest.raises(ModelNotFoundError, match="not in the Hugging Face cache"):
        gguf_spec("acme/absent")
    fake_hub(hub)
    with pytest.raises(ModelNotFoundError, match="holding no .gguf file"):
        gguf_spec(REPO)


def test_dtype_auto_is_the_checkpoints_where_the_cpu_computes_it(hub, monkeypatch, caplog):
    fake_hub(hub, "acme/bf16", dtype=torch.bfloat16)
    fake_hub(hub, "acme/fp32")
    monkeypatch.setattr(registry, "cpu_native_bf16", lambda: True)
    assert model_dtype("acme/bf16", "cpu", "auto") == "bfloat16"
    assert load_lm("acme/bf16", device="cpu", dtype="auto").dtype == torch.bfloat16
    monkeypatch.setattr(registry, "cpu_native_bf16", lambda: False)
    with caplog.at_level(logging.INFO, logger="edgespec.backends.registry"):
        assert model_dtype("acme/bf16", "cpu", "auto") == "float32"
    assert "no native bfloat16" in caplog.text and "float32" in caplog.text
    assert load_lm("acme/bf16", device="cpu", dtype="auto").dtype == torch.float32
    assert model_dtype("acme/fp32", "cpu", "auto") == "float32"
    assert model_dtype("tiny:1", "cpu", "auto") == "float32"
    assert model_dtype("acme/bf16", "cpu", "bfloat16") == "bfloat16"    # an explicit dtype is taken as given


def test_dtype_auto_is_a_flag_value():
    from services.drafter.__main__ import parse_args as drafter_args
    from services.verifier.__main__ import parse_args as verifier_args

    assert verifier_args(["--dtype", "auto", "--model", REPO]).service.dtype == "auto"
    assert drafter_args(["--dtype", "auto"]).service.dtype == "auto"


def test_the_drafter_reports_its_eos_ids_in_the_ids_it_sends():
    from edgespec.backends.ngram import NgramDrafter
    from services.drafter.__main__ import draft_eos_ids

    assert draft_eos_ids(load_lm("tiny:1")) == [registry.TINY_EOS]
    assert draft_eos_ids(NgramDrafter(320)) == []

    class Cross:    # a cross-tokenizer drafter: the draft's EOS ids mapped to target ids (None: no such id)
        eos_map = {2: 151645, 0: None}
    assert draft_eos_ids(Cross()) == [151645]


def test_a_snapshot_without_weights_says_so(hub):
    snapshot = fake_hub(hub)
    for weights in snapshot.glob("*.safetensors"):
        weights.unlink()          # a download that fetched only the config and the tokenizer
    with pytest.raises(ModelNotFoundError, match="no weights .* partial download"):
        load_lm(REPO, device="cpu")
