"""The gateway's limits for slow and large traffic (`gateway._http`, `gateway.limits`), driven on
loopback sockets against the real server in front of a real upstream: heads, bodies, idle connections,
the connection cap and the request-body budget."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests._polling import wait_until
from tests.gateway.conftest import make_settings
from tests.gateway.live import echo_gateway
from tests.gateway.test_server import close, post
from tests.gateway.wire import read_response
from usage_ledger.gateway import limits as limits_module
from usage_ledger.ledger.db import Database

FAST = {"head_timeout_s": 0.3, "body_timeout_s": 0.3, "keepalive_idle_s": 0.3}


async def _connect(port: int, data: bytes = b"") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    if data:
        writer.write(data)
        await writer.drain()
    return reader, writer


async def _error(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], dict[str, str]]:
    status, headers, body = await asyncio.wait_for(read_response(reader), 10)
    return status, headers, json.loads(body)["error"]


async def test_an_incomplete_head_is_answered_408_and_closed(database: Database, tmp_path: Path) -> None:
    async with echo_gateway(make_settings(**FAST), database, tmp_path) as gw:
        reader, writer = await _connect(gw.port, b"POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\n")
        status, headers, error = await _error(reader)
        assert status == 408 and headers["connection"] == "close" and error["code"] == "request_timeout"
        assert await reader.read() == b""
        assert gw.live.app.metrics.requests_timed_out == 1
        await close(writer)


async def test_a_stalled_body_is_answered_408_and_never_reaches_the_upstream(
    database: Database, tmp_path: Path
) -> None:
    async with echo_gateway(make_settings(**FAST), database, tmp_path) as gw:
        reader, writer = await _connect(gw.port, post("/v1/x", b"0123456789")[:-5])
        status, headers, error = await _error(reader)
        assert status == 408 and "LEDGER_BODY_TIMEOUT_S" in error["message"] and headers["connection"] == "close"
        assert gw.live.server.request_bytes.held == 0  # what it sent is let go
        assert gw.live.app.metrics.bodies_too_slow == 1
        await close(writer)
    assert gw.upstream.handled == []


async def test_a_body_slower_than_the_minimum_rate_is_answered_408(
    database: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each byte comes well within the pause limit, but their pace is below `min_body_rate`: cut."""
    monkeypatch.setattr(limits_module, "BODY_RATE_GRACE_S", 0.3)
    settings = make_settings(body_timeout_s=30, min_body_rate=50)
    async with echo_gateway(settings, database, tmp_path) as gw:
        reader, writer = await _connect(gw.port, post("/v1/chat/completions", b"x" * 1000)[:-1000])
        answer: asyncio.Task[tuple[int, dict[str, str], dict[str, str]]] = asyncio.create_task(_error(reader))
        for _ in range(100):  # a byte every 0.1 s: 10 bytes/s
            if answer.done():
                break
            writer.write(b"x")
            await asyncio.sleep(0.1)
        status, _, error = await answer
        assert status == 408 and "LEDGER_MIN_BODY_RATE" in error["message"] and error["code"] == "request_timeout"
        metrics = gw.live.app.metrics
        assert metrics.bodies_too_slow == 1 and metrics.requests_timed_out == 1
        assert gw.live.server.request_bytes.held == 0
        await close(writer)
        # a body at a normal pace is served
        reader, writer = await _connect(gw.port, post("/v1/x", b"quick"))
        assert (await asyncio.wait_for(read_response(reader), 10))[0] == 200
        await close(writer)
    assert gw.upstream.handled == [b"quick"]


async def test_an_idle_keep_alive_connection_is_closed_after_its_limit(database: Database, tmp_path: Path) -> None:
    async with echo_gateway(make_settings(**{**FAST, "keepalive_idle_s": 1}), database, tmp_path) as gw:
        reader, writer = await _connect(gw.port, post("/v1/x", b"hi"))
        status, _, _ = await asyncio.wait_for(read_response(reader), 10)
        assert status == 200
        assert await asyncio.wait_for(reader.read(), 10) == b""  # closed without an answer: it asked nothing
        await wait_until(lambda: gw.live.server.connections == 0, what="the closed connection let go")
        await close(writer)
        reader, writer = await _connect(gw.port)  # a new connection that never sends: closed too
        assert await asyncio.wait_for(reader.read(), 10) == b""
        await close(writer)


async def test_at_the_cap_the_longest_waiting_connection_makes_room(database: Database, tmp_path: Path) -> None:
    async with echo_gateway(
        make_settings(**{**FAST, "head_timeout_s": 30, "max_connections": 2}), database, tmp_path
    ) as gw:
        oldest = await _connect(gw.port, b"POST /v1/x HTTP/1.1\r\n")
        second = await _connect(gw.port, b"POST /v1/x HTTP/1.1\r\n")
        reader, writer = await _connect(gw.port, post("/v1/x", b"served"))
        status, _, body = await asyncio.wait_for(read_response(reader), 10)
        assert status == 200 and json.loads(body)["body"] == "served"
        status, _, error = await _error(oldest[0])
        assert status == 408 and "LEDGER_MAX_CONNECTIONS" in error["message"]
        assert gw.live.app.metrics.connections_shed == 1
        for conn_writer in (writer, oldest[1], second[1]):
            await close(conn_writer)


