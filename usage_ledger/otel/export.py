"""Sending committed calls to an OTLP/HTTP receiver, from a durable checkpoint, at least once (docs/otel.md).

The checkpoint advances only after the receiver accepted the page; a crash in between re-sends the page
with the same trace/span ids. The SDK reads `OTEL_EXPORTER_OTLP_*` and `OTEL_SERVICE_NAME` itself."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import structlog
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from usage_ledger.ledger import (
    BlobNotFound,
    CallFinished,
    CallStarted,
    Database,
    LedgerError,
    StoredEvent,
    decode_event,
    read_blob,
    read_events,
)
from usage_ledger.ledger.schema import events
from usage_ledger.otel.calls import ExportedCall, call_from_row, response_model, trace_ids
from usage_ledger.otel.errors import ExportFailed, OtelMissing
from usage_ledger.projections import CallRow, decode_calls, fold_calls, read_checkpoint, write_checkpoint

__all__ = ("CHECKPOINT_NAME", "Exporters", "export_once", "follow_export", "open_exporters", "read_export_checkpoint")

CHECKPOINT_NAME = "otel.export"
_VERSION = 1
"""The export's checkpoint is a row of the projections' checkpoints, under a version of its own that never changes."""
_ENDS = ("call.finished", "call.failed", "call.imported")
_Event = tuple[int, str, str]
"""(position, type, payload): an event as the fold reads it."""
log = structlog.get_logger("usage_ledger.otel")


@dataclass
class Exporters:
    """The SDK objects, built once per command (never at import time)."""

    span_exporter: Any
    meter_provider: Any
    token_usage: Any
    ttft: Any
    resource: Any

    def shutdown(self) -> None:
        self.meter_provider.shutdown()
        self.span_exporter.shutdown()


def open_exporters(span_exporter: Any = None, metric_exporter: Any = None) -> Exporters:
    """OTLP/HTTP exporters configured by the standard environment variables (the SDK reads them)."""
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
    except ImportError as exc:
        raise OtelMissing(
            "OpenTelemetry export needs the `otel` extra: pip install 'usage-ledger[otel]'"
            f" (missing module: {exc.name})"
        ) from exc
    resource = Resource.create()  # OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
    reader = PeriodicExportingMetricReader(
        metric_exporter or OTLPMetricExporter(), export_interval_millis=24 * 3600 * 1000
    )  # flushed explicitly after each page, not on a timer
    provider = MeterProvider(resource=resource, metric_readers=[reader])
    meter = provider.get_meter("usage_ledger")
    token_usage = meter.create_histogram(
        "gen_ai.client.token.usage", unit="{token}", description="Tokens used per call, by gen_ai.token.type"
    )
    ttft = meter.create_histogram(
        "gen_ai.server.time_to_first_token", unit="s", description="Time to the first token of a stream"
    )
    return Exporters(span_exporter or OTLPSpanExporter(), provider, token_usage, ttft, resource)


def _ns(moment: datetime) -> int:
    return int(moment.timestamp()) * 1_000_000_000 + moment.microsecond * 1000


def _span(call: ExportedCall, resource: Any) -> Any:
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import SpanContext, SpanKind, TraceFlags
    from opentelemetry.trace.status import Status, StatusCode

    trace_id, span_id = trace_ids(call.call_id)
    context = SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    return ReadableSpan(
        name=call.name,
        context=context,
        parent=None,
        resource=resource,
        attributes=call.attributes,
        kind=SpanKind.CLIENT,
        status=Status(StatusCode.UNSET) if call.error is None else Status(StatusCode.ERROR, call.error),
        start_time=_ns(call.start),
        end_time=_ns(call.end),
        instrumentation_scope=InstrumentationScope("usage_ledger"),
    )


def _record_metrics(exporters: Exporters, call: ExportedCall) -> None:
    base = {"gen_ai.operation.name": call.operation, "gen_ai.request.model": call.model}
    if call.tokens is not None:
        exporters.token_usage.record(call.tokens[0], {**base, "gen_ai.token.type": "input"})
        exporters.token_usage.record(call.tokens[1], {**base, "gen_ai.token.type": "output"})
    if call.ttft_s is not None:
        exporters.ttft.record(call.ttft_s, base)


async def read_export_checkpoint(conn: AsyncConnection) -> int:
    return await read_checkpoint(conn, CHECKPOINT_NAME, _VERSION)


async def _call_events(conn: AsyncConnection, streams: Sequence[str], until: int) -> dict[str, list[_Event]]:
    """Each stream's events up to position `until`, in position order (a call's start may be in an earlier page)."""
    rows = await conn.execute(
        select(events.c.stream, events.c.position, events.c.type, events.c.payload)
        .where(events.c.stream.in_(streams), events.c.position <= until)
        .order_by(events.c.position)
    )
    out: dict[str, list[_Event]] = {}
    for stream, position, type_, payload in rows:
        out.setdefault(stream, []).append((position, type_, payload))
    return out


def _ended(history: Sequence[_Event], end: StoredEvent) -> tuple[CallRow, str | None, str | None] | None:
    """(row, path, response id) of the call `end` ends: its events up to `end` run through the read model's fold."""
    seen = [event for event in history if event[0] <= end.position]
    row = next(r for r in fold_calls(decode_calls(seen)[0], {}, 0) if r.last_position == end.position)
    if row.origin == "import":
        return row, None, None
    started = [decode_event(payload) for _, type_, payload in seen if type_ == "call.started"]
    if not started or not isinstance(started[-1], CallStarted):
        log.warning("otel_call_without_start", call_id=row.call_id)  # no endpoint to name the span by
        return None
    body = end.body()
    return row, started[-1].path, body.upstream_request_id if isinstance(body, CallFinished) else None


