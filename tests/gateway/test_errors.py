"""Upstream failures as the gateway meets them on real sockets: each an OpenAI-shaped error and a record."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from tests.gateway.conftest import make_settings
from tests.gateway.live import live_gateway
from tests.gateway.processes import free_port
from tests.gateway.scripted import Request, Respond, Server
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.events import CallFailed, CallStarted, Event
from usage_ledger.ledger.read import iter_events
from usage_ledger.ledger.spool import Spool
from usage_ledger.ledger.writer import EventWriter


@asynccontextmanager
async def gateway_with(
    database: Database, tmp_path: Path, upstream: str, **settings: object
) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        EventWriter(database, Spool(tmp_path / "spool")) as writer,
        live_gateway(make_settings(**settings), database=database, writer=writer, upstream=upstream) as gateway,
        httpx.AsyncClient(base_url=gateway.url, trust_env=False) as client,
    ):
        yield client


async def events(database: Database) -> list[Event]:
    return [e.body() async for e in iter_events(database)]


async def silent(request: Request, writer: asyncio.StreamWriter) -> bool:
    """Reads the request, never answers."""
    return await request.hang()


async def hang_up(request: Request, writer: asyncio.StreamWriter) -> bool:
    """Reads the request, closes the connection without a byte of response."""
    return False


async def one_chunk_then_gone(request: Request, writer: asyncio.StreamWriter) -> bool:
    """A stream's head and first event (chunked), then the connection closes mid-body."""
    event = b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
    writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        + b"%x\r\n%s\r\n" % (len(event), event)
    )
    await writer.drain()
    return False


@asynccontextmanager
async def upstream(respond: Respond | None) -> AsyncIterator[str]:
    """A scripted upstream's URL; None: a port nothing listens on."""
    if respond is None:
        yield f"http://127.0.0.1:{free_port()}"
        return
    async with Server(respond) as server:
        yield server.url


@pytest.mark.parametrize(
    ("respond", "status", "reason"),
    [(None, 502, "upstream_unreachable"), (silent, 504, "upstream_timeout"), (hang_up, 502, "upstream_reset")],
)
async def test_upstream_failures_map_to_openai_errors(
    database: Database, tmp_path: Path, respond: Respond | None, status: int, reason: str
) -> None:
    async with (
        upstream(respond) as url,
        gateway_with(database, tmp_path, url, upstream_read_timeout_s=0.3) as client,
    ):
        resp = await client.post("/v1/chat/completions", content=b'{"model":"m","messages":[]}')
    assert resp.status_code == status
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == reason
    started, failed = await events(database)
    assert isinstance(started, CallStarted) and isinstance(failed, CallFailed)
    assert failed.reason == reason and failed.call_id == resp.headers["x-ledger-call-id"]


async def test_body_over_limit_413(database: Database, tmp_path: Path) -> None:
    async with upstream(None) as url, gateway_with(database, tmp_path, url, max_body_bytes=100) as client:
        resp = await client.post("/v1/completions", content=b"x" * 101)
        ok = await client.post("/v1/completions", content=b"x" * 10)  # forwarded; nothing listens there: 502
    assert resp.status_code == 413 and resp.json()["error"]["code"] == "request_too_large"
    assert ok.status_code == 502


async def test_mid_body_failure_aborts_the_response(database: Database, tmp_path: Path) -> None:
    async with upstream(one_chunk_then_gone) as url, gateway_with(database, tmp_path, url) as client:
        # the client must not take the cut stream for a complete one: its connection is dropped
        with pytest.raises(httpx.RemoteProtocolError):
            await client.post(
                "/v1/chat/completions", content=b'{"stream":true,"stream_options":{"include_usage":true}}'
            )
    _, failed = await events(database)
    assert isinstance(failed, CallFailed)
    assert (failed.reason, failed.phase, failed.client_status, failed.chunk_count) == (
        "upstream_reset",
        "stream",
        200,
        1,
    )
