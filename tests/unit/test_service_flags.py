"""Service configuration: flags, environment overrides, --help."""
import os
import subprocess
import sys

import pytest

from harness.cluster import REPO_ROOT
from edgespec.loop.generation import GenerationConfig
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
    assert (c.port, c.generation.speculation.window, c.verifiers, c.drafters) == (50051, -1, ("127.0.0.1:50061",),
                                                                             {"draft": "127.0.0.1:50062"})
    speculation = c.generation.speculation
    assert (speculation.pipeline, speculation.on_verifier_loss, c.failover_deadline_seconds) == (False, "fail", 30.0)
    assert c.generation == GenerationConfig()   # the library's defaults are the flags' defaults
    # Without authentication nobody can be told apart: every caller is 'anonymous', a service identity
    # (--max-sessions-per-service), so 64 anonymous users do not cap the whole coordinator.
    assert v.service.security.service_identities == d.service.security.service_identities == ("anonymous",)
    assert c.security.service_identities == ("anonymous",) and c.security.max_sessions_per_client == 64


def test_coordinator_takes_a_verifier_pool():
    c = coordinator_args(["--verifier", "10.0.0.1:1, 10.0.0.2:2", "--pipeline", "on", "--on-verifier-loss", "draft-only"])
    assert c.verifiers == ("10.0.0.1:1", "10.0.0.2:2") and c.generation.speculation.pipeline
    assert c.generation.speculation.on_verifier_loss == "draft-only"


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
    assert coordinator_args([]).generation.speculation.window == 3
    assert coordinator_args(["--window", "auto"]).generation.speculation.window == -1


def test_free_drafts_default_on_and_can_be_turned_off(monkeypatch):
    assert coordinator_args([]).free_drafts == "suffix"
    assert coordinator_args(["--free-drafts", "off"]).free_drafts == "off"
    monkeypatch.setenv("EDGESPEC_COORDINATOR_FREE_DRAFTS", "off")
    assert coordinator_args([]).free_drafts == "off"
    assert coordinator_args(["--free-drafts", "suffix"]).free_drafts == "suffix"


def test_the_first_token_is_alone_unless_asked_to_be_drafted(monkeypatch):
    assert coordinator_args([]).generation.speculation.first_token_alone
    assert not coordinator_args(["--first-token", "drafted"]).generation.speculation.first_token_alone
    monkeypatch.setenv("EDGESPEC_COORDINATOR_FIRST_TOKEN", "drafted")
    assert not coordinator_args([]).generation.speculation.first_token_alone


def test_bad_flag_values_exit_with_usage():
    with pytest.raises(SystemExit):
        coordinator_args(["--first-token", "first"])
    with pytest.raises(SystemExit):
        coordinator_args(["--free-drafts", "ngram"])
    with pytest.raises(SystemExit):
        coordinator_args(["--window", "-3"])
    with pytest.raises(SystemExit):
        coordinator_args(["--http-port", "0", "--sse-ping-seconds", "-1"])
    assert coordinator_args(["--http-port", "0"]).http.sse_ping_seconds == 0            # no SSE comments
    assert coordinator_args(["--http-port", "0", "--sse-ping-seconds", "15"]).http.sse_ping_seconds == 15
    with pytest.raises(SystemExit):
        coordinator_args(["--verifier", "a:1,a:1"])
    with pytest.raises(SystemExit):
        coordinator_args(["--verifier", " , "])
    with pytest.raises(SystemExit):
        verifier_args(["--dtype", "int4"])
    for bad in ("-1", "17", "x"):     # past --max-window (16)
        with pytest.raises(SystemExit):
            verifier_args(["--profile-window", bad])
    assert verifier_args(["--profile-window", "0"]).profile_window == 0 and verifier_args([]).profile_window == 8
    for bad in (["--prefill-chunk", "-1"], ["--prefill-chunk", "4096"], ["--prefill-chunk", "x"]):
        with pytest.raises(SystemExit):
            verifier_args(bad)
    assert verifier_args([]).limits.prefill_chunk_tokens == 0                       # torch: one part
    assert verifier_args(["--backend", "llamacpp"]).limits.prefill_chunk_tokens == 64
    assert verifier_args(["--backend", "llamacpp", "--prefill-chunk", "0"]).limits.prefill_chunk_tokens == 0
    for bad in (["--max-batch", "0"], ["--max-queue", "0"], ["--idle-ttl", "-1"],
                ["--idle-ttl", "60", "--forget-after", "30"]):
        with pytest.raises(SystemExit):
            verifier_args(bad)


