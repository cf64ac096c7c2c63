"""Spans and W3C trace-context propagation, on the OpenTelemetry API only.

Library code (the round loop, the servicers) makes spans here; the services'
composition roots install the SDK and the exporters (edgespec.observe.exporters).
Without that the API is a no-op: no span is recorded and nothing is injected.

Trace context crosses the wire in two ways: unary calls carry it in the gRPC
metadata (``traceparent`` / ``tracestate``), and every verifier ``Window``
carries it in its ``trace_context`` map, because one VerifyStream carries the
windows of many rounds, each with its own parent span.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Mapping, MutableMapping, Sequence

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind
from opentelemetry.util.types import Attributes

TRACER_NAME = "edgespec"

# Span attribute names, one vocabulary for every service.
SESSION_ID = "edgespec.session_id"
REQUEST_ID = "edgespec.request_id"


def tracer() -> trace.Tracer:
    """The edgespec tracer of the global provider (a no-op one until a provider is set)."""
    return trace.get_tracer(TRACER_NAME)


def inject(carrier: MutableMapping[str, str]) -> None:
    """Write the current span's context into ``carrier`` (a dict, or a protobuf map field)."""
    propagate.inject(carrier)


def extract(carrier: Mapping[str, str]) -> Context:
    """The context a peer injected into ``carrier``; an empty one if it sent none."""
    return propagate.extract(carrier)


def outgoing_metadata() -> list[tuple[str, str]]:
    """gRPC metadata carrying the current span's context to the callee (empty when not tracing)."""
    carrier: dict[str, str] = {}
    inject(carrier)
    return list(carrier.items())


def incoming_carrier(metadata: Sequence[tuple[str, str | bytes]] | None) -> dict[str, str]:
    """A servicer's invocation metadata as a carrier for ``extract`` / ``server_span``."""
    return {key: value for key, value in metadata or () if isinstance(value, str)}


@contextmanager
def server_span(name: str, carrier: Mapping[str, str], attributes: Attributes = None) -> Iterator[Span]:
    """A SERVER span for one call (or one stream message), child of the caller's span in ``carrier``.

    The span is current inside the block; an exception leaving it is recorded and sets status ERROR.
    """
    with tracer().start_as_current_span(name, context=extract(carrier), kind=SpanKind.SERVER,
                                        attributes=attributes) as span:
        yield span
