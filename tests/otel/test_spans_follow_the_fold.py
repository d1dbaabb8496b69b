"""A span says what the calls read model says: one ledger, folded by the projection follower and exported with
the SDK's in-memory span exporter, then each span field held against its row's column."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import msgspec
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from sqlalchemy import select

from tests.projections.helpers import at
from usage_ledger.ledger.append import append_events
from usage_ledger.ledger.blobs import PreparedBlob, blob_hash
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.events import (
    CallFailed,
    CallFinished,
    CallImported,
    CallStarted,
    Timings,
    Usage,
    new_event,
)
from usage_ledger.otel.calls import trace_ids
from usage_ledger.otel.export import export_once, open_exporters
from usage_ledger.projections.engine import catch_up_all, live_version
from usage_ledger.projections.tables import calls

ANSWER = b'{"id": "cmpl-1", "model": "served-m", "choices": []}'
ANSWER_BLOB = PreparedBlob(blob_hash(ANSWER), len(ANSWER), "raw", ANSWER)

OPERATIONS = {  # the operation each call's path names, as the gateway routes it
    "streamed": "chat",
    "plain": "text_completion",
    "failed": "chat",
    "refused": "chat",
    "cached": "chat",
    "choices": "chat",
    "spelled": "chat",  # /v1/chat/%63ompletions
    "imported": "chat",
}
RESPONSE_IDS = {"streamed": "req-1"}  # the upstream's id, the one value besides the path not in the row

Event = CallStarted | CallFinished | CallFailed | CallImported


def _start(call_id: str, t: float, *, path: str = "/v1/chat/completions", stream: bool = False) -> Event:
    return CallStarted(
        call_id=call_id,
        received_at=at(t),
        method="POST",
        path=path,
        model="m",
        stream=stream,
        run="r1" if call_id != "plain" else None,
        tags={"ticker": call_id.upper(), "desk": "d"} if call_id != "failed" else {},
    )


def _timings(t0: float, t1: float, *, tokens: bool = True) -> Timings:
    first, last = (at(t0 + 0.25), at(t1 - 0.125)) if tokens else (None, None)
    return Timings(received=at(t0), upstream_headers=at(t0 + 0.1), first_token=first, last_token=last, finished=at(t1))


def _usage(prompt: int, completion: int, cached: int | None = None) -> Usage:
    return Usage(
        prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion, cached_tokens=cached
    )


def _end(call_id: str, t0: float, t1: float, **fields: Any) -> Event:
    fields.setdefault("usage", _usage(40, 9))
    return CallFinished(call_id=call_id, status=200, usage_source="reported", timings=_timings(t0, t1), **fields)


def _ledger() -> list[Event]:
    return [
        _start("streamed", 0, stream=True),
        _end(
            "streamed",
            0,
            2,
            upstream_request_id="req-1",
            response_blob=ANSWER_BLOB.hash,
            finish_reasons=["stop"],
            finish_choices=[0],
        ),
        # not a stream, yet its first token has a moment: the fold's TTFT (the old exporter's had none)
        _start("plain", 3, path="/v1/completions"),
        _end("plain", 3, 4, usage=_usage(7, 1)),
        _start("failed", 5),
        CallFailed(
            call_id="failed",
            phase="connect",
            reason="upstream_unreachable",
            client_status=502,
            timings=Timings(received=at(5), finished=at(5.5)),
        ),
        _start("refused", 6),
        CallFinished(call_id="refused", status=503, timings=_timings(6, 6.5, tokens=False)),
        _start("cached", 7),
        _end("cached", 7, 8, usage=_usage(30, 5, cached=2**40)),  # an implausible cached count: the row says so
        _start("choices", 9),
        _end("choices", 9, 10, finish_reasons=["length", "stop"], finish_choices=[1, 0]),  # choice 0's is `stop`
        _start("spelled", 11, path="/v1/chat/%63ompletions"),
        _end("spelled", 11, 12, usage=_usage(12, 3, cached=4)),
        CallImported(
            call_id="imported",
            source="runs.jsonl",
            line=3,
            started_at=at(13),
            finished_at=at(15),
            input_tokens=20,
            output_tokens=2,
            run="r2",
            tags={"ticker": "IMP"},
            model="m",
            ttft_s=0.5,
            status="error",
            finish_reason="length",
        ),
    ]


class _Metrics(MetricExporter):
    """The SDK's metrics as exported, kept in memory (the SDK has an in-memory reader, not an exporter)."""

    def __init__(self) -> None:
        super().__init__()
        self.exported: list[MetricsData] = []

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        self.exported.append(metrics_data)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        pass

    def points(self, name: str) -> list[Any]:
        """The last export's points of histogram `name` (cumulative: the last holds every call)."""
        return [
            point
            for resource in self.exported[-1].resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
            if metric.name == name
            for point in metric.data.data_points
        ]


