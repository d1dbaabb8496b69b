"""RFC 9112 framing at both ends of the gateway (its own server and upstream client, `gateway._http`).

Each case is a message a peer may really send (or a smuggling attempt), written byte for byte on a
loopback socket: what the RFC requires or allows, and which of the allowed answers the gateway gives.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.gateway.conftest import make_settings
from tests.gateway.live import EchoUpstream, echo_gateway, live_gateway
from tests.gateway.scripted import Request as ScriptedRequest
from tests.gateway.scripted import Server
from tests.gateway.wire import read_response
from usage_ledger.gateway.serve import bind_socket
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.spool import Spool
from usage_ledger.ledger.writer import EventWriter


@pytest.fixture
async def gateway(database: Database, tmp_path: Path) -> AsyncIterator[tuple[int, EchoUpstream]]:
    """The gateway in front of an upstream answering with what it received; its port and that upstream."""
    async with echo_gateway(make_settings(), database, tmp_path) as gw:
        yield gw.port, gw.upstream


async def exchange_bytes(port: int, data: bytes) -> tuple[int, dict[str, str], bytes, bool]:
    """Send `data`, read one response; (status, headers, body, whether the server closed within 1 s)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        status, headers, body = await asyncio.wait_for(read_response(reader), 5)
        try:
            closed = await asyncio.wait_for(reader.read(1), 1) == b""
        except TimeoutError:
            closed = False  # kept alive for the next request
        return status, headers, body, closed
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


