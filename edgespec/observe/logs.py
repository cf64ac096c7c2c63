"""Service logs: today's text lines, or JSON objects carrying session, request and trace ids.

The ids live in context variables. A servicer binds them at the start of each
call; grpc.aio runs every call in its own asyncio task, and tasks started from
it inherit them, so every record made on the call's behalf carries them
(records made on a model worker thread do not). A filter on the handler copies
them, and the current span's trace and span ids, onto each record.
"""
from __future__ import annotations

import faulthandler
import json
import logging
import time
from contextvars import ContextVar
from datetime import datetime, timezone
from typing import Sequence

from opentelemetry import trace

REQUEST_ID_KEY = "x-request-id"   # gRPC metadata: the caller's request id; the coordinator echoes it back
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
FORMATS = ("text", "json")
LEVELS = ("debug", "info", "warning", "error")

session_id: ContextVar[str] = ContextVar("edgespec_session_id", default="")
request_id: ContextVar[str] = ContextVar("edgespec_request_id", default="")

_IDS = ("session_id", "request_id", "trace_id", "span_id")


def bind(session: str = "", request: str = "") -> None:
    """Tag this task's log records (and those of tasks it starts) with these ids; "" leaves one unset."""
    session_id.set(session)
    request_id.set(request)


def request_id_from(metadata: Sequence[tuple[str, str | bytes]] | None) -> str:
    """The caller's ``x-request-id`` metadata value; "" if it sent none."""
    for key, value in metadata or ():
        if key == REQUEST_ID_KEY and isinstance(value, str):
            return value
    return ""


class LogThrottle:
    """At most one record per key and interval for a problem that repeats (no verifier reachable: every
    request fails the same way, as often as clients retry); the next record says how many were held back,
    and those go to DEBUG meanwhile."""

    MAX_KEYS = 1000

    def __init__(self, interval_seconds: float = 30.0, clock=time.monotonic):
        self.interval = interval_seconds
        self.clock = clock
        self._last: dict[str, tuple[float, int]] = {}   # key -> (when last logged, records held back since)

    def log(self, logger: logging.Logger, level: int, key: str, message: str, *args) -> None:
        now = self.clock()
        at, held = self._last.get(key, (None, 0))
        if at is not None and now - at < self.interval:
            self._last[key] = (at, held + 1)
            logger.debug(message, *args)
            return
        if held:
            message, args = message + " (%d more like it in the last %.0fs)", (*args, held, now - at)
        if len(self._last) >= self.MAX_KEYS and key not in self._last:
            self._last.clear()
        self._last[key] = (now, 0)
        logger.log(level, message, *args)


class ContextFilter(logging.Filter):
    """Copies the bound ids and the current span's ids onto every record (never drops one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.session_id = session_id.get()
        record.request_id = request_id.get()
        span = trace.get_current_span().get_span_context()
        record.trace_id = trace.format_trace_id(span.trace_id) if span.is_valid else ""
        record.span_id = trace.format_span_id(span.span_id) if span.is_valid else ""
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and the ids that are known."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
                 "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        entry.update((key, getattr(record, key)) for key in _IDS if getattr(record, key, ""))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure(log_format: str, level: int | str = logging.INFO) -> None:
    """Send the root logger's records of ``level`` and above to stderr as ``log_format`` ("text" or "json").

    ``level`` is a logging level or one of LEVELS ("debug", "info", "warning", "error").
    """
    if log_format not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {log_format!r}")
    if isinstance(level, str):
        if level.lower() not in LEVELS:
            raise ValueError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}")
        level = getattr(logging, level.upper())
    handler = logging.StreamHandler()
    handler.addFilter(ContextFilter())
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level, handlers=[handler], force=True)
    # An engine that dies by a signal in native code (a llama.cpp kernel) leaves the Python stack it died in on
    # stderr, so the log says whether it was loading or in a forward; whoever started the service reports the
    # death in one line (harness.cluster.exit_note).
    faulthandler.enable()
