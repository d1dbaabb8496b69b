"""The gateway's HTTP/1.1 server on loopback sockets: keep-alive, request bodies, pipelining,
malformed requests, backpressure to the upstream, and ASGI apps through the adapter."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.gateway.conftest import make_settings
from tests.gateway.live import live_gateway, serving
from tests.gateway.upstream import FakeUpstream
from tests.gateway.wire import read_response
from usage_ledger.gateway.asgi import run_asgi
from usage_ledger.gateway.exchange import Exchange, Request
from usage_ledger.gateway.limits import MAX_HEAD_BYTES
from usage_ledger.gateway.rawclient import RawUpstream
from usage_ledger.gateway.serve import bind_socket
from usage_ledger.gateway.server import HttpServer
from usage_ledger.gateway.settings import GatewaySettings
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.spool import Spool
from usage_ledger.ledger.writer import EventWriter

Handler = Callable[[Request, Exchange], Awaitable[None]]


@asynccontextmanager
async def running(handler: Handler, *, max_body_bytes: int = 1 << 20) -> AsyncIterator[tuple[HttpServer, int]]:
    sock = bind_socket("127.0.0.1", 0)
    server = HttpServer(handler, max_body_bytes=max_body_bytes)
    await server.start(sock)
    try:
        yield server, sock.getsockname()[1]
    finally:
        await server.shutdown(grace_s=5)


async def close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()


async def echo(request: Request, exchange: Exchange) -> None:
    body = json.dumps(
        {
            "method": request.method,
            "path": request.path,
            "query": request.query.decode(),
            "body": request.body.decode("latin-1"),
            "version": request.http_version,
        }
    ).encode()
    exchange.start_now(200, [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())])
    exchange.end_now(body)


def post(path: str, body: bytes, *extra: bytes) -> bytes:
    head = b"POST %s HTTP/1.1\r\nhost: t\r\ncontent-length: %d\r\n" % (path.encode(), len(body))
    return head + b"".join(h + b"\r\n" for h in extra) + b"\r\n" + body


async def test_keep_alive_several_requests_on_one_connection() -> None:
    async with running(echo) as (server, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for i in range(3):
            writer.write(post(f"/v1/x?i={i}", b"body %d" % i))
            status, headers, body = await read_response(reader)
            assert status == 200 and "connection" not in headers
            assert json.loads(body) == {
                "method": "POST",
                "path": "/v1/x",
                "query": f"i={i}",
                "body": f"body {i}",
                "version": "1.1",
            }
        assert len(server.connections) == 1
        await close(writer)


async def test_chunked_request_body() -> None:
    async with running(echo) as (_, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /chunked HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)  # the body arrives in pieces
        writer.write(b"1\r\n \r\n5\r\nworld\r\n0\r\n\r\n")
        status, _, body = await read_response(reader)
        assert status == 200 and json.loads(body)["body"] == "hello world"
        await close(writer)


async def test_pipelined_pair_answered_in_order_one_at_a_time() -> None:
    order: list[str] = []

    async def slow_first(request: Request, exchange: Exchange) -> None:
        order.append("start " + request.path)
        if request.path == "/first":
            await asyncio.sleep(0.1)
        order.append("end " + request.path)
        await echo(request, exchange)

    async with running(slow_first) as (_, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post("/first", b"1") + post("/second", b"22"))
        first = await read_response(reader)
        second = await read_response(reader)
        assert json.loads(first[2])["path"] == "/first" and json.loads(second[2])["body"] == "22"
        assert order == ["start /first", "end /first", "start /second", "end /second"]
        await close(writer)


async def test_expect_100_continue() -> None:
    async with running(echo) as (_, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /e HTTP/1.1\r\nhost: t\r\ncontent-length: 4\r\nexpect: 100-continue\r\n\r\n")
        interim = await read_response(reader)
        assert interim[0] == 100
        writer.write(b"data")
        status, _, body = await read_response(reader)
        assert status == 200 and json.loads(body)["body"] == "data"
        await close(writer)


async def test_malformed_request_gets_400_and_the_connection_closes() -> None:
    handled: list[str] = []

    async def handler(request: Request, exchange: Exchange) -> None:
        handled.append(request.path)
        await echo(request, exchange)

    async with running(handler) as (_, port):
        for garbage in (b"NOT HTTP AT ALL\r\n\r\n", b"GET / HTTP/1.1\r\nbad header line\r\n\r\n"):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(garbage)
            status, headers, body = await read_response(reader)
            assert status == 400 and headers["connection"] == "close"
            assert json.loads(body)["error"]["code"] == "bad_request"
            assert await reader.read() == b""  # closed by the server
            await close(writer)
        # a good request followed by garbage on the same connection: the good one is answered first
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post("/ok", b"x") + b"\x00\x01garbage\r\n\r\n")
        assert (await read_response(reader))[0] == 200
        assert (await read_response(reader))[0] == 400
        assert await reader.read() == b""
        await close(writer)
    assert handled == ["/ok"]


async def test_oversized_request_head_gets_431_and_the_connection_closes() -> None:
    handled: list[str] = []

    async def handler(request: Request, exchange: Exchange) -> None:
        handled.append(request.path)
        await echo(request, exchange)

    async with running(handler) as (_, port):
        for head in (
            b"GET /" + b"a" * MAX_HEAD_BYTES + b" HTTP/1.1\r\nhost: x\r\n\r\n",
            b"GET / HTTP/1.1\r\n" + b"".join(b"x-filler-%d: %s\r\n" % (i, b"v" * 1000) for i in range(70)) + b"\r\n",
        ):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(head)
            status, headers, body = await read_response(reader)
            assert status == 431 and headers["connection"] == "close"
            assert json.loads(body)["error"]["code"] == "headers_too_large"
            assert await reader.read() == b""
            await close(writer)
        # just under the limit is an ordinary request
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /" + b"a" * (MAX_HEAD_BYTES // 2) + b" HTTP/1.1\r\nhost: x\r\n\r\n")
        assert (await read_response(reader))[0] == 200
        await close(writer)
    assert len(handled) == 1


async def test_body_over_the_limit_gets_413_and_the_connection_closes() -> None:
    async with running(echo, max_body_bytes=10) as (_, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post("/big", b"x" * 11))
        status, _, body = await read_response(reader)
        assert status == 413 and json.loads(body)["error"]["code"] == "request_too_large"
        assert await reader.read() == b""
        await close(writer)


async def test_http10_response_without_length_ends_with_the_connection() -> None:
    async def stream(request: Request, exchange: Exchange) -> None:
        exchange.start_now(200, [(b"content-type", b"text/plain")])
        await exchange.send(b"one ")
        exchange.end_now(b"two")

    async with running(stream) as (_, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.0\r\n\r\n")
        status, headers, body = await read_response(reader)
        assert status == 200 and headers["connection"] == "close" and body == b"one two"
        await close(writer)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nhost: t\r\n\r\n")
        status, headers, body = await read_response(reader)
        assert headers["transfer-encoding"] == "chunked" and body == b"one two"
        await close(writer)
    async with running(echo) as (_, port):  # HTTP/1.0 with keep-alive: a length-framed response keeps it
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(2):
            writer.write(b"GET /k HTTP/1.0\r\nconnection: keep-alive\r\n\r\n")
            status, headers, body = await read_response(reader)
            assert status == 200 and headers["connection"] == "keep-alive" and json.loads(body)["version"] == "1.0"
        await close(writer)


async def test_stalled_client_pauses_the_upstream_and_memory_stays_bounded() -> None:
    """A client that stops reading: the gateway's buffer stays small and the upstream is not read."""
    total = 64 * 1024 * 1024
    piece = b"x" * 65536
    written = 0

    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal written
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ncontent-length: %d\r\n\r\n" % total)
        while written < total:
            writer.write(piece)
            written += len(piece)
            await writer.drain()
        await close(writer)

    upstream_server = await asyncio.start_server(upstream, "127.0.0.1", 0)
    upstream_port = upstream_server.sockets[0].getsockname()[1]
    client = RawUpstream(GatewaySettings(upstream=f"http://127.0.0.1:{upstream_port}"))

    async def relay(request: Request, exchange: Exchange) -> None:
        response = await client.send("GET", "/big", [], b"")
        exchange.start_now(response.status, response.headers)
        exchange.flow(response.hold)
        await response.pipe(exchange.push)
        exchange.end_now()

    async with running(relay) as (server, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=65536)
        writer.write(b"GET /big HTTP/1.1\r\nhost: t\r\n\r\n")
        await reader.readuntil(b"\r\n\r\n")
        reader._transport.pause_reading()  # type: ignore[attr-defined]  # the client stops reading
        previous = -1
        for _ in range(200):  # until the upstream is stuck (its writes stop making progress)
            await asyncio.sleep(0.05)
            if written == previous:
                break
            previous = written
        assert written < total  # the upstream is held back: not everything was read from it
        [conn] = server.connections
        assert conn.transport is not None and conn.transport.get_write_buffer_size() <= 1024 * 1024
        reader._transport.resume_reading()  # type: ignore[attr-defined]
        received = 0
        while received < total:
            received += len(await reader.read(1 << 20))
        assert received == total and written == total
        await close(writer)
    await client.aclose()
    upstream_server.close()


