"""The metrics each service records, on the OpenTelemetry API only.

One class per role holds its instruments; the service creates it once and calls
its methods where the thing happens. Names mirror vLLM's spec-decode metrics
where they mean the same (README.md "Observability" has the table): OpenTelemetry
``edgespec.spec_decode.num_drafts`` is Prometheus ``edgespec_spec_decode_num_drafts_total``
(dots become underscores; counters get ``_total``, and a unit ``s`` or ``By``
appends ``_seconds`` or ``_bytes``).

Without a meter provider (edgespec.observe.exporters.setup) every call is a no-op.

The Prometheus registry also serves the families in VLLM_NAMES under vLLM's own names
(edgespec.observe.exporters): the same counters, so that `vllm bench serve`, which reports
acceptance from vLLM's spec-decode counters, reads the coordinator's. Those counters exist
from the start, at 0, as vLLM's do: a tool reads them before a run and after it.
"""
from __future__ import annotations

from opentelemetry import metrics
from opentelemetry.metrics import Meter

from edgespec.control.sample import RoundSample

METER_NAME = "edgespec"

# Histogram buckets: OpenTelemetry's defaults suit milliseconds, not these.
SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
WINDOW_BUCKETS = (0, 1, 2, 3, 4, 5, 6, 8, 10, 12, 16)
COUNT_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128)
TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


# Prometheus family -> vLLM's name for it (vllm/v1/spec_decode/metrics.py); counters, served with "_total"
VLLM_NAMES = {
    "edgespec_spec_decode_num_drafts": "vllm:spec_decode_num_drafts",
    "edgespec_spec_decode_num_draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "edgespec_spec_decode_num_accepted_tokens": "vllm:spec_decode_num_accepted_tokens",
    "edgespec_spec_decode_num_accepted_tokens_per_pos": "vllm:spec_decode_num_accepted_tokens_per_pos",
}


def _meter(meter: Meter | None) -> Meter:
    return meter or metrics.get_meter(METER_NAME)


class CoordinatorMetrics:
    """Rounds, generations and failovers, as the coordinator sees them."""

    def __init__(self, meter: Meter | None = None):
        m = _meter(meter)
        self.drafts = m.create_counter(
            "edgespec.spec_decode.num_drafts", "{window}", "windows with draft tokens verified (self-drafted too)")
        self.draft_tokens = m.create_counter(
            "edgespec.spec_decode.num_draft_tokens", "{token}",
            "draft tokens proposed in verified windows: the drafter's, free and self-drafted ones, runner-ups")
        self.accepted_tokens = m.create_counter(
            "edgespec.spec_decode.num_accepted_tokens", "{token}", "draft tokens the verifier accepted")
        self.accepted_per_position = m.create_counter(
            "edgespec.spec_decode.num_accepted_tokens_per_pos", "{token}",
            "accepted draft tokens by their position in the window (0 = first)")
        self.window_size = m.create_histogram(
            "edgespec.spec_decode.window_size", "{token}", "draft window k per round (0 = target-only)",
            explicit_bucket_boundaries_advisory=WINDOW_BUCKETS)
        self.link_rtt = m.create_histogram(
            "edgespec.link.rtt", "s", "verify round trip minus the verifier-reported time inside it, per round",
            explicit_bucket_boundaries_advisory=SECONDS_BUCKETS)
        self.verifier_wait = m.create_histogram(
            "edgespec.verdict.wait", "s", "seconds a window waited in the verifier behind other sessions' work",
            explicit_bucket_boundaries_advisory=SECONDS_BUCKETS)
        self.verdict_queue_depth = m.create_histogram(
            "edgespec.verdict.queue_depth", "{window}", "windows waiting at the verifier, as its verdicts report",
            explicit_bucket_boundaries_advisory=COUNT_BUCKETS)
        self.time_per_output_token = m.create_histogram(
            "edgespec.time_per_output_token", "s", "per generation: seconds after the prefill / new tokens",
            explicit_bucket_boundaries_advisory=SECONDS_BUCKETS)
        self.generations = m.create_counter(
            "edgespec.generations", "{generation}", "finished generations by finish_reason")
        self.failovers = m.create_counter(
            "edgespec.failovers", "{failover}", "sessions re-opened on a verifier, by reason")
        self.tree_siblings = m.create_counter(
            "edgespec.spec_decode.tree_siblings", "{token}",
            "runner-up nodes drafted beside the chain in token-tree windows, by outcome (taken | not_taken)")
        self.self_drafted = m.create_counter(
            "edgespec.spec_decode.self_drafted_tokens", "{token}",
            "cloud drafting: tokens the verifier guessed and scored itself, by outcome (accepted | rejected)")
        for counter in (self.drafts, self.draft_tokens, self.accepted_tokens):
            counter.add(0)   # served from the start (see the module doc)

    def round(self, sample: RoundSample) -> None:
        """One committed round."""
        self.window_size.record(sample.k)
        self.verdict_queue_depth.record(sample.queue_depth)
        self.link_rtt.record(sample.rtt, {"verifier": sample.link})
        self.verifier_wait.record(sample.verifier_wait, {"verifier": sample.link})
        if sample.self_drafted:
            self.self_drafted.add(sample.accepted, {"outcome": "accepted"})
            self.self_drafted.add(sample.self_drafted - sample.accepted, {"outcome": "rejected"})
        drafted = sample.k + sample.siblings + sample.self_drafted   # as the session's stats count them
        if drafted == 0:
            return
        self.drafts.add(1)
        self.draft_tokens.add(drafted)
        if sample.siblings:
            taken = int(sample.took_sibling)
            self.tree_siblings.add(taken, {"outcome": "taken"})
            self.tree_siblings.add(sample.siblings - taken, {"outcome": "not_taken"})
        self.accepted_tokens.add(sample.accepted)
        for position in range(sample.accepted):
            self.accepted_per_position.add(1, {"position": position})

    def generation(self, finish_reason: str, new_tokens: int, decode_seconds: float) -> None:
        """One finished generation; ``decode_seconds`` is its time after the prefill."""
        self.generations.add(1, {"finish_reason": finish_reason})
        if new_tokens:
            self.time_per_output_token.record(decode_seconds / new_tokens)

    def failed(self) -> None:
        """A generation that ended with an error status."""
        self.generations.add(1, {"finish_reason": "error"})

    def failover(self, reason: str) -> None:
        """reason: "unreachable" (moved to another verifier) or "lost_session" (re-opened in place)."""
        self.failovers.add(1, {"reason": reason})


