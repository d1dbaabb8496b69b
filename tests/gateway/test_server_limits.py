"""`gateway.server` under slow and large traffic, in-process: timeouts, the connection cap, the body budget.

The same limits against the real `ledger serve` (fd limit, 1,100 connections, RSS): tests/reliability.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace

from tests.gateway.test_server import close, echo, post
from tests.gateway.wire import read_response
from usage_ledger.gateway.limits import ServerLimits
from usage_ledger.gateway.metrics import Metrics
from usage_ledger.gateway.serve import bind_socket
from usage_ledger.gateway.server import HttpServer
from usage_ledger.gateway.settings import GatewaySettings

FAST = replace(
    ServerLimits.from_settings(GatewaySettings()), head_timeout_s=0.3, body_timeout_s=0.3, keepalive_idle_s=0.3
)


@asynccontextmanager
async def running(limits: ServerLimits) -> AsyncIterator[tuple[HttpServer, int]]:
    sock = bind_socket("127.0.0.1", 0)
    server = HttpServer(echo, limits=limits, metrics=Metrics())
    await server.start(sock)
    try:
        yield server, sock.getsockname()[1]
    finally:
        await server.shutdown(grace_s=5)


async def _connect(port: int, data: bytes = b"") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    if data:
        writer.write(data)
        await writer.drain()
    return reader, writer


async def _error(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], dict[str, str]]:
    status, headers, body = await asyncio.wait_for(read_response(reader), 10)
    return status, headers, json.loads(body)["error"]


async def test_an_incomplete_head_is_answered_408_and_closed() -> None:
    async with running(FAST) as (server, port):
        reader, writer = await _connect(port, b"POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\n")
        status, headers, error = await _error(reader)
        assert status == 408 and headers["connection"] == "close" and error["code"] == "request_timeout"
        assert await reader.read() == b""
        assert server.metrics.requests_timed_out == 1
        await close(writer)


async def test_a_stalled_body_is_answered_408_and_never_reaches_the_handler() -> None:
    async with running(FAST) as (server, port):
        reader, writer = await _connect(port, post("/v1/x", b"0123456789")[:-5])
        status, _, error = await _error(reader)
        assert status == 408 and "LEDGER_BODY_TIMEOUT_S" in error["message"]
        assert server.request_bytes.held == 0  # what it sent is let go
        await close(writer)


async def test_an_idle_keep_alive_connection_is_closed_after_its_limit() -> None:
    async with running(FAST) as (server, port):
        reader, writer = await _connect(port, post("/v1/x", b"hi"))
        status, _, _ = await asyncio.wait_for(read_response(reader), 10)
        assert status == 200
        assert await asyncio.wait_for(reader.read(), 10) == b""  # closed without an answer: it asked nothing
        assert not server.connections
        await close(writer)


async def test_at_the_cap_the_longest_waiting_connection_makes_room() -> None:
    async with running(replace(FAST, head_timeout_s=30, max_connections=2)) as (server, port):
        oldest = await _connect(port, b"POST /v1/x HTTP/1.1\r\n")
        second = await _connect(port, b"POST /v1/x HTTP/1.1\r\n")
        reader, writer = await _connect(port, post("/v1/x", b"served"))
        status, _, body = await asyncio.wait_for(read_response(reader), 10)
        assert status == 200 and json.loads(body)["body"] == "served"
        status, _, error = await _error(oldest[0])
        assert status == 408 and "LEDGER_MAX_CONNECTIONS" in error["message"]
        assert server.metrics.connections_shed == 1
        for conn_writer in (writer, oldest[1], second[1]):
            await close(conn_writer)


async def test_at_the_cap_with_every_connection_busy_a_new_one_gets_503() -> None:
    async with running(replace(FAST, body_timeout_s=30, max_connections=1)) as (server, port):
        busy = await _connect(port, post("/v1/x", b"0123456789")[:-5])
        reader, writer = await _connect(port, post("/v1/x", b"refused"))
        status, headers, error = await _error(reader)
        assert status == 503 and headers["connection"] == "close" and error["code"] == "gateway_busy"
        assert await reader.read() == b""
        assert server.metrics.connections_refused == 1
        await close(writer)
        await close(busy[1])


async def test_request_bodies_over_the_shared_budget_get_503_and_the_budget_comes_back() -> None:
    async with running(replace(FAST, body_timeout_s=30, max_request_bytes_in_flight=1000)) as (server, port):
        holding = await _connect(port, post("/v1/x", b"a" * 2000)[:-1200])  # 800 bytes held, stalled
        reader, writer = await _connect(port, post("/v1/x", b"b" * 500))
        status, _, error = await _error(reader)
        assert status == 503 and "LEDGER_MAX_REQUEST_BYTES_IN_FLIGHT" in error["message"]
        assert server.request_bytes.held == 800 and server.metrics.requests_refused_busy == 1
        await close(writer)
        small, small_writer = await _connect(port, post("/v1/x", b"c" * 100))
        status, _, _ = await asyncio.wait_for(read_response(small), 10)
        assert status == 200 and server.request_bytes.held == 800  # a finished request gives its bytes back
        await close(small_writer)
        await close(holding[1])