# -- the gateway as a server -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "request_bytes"),
    [
        # §6.3 ¶3: both present is a smuggling vector; the server may reject (it must then close)
        (
            "cl_and_te",
            b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
        ),
        # §6.3 ¶5: differing Content-Length values are unrecoverable
        ("two_lengths", b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\nhello!"),
        # §6.3 ¶5 allows accepting identical duplicates; the gateway refuses them too (one rule: one length)
        ("same_length_twice", b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: 2\r\ncontent-length: 2\r\n\r\nhi"),
        # §6.3 ¶4: chunked not the final coding of a request: 400, then close
        ("te_not_chunked", b"POST / HTTP/1.1\r\nhost: t\r\ntransfer-encoding: gzip\r\n\r\nxx"),
        # §5.2: obs-fold in a request: reject with 400 (or unfold; the gateway rejects)
        ("obs_fold", b"POST / HTTP/1.1\r\nhost: t\r\nx-note: a\r\n b\r\ncontent-length: 0\r\n\r\n"),
        # §7.1: a chunk size that is not hex
        ("bad_chunk_size", b"POST / HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n"),
    ],
)
async def test_ambiguous_framing_is_refused_and_the_connection_closed(
    gateway: tuple[int, EchoUpstream], name: str, request_bytes: bytes
) -> None:
    port, upstream = gateway
    status, headers, _, closed = await exchange_bytes(port, request_bytes)
    assert status == 400 and headers.get("connection") == "close" and closed, name
    assert upstream.handled == []  # nothing went upstream: no call recorded from a message of unknown length


async def test_chunk_extensions_are_ignored_and_trailers_accepted(gateway: tuple[int, EchoUpstream]) -> None:
    port, upstream = gateway
    body = b"5;name=value\r\nhello\r\n6;x\r\n world\r\n0\r\ntrailer-field: t\r\n\r\n"  # §7.1.1, §7.1.2
    status, _, response, closed = await exchange_bytes(
        port, b"POST / HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n" + body
    )
    assert status == 200 and json.loads(response)["body"] == "hello world" and upstream.handled == [b"hello world"]
    assert not closed  # the message ended where the chunks said: the connection serves the next one


async def test_http10_request_is_answered_then_closed(gateway: tuple[int, EchoUpstream]) -> None:
    port, _ = gateway
    status, _, body, closed = await exchange_bytes(port, b"POST / HTTP/1.0\r\ncontent-length: 2\r\n\r\nhi")
    assert status == 200 and json.loads(body)["body"] == "hi" and closed  # §9.3: no persistence


async def test_half_close_while_a_request_is_handled_counts_as_the_client_leaving(
    gateway: tuple[int, EchoUpstream],
) -> None:
    """§9.6 lets a client shut down its sending side and still read; the gateway cannot tell that FIN
    from a client that closed and left, and treats it as leaving (as uvicorn and nginx do): a request
    not yet forwarded is dropped (its body was never handed over: no call), one already upstream is
    cancelled (recorded as `client_disconnected`) rather than generating tokens nobody may read."""
    port, upstream = gateway
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /slow HTTP/1.1\r\nhost: t\r\ncontent-length: 2\r\n\r\nhi")
    writer.write_eof()
    assert await asyncio.wait_for(reader.read(), 5) == b""  # closed, no partial answer
    writer.close()
    if upstream.handled:  # it reached the upstream before the FIN was read: that request is cancelled
        await asyncio.wait_for(upstream.left.wait(), 5)


async def test_pipelined_requests_in_one_segment_each_get_their_own_response(gateway: tuple[int, EchoUpstream]) -> None:
    port, upstream = gateway
    two = b"".join(b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: 1\r\n\r\n%d" % i for i in (1, 2))
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(two)
    bodies = [json.loads((await read_response(reader))[2])["body"] for _ in range(2)]
    writer.close()
    assert bodies == ["1", "2"] and upstream.handled == [b"1", b"2"]


# -- the gateway as a client (its client against a scripted upstream, through the gateway) ---------------


def answering(raw: bytes):  # type: ignore[no-untyped-def]
    async def respond(request: ScriptedRequest, writer: asyncio.StreamWriter) -> bool:
        writer.write(raw)
        await writer.drain()
        return False  # then close: a body delimited by the close ends there

    return respond


async def fetch_through(raw: bytes, database: Database, tmp_path: Path) -> tuple[int, bytes, bool]:
    """The upstream answers `raw`; what the gateway's client gets: status, body, whether it was complete."""
    async with (
        Server(answering(raw)) as server,
        EventWriter(database, Spool(tmp_path / "spool")) as writer,
        live_gateway(make_settings(), database=database, writer=writer, upstream=server.url) as gw,
    ):
        reader, conn = await asyncio.open_connection("127.0.0.1", int(gw.url.rsplit(":", 1)[1]))
        conn.write(b"GET / HTTP/1.1\r\nhost: t\r\n\r\n")
        try:
            status, _, body = await asyncio.wait_for(read_response(reader), 10)
            return status, body, True
        except asyncio.IncompleteReadError:
            return 200, b"", False  # the gateway dropped the connection: the body was cut short
        finally:
            conn.close()


async def fetch(raw: bytes, database: Database, tmp_path: Path) -> tuple[int, bytes]:
    status, body, complete = await fetch_through(raw, database, tmp_path)
    assert complete
    return status, body


async def test_response_chunk_extensions_and_trailers(database: Database, tmp_path: Path) -> None:
    raw = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n0\r\nx-trailer: 1\r\n\r\n"
    assert await fetch(raw, database, tmp_path) == (200, b"abc")


@pytest.mark.parametrize(
    "raw",
    [
        # §6.3 ¶3: both lengths "ought to be handled as an error" (a response-splitting attempt): it is
        b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\nabcd",  # §6.3 ¶5
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",  # a bad chunk size
        b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc",  # closed before the length: incomplete
    ],
)
async def test_response_of_unknown_or_broken_length_is_an_upstream_reset(
    raw: bytes, database: Database, tmp_path: Path
) -> None:
    status, body, complete = await fetch_through(raw, database, tmp_path)
    if complete:  # refused before the response began: a 502 upstream_reset
        assert status == 502 and json.loads(body)["error"]["code"] == "upstream_reset", body
    # else: the head was relayed and the body cut short — the connection was dropped, never completed


async def test_a_response_with_obs_fold_is_discarded_for_a_502(database: Database, tmp_path: Path) -> None:
    """§5.2: a gateway either discards such a response for a 502 (explaining why) or replaces each obs-fold
    with SP before forwarding; the gateway's client (httptools) discards it."""
    status, body, complete = await fetch_through(
        b"HTTP/1.1 200 OK\r\nx-a: a\r\n b\r\ncontent-length: 2\r\n\r\nok", database, tmp_path
    )
    error = json.loads(body)["error"]
    assert (status, complete, error["code"]) == (502, True, "upstream_reset")
    assert "invalid HTTP response" in error["message"]


async def test_http10_response_without_length_is_read_to_the_close(database: Database, tmp_path: Path) -> None:
    raw = b"HTTP/1.0 200 OK\r\ncontent-type: text/plain\r\n\r\nall of it"
    assert await fetch(raw, database, tmp_path) == (200, b"all of it")


async def test_interim_responses_are_skipped(database: Database, tmp_path: Path) -> None:
    raw = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\n"
    raw += b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
    assert await fetch(raw, database, tmp_path) == (200, b"ok")


def test_the_listening_socket_disables_nagle() -> None:
    sock = bind_socket("127.0.0.1", 0)
    try:
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1  # small chunks are not held back
    finally:
        sock.close()
