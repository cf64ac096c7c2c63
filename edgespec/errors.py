"""Typed domain errors. Each says what went wrong and what the caller should do.

The gRPC status for each lives in one table (edgespec/net/rpc.py); nothing else maps
errors to codes.
"""
from __future__ import annotations


class EdgespecError(Exception):
    """Base class: a failure the caller can act on."""


class InvalidArgument(EdgespecError):
    """Bad input: fix the named field; retrying the same request cannot succeed."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")
        self.field = field


class NotFound(EdgespecError):
    """Unknown session: open it again with its committed prefix."""


class Aborted(EdgespecError):
    """Stale request: resync to ``committed_position`` and continue from there."""

    def __init__(self, message: str, committed_position: int):
        super().__init__(f"{message} (committed position {committed_position})")
        self.committed_position = committed_position


class FailedPrecondition(EdgespecError):
    """This server cannot do what was asked (its backend lacks a mode): use a server that can; retrying here fails."""


class ResourceExhausted(EdgespecError):
    """Over a limit or overloaded: back off (for ``retry_after_seconds`` when given), or ask for less."""

    def __init__(self, message: str, retry_after_seconds: float | None = None):
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds


class Unavailable(EdgespecError):
    """A peer could not be reached: retry, possibly elsewhere."""


class Unauthenticated(EdgespecError):
    """No valid credentials: send a known bearer token (or client certificate)."""


class PermissionDenied(EdgespecError):
    """The caller is known but may not do this (e.g. touch another client's session)."""
