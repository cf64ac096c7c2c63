"""Service configuration: flags, environment overrides, --help."""
import subprocess
import sys

import pytest

from edgespec.tools.cluster import REPO_ROOT
from services.coordinator.__main__ import parse_args as coordinator_args
from services.drafter.__main__ import parse_args as drafter_args
from services.verifier.__main__ import parse_args as verifier_args


def test_defaults():
    v = verifier_args([])
    assert (v.service.port, v.service.model, v.service.device, v.service.dtype) == (50061, "target", "auto", "float32")
    assert (v.limits.max_window, v.batch.max_batch, v.batch.max_queue, v.limits.idle_ttl_seconds) == (16, 16, 64, 300)
    d = drafter_args([])
    assert (d.service.port, d.service.model, d.service.device, d.quantize) == (50062, "draft", "cpu", "auto")
    c = coordinator_args([])
    assert (c.port, c.window, c.verifiers, c.drafters) == (50051, -1, ("127.0.0.1:50061",), {"draft": "127.0.0.1:50062"})
    assert (c.pipeline, c.on_verifier_loss, c.failover_deadline_seconds) == (False, "fail", 30.0)


def test_coordinator_takes_a_verifier_pool():
    c = coordinator_args(["--verifier", "10.0.0.1:1, 10.0.0.2:2", "--pipeline", "on", "--on-verifier-loss", "draft-only"])
    assert c.verifiers == ("10.0.0.1:1", "10.0.0.2:2") and c.pipeline and c.on_verifier_loss == "draft-only"


def test_environment_overrides_defaults_and_flags_override_environment(monkeypatch):
    monkeypatch.setenv("EDGESPEC_VERIFIER_PORT", "6000")
    monkeypatch.setenv("EDGESPEC_VERIFIER_MAX_SESSION_TOKENS", "1024")
    monkeypatch.setenv("EDGESPEC_DRAFTER_QUANTIZE", "none")
    monkeypatch.setenv("EDGESPEC_COORDINATOR_WINDOW", "3")
    monkeypatch.setenv("EDGESPEC_VERIFIER_MAX_BATCH", "1")
    assert verifier_args([]).service.port == 6000 and verifier_args([]).limits.max_session_tokens == 1024
    assert verifier_args([]).batch.max_batch == 1
    assert verifier_args(["--port", "7000"]).service.port == 7000
    assert drafter_args([]).quantize == "none"
    assert coordinator_args([]).window == 3 and coordinator_args(["--window", "auto"]).window == -1


def test_bad_flag_values_exit_with_usage():
    with pytest.raises(SystemExit):
        coordinator_args(["--window", "-3"])
    with pytest.raises(SystemExit):
        coordinator_args(["--verifier", "a:1,a:1"])
    with pytest.raises(SystemExit):
        coordinator_args(["--verifier", " , "])
    with pytest.raises(SystemExit):
        verifier_args(["--dtype", "int4"])
    for bad in (["--max-batch", "0"], ["--max-queue", "0"], ["--idle-ttl", "-1"],
                ["--idle-ttl", "60", "--forget-after", "30"]):
        with pytest.raises(SystemExit):
            verifier_args(bad)


@pytest.mark.parametrize("module", ["services.verifier", "services.drafter", "services.coordinator"])
def test_help_explains_every_service(module):
    out = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, cwd=REPO_ROOT)
    assert out.returncode == 0 and "edgespec" in out.stdout and "--port" in out.stdout


def test_several_named_drafters_and_bad_lists():
    assert coordinator_args(["--drafter", "draft=h:1,ngram=h:2"]).drafters == {"draft": "h:1", "ngram": "h:2"}
    for bad in ["a=h:1,a=h:2", "=h:1", "a=", "h:1,h:2"]:
        with pytest.raises(SystemExit):
            coordinator_args(["--drafter", bad])
