"""Traces, metrics and logs of known runs, read back from in-memory exporters.

OpenTelemetry allows one global tracer provider per process, so the spans of
every test here go to one in-memory exporter, installed on first use and
cleared around each test. Metrics go to a meter provider of each test's own.
"""
import asyncio
import functools
import io
import json
import logging
import re

import grpc
import pytest
from opentelemetry import trace
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry, generate_latest

from edgespec.observe import logs, tracing
from edgespec.net import rpc
from edgespec.backends.registry import TINY_EOS
from edgespec.engines.drafter import DrafterEngine
from edgespec.loop.failover import FailoverVerifier
from edgespec.loop.generation import GenerationConfig
from edgespec.observe.metrics import CoordinatorMetrics, DrafterMetrics, VerifierMetrics
from edgespec.loop.pool import VerifierPool
from edgespec.verify.window import Window
from edgespec.verify.sampling import SamplingParams
from edgespec.net.security import SessionOwners
from edgespec.loop.session import SessionLog
from edgespec.loop.config import SpeculationConfig
from edgespec.loop.speculation import speculate
from edgespec.control.sample import RoundSample
from edgespec.backends.tokenizer import load_tokenizer
from harness.cluster import REPO_ROOT
from edgespec.v1 import coordinator_pb2, coordinator_pb2_grpc, drafter_pb2, verifier_pb2, verifier_pb2_grpc
from edgespec.engines.verifier import VerifierEngine
from edgespec.control.window import FixedWindow
from edgespec.engines.worker import ModelWorker
from services.coordinator.clients import GrpcDrafter, GrpcVerifier
from services.coordinator.servicer import CoordinatorServicer
from services.coordinator.servicer import register as register_coordinator
from services.drafter.servicer import DrafterServicer
from services.drafter.servicer import register as register_drafter
from tests.tiny import InProcessDrafter, InProcessVerifier, target_only_greedy, tiny
from tests.unit.test_failover import Faulty

TARGET, DRAFT = "tiny:7", "tiny:7~1"   # a draft that agrees with the target often, not always
PROMPT = "def add(a, b):"


@functools.lru_cache(maxsize=None)
def _span_exporter() -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    assert trace.get_tracer_provider() is provider, "another global tracer provider was installed first"
    return exporter


@pytest.fixture
def spans():
    exporter = _span_exporter()
    exporter.clear()
    yield exporter
    exporter.clear()


class Metrics:
    """A meter provider of this test's own, read back as {instrument name: data points}."""

    def __init__(self):
        self.reader = InMemoryMetricReader()
        self.provider = MeterProvider(metric_readers=[self.reader])
        self.meter = self.provider.get_meter("edgespec")

    def read(self) -> dict[str, list]:
        data = self.reader.get_metrics_data()
        return {m.name: list(m.data.data_points) for rm in data.resource_metrics for sm in rm.scope_metrics
                for m in sm.metrics}


@pytest.fixture
def meter():
    metrics = Metrics()
    yield metrics
    metrics.provider.shutdown()


def total(points: dict[str, list], name: str) -> float:
    return sum(p.value for p in points.get(name, []))


def children(all_spans, parent) -> list:
    return [s for s in all_spans if s.parent is not None and s.parent.span_id == parent.context.span_id]


def committed_rounds(all_spans) -> list:
    return [s for s in all_spans if s.name == "round" and "edgespec.dropped" not in s.attributes]


def assert_metrics_match_rounds(points: dict[str, list], rounds: list, drafted: int, accepted: int) -> None:
    """The counters, from the same run's round spans and stats: vLLM's spec-decode arithmetic."""
    ks = [r.attributes["edgespec.k"] for r in rounds]
    ns = [r.attributes["edgespec.accepted"] for r in rounds]
    assert (sum(ks), sum(ns)) == (drafted, accepted)
    assert total(points, "edgespec.spec_decode.num_drafts") == sum(k > 0 for k in ks)
    assert total(points, "edgespec.spec_decode.num_draft_tokens") == drafted
    assert total(points, "edgespec.spec_decode.num_accepted_tokens") == accepted
    per_position = {p.attributes["position"]: p.value for p in points["edgespec.spec_decode.num_accepted_tokens_per_pos"]}
    assert per_position == {i: sum(n > i for n in ns) for i in range(max(ns))}
    [window] = points["edgespec.spec_decode.window_size"]
    assert (window.count, window.sum) == (len(rounds), drafted)
    [rtt] = points["edgespec.link.rtt"]
    assert rtt.count == len(rounds) and rtt.sum == pytest.approx(sum(r.attributes["edgespec.rtt_seconds"] for r in rounds))