async def _answered_models(conn: AsyncConnection, rows: Sequence[CallRow]) -> dict[str, str | None]:
    """Per response blob of the calls, the model it names (one read per distinct blob)."""
    found: dict[str, str | None] = {}
    for row in rows:
        digest = row.response_blob
        if digest is not None and digest not in found:
            try:
                found[digest] = response_model(await read_blob(conn, digest))
            except BlobNotFound:  # redacted, or stored nowhere (too large, budget full)
                found[digest] = None
    return found


async def _calls(conn: AsyncConnection, page: Sequence[StoredEvent]) -> list[ExportedCall]:
    """The spans of the calls the page ends, in the order of their ends."""
    ends = [e for e in page if e.type in _ENDS]
    if not ends:
        return []
    histories = await _call_events(conn, sorted({e.stream for e in ends}), ends[-1].position)
    ended = [found for end in ends if (found := _ended(histories[end.stream], end)) is not None]
    models = await _answered_models(conn, [row for row, _, _ in ended])
    return [call_from_row(row, path, rid, models.get(row.response_blob or "")) for row, path, rid in ended]


async def export_once(database: Database, exporters: Exporters, *, page_size: int = 500) -> int:
    """Export every committed call after the checkpoint; returns the new checkpoint.

    Raises ExportFailed (checkpoint unchanged for that page) when the receiver refuses or is down."""
    from opentelemetry.sdk.trace.export import SpanExportResult

    async with database.engine.connect() as conn:
        position = await read_export_checkpoint(conn)
    while True:
        async with database.engine.connect() as conn:
            page = await read_events(conn, position, page_size)
            calls = await _calls(conn, page)
        if not page:
            return position
        if calls:
            # The SDK's exporter blocks (requests, retries): off the event loop.
            result = await asyncio.to_thread(
                exporters.span_exporter.export, [_span(c, exporters.resource) for c in calls]
            )
            if result is not SpanExportResult.SUCCESS:
                raise ExportFailed(f"the OTLP receiver did not accept {len(calls)} spans (after position {position})")
            for call in calls:
                _record_metrics(exporters, call)
            # Cumulative histograms: a flush that fails is carried by the next one, so it must not hold
            # the checkpoint back (a re-read page would count its tokens twice).
            if not await asyncio.to_thread(exporters.meter_provider.force_flush):
                log.warning("otel_metrics_not_flushed", checkpoint=page[-1].position)
        position = page[-1].position
        async with database.engine.begin() as conn:
            await write_checkpoint(conn, CHECKPOINT_NAME, _VERSION, position)
        log.info("otel_exported", spans=len(calls), checkpoint=position)


async def follow_export(database: Database, exporters: Exporters, *, poll_interval_s: float = 1.0) -> None:
    """Export forever; a receiver or database that is down is retried with a back-off, never fatal."""
    delay = poll_interval_s
    while True:
        try:
            await export_once(database, exporters)
            delay = poll_interval_s
        except LedgerError as exc:  # ExportFailed, DatabaseUnavailable, … : retried
            log.warning("otel_export_failed", error=str(exc), retry_in_s=delay)
            delay = min(delay * 2, 30.0)
        await asyncio.sleep(delay)