async def test_at_the_cap_the_body_furthest_behind_the_minimum_rate_makes_room(
    database: Database, tmp_path: Path
) -> None:
    """Issue #52: a body under way never made room, so bodies trickled again whenever they were cut kept every slot.
    Now the one furthest behind `min_body_rate` does (its grace not counted); a body on pace keeps its slot."""
    settings = make_settings(**{**FAST, "body_timeout_s": 30, "max_connections": 3, "min_body_rate": 100})
    async with echo_gateway(settings, database, tmp_path) as gw:
        budget = gw.live.server.request_bytes
        whole = post("/v1/x", b"x" * 1000)
        furthest = await _connect(gw.port, whole[:-990])  # 10 bytes: on pace for 0.1 s
        await wait_until(lambda: budget.held == 10, what="the first body begun")
        await asyncio.sleep(0.2)
        behind = await _connect(gw.port, whole[:-990])
        on_pace = await _connect(gw.port, whole[:-500])  # 500 bytes: on pace for 5 s
        await wait_until(lambda: budget.held == 520, what="every body begun")
        await asyncio.sleep(0.2)  # both short ones are behind now, the first further
        reader, writer = await _connect(gw.port, post("/v1/x", b"served"))
        status, _, body = await asyncio.wait_for(read_response(reader), 10)
        assert status == 200 and json.loads(body)["body"] == "served"
        status, headers, error = await _error(furthest[0])
        assert status == 408 and headers["connection"] == "close" and error["code"] == "request_timeout"
        assert "LEDGER_MAX_CONNECTIONS" in error["message"] and "LEDGER_MIN_BODY_RATE" in error["message"]
        assert gw.live.app.metrics.connections_shed == 1
        on_pace[1].write(whole[-500:])  # kept its slot: its request is served
        status, _, body = await asyncio.wait_for(read_response(on_pace[0]), 10)
        assert status == 200 and len(json.loads(body)["body"]) == 1000
        for conn_writer in (writer, furthest[1], behind[1], on_pace[1]):
            await close(conn_writer)
    assert gw.upstream.handled == [b"served", b"x" * 1000]


async def test_at_the_cap_with_every_connection_busy_a_new_one_gets_503(database: Database, tmp_path: Path) -> None:
    # the busy body is on pace (5 bytes at 1 byte/s: for 5 s); one behind it would make room (above)
    settings = make_settings(**{**FAST, "body_timeout_s": 30, "max_connections": 1, "min_body_rate": 1})
    async with echo_gateway(settings, database, tmp_path) as gw:
        busy = await _connect(gw.port, post("/v1/x", b"0123456789")[:-5])
        budget = gw.live.server.request_bytes
        await wait_until(lambda: budget.held == 5, what="the busy connection's head read, its body begun")
        reader, writer = await _connect(gw.port, post("/v1/x", b"refused"))
        status, headers, error = await _error(reader)
        assert status == 503 and headers["connection"] == "close" and error["code"] == "gateway_busy"
        assert await reader.read() == b""
        assert gw.live.app.metrics.connections_refused == 1
        await close(writer)
        await close(busy[1])


async def test_request_bodies_over_the_shared_budget_get_503_and_the_budget_comes_back(
    database: Database, tmp_path: Path
) -> None:
    settings = make_settings(**{**FAST, "body_timeout_s": 30, "max_request_bytes_in_flight": 1000})
    async with echo_gateway(settings, database, tmp_path) as gw:
        budget = gw.live.server.request_bytes
        holding = await _connect(gw.port, post("/v1/x", b"a" * 2000)[:-1200])  # 800 bytes held, stalled
        await wait_until(lambda: budget.held == 800, what="800 bytes held")
        reader, writer = await _connect(gw.port, post("/v1/x", b"b" * 500))
        status, _, error = await _error(reader)
        assert status == 503 and "LEDGER_MAX_REQUEST_BYTES_IN_FLIGHT" in error["message"]
        assert budget.held == 800 and gw.live.app.metrics.requests_refused_busy == 1
        await close(writer)
        small, small_writer = await _connect(gw.port, post("/v1/x", b"c" * 100))
        status, _, _ = await asyncio.wait_for(read_response(small), 10)
        assert status == 200 and budget.held == 800  # a finished request gives its bytes back
        await close(small_writer)
        await close(holding[1])


async def test_admin_paths_are_under_the_same_body_limits(database: Database, tmp_path: Path) -> None:
    """`/_ledger/` bodies are read by the gateway first: a stalled one is cut (408), a large one refused (413)."""
    settings = make_settings(**{**FAST, "max_body_bytes": 100})
    async with echo_gateway(settings, database, tmp_path) as gw:
        reader, writer = await _connect(gw.port, post("/_ledger/api/runs", b"0123456789")[:-5])
        status, _, error = await _error(reader)
        assert status == 408 and "LEDGER_BODY_TIMEOUT_S" in error["message"]
        await close(writer)
        reader, writer = await _connect(gw.port, post("/_ledger/api/runs", b"x" * 101))
        status, _, error = await _error(reader)
        assert status == 413 and error["code"] == "request_too_large"
        await close(writer)
        reader, writer = await _connect(gw.port, b"GET /_ledger/health HTTP/1.1\r\nhost: t\r\n\r\n")
        status, _, body = await asyncio.wait_for(read_response(reader), 10)
        assert status == 200 and json.loads(body)["status"] == "ok"
        await close(writer)
    assert gw.upstream.handled == []