@pytest.mark.parametrize("pipeline", [False, True], ids=["blocking", "pipelined"])
def test_in_process_run_has_one_round_span_per_round_and_counts_its_tokens(spans, meter, pipeline):
    prompt = list(PROMPT.encode())
    verifier, drafter = VerifierEngine(tiny(TARGET), [TINY_EOS]), DrafterEngine(tiny(DRAFT))
    log = SessionLog(prompt, 40, frozenset({TINY_EOS}))

    async def go():
        verifier.open("s1", prompt)
        with tracing.tracer().start_as_current_span("generate"):
            async for _ in speculate(log, "s1", InProcessDrafter(drafter), InProcessVerifier(verifier), FixedWindow(3),
                                     config=SpeculationConfig(pipeline=pipeline),
                                     metrics=CoordinatorMetrics(meter.meter)):
                pass

    asyncio.run(go())
    assert log.generated == target_only_greedy(TARGET, prompt, 40)
    finished = spans.get_finished_spans()
    [generate] = [s for s in finished if s.name == "generate"]
    rounds = committed_rounds(finished)
    assert len(rounds) == log.stats.rounds
    assert all(r.parent.span_id == generate.context.span_id for r in finished if r.name == "round")
    for r in rounds:
        names = sorted(s.name for s in children(finished, r))
        assert names == (["commit", "draft", "verify"] if r.attributes["edgespec.k"] else ["commit", "verify"]), names
    bases = [r.attributes["edgespec.base_position"] for r in sorted(rounds, key=lambda r: r.start_time)]
    assert bases == sorted(bases) and bases[0] == len(prompt)
    dropped = [s for s in finished if s.attributes.get("edgespec.dropped") == "its assumption missed"]
    assert len(dropped) == log.stats.optimistic_windows - log.stats.optimistic_hits
    if pipeline:
        assert log.stats.optimistic_hits > 0    # the pipelined run did overlap rounds
    assert_metrics_match_rounds(meter.read(), rounds, log.stats.drafted, log.stats.accepted)


def test_a_failover_is_a_span_under_the_verify_that_met_it_and_is_counted(spans, meter):
    prompt = list(PROMPT.encode())
    a = Faulty(VerifierEngine(tiny(TARGET), [TINY_EOS]), "a", fail_on={3})   # the third window finds it gone
    b = Faulty(VerifierEngine(tiny(TARGET), [TINY_EOS]), "b", fail_on=set())
    metrics = CoordinatorMetrics(meter.meter)
    failover = FailoverVerifier(VerifierPool(["a", "b"], base_backoff_seconds=0.01), {"a": a, "b": b}, 5, metrics)
    log = SessionLog(prompt, 30, frozenset({TINY_EOS}))

    async def go():
        await failover.open("s1", prompt, SamplingParams())
        async for _ in speculate(log, "s1", InProcessDrafter(DrafterEngine(tiny(DRAFT))), failover, FixedWindow(3),
                                 metrics=metrics):
            pass

    asyncio.run(go())
    assert log.generated == target_only_greedy(TARGET, prompt, 30)
    finished = spans.get_finished_spans()
    [moved] = [s for s in finished if s.name == "failover"]
    [verify] = [s for s in finished if s.context.span_id == moved.parent.span_id]
    assert verify.name == "verify" and verify.attributes["edgespec.accepted"] >= 0   # the resent window's verdict
    assert {k: moved.attributes[k] for k in ("edgespec.reason", "edgespec.from_verifier", "edgespec.to_verifier")} == {
        "edgespec.reason": "unreachable", "edgespec.from_verifier": "a", "edgespec.to_verifier": "b"}
    points = meter.read()
    assert [(p.attributes, p.value) for p in points["edgespec.failovers"]] == [({"reason": "unreachable"}, 1)]
    assert failover.stats("s1").failovers == 1
    rtt = {p.attributes["verifier"]: p.count for p in points["edgespec.link.rtt"]}
    assert rtt == {"a": 2, "b": log.stats.rounds - 2}


