"""`Upstream` against real loopback servers whose every byte the test controls."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import pytest
import uvloop

from tests.gateway.processes import free_port
from tests.gateway.scripted import Request, Respond, Server
from usage_ledger.gateway import Upstream
from usage_ledger.gateway.errors import UpstreamReset, UpstreamTimeout, UpstreamUnreachable
from usage_ledger.gateway.settings import GatewaySettings
from usage_ledger.ledger.errors import ConfigError

Scenario = Callable[[], Coroutine[Any, Any, None]]
HIGH_WATER = 256 * 1024  # what the client buffers for a lagging reader (`_http.upstream_connection.HIGH_WATER`)
SCENARIOS: list[Scenario] = []


def scenario(check: Scenario) -> Scenario:
    """Collected here and run twice below: on asyncio's loop and on uvloop."""
    SCENARIOS.append(check)
    return check


def settings(url: str, **overrides: object) -> GatewaySettings:
    return GatewaySettings(upstream=url, **overrides)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def client(url: str, **overrides: object) -> AsyncIterator[Upstream]:
    upstream = Upstream(settings(url, **overrides))
    try:
        yield upstream
    finally:
        await upstream.aclose()


def fixed(body: bytes, *extra: bytes) -> Respond:
    async def respond(request: Request, writer: asyncio.StreamWriter) -> bool:
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
        writer.write(head + b"".join(e + b"\r\n" for e in extra) + b"\r\n" + body)
        await writer.drain()
        return True

    return respond


async def read_all(upstream: Upstream, method: str = "POST", body: bytes = b"{}") -> tuple[int, bytes]:
    response = await upstream.send(method, "/v1/x", [(b"content-type", b"application/json")], body)
    try:
        return response.status, b"".join([chunk async for chunk in response.chunks()])
    finally:
        await response.aclose()


@scenario
async def content_length_body_headers_and_request_shape() -> None:
    respond = fixed(b'{"ok":true}', b"X-Request-Id: r1", b"Set-Cookie: a")
    async with Server(respond) as server, client(server.url) as upstream:
        response = await upstream.send("POST", "/v1/chat?x=1", [(b"authorization", b"Bearer k")], b'{"a":1}')
        assert response.status == 200
        assert response.headers == [
            (b"content-type", b"application/json"),
            (b"content-length", b"11"),
            (b"x-request-id", b"r1"),
            (b"set-cookie", b"a"),
        ]
        assert b"".join([c async for c in response.chunks()]) == b'{"ok":true}'
        await response.aclose()
    request = server.requests[0]
    assert request.line == "POST /v1/chat?x=1 HTTP/1.1"
    assert [(name.lower(), value) for name, value in request.headers] == [
        ("host", f"127.0.0.1:{server.port}"),
        ("authorization", "Bearer k"),
        ("content-length", "7"),
    ]
    assert request.body == b'{"a":1}'


@scenario
async def base_url_path_prefix_and_get_without_length() -> None:
    async with Server(fixed(b"x")) as server, client(server.url + "/prefix/") as upstream:
        assert await read_all(upstream, "GET", b"") == (200, b"x")
    assert server.requests[0].line == "GET /prefix/v1/x HTTP/1.1"
    assert [k.lower() for k, _ in server.requests[0].headers] == ["host", "content-type"]  # nothing of its own


@scenario
async def chunked_body_split_across_reads_is_dechunked() -> None:
    payload = b"".join(b'data: {"i":%d}\n\n' % i for i in range(40))
    wire = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (payload[:7], payload[7:300], payload[300:])) + b"0\r\n\r\n"
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"

    async def respond(request: Request, writer: asyncio.StreamWriter) -> bool:
        data, start, sizes = head + wire, 0, [1, 5, 13, 2, 40, 3]
        while start < len(data):  # pieces cut anywhere: in the head, chunk sizes, CRLFs and data
            size = sizes[start % len(sizes)]
            writer.write(data[start : start + size])
            await writer.drain()
            await asyncio.sleep(0.001)
            start += size
        return True

    async with Server(respond) as server, client(server.url) as upstream:
        assert await read_all(upstream) == (200, payload)
        assert await read_all(upstream) == (200, payload)  # the parser is reset for the next response
    assert server.accepted == 1


@scenario
async def keep_alive_reuses_one_connection() -> None:
    async with Server(fixed(b"hello")) as server:
        async with client(server.url) as upstream:
            for _ in range(3):
                assert await read_all(upstream) == (200, b"hello")
        await server.wait_peer_close()  # aclose() of the client closes the pooled connection
    assert server.accepted == 1 and len(server.requests) == 3