def _ns(moment: datetime) -> int:
    return int(moment.timestamp()) * 1_000_000_000 + moment.microsecond * 1000


async def _rows(database: Database) -> dict[str, Mapping[str, Any]]:
    """The live rows of the calls read model, as the follower wrote them."""
    await catch_up_all(database)
    async with database.engine.connect() as conn:
        version, _ = await live_version(conn, "calls")
        found = await conn.execute(select(calls).where(calls.c.version == version))
        return {row.call_id: dict(row._mapping) for row in found}


def _assert_span_is_row(span: ReadableSpan, row: Mapping[str, Any]) -> None:
    call_id = row["call_id"]
    operation = OPERATIONS[call_id]
    attributes = dict(span.attributes or {})
    assert span.name == f"{operation} {row['model']}"
    assert (span.start_time, span.end_time) == (_ns(row["started_at"]), _ns(row["ended_at"]))
    assert span.kind is SpanKind.CLIENT
    assert (span.context.trace_id, span.context.span_id) == trace_ids(call_id)
    if row["status"] in ("error", "failed"):
        expected = row["failure_reason"] or (f"HTTP {row['http_status']}" if row["http_status"] else "status error")
        assert (span.status.status_code, span.status.description) == (StatusCode.ERROR, expected)
    else:
        assert row["status"] == "ok" and span.status.status_code is StatusCode.UNSET
    # each attribute against its column; what is left at the end is an attribute no column accounts for
    assert attributes.pop("gen_ai.operation.name") == operation
    assert attributes.pop("gen_ai.request.model") == row["model"]
    assert attributes.pop("gen_ai.response.model", None) == ("served-m" if row["response_blob"] else None)
    assert attributes.pop("usage_ledger.usage_source") == row["usage_source"]
    has_usage = row["usage_source"] != "absent"
    assert attributes.pop("gen_ai.usage.input_tokens", None) == (row["input_tokens"] if has_usage else None)
    assert attributes.pop("gen_ai.usage.output_tokens", None) == (row["output_tokens"] if has_usage else None)
    reasons = attributes.pop("gen_ai.response.finish_reasons", ())
    assert list(reasons) == ([row["finish_reason"]] if row["finish_reason"] else [])  # type: ignore[arg-type]
    assert attributes.pop("http.response.status_code", None) == row["http_status"]
    assert attributes.pop("error.type", None) == row["failure_reason"]
    assert attributes.pop("usage_ledger.import_source", None) == row["source"]
    assert attributes.pop("gen_ai.response.id", None) == RESPONSE_IDS.get(call_id)
    assert attributes.pop("usage_ledger.call_id") == call_id
    assert attributes.pop("usage_ledger.run", None) == row["run"]
    tags = {
        k.removeprefix("usage_ledger.tag."): attributes.pop(k)
        for k in list(attributes)
        if k.startswith("usage_ledger.tag.")
    }
    assert tags == msgspec.json.decode(row["tags"])
    assert attributes == {}


def _assert_metrics_are_rows(metrics: _Metrics, rows: Sequence[Mapping[str, Any]]) -> None:
    tokens: dict[tuple[str, str], float] = {}
    for point in metrics.points("gen_ai.client.token.usage"):
        key = (point.attributes["gen_ai.operation.name"], point.attributes["gen_ai.token.type"])
        tokens[key] = tokens.get(key, 0) + point.sum
    expected: dict[tuple[str, str], float] = {}
    for row in rows:
        if row["usage_source"] != "absent":
            for kind in ("input", "output"):
                key = (OPERATIONS[row["call_id"]], kind)
                expected[key] = expected.get(key, 0) + row[f"{kind}_tokens"]
    assert tokens == expected
    ttft = metrics.points("gen_ai.server.time_to_first_token")
    with_ttft = [row["ttft_s"] for row in rows if row["ttft_s"] is not None]
    assert sum(p.count for p in ttft) == len(with_ttft) == 6  # every call with a first token, streamed or not
    assert sum(p.sum for p in ttft) == sum(with_ttft)


async def test_every_span_field_is_its_rows_column(database: Database) -> None:
    ledger = _ledger()
    await append_events(database, [new_event(e, stream=f"call-{e.call_id}") for e in ledger], [ANSWER_BLOB])
    spans, metrics = InMemorySpanExporter(), _Metrics()
    exporters = open_exporters(spans, metrics)
    try:
        await export_once(database, exporters, page_size=5)  # a call's start and end in different pages too
    finally:
        exporters.shutdown()
    rows = await _rows(database)
    exported = {str((s.attributes or {})["usage_ledger.call_id"]): s for s in spans.get_finished_spans()}
    assert sorted(exported) == sorted(rows) == sorted(OPERATIONS)
    assert rows["cached"]["usage_source"] == "implausible" and rows["choices"]["finish_reason"] == "stop"
    for call_id, row in rows.items():
        _assert_span_is_row(exported[call_id], row)
    _assert_metrics_are_rows(metrics, list(rows.values()))
