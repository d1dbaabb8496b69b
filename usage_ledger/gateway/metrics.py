"""The gateway's Prometheus metrics: plain counters rendered as text exposition (no client library)."""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field

__all__ = ("Histogram", "Metrics")

# seconds: LLM calls run from milliseconds (errors, tiny prompts) to many minutes (long generations)
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


@dataclass(slots=True)
class Histogram:
    """A Prometheus histogram: cumulative buckets, sum and count."""

    buckets: tuple[float, ...] = _LATENCY_BUCKETS
    counts: list[int] = field(init=False)
    """One per bucket, then the overflow above the last bound (not cumulative; `render` sums them)."""
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value

    def render(self, name: str, help_text: str) -> list[str]:
        lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        cumulative = 0
        for bound, count in zip(self.buckets, self.counts, strict=False):
            cumulative += count
            lines.append(f'{name}_bucket{{le="{bound:g}"}} {cumulative}')
        cumulative += self.counts[-1]
        lines += [
            f'{name}_bucket{{le="+Inf"}} {cumulative}',
            f"{name}_sum {self.total:.6f}",
            f"{name}_count {cumulative}",
        ]
        return lines


@dataclass(slots=True)
class Metrics:
    calls: Counter[int] = field(default_factory=Counter)
    """Finished calls by upstream status."""
    failures: Counter[str] = field(default_factory=Counter)
    """Failed calls by reason."""
    in_flight: int = 0
    chunks: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    response_bytes: int = 0
    record_failures: int = 0
    refused_unrecorded: int = 0
    usage_injected: int = 0
    usage_sources: Counter[str] = field(default_factory=Counter)
    """Recorded calls by where their token counts came from (`ledger.events.UsageSource`)."""
    passed_through: int = 0
    """Requests proxied that are not calls (not an inference API): not recorded."""
    connections_refused: int = 0
    """Connections answered 503 at the connection cap (`gateway.limits`)."""
    connections_shed: int = 0
    """Waiting connections closed to make room at the connection cap."""
    requests_timed_out: int = 0
    """Requests whose head or body did not arrive in time (408)."""
    bodies_too_slow: int = 0
    """Of those, request bodies cut for pausing or arriving too slowly (`gateway._http.guard`); never calls."""
    requests_refused_busy: int = 0
    """Requests answered 503: the request-body budget was full."""
    response_blobs_omitted: int = 0
    """Recorded calls whose response body was not stored (over the stored-body cap or budget)."""
    bodies_erased: int = 0
    """Bodies erased by `--keep-bodies` (`gateway.retention`)."""
    retention_passes: int = 0
    retention_failures: int = 0
    duration: Histogram = field(default_factory=Histogram)
    """Seconds from request received to call recorded, every call."""
    ttft: Histogram = field(default_factory=Histogram)
    """Seconds from request received to the first token, calls that produced one."""

    def render(self, *, queue_depth: int, spool_bytes: int, spooling: bool, committed: int, spooled: int) -> str:
        lines: list[str] = []
        for name, label, counts, text in (
            ("ledger_gateway_calls_total", "status", self.calls, "Calls proxied, by upstream status."),
            ("ledger_gateway_call_failures_total", "reason", self.failures, "Calls that failed, by reason."),
            (
                "ledger_gateway_usage_total",
                "source",
                self.usage_sources,
                "Recorded calls by where their token counts came from.",
            ),
        ):
            lines += [f"# HELP {name} {text}", f"# TYPE {name} counter"]
            lines += (f'{name}{{{label}="{key}"}} {n}' for key, n in sorted(counts.items()))
        for name, kind, value, text in (
            ("ledger_gateway_in_flight", "gauge", self.in_flight, "Calls being proxied now."),
            ("ledger_gateway_stream_chunks_total", "counter", self.chunks, "SSE events relayed."),
            ("ledger_gateway_prompt_tokens_total", "counter", self.prompt_tokens, "Prompt tokens of recorded calls."),
            ("ledger_gateway_completion_tokens_total", "counter", self.completion_tokens, "Completion tokens."),
            ("ledger_gateway_response_bytes_total", "counter", self.response_bytes, "Response bytes, calls."),
            ("ledger_gateway_usage_injected_total", "counter", self.usage_injected, "Streams asked for usage."),
            ("ledger_gateway_passed_through_total", "counter", self.passed_through, "Requests that are no calls."),
            ("ledger_gateway_connections_refused_total", "counter", self.connections_refused, "503 at the cap."),
            ("ledger_gateway_connections_shed_total", "counter", self.connections_shed, "Closed for room."),
            ("ledger_gateway_requests_timed_out_total", "counter", self.requests_timed_out, "408: head or body."),
            (
                "ledger_gateway_request_bodies_too_slow_total",
                "counter",
                self.bodies_too_slow,
                "408: body paused or slow.",
            ),
            ("ledger_gateway_requests_refused_busy_total", "counter", self.requests_refused_busy, "503: bodies."),
            ("ledger_gateway_response_blobs_omitted_total", "counter", self.response_blobs_omitted, "Not stored."),
            (
                "ledger_gateway_record_failures_total",
                "counter",
                self.record_failures,
                "Calls whose final event is durable nowhere (strict: not completed to the client).",
            ),
            (
                "ledger_gateway_calls_refused_unrecorded_total",
                "counter",
                self.refused_unrecorded,
                "Strict: 503 ledger_unavailable, the call's start durable nowhere (upstream cancelled).",
            ),
            ("ledger_retention_bodies_erased_total", "counter", self.bodies_erased, "Bodies erased: --keep-bodies."),
            ("ledger_retention_passes_total", "counter", self.retention_passes, "Retention passes completed."),
            ("ledger_retention_failures_total", "counter", self.retention_failures, "Retention passes failed."),
            ("ledger_writer_queue_depth", "gauge", queue_depth, "Event batches waiting for the writer."),
            ("ledger_writer_committed_events_total", "counter", committed, "Events committed."),
            ("ledger_writer_spooled_events_total", "counter", spooled, "Events written to the spool."),
            ("ledger_spool_bytes", "gauge", spool_bytes, "Size of the outage spool."),
            ("ledger_spooling", "gauge", int(spooling), "1 while the database is unreachable."),
        ):
            lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", f"{name} {value}"]
        lines += self.duration.render("ledger_gateway_call_duration_seconds", "Call duration through the gateway.")
        lines += self.ttft.render("ledger_gateway_time_to_first_token_seconds", "Time to the first token.")
        return "\n".join(lines) + "\n"