class TracedVerifier(verifier_pb2_grpc.VerifierServicer):
    """A verifier servicer over an in-process engine that joins each window's trace as the real one does."""

    def __init__(self, engine: VerifierEngine, vocab_size: int):
        self.port = InProcessVerifier(engine)
        self.vocab_size = vocab_size
        self.trace_contexts: list[dict[str, str]] = []   # of each window received
        self.stream_request_ids: list[str] = []            # of each stream opened

    async def Info(self, request, context):
        return verifier_pb2.InfoResponse(model=TARGET, vocab_size=self.vocab_size, eos_token_ids=[TINY_EOS],
                                         max_window=8, max_session_tokens=512)

    async def OpenSession(self, request, context):
        await self.port.open(request.session_id, list(request.tokens))
        return verifier_pb2.OpenSessionResponse(committed_position=len(request.tokens))

    async def VerifyStream(self, request_iterator, context):
        self.stream_request_ids.append(logs.request_id_from(context.invocation_metadata()))
        async for window in request_iterator:
            self.trace_contexts.append(dict(window.trace_context))
            with tracing.server_span("verifier.verify", dict(window.trace_context),
                                     {tracing.SESSION_ID: window.session_id}):
                verdict = await self.port.verify(window.session_id, Window(
                    window.window_seq, window.base_position, tuple(window.draft_tokens)))
            yield verifier_pb2.Verdict(session_id=window.session_id, window_seq=window.window_seq,
                                       base_position=window.base_position, accepted=verdict.accepted,
                                       next_token=verdict.next_token,
                                       committed_position=window.base_position + verdict.accepted + 1)

    async def CloseSession(self, request, context):
        await self.port.close(request.session_id)
        return verifier_pb2.CloseSessionResponse()


async def start(register):
    server, port, _ = rpc.create_server("127.0.0.1", 0, register)
    await server.start()
    return server, f"127.0.0.1:{port}"


