"""The HTTP stack's smaller edges (issue #52, point 5): trailers stay out of headers at both ends, an Upgrade or
CONNECT request is refused before anything is forwarded, and an upstream answer no request can have (a status
outside 100-599, a 101 to a request that asked no upgrade) is a 502 that closes the connection.

Every message is written byte for byte on loopback sockets, through the real gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import pytest

from tests.gateway.conftest import make_settings
from tests.gateway.live import echo_gateway, live_gateway
from tests.gateway.scripted import Request as ScriptedRequest
from tests.gateway.scripted import Server
from tests.gateway.wire import read_response
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.events import CallFailed, CallFinished, CallStarted, Event
from usage_ledger.ledger.read import iter_events
from usage_ledger.ledger.spool import Spool
from usage_ledger.ledger.writer import EventWriter

CHAT = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'


async def exchange(port: int, data: bytes, *, call_ids: bool = False) -> tuple[int, dict[str, str], bytes, bool]:
    """Send `data`, read one response; (status, headers, body, whether the gateway closed the connection after it).

    `call_ids`: also `x-ledger-call-ids`, every `x-ledger-call-id` value of the head joined by ", " (the
    headers dict keeps the last one only)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        ids: list[str] = []
        if call_ids:
            reader = _Tee(reader, ids)
        status, headers, body = await asyncio.wait_for(read_response(reader), 10)
        if call_ids:
            headers["x-ledger-call-ids"] = ", ".join(ids)
        try:
            closed = await asyncio.wait_for(reader.read(1), 1) == b""
        except TimeoutError:
            closed = False
        return status, headers, body, closed
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


class _Tee(asyncio.StreamReader):
    """A reader that notes each `x-ledger-call-id` line it hands over."""

    def __init__(self, inner: asyncio.StreamReader, ids: list[str]) -> None:
        super().__init__()
        self.inner = inner
        self.ids = ids

    async def readuntil(self, separator: bytes = b"\n") -> bytes:
        line = await self.inner.readuntil(separator)
        name, _, value = line.decode("latin-1").partition(":")
        if name.strip().lower() == "x-ledger-call-id":
            self.ids.append(value.strip())
        return line

    async def readexactly(self, n: int) -> bytes:
        return await self.inner.readexactly(n)

    async def read(self, n: int = -1) -> bytes:
        return await self.inner.read(n)


async def events(database: Database) -> list[Event]:
    return [stored.body() async for stored in iter_events(database)]


async def test_request_trailers_never_become_headers(database: Database, tmp_path: Path) -> None:
    """A trailer `X-Ledger-Run` used to set the call's run, and other trailers were forwarded as headers."""
    body = b"%x\r\n%b\r\n0\r\nx-ledger-run: evil\r\nx-note: trailer\r\n\r\n" % (len(CHAT), CHAT)
    head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\nx-ledger-run: mine\r\ntransfer-encoding: chunked\r\n\r\n"
    async with echo_gateway(make_settings(), database, tmp_path / "spool") as gw:
        status, headers, response, _ = await exchange(gw.port, head + body)
    assert status == 200 and gw.upstream.handled == [CHAT]
    received = json.loads(response)["headers"]
    assert "x-note" not in received and not any(name.startswith("x-ledger-") for name in received)
    started = next(e for e in await events(database) if isinstance(e, CallStarted))
    assert started.call_id == headers["x-ledger-call-id"] and started.run == "mine"
    assert "x-note" not in dict(started.request_headers)


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\nupgrade: h2c\r\nconnection: upgrade\r\n"
        b"content-length: %d\r\n\r\n%b" % (len(CHAT), CHAT),
        b"GET /v1/models HTTP/1.1\r\nhost: t\r\nupgrade: websocket\r\nconnection: Upgrade\r\n\r\n",
        b"CONNECT 127.0.0.1:1 HTTP/1.1\r\nhost: 127.0.0.1:1\r\n\r\n",
    ],
    ids=["upgrade_post", "websocket_get", "connect"],
)
async def test_an_upgrade_is_refused_before_forwarding(
    database: Database, tmp_path: Path, request_bytes: bytes
) -> None:
    """Such a request used to be forwarded (its body dropped: the parser stops at the head) and recorded, then 400."""
    async with echo_gateway(make_settings(), database, tmp_path / "spool") as gw:
        status, headers, body, closed = await exchange(gw.port, request_bytes)
    assert status == 400 and closed and "x-ledger-call-id" not in headers
    assert "not supported" in json.loads(body)["error"]["message"]
    assert gw.upstream.handled == [] and await events(database) == []


async def _through(raw: bytes, database: Database, tmp_path: Path) -> tuple[int, dict[str, str], bytes, bool]:
    """A chat completion through the gateway to an upstream that answers `raw` (then closes)."""

    async def respond(request: ScriptedRequest, writer: asyncio.StreamWriter) -> bool:
        writer.write(raw)
        await writer.drain()
        await asyncio.sleep(0.2)
        return False

    async with (
        Server(respond) as server,
        EventWriter(database, Spool(tmp_path / "spool")) as writer,
        live_gateway(make_settings(), database=database, writer=writer, upstream=server.url) as gw,
    ):
        port = int(gw.url.rsplit(":", 1)[1])
        head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-length: %d\r\n\r\n" % len(CHAT)
        status, headers, body, closed = await exchange(port, head + CHAT, call_ids=True)
        return status, headers, body, closed


async def test_upstream_trailers_never_become_response_headers(database: Database, tmp_path: Path) -> None:
    """Trailers in the same read as the head used to join the response headers, ahead of the gateway's call id."""
    answer = b'{"choices":[]}'
    raw = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-ledger-call-id: forged-by-header\r\n"
        b"transfer-encoding: chunked\r\n\r\n%x\r\n%b\r\n0\r\nx-ledger-call-id: forged\r\nx-evil: 1\r\n\r\n"
    ) % (len(answer), answer)
    status, headers, body, _ = await _through(raw, database, tmp_path)
    assert (status, body) == (200, answer) and "x-evil" not in headers
    assert headers["x-ledger-call-ids"] == headers["x-ledger-call-id"]  # sent once: the upstream's ones are gone
    recorded = [e for e in await events(database) if isinstance(e, CallFinished)]
    assert [e.call_id for e in recorded] == [headers["x-ledger-call-id"]]  # the gateway's


FORGED = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 8\r\n\r\n{forged}"


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/1.1 099 Early\r\ncontent-length: 0\r\n\r\n" + FORGED,
        b"HTTP/1.1 101 Switching Protocols\r\nupgrade: h2c\r\nconnection: upgrade\r\n\r\n" + FORGED,
        b"HTTP/1.1 600 Beyond\r\ncontent-length: 8\r\n\r\n{forged}",
    ],
    ids=["099", "101", "600"],
)
async def test_an_impossible_upstream_status_is_a_502_that_closes(
    database: Database, tmp_path: Path, raw: bytes
) -> None:
    """Such an answer used to be relayed (099, 600) or relayed with the connection kept (101)."""
    status, headers, body, closed = await _through(raw, database, tmp_path)
    error = json.loads(body)["error"]
    assert (status, error["code"], closed) == (502, "upstream_reset", True) and b"forged" not in body
    assert "status" in error["message"]
    failed = [e for e in await events(database) if isinstance(e, CallFailed)]
    assert [(e.call_id, e.reason) for e in failed] == [(headers["x-ledger-call-id"], "upstream_reset")]