async def test_asgi_streaming_response_and_disconnect() -> None:
    saw_disconnect = asyncio.Event()

    async def app(
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[MutableMapping[str, Any]]],
        send: Callable[[MutableMapping[str, Any]], Awaitable[None]],
    ) -> None:
        assert scope["type"] == "http" and scope["path"] == "/_ledger/s p" and scope["raw_path"] == b"/_ledger/s%20p"
        assert scope["client"][0] == scope["server"][0] == "127.0.0.1"
        assert (await receive()) == {"type": "http.request", "body": b"", "more_body": False}
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"tick\n", "more_body": True})
        message = await receive()  # the client leaves after the first tick
        assert message["type"] == "http.disconnect"
        saw_disconnect.set()

    async def handler(request: Request, exchange: Exchange) -> None:
        await run_asgi(app, request, exchange)

    async with running(handler) as (_, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /_ledger/s%20p HTTP/1.1\r\nhost: t\r\n\r\n")
        await reader.readuntil(b"\r\n\r\n")
        await reader.readuntil(b"tick\n")  # raises if the connection ends before the first tick
        await close(writer)
        await asyncio.wait_for(saw_disconnect.wait(), 10)


async def test_gateway_app_admin_and_proxy_through_the_server(database: Database, tmp_path: Path) -> None:
    """The real app: /_ledger/ through the ASGI adapter (token, metrics, OpenAPI), the rest proxied."""
    settings = make_settings(admin_token="s3cret")
    async with (
        serving(FakeUpstream()) as upstream_url,
        EventWriter(database, Spool(tmp_path / "spool")) as writer,
        live_gateway(settings, database=database, writer=writer, upstream=upstream_url) as gateway,
        httpx.AsyncClient(base_url=gateway.url, trust_env=False) as http,
    ):
        call = await http.post("/v1/chat/completions", content=b'{"model":"m","messages":[],"max_tokens":2}')
        assert call.status_code == 200 and call.json()["usage"]["completion_tokens"] == 2
        call_id = call.headers["x-ledger-call-id"]
        stream = await http.post("/v1/chat/completions", content=b'{"model":"m","stream":true,"max_tokens":3}')
        assert stream.text.endswith("data: [DONE]\n\n") and '"usage"' not in stream.text
        assert (await http.get("/_ledger/health")).json()["status"] == "ok"
        auth = {"authorization": "Bearer s3cret"}
        assert (await http.get("/_ledger/metrics")).status_code == 401
        metrics = await http.get("/_ledger/metrics", headers=auth)
        assert 'ledger_gateway_calls_total{status="200"} 2' in metrics.text
        events = (await http.get(f"/_ledger/api/calls/{call_id}/events", headers=auth)).json()
        assert [e["type"] for e in events["events"]] == ["call.started", "call.finished"]
        schema = (await http.get("/_ledger/api/schema/openapi.json", headers=auth)).json()
        assert "/_ledger/api/calls/{call_id}/events" in schema["paths"]
        assert (await http.get("/_ledger/nope", headers=auth)).status_code == 404
