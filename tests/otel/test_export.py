"""`otel.export` against a local OTLP/HTTP receiver: spans and metrics from committed events only."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator

import pytest

from tests.otel.receiver import Receiver, attrs, running_receiver
from tests.projections.helpers import append, at, failed, finished, started
from usage_ledger.cli import main
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.events import CallStarted, new_event
from usage_ledger.otel.calls import trace_ids
from usage_ledger.otel.errors import ExportFailed, OtelMissing
from usage_ledger.otel.export import export_once, open_exporters, read_export_checkpoint


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    with running_receiver() as r:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", r.url)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=secret")
        monkeypatch.setenv("OTEL_SERVICE_NAME", "ledger-test")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "2")
        yield r


async def _checkpoint(database: Database) -> int:
    async with database.engine.connect() as conn:
        return await read_export_checkpoint(conn)


def _ns(seconds: float) -> int:
    moment = at(seconds)
    return int(moment.timestamp()) * 1_000_000_000 + moment.microsecond * 1000


async def test_spans_and_metrics_match_the_events(database: Database, receiver: Receiver) -> None:
    stream_start = new_event(
        CallStarted(
            call_id="s1",
            received_at=at(10),
            method="POST",
            path="/v1/completions",
            model="m2",
            stream=True,
            run="r1",
            tags={"ticker": "T"},
        ),
        stream="call-s1",
        occurred_at=at(10),
    )
    await append(database, started("c1", 0, run="r1", ticker="A"), finished("c1", 0, 2, prompt=7, completion=3))
    await append(database, started("c2", 3), failed("c2", 3, 4), stream_start, finished("s1", 10, 12, ttft=0.25))
    await append(database, started("open", 20))  # never finished: not a call the ledger holds yet
    exporters = open_exporters()
    try:
        position = await export_once(database, exporters)
    finally:
        exporters.shutdown()
    assert position == await _checkpoint(database) > 0

    spans = {attrs(s)["usage_ledger.call_id"]: s for s in receiver.spans()}
    assert sorted(spans) == ["c1", "c2", "s1"]
    c1 = spans["c1"]
    assert (c1.start_time_unix_nano, c1.end_time_unix_nano) == (_ns(0), _ns(2))
    assert c1.name == "chat m"
    assert c1.kind == 3  # CLIENT
    assert attrs(c1) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "m",
        "gen_ai.usage.input_tokens": 7,
        "gen_ai.usage.output_tokens": 3,
        "usage_ledger.usage_source": "reported",
        "usage_ledger.call_id": "c1",
        "usage_ledger.run": "r1",
        "usage_ledger.tag.ticker": "A",
        "http.response.status_code": 200,
    }
    trace_id, span_id = trace_ids("c1")
    assert c1.trace_id == trace_id.to_bytes(16, "big") and c1.span_id == span_id.to_bytes(8, "big")
    assert spans["c2"].status.code == 2  # ERROR
    assert attrs(spans["c2"])["error.type"] == "upstream_unreachable"
    assert c1.status.code == 0
    assert attrs(spans["s1"])["gen_ai.operation.name"] == "text_completion"
    resource = {kv.key: kv.value.string_value for kv in receiver.traces[0].resource_spans[0].resource.attributes}
    assert resource["service.name"] == "ledger-test"
    assert all(h.get("x-api-key") == "secret" for h in receiver.headers)

    tokens = receiver.histogram_points("gen_ai.client.token.usage")
    by_type: dict[tuple[str, str], float] = {}  # c2 failed before any usage: no points
    for p in tokens:
        a = attrs(p)
        by_type[(a["gen_ai.token.type"], a["gen_ai.request.model"])] = p.sum
    assert by_type == {("input", "m"): 7, ("output", "m"): 3, ("input", "m2"): 1000, ("output", "m2"): 101}
    ttft = {attrs(p)["gen_ai.request.model"]: p for p in receiver.histogram_points("gen_ai.server.time_to_first_token")}
    assert {model: (p.count, p.sum) for model, p in ttft.items()} == {"m": (1, 0.5), "m2": (1, 0.25)}  # streamed or not

    # Again from the checkpoint: nothing new is sent.
    sent = len(receiver.spans())
    exporters = open_exporters()
    try:
        assert await export_once(database, exporters) == position
    finally:
        exporters.shutdown()
    assert len(receiver.spans()) == sent


async def test_a_refusing_receiver_does_not_advance_the_checkpoint(database: Database, receiver: Receiver) -> None:
    await append(database, started("c1", 0), finished("c1", 0, 1))
    receiver.refuse = True
    exporters = open_exporters()
    try:
        with pytest.raises(ExportFailed):
            await export_once(database, exporters)
        assert await _checkpoint(database) == 0
        receiver.refuse = False
        assert await export_once(database, exporters) > 0
    finally:
        exporters.shutdown()
    assert [attrs(s)["usage_ledger.call_id"] for s in receiver.spans()] == ["c1"]


async def test_a_receiver_that_is_down_does_not_advance_the_checkpoint(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on discard
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
    await append(database, started("c1", 0), finished("c1", 0, 1))
    exporters = open_exporters()
    try:
        with pytest.raises(ExportFailed):
            await export_once(database, exporters)
    finally:
        exporters.shutdown()
    assert await _checkpoint(database) == 0


def test_serve_does_not_export_unless_asked() -> None:
    from usage_ledger.cli import _serve_background
    from usage_ledger.followers import otel_follower_process, projections_follower_process
    from usage_ledger.settings import load_settings

    assert _serve_background(load_settings({})) == (projections_follower_process,)
    asked = load_settings({"LEDGER_OTEL_EXPORT": "1"})
    assert _serve_background(asked) == (projections_follower_process, otel_follower_process)


def test_without_the_extra_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    with pytest.raises(OtelMissing, match=r"usage-ledger\[otel\]"):
        open_exporters()


async def test_the_command_exports_and_reports_its_checkpoint(
    backend_url: str, database: Database, receiver: Receiver, capsys: pytest.CaptureFixture[str]
) -> None:
    await append(database, started("c1", 0), finished("c1", 0, 1))
    assert await asyncio.to_thread(main, ["otel", "export", "--db", backend_url]) == 0
    assert "exported up to position 2" in capsys.readouterr().out
    assert len(receiver.spans()) == 1
