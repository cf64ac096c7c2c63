"""Metrics, traces and logs of the real services: scraped over HTTP, received over OTLP, read from the log."""
import asyncio
import json
import re
import threading
import time
import urllib.request
from concurrent import futures

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from edge_client.client import generate
from harness.cluster import LocalCluster, Service
from tests.tiny import target_only_greedy

TARGET, DRAFT = "tiny:7", "tiny:7~1"
PROMPT = "def add(a, b):"
METRICS_AT = re.compile(r"metrics on (http://\S+/metrics)")


class Collector:
    """An OTLP gRPC receiver for traces and metrics, keeping what it is sent."""

    def __init__(self):
        self.spans: list[tuple[str, object]] = []          # (service.name, Span)
        self.metrics: list[tuple[str, object]] = []        # (service.name, Metric), in arrival order
        self.lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_Traces(self), self.server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(_Metrics(self), self.server)
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def keep(self, into: list, resources, scopes: str, items: str) -> None:
        with self.lock:
            for resource in resources:
                service = next(a.value.string_value for a in resource.resource.attributes if a.key == "service.name")
                into += [(service, item) for scope in getattr(resource, scopes) for item in getattr(scope, items)]

    def wait_for(self, what, seconds: float = 30):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            with self.lock:
                found = what()
            if found:
                return found
            time.sleep(0.1)
        raise AssertionError(f"the collector did not receive it within {seconds}s")


class _Traces(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, collector: Collector):
        self.collector = collector

    def Export(self, request, context):
        self.collector.keep(self.collector.spans, request.resource_spans, "scope_spans", "spans")
        return trace_service_pb2.ExportTraceServiceResponse()


class _Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, collector: Collector):
        self.collector = collector

    def Export(self, request, context):
        self.collector.keep(self.collector.metrics, request.resource_metrics, "scope_metrics", "metrics")
        return metrics_service_pb2.ExportMetricsServiceResponse()


def attribute(span, key: str):
    value = next(a.value for a in span.attributes if a.key == key)
    return getattr(value, value.WhichOneof("value"))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One greedy generation (fixed window 3) through coordinator and drafter processes that export
    everything; returns (cluster, collector, tokens, stats)."""
    collector = Collector()
    observed = ["--metrics-port", "0", "--otlp-endpoint", f"http://{collector.address}"]
    env = {"OTEL_BSP_SCHEDULE_DELAY": "100", "OTEL_METRIC_EXPORT_INTERVAL": "300"}
    mp = pytest.MonkeyPatch()
    for key, value in env.items():
        mp.setenv(key, value)   # the services inherit the test's environment
    try:
        with LocalCluster(tmp_path_factory.mktemp("logs"),
                          verifier_args=["--model", TARGET, "--max-window", "8", *observed],
                          drafter_args=["--model", DRAFT, "--max-window", "8", *observed],
                          coordinator_args=["--tokenizer", "bytes", "--max-window", "8", "--log-format", "json",
                                            *observed]) as cluster:
            async def go():
                tokens, stats = [], None
                async for event in generate(cluster.coordinator.address, PROMPT, 40, window=3, chat=False,
                                            timeout_seconds=120):
                    if event.HasField("chunk"):
                        tokens += event.chunk.token_ids
                    else:
                        stats = event.stats
                return tokens, stats
            tokens, stats = asyncio.run(go())
            assert tokens == target_only_greedy(TARGET, list(PROMPT.encode()), 40)
            yield cluster, collector, stats
    finally:
        mp.undo()
        collector.server.stop(0)


def scrape(service: Service) -> dict[tuple[str, tuple], float]:
    """The service's /metrics as {(sample name, sorted labels): value}."""
    [url] = METRICS_AT.findall(service.log_path.read_text())
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_scraped_counters_equal_the_generations_stats(run):
    cluster, _, stats = run
    coordinator, drafter = scrape(cluster.coordinator), scrape(cluster.drafter)
    target_only_rounds = coordinator[("edgespec_spec_decode_window_size_bucket", (("le", "0"),))]
    assert coordinator[("edgespec_spec_decode_window_size_count", ())] == stats.rounds
    assert coordinator[("edgespec_spec_decode_window_size_sum", ())] == stats.drafted_tokens
    assert coordinator[("edgespec_spec_decode_num_drafts_total", ())] == stats.rounds - target_only_rounds
    assert coordinator[("edgespec_spec_decode_num_draft_tokens_total", ())] == stats.drafted_tokens
    assert coordinator[("edgespec_spec_decode_num_accepted_tokens_total", ())] == stats.accepted_tokens
    per_position = {dict(labels)["position"]: value for (name, labels), value in coordinator.items()
                    if name == "edgespec_spec_decode_num_accepted_tokens_per_pos_total"}
    assert sum(per_position.values()) == stats.accepted_tokens
    assert all(per_position[str(i)] >= per_position.get(str(i + 1), 0) for i in range(len(per_position)))
    assert coordinator[("edgespec_generations_total", (("finish_reason", stats.finish_reason),))] == 1
    assert coordinator[("edgespec_time_per_output_token_seconds_count", ())] == 1
    assert drafter[("edgespec_drafter_drafted_tokens_total", ())] == stats.drafted_tokens
    verifier = scrape(cluster.verifier)
    assert verifier[("edgespec_verifier_batch_size_sum", ())] == stats.rounds   # one window per round, each verified once
    assert verifier[("edgespec_verifier_open_sessions", ())] == 0       # the generation closed its session
    assert verifier[("edgespec_verifier_kv_cache_bytes", ())] == 0
    assert any(name == "target_info" and ("service_name", "edgespec-drafter") in labels for name, labels in drafter)


