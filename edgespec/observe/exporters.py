"""Install the OpenTelemetry SDK in a service: a Prometheus endpoint and OTLP export.

Called once by each service's composition root (``python -m services.*``) with
its --metrics-port / --otlp-endpoint; library code only uses the API
(edgespec.observe.tracing, edgespec.observe.metrics) and records nothing until this has run.

- metrics_port: serve /metrics for Prometheus on (host, port); 0 picks a free
  port. The bound port is logged ("metrics on http://HOST:PORT/metrics") and returned.
- prometheus: keep the metrics in a Prometheus registry even without a port, for
  another server to serve (the coordinator's OpenAI API has /metrics too; ``prometheus_text``).
The registry serves the families edgespec.observe.metrics.VLLM_NAMES lists twice:
under their own names and under vLLM's (``vllm:spec_decode_num_drafts_total`` ...),
the same values, so that tools reading vLLM's counters read these.
- otlp_endpoint: export spans (batched; OTEL_BSP_SCHEDULE_DELAY, default 5 s) and
  metrics (every OTEL_METRIC_EXPORT_INTERVAL, default 60 s) to an OTLP gRPC
  collector; "http://HOST:4317" is plaintext, "https://..." TLS.
With neither, nothing is installed: spans and metrics stay no-ops.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from wsgiref.simple_server import WSGIServer

from opentelemetry import metrics, trace
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest, start_http_server
from prometheus_client.metrics_core import Metric

from edgespec.observe.metrics import VLLM_NAMES

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Observability:
    """What setup installed; ``shutdown`` flushes and stops it (call it once, on service exit)."""
    metrics_port: int | None = None                   # bound Prometheus port; None = no endpoint
    tracer_provider: TracerProvider | None = None     # None = spans are not recorded
    meter_provider: MeterProvider | None = None       # None = metrics are not recorded
    http: WSGIServer | None = field(default=None, repr=False)   # serves metrics_port
    registry: CollectorRegistry | None = field(default=None, repr=False)   # the Prometheus metrics; None = none

    def shutdown(self) -> None:
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()    # exports the spans still batched
        if self.meter_provider is not None:
            self.meter_provider.shutdown()     # one last OTLP export
        if self.http is not None:
            self.http.shutdown()
            self.http.server_close()


def setup(service_name: str, metrics_port: int | None = None, otlp_endpoint: str | None = None,
          metrics_host: str = "127.0.0.1", prometheus: bool = False) -> Observability:
    """Install global tracer and meter providers for ``service_name`` (see the module doc)."""
    resource = Resource.create({SERVICE_NAME: service_name})
    readers: list[MetricReader] = []
    http = tracer_provider = meter_provider = registry = None
    if metrics_port is not None or prometheus:
        reader, registry = _prometheus()
        readers.append(reader)
    if metrics_port is not None:
        http = _serve(registry, metrics_host, metrics_port)
        log.info("%s metrics on http://%s:%d/metrics", service_name, metrics_host, http.server_port)
    if otlp_endpoint:   # imported here: the OTLP exporters pull in their generated protobuf code
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        tracer_provider = TracerProvider(resource=resource)
        tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp_endpoint)))
        trace.set_tracer_provider(tracer_provider)
        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=otlp_endpoint)))
        log.info("%s exports spans and metrics over OTLP to %s", service_name, otlp_endpoint)
    if readers:
        meter_provider = MeterProvider(resource=resource, metric_readers=readers)
        metrics.set_meter_provider(meter_provider)
    return Observability(http.server_port if http else None, tracer_provider, meter_provider, http, registry)


def prometheus_text(registry: CollectorRegistry) -> tuple[bytes, str]:
    """The registry in Prometheus' text format, and its content type."""
    return generate_latest(registry), CONTENT_TYPE_LATEST


class _WithVllmNames:
    """A collector: what the OpenTelemetry reader's registry holds, then each family VLLM_NAMES lists again
    under vLLM's name (samples renamed, labels and values the same)."""

    def __init__(self, source: CollectorRegistry):
        self.source = source

    def collect(self):
        for family in self.source.collect():
            yield family
            alias = VLLM_NAMES.get(family.name)
            if alias is not None:
                copy = Metric(alias, family.documentation, family.type, family.unit)
                copy.samples = [sample._replace(name=alias + sample.name[len(family.name):])
                                for sample in family.samples]
                yield copy


def _prometheus() -> tuple[PrometheusMetricReader, CollectorRegistry]:
    """A reader on a registry of its own, and the registry to serve: the reader's families with vLLM's names too."""
    source = CollectorRegistry()
    # No otel_scope_* labels: every edgespec instrument has the one scope "edgespec".
    reader = PrometheusMetricReader(scope_info_enabled=False, registry=source)
    registry = CollectorRegistry()
    registry.register(_WithVllmNames(source))
    return reader, registry


def _serve(registry: CollectorRegistry, host: str, port: int) -> WSGIServer:
    """The registry over HTTP on a daemon thread."""
    try:
        server, _ = start_http_server(port, host, registry)
    except OSError as error:
        raise OSError(f"metrics endpoint: cannot listen on {host}:{port}: {error}") from error
    return server
