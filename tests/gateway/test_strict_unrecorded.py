"""Strict durability never sends a response for a call whose start is durable nowhere (red team, round three:
with the database and the spool on a full disk, 861 of 868 calls got their 200 and every chunk unrecorded).

The start is durable before the request goes upstream (issue #52: no call reaches the server without its
record; the 30-minute soak found 12 forwarded and withheld when the start used to commit beside the upstream's
work); when it cannot be made durable, nothing is forwarded and the client gets 503 `ledger_unavailable` with
Retry-After; the metrics count it and health says why. `--durability async` keeps proxying."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway.conftest import Rig, make_settings
from tests.gateway.live import live_gateway
from tests.gateway.scripted import Request, Respond
from tests.gateway.test_errors import hang_up, silent, upstream
from usage_ledger.gateway.settings import GatewaySettings
from usage_ledger.ledger.db import Database, open_database
from usage_ledger.ledger.errors import SpoolWriteFailed
from usage_ledger.ledger.events import CallStarted
from usage_ledger.ledger.read import iter_events
from usage_ledger.ledger.spool import Spool
from usage_ledger.ledger.writer import EventWriter

UNREACHABLE = "postgresql://postgres@127.0.0.1:1/nowhere"
CHAT = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 40, "stream": true}'


def _nowhere_to_record(rig: Rig | EventWriter, monkeypatch: pytest.MonkeyPatch) -> None:
    """The database gone and the spool's disk full."""
    writer = rig.writer if isinstance(rig, Rig) else rig
    monkeypatch.setattr(writer, "database", open_database(UNREACHABLE, null_pool=True))

    def full(_record: Any) -> None:
        raise SpoolWriteFailed("spool: write failed (No space left on device); the record was not kept")

    assert writer.spool is not None
    monkeypatch.setattr(writer.spool, "write", full)


async def test_an_unrecordable_start_is_a_503_before_any_byte(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    rig.upstream.delay_s = 0.01  # a stream long enough to be cancelled
    _nowhere_to_record(rig, monkeypatch)
    resp = await rig.client.post("/v1/chat/completions", content=CHAT, headers={"content-type": "application/json"})
    assert resp.status_code == 503, resp.text
    assert resp.json()["error"]["code"] == "ledger_unavailable" and resp.headers["retry-after"] == "5"
    assert "x-ledger-call-id" not in resp.headers and b"data:" not in resp.content
    assert rig.upstream.requests == []  # never forwarded: the upstream did no work the ledger does not hold
    metrics = (await rig.client.get("/_ledger/metrics")).text
    assert "ledger_gateway_calls_refused_unrecorded_total 1" in metrics
    health = await rig.client.get("/_ledger/health")
    assert health.status_code == 503 and "events cannot be recorded" in " ".join(health.json()["reasons"])
    monkeypatch.undo()  # room again: calls are recorded and answered
    ok = await rig.client.post("/v1/chat/completions", content=CHAT, headers={"content-type": "application/json"})
    assert ok.status_code == 200 and ok.headers["x-ledger-call-id"]


@pytest.mark.parametrize("settings", [make_settings(durability="async")])
async def test_async_durability_keeps_proxying(
    rig: Rig, settings: GatewaySettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    _nowhere_to_record(rig, monkeypatch)
    resp = await rig.client.post("/v1/chat/completions", content=CHAT, headers={"content-type": "application/json"})
    assert resp.status_code == 200 and b"data: [DONE]" in resp.content


@pytest.mark.parametrize("respond", [None, silent, hang_up], ids=["unreachable", "timeout", "reset"])
async def test_an_unrecordable_upstream_failure_is_a_503_without_a_call_id(
    database: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, respond: Respond | None
) -> None:
    """The gateway's own error answer (502/504) is a whole response too: with nowhere to record the call it
    must not name a call id the ledger will never hold (found by tests/soak: 502s during a full disk)."""
    async with (
        upstream(respond) as url,
        EventWriter(database, Spool(tmp_path / "spool")) as writer,
        live_gateway(make_settings(upstream_read_timeout_s=0.3), database=database, writer=writer, upstream=url) as gw,
        httpx.AsyncClient(base_url=gw.url, trust_env=False) as client,
    ):
        _nowhere_to_record(writer, monkeypatch)
        resp = await client.post("/v1/chat/completions", content=CHAT, headers={"content-type": "application/json"})
        assert resp.status_code == 503, resp.text
        assert resp.json()["error"]["code"] == "ledger_unavailable" and resp.headers["retry-after"] == "5"
        assert "x-ledger-call-id" not in resp.headers
        assert "ledger_gateway_calls_refused_unrecorded_total 1" in (await client.get("/_ledger/metrics")).text
        monkeypatch.undo()  # recordable again: the failure is answered as itself, with its call id
        again = await client.post("/v1/chat/completions", content=CHAT, headers={"content-type": "application/json"})
    assert again.status_code in (502, 504) and again.headers["x-ledger-call-id"]
    [started] = [e async for e in iter_events(database) if isinstance(e.body(), CallStarted)]
    assert started.body().call_id == again.headers["x-ledger-call-id"]  # type: ignore[union-attr]


def _sse_with_length(body: bytes, before: Callable[[], Awaitable[None]]) -> Respond:
    async def respond(request: Request, writer: asyncio.StreamWriter) -> bool:
        await before()
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n" % len(body))
        writer.write(body)
        await writer.drain()
        return False

    return respond


@pytest.mark.parametrize(
    "body",
    [b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n', b"\x00\xffnot an event stream", b"data: [DONE]\n\n"],
    ids=["no-end-marker", "garbage", "end-marker"],
)
async def test_an_sse_body_with_a_length_is_never_whole_when_unrecorded(
    database: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: bytes
) -> None:
    """An event stream framed by Content-Length, with no `data: [DONE]` to hold back: its last byte waits for the
    record, so a call whose end is recorded nowhere never reaches its client whole (found by tests/soak: an
    upstream's garbage typed as an event stream arrived whole, unrecorded, in a database outage on a full disk)."""
    writers: list[EventWriter] = []

    async def started_then_nowhere_to_record() -> None:
        for _ in range(200):  # the call's start is durable; its end will be durable nowhere
            if [e async for e in iter_events(database)]:
                break
            await asyncio.sleep(0.02)
        _nowhere_to_record(writers[0], monkeypatch)

    async with (
        upstream(_sse_with_length(body, started_then_nowhere_to_record)) as url,
        EventWriter(database, Spool(tmp_path / "spool")) as writer,
        live_gateway(make_settings(), database=database, writer=writer, upstream=url) as gw,
        httpx.AsyncClient(base_url=gw.url, trust_env=False) as client,
    ):
        writers.append(writer)
        post = {"content": CHAT.replace(b"true", b"false"), "headers": {"content-type": "application/json"}}
        with pytest.raises(httpx.RemoteProtocolError):  # short of its Content-Length: not taken for whole
            await client.post("/v1/chat/completions", **post)  # type: ignore[arg-type]
        monkeypatch.undo()
    [started] = [e.body() async for e in iter_events(database)]
    assert isinstance(started, CallStarted)  # and nothing else: the end was recorded nowhere
