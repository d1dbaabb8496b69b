from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from tests.gateway.conftest import make_settings
from usage_ledger.gateway.app import create_app
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.events import CallFailed, CallStarted, Event
from usage_ledger.ledger.read import iter_events
from usage_ledger.ledger.spool import Spool
from usage_ledger.ledger.writer import EventWriter


@asynccontextmanager
async def gateway_with(
    database: Database, tmp_path: Path, handler: Callable[[httpx.Request], httpx.Response], **settings: object
) -> AsyncIterator[httpx.AsyncClient]:
    config = make_settings(**settings)
    upstream = httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url=config.upstream)
    async with EventWriter(database, Spool(tmp_path / "spool")) as writer:
        app = create_app(config, database=database, writer=writer, http_client=upstream)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw.test") as client:
            yield client


async def events(database: Database) -> list[Event]:
    return [e.body() async for e in iter_events(database)]


def raising(exc: Exception) -> Callable[[httpx.Request], httpx.Response]:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc

    return handler


@pytest.mark.parametrize(
    ("exc", "status", "reason"),
    [
        (httpx.ConnectError("refused"), 502, "upstream_unreachable"),
        (httpx.ReadTimeout("slow"), 504, "upstream_timeout"),
        (httpx.RemoteProtocolError("reset"), 502, "upstream_reset"),
    ],
)
async def test_upstream_failures_map_to_openai_errors(
    database: Database, tmp_path: Path, exc: Exception, status: int, reason: str
) -> None:
    async with gateway_with(database, tmp_path, raising(exc)) as client:
        resp = await client.post("/v1/chat/completions", content=b'{"model":"m","messages":[]}')
    assert resp.status_code == status
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == reason
    started, failed = await events(database)
    assert isinstance(started, CallStarted) and isinstance(failed, CallFailed)
    assert failed.reason == reason and failed.call_id == resp.headers["x-ledger-call-id"]


async def test_body_over_limit_413(database: Database, tmp_path: Path) -> None:
    async with gateway_with(database, tmp_path, raising(httpx.ConnectError("refused")), max_body_bytes=100) as client:
        resp = await client.post("/v1/completions", content=b"x" * 101)
        ok = await client.post("/v1/completions", content=b"x" * 10)  # then the handler raises: 502
    assert resp.status_code == 413 and resp.json()["error"]["code"] == "request_too_large"
    assert ok.status_code == 502


async def test_mid_body_failure_aborts_the_response(database: Database, tmp_path: Path) -> None:
    class Broken(httpx.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            yield b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
            raise httpx.RemoteProtocolError("peer closed connection")

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=Broken())

    async with gateway_with(database, tmp_path, handler) as client:
        with pytest.raises(Exception, match="upstream connection failed"):
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