@pytest.mark.parametrize("module", ["services.verifier", "services.drafter", "services.coordinator"])
def test_help_explains_every_service(module):
    out = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, cwd=REPO_ROOT)
    assert out.returncode == 0 and "edgespec" in out.stdout and "--port" in out.stdout


def test_llamacpp_exact_mode_flag():
    from edgespec.backends import llamacpp
    assert verifier_args([]).service.llamacpp.exact == "auto"
    assert verifier_args(["--exact", "on"]).service.llamacpp.exact == "on"
    assert drafter_args(["--exact", "off"]).service.llamacpp.exact == "off"
    with pytest.raises(SystemExit):
        verifier_args(["--exact", "yes"])
    assert llamacpp.exact_settings("auto", 1) is llamacpp.EXACT and llamacpp.exact_settings("auto", 2) is None
    assert llamacpp.exact_settings("on", 4) is llamacpp.EXACT and llamacpp.exact_settings("off", 1) is None
    with pytest.raises(ValueError, match="exact mode must be"):
        llamacpp.exact_settings("always", 1)


def test_several_named_drafters_and_bad_lists():
    assert coordinator_args(["--drafter", "draft=h:1,ngram=h:2"]).drafters == {"draft": "h:1", "ngram": "h:2"}
    for bad in ["a=h:1,a=h:2", "=h:1", "a=", "h:1,h:2"]:
        with pytest.raises(SystemExit):
            coordinator_args(["--drafter", bad])


# Environment values are checked exactly as command-line values: a usage error naming the variable, exit 2.
BAD_ENVIRONMENT = [
    ("services.verifier", "EDGESPEC_VERIFIER_PORT", "abc"),               # int
    ("services.verifier", "EDGESPEC_VERIFIER_DTYPE", "fp16"),             # choice
    ("services.verifier", "EDGESPEC_VERIFIER_KV_BUDGET_MB", "lots"),      # float
    ("services.verifier", "EDGESPEC_VERIFIER_LOG_LEVEL", "verbose"),      # choice
    ("services.verifier", "EDGESPEC_VERIFIER_EXACT", "maybe"),            # choice
    ("services.drafter", "EDGESPEC_DRAFTER_MAX_WINDOW", "8.5"),           # int
    ("services.drafter", "EDGESPEC_DRAFTER_BACKEND", "tensorflow"),       # choice
    ("services.drafter", "EDGESPEC_DRAFTER_RATE_LIMIT", "fast"),          # float
    ("services.drafter", "EDGESPEC_DRAFTER_METRICS_PORT", "http"),        # optional int
    ("services.coordinator", "EDGESPEC_COORDINATOR_PORT", "5oo51"),       # int
    ("services.coordinator", "EDGESPEC_COORDINATOR_PIPELINE", "yes"),     # choice
    ("services.coordinator", "EDGESPEC_COORDINATOR_DEADLINE", "1m"),      # float
    ("services.coordinator", "EDGESPEC_COORDINATOR_WINDOW", "-3"),        # custom type
    ("services.coordinator", "EDGESPEC_COORDINATOR_LOG_FORMAT", "xml"),   # choice
    ("services.coordinator", "EDGESPEC_COORDINATOR_FREE_DRAFTS", "yes"),  # choice
]