class VerifierMetrics:
    """Batches, queue, sessions and evictions of one verifier."""

    def __init__(self, meter: Meter | None = None):
        m = _meter(meter)
        self.batch_size = m.create_histogram(
            "edgespec.verifier.batch_size", "{window}", "windows verified per target forward",
            explicit_bucket_boundaries_advisory=COUNT_BUCKETS[1:])
        self.batch_tokens = m.create_histogram(
            "edgespec.verifier.batch_tokens", "{token}", "tokens fed per target forward",
            explicit_bucket_boundaries_advisory=TOKEN_BUCKETS)
        self.forward_duration = m.create_histogram(
            "edgespec.verifier.forward_duration", "s", "seconds per target forward (one batch)",
            explicit_bucket_boundaries_advisory=SECONDS_BUCKETS)
        self.windows_waiting = m.create_gauge(
            "edgespec.verifier.num_windows_waiting", "{window}", "windows queued for a target forward")
        self.open_sessions = m.create_gauge("edgespec.verifier.open_sessions", "{session}", "sessions held")
        self.kv_cache = m.create_gauge("edgespec.verifier.kv_cache", "By", "bytes of KV cache held by sessions")
        self.evictions = m.create_counter(
            "edgespec.verifier.evictions", "{session}", "KV caches dropped, by reason (ttl | memory)")
        self.rejected_windows = m.create_counter(
            "edgespec.verifier.rejected_windows", "{window}", "windows refused, by reason (overload)")
        self.prefill_tokens = m.create_counter(
            "edgespec.verifier.prefill_tokens", "{token}",
            "prompt positions prefilled, by source (computed | prefix_cache: taken from stored blocks)")
        self.prefix_cache = m.create_gauge(
            "edgespec.verifier.prefix_cache", "By", "bytes of KV cache held by the prefix cache")

    def batch(self, windows: int, tokens: int, seconds: float, waiting: int) -> None:
        """One target forward: ``windows`` windows of ``tokens`` tokens in ``seconds``; ``waiting`` still queued."""
        self.batch_size.record(windows)
        self.batch_tokens.record(tokens)
        self.forward_duration.record(seconds)
        self.windows_waiting.set(waiting)

    def sessions(self, open_sessions: int, kv_cache_bytes: int) -> None:
        self.open_sessions.set(open_sessions)
        self.kv_cache.set(kv_cache_bytes)

    def evicted(self, reason: str, sessions: int = 1) -> None:
        self.evictions.add(sessions, {"reason": reason})

    def rejected(self, reason: str = "overload") -> None:
        self.rejected_windows.add(1, {"reason": reason})

    def prefilled(self, computed: int, from_cache: int, cache_bytes: int) -> None:
        if computed:
            self.prefill_tokens.add(computed, {"source": "computed"})
        if from_cache:
            self.prefill_tokens.add(from_cache, {"source": "prefix_cache"})
        self.prefix_cache.set(cache_bytes)


class DrafterMetrics:
    def __init__(self, meter: Meter | None = None):
        m = _meter(meter)
        self.draft_duration = m.create_histogram(
            "edgespec.drafter.draft_duration", "s", "model seconds per Draft call",
            explicit_bucket_boundaries_advisory=SECONDS_BUCKETS)
        self.drafted_tokens = m.create_counter("edgespec.drafter.drafted_tokens", "{token}", "tokens drafted")

    def draft(self, tokens: int, seconds: float) -> None:
        self.drafted_tokens.add(tokens)
        self.draft_duration.record(seconds)