def test_a_generation_over_grpc_is_one_trace_across_the_services(spans, meter):
    """Client span -> generate -> rounds -> draft / verify, and the drafter's and verifier's
    server spans under them, all in one trace; the metrics equal the run's GenerationStats."""
    worker = ModelWorker("drafter")
    traced = TracedVerifier(VerifierEngine(tiny(TARGET), [TINY_EOS]), tiny(TARGET).vocab_size)

    async def go():
        def add_verifier(server):
            verifier_pb2_grpc.add_VerifierServicer_to_server(traced, server)
            return []
        verifier_server, verifier_address = await start(add_verifier)
        drafter_server, drafter_address = await start(register_drafter(DrafterServicer(
            DrafterEngine(tiny(DRAFT)), worker, drafter_pb2.DrafterInfoResponse(), SessionOwners(8),
            DrafterMetrics(meter.meter))))
        coordinator_metrics = CoordinatorMetrics(meter.meter)
        failover = FailoverVerifier(VerifierPool([verifier_address]),
                                    {verifier_address: GrpcVerifier(verifier_address, 30)}, 5, coordinator_metrics)
        coordinator_server, coordinator_address = await start(register_coordinator(CoordinatorServicer(
            GenerationConfig(max_new_tokens=200,
                             speculation=SpeculationConfig(window=3, max_window=8)), load_tokenizer("bytes"),
            {"draft": GrpcDrafter(drafter_address, 30)}, failover, metrics=coordinator_metrics)))
        try:
            async with grpc.aio.insecure_channel(coordinator_address) as channel:
                with tracing.tracer().start_as_current_span("client"):
                    call = coordinator_pb2_grpc.CoordinatorStub(channel).Generate(
                        coordinator_pb2.GenerateRequest(prompt=PROMPT, max_new_tokens=40, window=3),
                        metadata=[(logs.REQUEST_ID_KEY, "req-7"), *tracing.outgoing_metadata()])
                    events = [event async for event in call]
                    echoed = dict(await call.initial_metadata())
        finally:
            for server in (coordinator_server, drafter_server, verifier_server):
                await server.stop(0)
        return events, echoed

    try:
        with Records("edgespec.loop.generation") as records:
            events, echoed = asyncio.run(go())
    finally:
        worker.shutdown()
    tokens = [t for e in events if e.HasField("chunk") for t in e.chunk.token_ids]
    stats = events[-1].stats
    assert tokens == target_only_greedy(TARGET, list(PROMPT.encode()), 40)
    assert echoed[logs.REQUEST_ID_KEY] == "req-7"

    finished = spans.get_finished_spans()
    [client] = [s for s in finished if s.name == "client"]
    assert {s.context.trace_id for s in finished} == {client.context.trace_id}
    [generate] = children(finished, client)
    assert generate.name == "generate" and generate.kind == trace.SpanKind.SERVER
    session_id = generate.attributes[tracing.SESSION_ID]
    assert generate.attributes[tracing.REQUEST_ID] == "req-7"
    assert (generate.attributes["edgespec.new_tokens"], generate.attributes["edgespec.finish_reason"],
            generate.attributes["edgespec.window_policy"]) == (stats.new_tokens, stats.finish_reason, "fixed 3")
    rounds = [s for s in children(finished, generate) if s.name == "round"]
    assert len(rounds) == stats.rounds and all(r.attributes[tracing.SESSION_ID] == session_id for r in rounds)
    drafting = [r for r in rounds if r.attributes["edgespec.k"]]
    assert rounds[0] not in drafting   # the first token is a target-only step
    for r in rounds:
        steps = {s.name: s for s in children(finished, r)}
        assert sorted(steps) == (["commit", "draft", "verify"] if r.attributes["edgespec.k"] else ["commit", "verify"])
        [verifier_span] = children(finished, steps["verify"])
        assert verifier_span.name == "verifier.verify" and verifier_span.kind == trace.SpanKind.SERVER
        if "draft" in steps:   # the first draft opens the drafter session too
            drafter_spans = children(finished, steps["draft"])
            assert [s.name for s in drafter_spans] == (["drafter.open_session"] if r is drafting[0] else []) + ["drafter.draft"]
            assert all(s.attributes[tracing.SESSION_ID] == session_id for s in drafter_spans)
    assert len(traced.trace_contexts) == stats.rounds and all("traceparent" in c for c in traced.trace_contexts)
    assert traced.stream_request_ids == ["req-7"]

    points = meter.read()
    assert_metrics_match_rounds(points, rounds, stats.drafted_tokens, stats.accepted_tokens)
    assert total(points, "edgespec.drafter.drafted_tokens") == stats.drafted_tokens
    assert [p.attributes for p in points["edgespec.generations"]] == [{"finish_reason": stats.finish_reason}]
    [tpot] = points["edgespec.time_per_output_token"]
    assert tpot.count == 1 and tpot.sum == pytest.approx((stats.seconds - stats.prefill_seconds) / stats.new_tokens)

    started = [r for r in records.records if "prompt tokens" in r.getMessage()]
    assert [(r.session_id, r.request_id) for r in started] == [(session_id, "req-7")]
    assert started[0].trace_id == trace.format_trace_id(client.context.trace_id)


class Records(logging.Handler):
    """Keeps the records of one logger, with the ids the context filter adds."""

    def __init__(self, logger: str):
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.addFilter(logs.ContextFilter())
        self.logger = logging.getLogger(logger)

    def __enter__(self) -> "Records":
        self.level = self.logger.level
        self.logger.setLevel(logging.INFO)
        self.logger.addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        self.logger.removeHandler(self)
        self.logger.setLevel(self.level)

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_json_log_records_carry_the_session_request_and_trace_ids(spans):
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(logs.ContextFilter())
    handler.setFormatter(logs.JsonFormatter())
    logger = logging.getLogger("edgespec.test_json_logs")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)   # a logger of this test's own

    async def call(session: str, request: str):
        logs.bind(session, request)   # as a servicer does at the start of a call (each call is its own task)
        with tracing.tracer().start_as_current_span("call") as span:
            logger.info("window %d verified", 3)
            return span.get_span_context()

    async def two_calls():
        return await asyncio.gather(call("s-1", "r-1"), call("s-2", "r-2"))

    try:
        first, second = asyncio.run(two_calls())
        logger.warning("outside any call")
    finally:
        logger.removeHandler(handler)
    entries = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(e["session_id"], e["request_id"], e["trace_id"], e["span_id"]) for e in entries[:2]] == [
        ("s-1", "r-1", trace.format_trace_id(first.trace_id), trace.format_span_id(first.span_id)),
        ("s-2", "r-2", trace.format_trace_id(second.trace_id), trace.format_span_id(second.span_id))]
    assert entries[0]["message"] == "window 3 verified" and entries[0]["level"] == "INFO"
    assert entries[0]["logger"] == "edgespec.test_json_logs" and re.match(r"\d{4}-\d\d-\d\dT", entries[0]["time"])
    assert set(entries[2]) == {"time", "level", "logger", "message"}   # no ids outside a call