@pytest.mark.parametrize("module,variable,value", BAD_ENVIRONMENT, ids=[v for _, v, _ in BAD_ENVIRONMENT])
def test_bad_environment_values_are_usage_errors_naming_the_variable(module, variable, value):
    # A command-line --port 0 does not hide a bad environment value (a bad flag followed by a good one
    # is an error too); --port 0 also keeps a service that wrongly starts off the real ports.
    argv = [sys.executable, "-m", module, "--host", "127.0.0.1", "--port", "0"]
    if module != "services.coordinator":
        argv += ["--model", "tiny:1"]
    else:
        argv += ["--tokenizer", "bytes"]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, cwd=REPO_ROOT, timeout=60,
                             env={**os.environ, "PYTHONPATH": str(REPO_ROOT), variable: value})
    except subprocess.TimeoutExpired:
        pytest.fail(f"{module} started with {variable}={value}")
    assert out.returncode == 2, out.stderr
    assert variable in out.stderr and value in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and "usage:" in out.stderr, out.stderr


def test_environment_values_of_every_type_and_the_command_line_over_them(monkeypatch):
    for variable, value in {"EDGESPEC_VERIFIER_GRACE": "2.5", "EDGESPEC_VERIFIER_DTYPE": "bfloat16",
                            "EDGESPEC_VERIFIER_METRICS_PORT": "0", "EDGESPEC_VERIFIER_LOG_LEVEL": "debug",
                            "EDGESPEC_VERIFIER_TLS_CERT": "", "EDGESPEC_DRAFTER_BACKEND": "ngram",
                            "EDGESPEC_DRAFTER_LOG_FORMAT": "json", "EDGESPEC_COORDINATOR_PIPELINE": "on",
                            "EDGESPEC_COORDINATOR_DEADLINE": "7.5", "EDGESPEC_COORDINATOR_LOG_LEVEL": "warning",
                            "EDGESPEC_COORDINATOR_VERIFIER": "10.0.0.1:1,10.0.0.2:2"}.items():
        monkeypatch.setenv(variable, value)
    v = verifier_args([])
    assert (v.service.grace_seconds, v.service.dtype, v.service.observability.metrics_port) == (2.5, "bfloat16", 0)
    assert v.service.observability.log_level == "debug" and v.service.security.tls_cert is None   # "" = unset
    v = verifier_args(["--grace", "1", "--dtype", "float16", "--log-level", "error"])
    assert (v.service.grace_seconds, v.service.dtype, v.service.observability.log_level) == (1.0, "float16", "error")
    d = drafter_args([])
    assert d.backend == "ngram" and d.service.observability.log_format == "json"
    assert drafter_args(["--backend", "torch", "--log-format", "text"]).backend == "torch"
    c = coordinator_args([])
    assert c.generation.speculation.pipeline and c.deadline_seconds == 7.5
    assert c.verifiers == ("10.0.0.1:1", "10.0.0.2:2")
    assert c.observability.log_level == "warning"
    c = coordinator_args(["--pipeline", "off", "--deadline", "3", "--log-level", "info"])
    assert not c.generation.speculation.pipeline and c.deadline_seconds == 3.0 and c.observability.log_level == "info"
    # A bad value on the command line is an error even with a good one in the environment.
    with pytest.raises(SystemExit) as raised:
        coordinator_args(["--deadline", "soon"])
    assert raised.value.code == 2


def test_log_level_defaults_to_info_and_sets_the_root_logger():
    import logging

    from edgespec.observe import logs

    assert verifier_args([]).service.observability.log_level == "info"
    assert drafter_args([]).service.observability.log_level == "info"
    assert coordinator_args([]).observability.log_level == "info"
    root = logging.getLogger()
    saved = root.level, list(root.handlers)
    try:
        for name, level in (("debug", logging.DEBUG), ("warning", logging.WARNING), ("error", logging.ERROR)):
            logs.configure("text", name)
            assert root.level == level
    finally:
        root.setLevel(saved[0])
        root.handlers[:] = saved[1]


