"""A model given by Hugging Face id, as a user has it in the local Hugging Face cache: real processes.

The verifier and a drafter load `acme/tiny-qwen` from a fake cache (HF_HUB_CACHE, offline) and a coordinator
generates through them exactly what target-only greedy decoding gives; the coordinator's startup check says the
drafter by id shares the verifier's vocabulary and an n-gram drafter with the Qwen vocabulary does not. A
missing id stops each service with one line naming it and the cache (exit 1, no traceback).
"""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import grpc
import pytest

from harness.cluster import REPO_ROOT, start_service, stop_service
from edge_client.client import generate
from edgespec.v1 import drafter_pb2, drafter_pb2_grpc, verifier_pb2, verifier_pb2_grpc
from tests.tiny import target_only_greedy
from tests.unit.test_model_resolution import REPO, fake_hub

SMALL = ["--threads", "1", "--grace", "2", "--max-window", "8", "--max-session-tokens", "512"]


def wait_for_log(service, text: str, seconds: float = 60) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        log = service.log_path.read_text(errors="replace")
        if text in log:
            return log
        time.sleep(0.2)
    raise AssertionError(f"{service.name} never logged {text!r}:\n{service.log_tail()}")


def test_services_load_a_model_by_hugging_face_id_and_the_coordinator_checks_vocabularies(tmp_path):
    cache = tmp_path / "hub"
    fake_hub(cache)       # tiny:3's weights, saved as a snapshot of acme/tiny-qwen
    env = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    logs, services = tmp_path / "logs", []
    try:
        verifier = start_service("services.verifier", ["--model", REPO, "--dtype", "auto", "--device", "cpu",
                                                       "--profile-window", "0", *SMALL], logs, "verifier", env=env)
        services.append(verifier)
        drafter = start_service("services.drafter", ["--model", REPO, "--quantize", "none", *SMALL], logs,
                                "drafter", env=env)
        services.append(drafter)
        ngram = start_service("services.drafter", ["--backend", "ngram", *SMALL], logs, "ngram")   # vocab 151936
        services.append(ngram)
        with grpc.insecure_channel(verifier.address) as channel:
            info = verifier_pb2_grpc.VerifierStub(channel).Info(verifier_pb2.InfoRequest(), timeout=30)
        assert (info.model, info.vocab_size, info.dtype) == (REPO, 320, "float32")
        with grpc.insecure_channel(drafter.address) as channel:
            dinfo = drafter_pb2_grpc.DrafterStub(channel).Info(drafter_pb2.DrafterInfoRequest(), timeout=30)
        assert (dinfo.model, dinfo.vocab_size, list(dinfo.eos_token_ids)) == (REPO, 320, [256])

        coordinator = start_service("services.coordinator", [
            "--tokenizer", "bytes", "--verifier", verifier.address, "--window", "2", "--grace", "2",
            "--drafter", f"same={drafter.address},ngram={ngram.address}"], logs, "coordinator")
        services.append(coordinator)
        log = wait_for_log(coordinator, "drafter ngram does not draft in the verifier's tokens")
        assert "--cross-tokenizer" in log and "151936" in log
        log = wait_for_log(coordinator, "drafter same (acme/tiny-qwen, 320 ids) drafts in the tokens of the verifier")

        async def tokens(prompt: str) -> list[int]:
            out = []
            async for event in generate(coordinator.address, prompt, 24, 2, chat=False, timeout_seconds=120):
                if event.HasField("chunk"):
                    out += event.chunk.token_ids
            return out
        prompt = "def add(a, b):"
        assert asyncio.run(tokens(prompt)) == target_only_greedy("tiny:3", list(prompt.encode()), 24)
    finally:
        for service in reversed(services):
            stop_service(service)
    for service in services:
        assert "Traceback" not in service.log_path.read_text(errors="replace"), service.log_tail()


@pytest.mark.parametrize("module,args", [
    ("services.verifier", ["--model", "acme/not-downloaded"]),
    ("services.drafter", ["--model", "acme/not-downloaded"]),
    ("services.coordinator", ["--tokenizer", "acme/not-downloaded", "--verifier", "127.0.0.1:9",
                              "--drafter", "127.0.0.1:9"]),
], ids=["verifier", "drafter", "coordinator"])
def test_a_missing_id_stops_the_service_with_one_line_naming_it_and_the_cache(tmp_path, module, args):
    cache = tmp_path / "empty-hub"
    cache.mkdir()
    out = subprocess.run([sys.executable, "-m", module, "--host", "127.0.0.1", "--port", "0", *args],
                         capture_output=True, text=True, cwd=REPO_ROOT, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_CACHE": str(cache),
                              "HF_HUB_OFFLINE": "1"})
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert "Traceback" not in text, text
    lines = [line for line in text.splitlines() if "cannot start" in line]
    assert len(lines) == 1, text
    assert "acme/not-downloaded" in lines[0] and str(cache) in lines[0], text
    assert "hf download acme/not-downloaded" in lines[0], text