def test_prometheus_names_are_the_documented_ones():
    """Every metric name in README.md's Observability table is what the Prometheus exporter serves."""
    registry = CollectorRegistry()
    provider = MeterProvider(metric_readers=[PrometheusMetricReader(scope_info_enabled=False, registry=registry)])
    meter = provider.get_meter("edgespec")
    coordinator, verifier, drafter = CoordinatorMetrics(meter), VerifierMetrics(meter), DrafterMetrics(meter)
    coordinator.round(RoundSample(3, 2, 0.01, 0.05, 0.02, 1, "v:1"))
    coordinator.round(RoundSample(3, 1, 0.01, 0.05, 0.02, 1, "v:1", siblings=2, took_sibling=True))
    coordinator.round(RoundSample(0, 2, 0.0, 0.05, 0.04, 1, "v:1", self_drafted=12))
    coordinator.generation("eos", 10, 0.5)
    coordinator.failover("unreachable")
    verifier.batch(windows=2, tokens=7, seconds=0.03, waiting=1)
    verifier.sessions(open_sessions=3, kv_cache_bytes=1000)
    verifier.evicted("ttl")
    verifier.rejected()
    verifier.prefilled(computed=40, from_cache=32, cache_bytes=4096)
    drafter.draft(3, 0.01)
    served = set(re.findall(r"^(edgespec_\w+?)(?:_bucket|_count|_sum)?(?:\{|\s)", generate_latest(registry).decode(),
                            re.MULTILINE))
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme[readme.index("## Observability"):]
    documented = set(re.findall(r"^\| `(edgespec_\w+)`", section, re.MULTILINE))
    assert documented == served
    provider.shutdown()


def test_observability_flags_and_their_environment(monkeypatch):
    from services.coordinator.__main__ import parse_args as coordinator_args
    from services.drafter.__main__ import parse_args as drafter_args

    off = coordinator_args([]).observability
    assert (off.metrics_port, off.otlp_endpoint, off.log_format) == (None, None, "text")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317")
    monkeypatch.setenv("EDGESPEC_DRAFTER_METRICS_PORT", "9102")
    monkeypatch.setenv("EDGESPEC_DRAFTER_LOG_FORMAT", "json")
    drafter = drafter_args([]).service.observability
    assert (drafter.metrics_port, drafter.otlp_endpoint, drafter.log_format) == (9102, "http://collector:4317", "json")
    coordinator = coordinator_args(["--metrics-port", "0", "--otlp-endpoint", "http://other:4317"]).observability
    assert (coordinator.metrics_port, coordinator.otlp_endpoint) == (0, "http://other:4317")
    for bad in (["--metrics-port", "-1"], ["--log-format", "xml"]):
        with pytest.raises(SystemExit):
            coordinator_args(bad)


def test_the_counters_count_draft_tokens_as_the_session_s_stats_do(meter):
    """One meaning of "drafted": the drafter's chain, a tree's runner-ups, free drafts and the verifier's own
    (cloud drafting) in both the session's stats and the Prometheus counters; target-only rounds in neither."""
    from edgespec.loop.session import RoundStats

    samples = [RoundSample(3, 2, 0.01, 0.05, 0.02, 1, "v:1"),
               RoundSample(3, 1, 0.01, 0.05, 0.02, 1, "v:1", siblings=2, took_sibling=True),
               RoundSample(0, 4, 0.0, 0.05, 0.04, 1, "v:1", self_drafted=6),
               RoundSample(5, 5, 0.0, 0.05, 0.02, 1, "v:1", free=True),
               RoundSample(0, 0, 0.0, 0.05, 0.02, 1, "v:1")]
    stats, coordinator = RoundStats(), CoordinatorMetrics(meter.meter)
    for sample in samples:
        stats.record(sample)
        coordinator.round(sample)
    points = meter.read()
    assert (stats.drafted, stats.accepted) == (3 + 5 + 6 + 5, 2 + 1 + 4 + 5)
    assert total(points, "edgespec.spec_decode.num_draft_tokens") == stats.drafted
    assert total(points, "edgespec.spec_decode.num_accepted_tokens") == stats.accepted
    assert total(points, "edgespec.spec_decode.num_drafts") == 4   # every round but the target-only one