@pytest.mark.parametrize("module,prefix", [("services.verifier", "EDGESPEC_VERIFIER"),
                                           ("services.drafter", "EDGESPEC_DRAFTER"),
                                           ("services.coordinator", "EDGESPEC_COORDINATOR")])
def test_help_names_the_environment_variable_of_each_flag(module, prefix):
    out = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, cwd=REPO_ROOT)
    assert out.returncode == 0 and f"{prefix}_<FLAG>" in " ".join(out.stdout.split())
    assert "--log-level" in out.stdout and f"{prefix}_LOG_LEVEL" in out.stdout and f"{prefix}_PORT" in out.stdout


@pytest.mark.parametrize("flags, says", [
    (["--model", "tiny:1"], "tiny:SEED models exist only for torch"),
    (["--kv-budget-mb", "100"], "vLLM sizes its own KV cache"),
    (["--max-session-kv-mb", "10"], "vLLM sizes its own KV cache"),
    (["--tensor-parallel-size", "0"], "--tensor-parallel-size and --pipeline-parallel-size must be >= 1"),
    (["--pipeline-parallel-size", "0"], "--tensor-parallel-size and --pipeline-parallel-size must be >= 1"),
    (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization must be in (0, 1]"),
    (["--gpu-memory-utilization", "0"], "--gpu-memory-utilization must be in (0, 1]"),
    (["--vllm-kv-cache-gb", "0"], "--vllm-kv-cache-gb must be > 0"),
    (["--max-model-len", "16"], "--max-model-len must hold at least one window"),
    (["--prefill-chunk", "64"], "vLLM chunks prompts itself"),
    ([], "needs vLLM, which this Python lacks"),      # this environment has no vLLM: the last check
])
def test_bad_vllm_backend_flags_say_what_is_wrong(flags, says, capsys):
    with pytest.raises(SystemExit):
        verifier_args(["--backend", "vllm", *flags])
    assert says in capsys.readouterr().err


def test_vllm_flags_reach_the_engine_and_bound_the_sessions(monkeypatch):
    from edgespec.backends import vllm_lm

    monkeypatch.setattr(vllm_lm, "available", lambda: True)   # what the vLLM environment says (tested there)
    config = verifier_args(["--backend", "vllm", "--model", "smollm2", "--dtype", "bfloat16", "--max-model-len",
                            "1024", "--tensor-parallel-size", "2", "--pipeline-parallel-size", "3",
                            "--gpu-memory-utilization", "0.5", "--quantization", "fp8", "--vllm-kv-cache-gb", "4",
                            "--vllm-compile", "--max-window", "8"])
    assert config.vllm == vllm_lm.VllmOptions(dtype="bfloat16", max_model_len=1024, tensor_parallel_size=2,
                                              pipeline_parallel_size=3, gpu_memory_utilization=0.5,
                                              quantization="fp8", kv_cache_gb=4.0, enforce_eager=False)
    # a session, one window and the token vLLM samples past it fit in --max-model-len
    assert config.limits.max_session_tokens == 1024 - 8 - 2
    # the torch backend ignores them
    torch_config = verifier_args(["--max-model-len", "1024", "--tensor-parallel-size", "2"])
    assert torch_config.backend == "torch" and torch_config.limits.max_session_tokens == 8192


def test_the_free_drafts_store_is_on_by_default_and_checked(monkeypatch):
    assert coordinator_args([]).free_drafts_store == 32768
    assert coordinator_args(["--free-drafts-store", "0"]).free_drafts_store == 0
    monkeypatch.setenv("EDGESPEC_COORDINATOR_FREE_DRAFTS_STORE", "100")
    assert coordinator_args([]).free_drafts_store == 100
    for bad in ("-1", "lots"):
        with pytest.raises(SystemExit):
            coordinator_args(["--free-drafts-store", bad])