@scenario
async def connection_close_and_read_until_eof_are_not_reused() -> None:
    async def respond(request: Request, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end")
        await writer.drain()
        return False

    async with Server(respond) as server, client(server.url) as upstream:
        assert await read_all(upstream) == (200, b"until the end")
        assert await read_all(upstream) == (200, b"until the end")
    assert server.accepted == 2


@scenario
async def server_close_mid_body_is_a_reset_after_the_bytes_received() -> None:
    async def respond(request: Request, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
        await writer.drain()
        await asyncio.sleep(0.05)
        return False

    async with Server(respond) as server, client(server.url) as upstream:
        response = await upstream.send("POST", "/", [], b"")
        got = []
        with pytest.raises(UpstreamReset, match="without sending a complete message body"):
            async for chunk in response.chunks():
                got.append(chunk)
        assert got == [b"partial"]


@scenario
async def server_close_before_headers_is_a_reset() -> None:
    async def respond(request: Request, writer: asyncio.StreamWriter) -> bool:
        return False

    async with Server(respond) as server, client(server.url) as upstream:
        with pytest.raises(UpstreamReset):
            await upstream.send("POST", "/", [], b"")


@scenario
async def invalid_response_is_a_reset() -> None:
    async def respond(request: Request, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"SPDY/9 what\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.1)
        return False

    async with Server(respond) as server, client(server.url) as upstream:
        with pytest.raises(UpstreamReset, match="invalid HTTP response"):
            await upstream.send("POST", "/", [], b"")


@scenario
async def a_response_head_over_the_cap_is_a_reset_and_closes_the_connection() -> None:
    """Issue #52: an upstream's header line that never ends is counted as it arrives (httptools hands a header
    over only once it ends, buffering it meanwhile); a head of many complete lines is capped as well."""
    endless = [b"HTTP/1.1 200 OK\r\nx-endless: ", *[b"v" * 65536] * 64]  # 4 MiB, never ended
    lines = b"".join(b"x-filler-%d: %s\r\n" % (i, b"v" * 1000) for i in range(70))
    many = [b"HTTP/1.1 200 OK\r\n" + lines, b"content-length: 2\r\n\r\n{}"]  # complete lines, 70 kB
    for parts in (endless, many):

        async def respond(request: Request, writer: asyncio.StreamWriter, parts: list[bytes] = parts) -> bool:
            with contextlib.suppress(ConnectionError):
                for part in parts:
                    writer.write(part)
                    await writer.drain()
            return await request.hang()

        async with Server(respond) as server, client(server.url, upstream_read_timeout_s=3) as upstream:
            with pytest.raises(UpstreamReset, match="response head exceeds 65536 bytes"):
                await upstream.send("POST", "/", [], b"")
            await server.wait_peer_close()


@scenario
async def a_trailer_line_that_never_ends_is_a_reset_and_closes_the_connection() -> None:
    """An endless trailer line after a chunked body is never silent (the read timeout never cut it) and was buffered
    by httptools until it ended: counted as it arrives, as the head's. A trailer under the cap is dropped."""
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n"
    endless = [head + b"x-endless: ", *[b"v" * 65536] * 64]  # 4 MiB, never ended
    under = [head + b"x-long: ", *[b"v" * 4096] * 8, b"\r\n\r\n"]  # 32 KiB in many reads, then ended
    for parts in (endless, under):

        async def respond(request: Request, writer: asyncio.StreamWriter, parts: list[bytes] = parts) -> bool:
            with contextlib.suppress(ConnectionError):
                for part in parts:
                    writer.write(part)
                    await writer.drain()
                    await asyncio.sleep(0)
            return await request.hang()

        async with Server(respond) as server, client(server.url, upstream_read_timeout_s=3) as upstream:
            if parts is under:
                assert await read_all(upstream) == (200, b"{}")
                continue
            with pytest.raises(UpstreamReset, match="trailer fields exceed 65536 bytes"):
                await read_all(upstream)
            await server.wait_peer_close()


@scenario
async def refused_is_unreachable() -> None:
    async with client(f"http://127.0.0.1:{free_port()}") as upstream:
        with pytest.raises(UpstreamUnreachable, match="cannot connect"):
            await upstream.send("POST", "/", [], b"")


@scenario
async def headers_timeout() -> None:
    async def respond(request: Request, writer: asyncio.StreamWriter) -> bool:
        return await request.hang()

    async with Server(respond) as server, client(server.url, upstream_read_timeout_s=0.2) as upstream:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(UpstreamTimeout, match=r"\(headers\)"):
            await upstream.send("POST", "/", [], b"")
        assert 0.15 < loop.time() - t0 < 2
        await server.wait_peer_close()


@scenario
async def body_idle_timeout_counts_from_the_last_byte() -> None:
    async def respond(request: Request, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(4):  # a byte every 0.1 s: never idle for 0.25 s
            await asyncio.sleep(0.1)
            writer.write(b"1\r\nx\r\n")
            await writer.drain()
        return await request.hang()

    async with Server(respond) as server, client(server.url, upstream_read_timeout_s=0.25) as upstream:
        response = await upstream.send("POST", "/", [], b"")
        got = []
        with pytest.raises(UpstreamTimeout, match=r"\(body\)"):
            async for chunk in response.chunks():
                got.append(chunk)
        assert b"".join(got) == b"xxxx"


@scenario
async def cancel_mid_body_closes_the_connection() -> None:
    started = asyncio.Event()

    async def respond(request: Request, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        return await request.hang()

    async def consume(upstream: Upstream) -> None:
        response = await upstream.send("POST", "/", [], b"")
        try:
            async for _ in response.chunks():
                started.set()
        finally:
            await response.aclose()  # as a call does whatever ends it

    async with Server(respond) as server, client(server.url) as upstream:
        task = asyncio.create_task(consume(upstream))
        await asyncio.wait_for(started.wait(), 2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await server.wait_peer_close()
        server.respond = fixed(b"fresh")
        assert await read_all(upstream) == (200, b"fresh")  # a new connection, not the half-read one
    assert server.accepted == 2


@scenario
async def cancel_while_waiting_for_headers_closes_the_connection() -> None:
    async def respond(request: Request, writer: asyncio.StreamWriter) -> bool:
        return await request.hang()

    async with Server(respond) as server, client(server.url) as upstream:
        task = asyncio.create_task(upstream.send("POST", "/", [], b""))
        await asyncio.wait_for(server.received.wait(), 2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await server.wait_peer_close()


@scenario
async def aclose_before_the_end_closes_the_connection() -> None:
    async def respond(request: Request, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 1000)
        await writer.drain()
        return await request.hang()

    async with Server(respond) as server, client(server.url) as upstream:
        response = await upstream.send("POST", "/", [], b"")
        await response.aclose()
        await server.wait_peer_close()
        server.respond = fixed(b"fresh")
        assert await read_all(upstream) == (200, b"fresh")
    assert server.accepted == 2


@scenario
async def unread_body_complete_on_the_wire_keeps_the_connection() -> None:
    async with Server(fixed(b"small")) as server, client(server.url) as upstream:
        response = await upstream.send("POST", "/", [], b"")
        await asyncio.sleep(0.05)  # the body arrives, nobody reads it
        await response.aclose()
        assert await read_all(upstream) == (200, b"small")
    assert server.accepted == 1


@scenario
async def slow_consumer_pauses_reading_and_gets_every_byte() -> None:
    body = bytes(range(256)) * (16 * HIGH_WATER // 256)
    async with Server(fixed(body)) as server, client(server.url) as upstream:
        response = await upstream.send("POST", "/", [], b"")
        got = []
        async for chunk in response.chunks():
            got.append(chunk)
            assert len(chunk) <= 4 * HIGH_WATER  # never the whole body buffered at once
            await asyncio.sleep(0.01)
        assert b"".join(got) == body
        assert await read_all(upstream) == (200, body)
    assert server.accepted == 1


@scenario
async def many_concurrent_requests_share_a_bounded_pool() -> None:
    async def respond(request: Request, writer: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(0.01)
        body = request.body
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        return True

    async with Server(respond) as server, client(server.url, upstream_max_connections=8) as upstream:
        results = await asyncio.gather(*(read_all(upstream, body=b"%d" % i) for i in range(200)))
    assert results == [(200, b"%d" % i) for i in range(200)]
    assert server.accepted <= 8


@scenario
async def a_piped_body_goes_to_the_sink_once_per_read_not_once_per_chunk() -> None:
    """A saturated upstream's many small chunks that arrive in one read are handed over together: one write
    to the client instead of one per chunk of the upstream's framing (bytes unchanged, nothing held)."""
    pieces = [b"data: %d\n\n" % i for i in range(200)]

    async def respond(request: Request, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.2)  # the body comes once the client pipes it
        writer.write(b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n")  # one write
        await writer.drain()
        return True

    handed: list[bytes] = []
    async with Server(respond) as server, client(server.url) as upstream:
        response = await upstream.send("POST", "/", [], b"")
        await response.pipe(handed.append)
    assert b"".join(handed) == b"".join(pieces)
    assert len(handed) < len(pieces) // 10, len(handed)  # a few reads on loopback (was one call per chunk)


@pytest.mark.parametrize("check", SCENARIOS, ids=lambda f: f.__name__)
async def test_on_asyncio(check: Scenario) -> None:
    await check()


@pytest.mark.parametrize("check", SCENARIOS, ids=lambda f: f.__name__)
def test_on_uvloop(check: Scenario) -> None:
    """uvloop runs the gateway in production; its transports are not asyncio's."""
    uvloop.run(check())


def test_http_and_https_only() -> None:
    with pytest.raises(ConfigError, match="http:// or https://"):
        Upstream(settings("ftp://example.com"))
