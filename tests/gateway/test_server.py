"""The gateway's HTTP server (`gateway._http`) on loopback sockets, in front of a
real upstream: keep-alive, request bodies, pipelining, malformed requests, backpressure to the upstream,
client disconnects, and the admin app beside the proxy."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

from tests.gateway.conftest import make_settings, rigged
from tests.gateway.live import echo_gateway, live_gateway
from tests.gateway.wire import read_response
from usage_ledger.gateway.limits import MAX_HEAD_BYTES
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.spool import Spool
from usage_ledger.ledger.writer import EventWriter


async def close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()


def post(path: str, body: bytes, *extra: bytes) -> bytes:
    head = b"POST %s HTTP/1.1\r\nhost: t\r\ncontent-length: %d\r\n" % (path.encode(), len(body))
    return head + b"".join(h + b"\r\n" for h in extra) + b"\r\n" + body


async def test_keep_alive_several_requests_on_one_connection(database: Database, tmp_path: Path) -> None:
    async with echo_gateway(make_settings(), database, tmp_path) as gw:
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        for i in range(3):
            writer.write(post(f"/v1/x?i={i}", b"body %d" % i))
            status, headers, body = await read_response(reader)
            assert status == 200 and "connection" not in headers
            echoed = json.loads(body)
            assert (echoed["method"], echoed["path"], echoed["query"], echoed["body"]) == (
                "POST",
                "/v1/x",
                f"i={i}",
                f"body {i}",
            )
        assert gw.live.server.connections == 1
        await close(writer)


async def test_chunked_request_body(database: Database, tmp_path: Path) -> None:
    async with echo_gateway(make_settings(), database, tmp_path) as gw:
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(b"POST /chunked HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)  # the body arrives in pieces
        writer.write(b"1\r\n \r\n5\r\nworld\r\n0\r\n\r\n")
        status, _, body = await read_response(reader)
        assert status == 200 and json.loads(body)["body"] == "hello world"
        assert json.loads(body)["headers"]["content-length"] == "11"  # forwarded with its length, not chunked
        await close(writer)


async def test_pipelined_pair_answered_in_order(database: Database, tmp_path: Path) -> None:
    async with echo_gateway(make_settings(), database, tmp_path) as gw:
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(post("/first", b"1") + post("/second", b"22"))
        first = await read_response(reader)
        second = await read_response(reader)
        assert json.loads(first[2])["path"] == "/first" and json.loads(second[2])["body"] == "22"
        await close(writer)
    assert gw.upstream.handled == [b"1", b"22"]


async def test_expect_100_continue(database: Database, tmp_path: Path) -> None:
    async with echo_gateway(make_settings(), database, tmp_path) as gw:
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(b"POST /e HTTP/1.1\r\nhost: t\r\ncontent-length: 4\r\nexpect: 100-continue\r\n\r\n")
        interim = await read_response(reader)
        assert interim[0] == 100
        writer.write(b"data")
        status, _, body = await read_response(reader)
        assert status == 200 and json.loads(body)["body"] == "data"
        assert "expect" not in json.loads(body)["headers"]  # hop-by-hop for the gateway: answered here
        await close(writer)


async def test_malformed_request_gets_400_and_the_connection_closes(database: Database, tmp_path: Path) -> None:
    async with echo_gateway(make_settings(), database, tmp_path) as gw:
        for garbage in (b"NOT HTTP AT ALL\r\n\r\n", b"GET / HTTP/1.1\r\nbad header line\r\n\r\n"):
            reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
            writer.write(garbage)
            status, headers, body = await read_response(reader)
            assert status == 400 and headers["connection"] == "close"
            assert json.loads(body)["error"]["code"] == "bad_request"
            assert await reader.read() == b""  # closed by the server
            await close(writer)
        # a good request followed by garbage on the same connection: the good one reaches the upstream
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(post("/ok", b"x"))
        assert (await read_response(reader))[0] == 200
        writer.write(b"\x00\x01garbage\r\n\r\n")
        assert (await read_response(reader))[0] == 400
        assert await reader.read() == b""
        await close(writer)
    assert gw.upstream.handled == [b"x"]


async def test_oversized_request_head_gets_431_and_the_connection_closes(database: Database, tmp_path: Path) -> None:
    async with echo_gateway(make_settings(), database, tmp_path) as gw:
        for head in (
            b"GET /" + b"a" * MAX_HEAD_BYTES + b" HTTP/1.1\r\nhost: x\r\n\r\n",
            b"GET / HTTP/1.1\r\n" + b"".join(b"x-filler-%d: %s\r\n" % (i, b"v" * 1000) for i in range(70)) + b"\r\n",
        ):
            reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
            writer.write(head)
            status, headers, body = await read_response(reader)
            assert status == 431 and headers["connection"] == "close"
            assert json.loads(body)["error"]["code"] == "headers_too_large"
            assert await reader.read() == b""
            await close(writer)
        # just under the limit is an ordinary request
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(b"GET /" + b"a" * (MAX_HEAD_BYTES // 2) + b" HTTP/1.1\r\nhost: x\r\n\r\n")
        assert (await read_response(reader))[0] == 200
        await close(writer)
    assert len(gw.upstream.handled) == 1


async def test_a_header_line_that_never_ends_gets_431_once_over_the_limit(database: Database, tmp_path: Path) -> None:
    """Issue #52: httptools hands a header over only once its line ends, so an endless one was never counted (it
    was buffered, and copied again at each read, until the head timeout). Now the head's bytes count as they come."""
    async with echo_gateway(make_settings(head_timeout_s=5), database, tmp_path) as gw:
        for start in (b"GET / HTTP/1.1\r\nhost: x\r\nx-endless: ", b"GET / HTTP/1.1\r\nhost: x\r\nx-endless-name"):
            reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
            writer.write(start)
            with contextlib.suppress(ConnectionError):
                for _ in range(4 * MAX_HEAD_BYTES // 4096):  # four times the limit in pieces, the line never ended
                    writer.write(b"v" * 4096)
                    await writer.drain()
            status, headers, body = await read_response(reader)
            assert status == 431 and headers["connection"] == "close"
            assert json.loads(body)["error"]["code"] == "headers_too_large"
            await close(writer)
        # a head near the limit in many reads is an ordinary request
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(b"GET / HTTP/1.1\r\nhost: x\r\nx-long: ")
        for _ in range(MAX_HEAD_BYTES // 2 // 4096):
            writer.write(b"v" * 4096)
            await writer.drain()
        writer.write(b"\r\n\r\n")
        assert (await read_response(reader))[0] == 200
        await close(writer)
    assert len(gw.upstream.handled) == 1


async def test_a_trailer_line_that_never_ends_gets_431_once_over_the_limit(database: Database, tmp_path: Path) -> None:
    """After a chunked body httptools buffers a trailer line until it ends, as a header line: counted the same way
    (before, only the minimum body rate cut it, once its grace had passed). Nothing reaches the upstream."""
    head = b"POST /t HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
    async with echo_gateway(make_settings(), database, tmp_path) as gw:
        for start in (b"5\r\nhello\r\n0\r\nx-endless: ", b"5\r\nhello\r\n0\r\nx-endless-name"):
            reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
            writer.write(head + start)
            with contextlib.suppress(ConnectionError):
                for _ in range(4 * MAX_HEAD_BYTES // 4096):  # four times the limit in pieces, the line never ended
                    writer.write(b"v" * 4096)
                    await writer.drain()
            status, headers, body = await read_response(reader)
            assert status == 431 and headers["connection"] == "close"
            assert json.loads(body)["error"]["code"] == "headers_too_large"
            await close(writer)
        assert gw.upstream.handled == []
        # trailers near the limit, after a body sent in small chunks, in many reads: an ordinary request
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(head)
        for _ in range(3 * MAX_HEAD_BYTES // 1024):  # body pieces reset the count: more than the limit in all
            writer.write(b"1;ext=" + b"e" * 1000 + b"\r\nx\r\n")
            await writer.drain()
        writer.write(b"0\r\nx-long: ")
        for _ in range(MAX_HEAD_BYTES // 2 // 4096):
            writer.write(b"v" * 4096)
            await writer.drain()
        writer.write(b"\r\n\r\n")
        assert (await read_response(reader))[0] == 200
        await close(writer)
    assert gw.upstream.handled == [b"x" * (3 * MAX_HEAD_BYTES // 1024)]


async def test_body_over_the_limit_gets_413_and_the_connection_closes(database: Database, tmp_path: Path) -> None:
    async with echo_gateway(make_settings(max_body_bytes=10), database, tmp_path) as gw:
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(post("/big", b"x" * 11))
        status, headers, body = await read_response(reader)
        assert status == 413 and json.loads(body)["error"]["code"] == "request_too_large"
        assert headers["connection"] == "close" and await reader.read() == b""
        await close(writer)
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(post("/small", b"x" * 6))
        assert (await read_response(reader))[0] == 200
        await close(writer)
        # no Content-Length to refuse up front: a chunked body is counted as it comes
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(
            b"POST /c HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n8\r\n12345678\r\n8\r\n12345678\r\n0\r\n\r\n"
        )
        status, _, body = await read_response(reader)
        assert status == 413 and await reader.read() == b""
        await close(writer)
    assert gw.upstream.handled == [b"x" * 6]


async def test_http10_and_streamed_responses_are_framed_for_the_client(database: Database, tmp_path: Path) -> None:
    async with echo_gateway(make_settings(), database, tmp_path) as gw:
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(b"GET /stream HTTP/1.0\r\n\r\n")
        status, headers, body = await read_response(reader)
        assert status == 200 and headers["connection"] == "close" and body == b"one two"
        await close(writer)
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(b"GET /stream HTTP/1.1\r\nhost: t\r\n\r\n")
        status, headers, body = await read_response(reader)
        assert headers["transfer-encoding"] == "chunked" and body == b"one two"
        await close(writer)
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        for _ in range(2):  # HTTP/1.0 asking for keep-alive (§9.3): a length-framed response keeps the connection
            writer.write(b"GET /k HTTP/1.0\r\nconnection: keep-alive\r\n\r\n")
            status, headers, body = await read_response(reader)
            assert status == 200 and json.loads(body)["path"] == "/k" and headers["connection"] == "keep-alive"
        await close(writer)


async def test_stalled_client_pauses_the_upstream_and_memory_stays_bounded(database: Database, tmp_path: Path) -> None:
    """A client that stops reading: the gateway's buffers stay small and the upstream is not read."""
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
    upstream_url = f"http://127.0.0.1:{upstream_server.sockets[0].getsockname()[1]}"
    async with (
        EventWriter(database, Spool(tmp_path / "spool")) as events,
        live_gateway(make_settings(), database=database, writer=events, upstream=upstream_url) as gateway,
    ):
        port = int(gateway.url.rsplit(":", 1)[1])
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
        assert written < total // 4  # the upstream is held back: not everything was read from it
        reader._transport.resume_reading()  # type: ignore[attr-defined]
        received = 0
        while received < total:
            received += len(await reader.read(1 << 20))
        assert received == total and written == total
        await close(writer)
    upstream_server.close()


async def test_a_client_that_leaves_cancels_the_upstream_request(database: Database, tmp_path: Path) -> None:
    async with echo_gateway(make_settings(), database, tmp_path) as gw:
        _, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        writer.write(post("/slow", b"wait"))
        await writer.drain()
        for _ in range(500):  # until the request is upstream
            if gw.upstream.handled:
                break
            await asyncio.sleep(0.01)
        await close(writer)
        await asyncio.wait_for(gw.upstream.left.wait(), 10)  # the gateway closed its upstream request


async def test_gateway_app_admin_and_proxy_through_the_server(database: Database, tmp_path: Path) -> None:
    """The real app: /_ledger/ to Litestar (token, metrics, OpenAPI), the rest proxied."""
    settings = make_settings(admin_token="s3cret")
    async with rigged(database, settings, tmp_path / "spool") as rig:
        http = rig.client
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
        assert call.headers.get_list("server") == ["uvicorn"]  # the upstream's (also uvicorn), none of the gateway's
