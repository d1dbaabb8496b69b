"""The gateway's Prometheus metrics: plain counters rendered as text exposition (no client library)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

__all__ = ("Metrics",)


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
    usage_injected: int = 0

    def render(self, *, queue_depth: int, spool_bytes: int, spooling: bool, committed: int, spooled: int) -> str:
        lines = [
            "# HELP ledger_gateway_calls_total Calls proxied, by upstream status.",
            "# TYPE ledger_gateway_calls_total counter",
            *(f'ledger_gateway_calls_total{{status="{s}"}} {n}' for s, n in sorted(self.calls.items())),
            "# HELP ledger_gateway_call_failures_total Calls that failed, by reason.",
            "# TYPE ledger_gateway_call_failures_total counter",
            *(f'ledger_gateway_call_failures_total{{reason="{r}"}} {n}' for r, n in sorted(self.failures.items())),
        ]
        for name, kind, value, text in (
            ("ledger_gateway_in_flight", "gauge", self.in_flight, "Calls being proxied now."),
            ("ledger_gateway_stream_chunks_total", "counter", self.chunks, "SSE events relayed."),
            ("ledger_gateway_prompt_tokens_total", "counter", self.prompt_tokens, "Prompt tokens of recorded calls."),
            ("ledger_gateway_completion_tokens_total", "counter", self.completion_tokens, "Completion tokens."),
            ("ledger_gateway_response_bytes_total", "counter", self.response_bytes, "Response bytes relayed."),
            ("ledger_gateway_usage_injected_total", "counter", self.usage_injected, "Streams asked for usage."),
            ("ledger_gateway_record_failures_total", "counter", self.record_failures, "Events lost."),
            ("ledger_writer_queue_depth", "gauge", queue_depth, "Event batches waiting for the writer."),
            ("ledger_writer_committed_events_total", "counter", committed, "Events committed."),
            ("ledger_writer_spooled_events_total", "counter", spooled, "Events written to the spool."),
            ("ledger_spool_bytes", "gauge", spool_bytes, "Size of the outage spool."),
            ("ledger_spooling", "gauge", int(spooling), "1 while the database is unreachable."),
        ):
            lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", f"{name} {value}"]
        return "\n".join(lines) + "\n"