def test_spans_reach_an_otlp_collector_in_one_trace_across_processes(run):
    _, collector, stats = run
    [generate_span] = collector.wait_for(lambda: [s for service, s in collector.spans if s.name == "generate"])
    session_id = attribute(generate_span, "edgespec.session_id")
    assert attribute(generate_span, "edgespec.new_tokens") == stats.new_tokens
    rounds = collector.wait_for(lambda: [s for _, s in collector.spans if s.name == "round"])
    assert len(rounds) == stats.rounds
    assert {attribute(r, "edgespec.session_id") for r in rounds} == {session_id}
    assert {r.trace_id for r in rounds} == {generate_span.trace_id}
    drafts = {s.span_id for service, s in collector.spans if s.name == "draft" and service == "edgespec-coordinator"}

    def served():
        spans = [s for service, s in collector.spans if s.name == "drafter.draft" and service == "edgespec-drafter"]
        return spans if len(spans) >= len(drafts) else None
    served = collector.wait_for(served)
    assert len(served) == len(drafts) and {s.parent_span_id for s in served} == drafts
    assert {s.trace_id for s in served} == {generate_span.trace_id}

    verifies = {s.span_id for service, s in collector.spans if s.name == "verify" and service == "edgespec-coordinator"}

    def verified():
        spans = [s for service, s in collector.spans if s.name == "verifier.verify" and service == "edgespec-verifier"]
        return spans if len(spans) >= len(verifies) else None
    verified = collector.wait_for(verified)
    assert len(verified) == stats.rounds and {s.parent_span_id for s in verified} == verifies
    assert {s.trace_id for s in verified} == {generate_span.trace_id}
    assert {attribute(s, "edgespec.batch_size") for s in verified} == {1}

    def accepted():
        points = [m.sum.data_points[0].as_int for service, m in collector.metrics
                  if m.name == "edgespec.spec_decode.num_accepted_tokens"]
        return points[-1:] if points and points[-1] == stats.accepted_tokens else None
    assert collector.wait_for(accepted) == [stats.accepted_tokens]


def test_json_logs_carry_the_generations_session_request_and_trace(run):
    cluster, collector, _ = run
    [generate_span] = collector.wait_for(lambda: [s for _, s in collector.spans if s.name == "generate"])
    session_id = attribute(generate_span, "edgespec.session_id")
    entries = [json.loads(line) for line in cluster.coordinator.log_path.read_text().splitlines()
               if line.startswith("{")]
    mine = [e for e in entries if e.get("session_id") == session_id]
    assert any("prompt tokens" in e["message"] for e in mine) and any("tokens in" in e["message"] for e in mine)
    assert len({e["request_id"] for e in mine}) == 1 and mine[0]["request_id"]
    assert {e.get("trace_id") for e in mine} == {generate_span.trace_id.hex()}
