"""Any string a client can send is recorded exactly, and the projections advance past it on both backends.

NUL, lone surrogates and invalid UTF-8 in the model (JSON body), path, query and X-Ledger-* headers:
the ledger keeps the exact bytes; the follower and a rebuild (bulk SQL + Python fold) both reach the
head with the same rows; reports show each value under the one rule of `projections.text` (U+0000 as
U+FFFD). Before that rule a `\\u0000` stalled every PostgreSQL projection at its checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterator, MutableMapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from litestar import Litestar
from litestar.testing import AsyncTestClient

from tests.gateway.live import live_gateway, serving
from tests.gateway.wire import read_response
from tests.projections.helpers import T0, append, assert_projections_at_head, at, finished, projection_digests
from usage_ledger.answers.api import build_api_routers
from usage_ledger.answers.reports import runs_report, tickers_report
from usage_ledger.gateway.settings import GatewaySettings
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.events import CallImported, CallStarted, RunAnnotated, new_event
from usage_ledger.ledger.read import iter_events
from usage_ledger.ledger.spool import Spool
from usage_ledger.ledger.writer import EventWriter
from usage_ledger.projections.annotations import load_annotations
from usage_ledger.projections.engine import PROJECTIONS, catch_up_all, live_version
from usage_ledger.projections.rebuild import rebuild_projection
from usage_ledger.projections.text import projection_tags, projection_text

_serial = itertools.count()
_checked = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# Every Python string an event can hold (msgspec cannot encode a lone surrogate, so none is stored),
# with NUL, other controls and the characters PostgreSQL's JSON parser treats specially made likely.
_odd = st.sampled_from(["\x00", "\x01", "\x7f", "\\", '"', "\\u0000", "\u2028", "\ufffd", "\ufffe", "\U0010ffff"])
_text = st.lists(st.one_of(_odd, st.characters(exclude_categories=["Cs"])), min_size=1, max_size=12).map("".join)


async def _follow_then_rebuild(database: Database) -> None:
    """The follower, then a full rebuild: both reach the head, with the same rows."""
    await catch_up_all(database)
    await assert_projections_at_head(database)
    followed = await projection_digests(database)
    for name in PROJECTIONS:
        await rebuild_projection(database, name)
    assert await projection_digests(database) == followed
    await catch_up_all(database)  # past the `projection.promoted` events the rebuilds appended
    await assert_projections_at_head(database)


@_checked
@given(model=_text, run=_text, ticker=_text, tag=_text, path=_text, query=_text, source=_text, label=_text)
async def test_event_strings_are_projected_by_the_follower_and_the_rebuild(
    database: Database, model: str, run: str, ticker: str, tag: str, path: str, query: str, source: str, label: str
) -> None:
    n = next(_serial)
    run = f"{run}#{n}"  # runs of earlier examples stay in the ledger
    tags = {"ticker": ticker, f"k{tag}": tag}
    started = CallStarted(
        call_id=f"s{n}", received_at=at(n), method="POST", path=path, query=query, run=run, tags=tags, model=model
    )
    imported = CallImported(
        call_id=f"i{n}",
        source=source,
        line=1,
        started_at=at(n),
        finished_at=at(n + 1),
        input_tokens=3,
        output_tokens=2,
        run=run,
        tags=tags,
        model=model,
    )
    note = RunAnnotated(run=run, labels={label: label})
    await append(
        database,
        new_event(started, stream=f"call-s{n}", occurred_at=at(n)),
        finished(f"s{n}", n, n + 10),
        new_event(imported, stream=f"call-i{n}", occurred_at=at(n)),
        new_event(note, stream=f"run-{n}", occurred_at=at(n)),
    )
    await _follow_then_rebuild(database)

    shown_run, shown_tags = projection_text(run), projection_tags(tags)
    [row] = await runs_report(database, run=shown_run, refresh=False)
    assert (row.calls, row.model, row.labels) == (2, projection_text(model), projection_tags({label: label}))
    tickers = await tickers_report(database, run=shown_run, refresh=False)
    assert [(t.ticker, t.calls) for t in tickers] == [(shown_tags["ticker"], 2)]
    app = Litestar(route_handlers=build_api_routers(database))
    async with AsyncTestClient(app) as client:
        for call_id in (f"s{n}", f"i{n}"):
            view = (await client.get(f"/calls/{call_id}")).json()
            assert (view["run"], view["model"], view["tags"]) == (shown_run, projection_text(model), shown_tags)
        page = await client.get("/calls", params={"run": run})  # a filter is read under the same rule
        assert page.status_code == 200 and len(page.json()["items"]) == 2
    async with database.engine.connect() as conn:
        notes = await load_annotations(conn, (await live_version(conn, "annotations"))[0])
    assert notes[-1].run == shown_run
    stored = [e.body() async for e in iter_events(database)]
    assert started in stored and imported in stored and note in stored  # the ledger keeps the exact strings


class _Upstream:
    """Answers every request with a small chat completion (whatever its path, headers or body)."""

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        body = b'{"id":"c","object":"chat.completion","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}'
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})


_bytes = st.one_of(
    _text.map(lambda s: s.encode("utf-8")),
    st.binary(min_size=1, max_size=12),  # invalid UTF-8 among them
    st.sampled_from([b"\x00", b"\xed\xa0\x80", b"\xff\xfe", b"%00", b"%ed%a0%80", b"\\u0000", b"\x85"]),
)
# header values a client may well send (no controls: those are refused), and now and then any bytes at all
_no_controls = st.sampled_from(["\\", '"', "\\u0000", "%00", "\u2028", "\x85", "\ufffd", "\ufffe", "\U0010ffff"])
_header_text = st.lists(
    st.one_of(_no_controls, st.characters(exclude_categories=["Cs", "Cc"])), min_size=1, max_size=12
).map("".join)
_header = st.one_of(*[_header_text.map(lambda s: s.encode("utf-8"))] * 3, _bytes)
_json_model = st.one_of(
    _text.map(lambda s: json.dumps(s).encode()),  # escapes: \u0000, \\, \"
    st.sampled_from([b'"\\ud800"', b'"a\\udc00b"', b'"\\u0000"', b'"x\\u0000\\u0000"']),  # lone surrogates
    _bytes.map(lambda b: b'"' + b.replace(b"\\", b"").replace(b'"', b"") + b'"'),  # raw bytes, maybe invalid
)


# What the gateway's HTTP parser refuses in a request target (a 400 before anything is recorded):
# controls, space, DEL and every byte from 0x80; in a header value, controls but tab, and DEL.
_NOT_IN_TARGET = bytes([*range(0x21), 0x7F, *range(0x80, 0x100)])


def _escaped(raw: bytes, unsafe: bytes) -> bytes:
    """`raw` with the bytes in `unsafe` percent-encoded (as a client library would), every other byte as it is."""
    return b"".join(b"%%%02X" % b if b in unsafe else bytes([b]) for b in raw)


@pytest.fixture
async def gateway(database: Database, tmp_path: Path) -> AsyncIterator[int]:
    """The gateway's own HTTP/1.1 server on a loopback port (the bytes a client sends reach it as sent)."""
    async with (
        serving(_Upstream()) as upstream_url,
        EventWriter(database, Spool(tmp_path / "spool")) as writer,
        live_gateway(
            GatewaySettings(max_body_bytes=1 << 20), database=database, writer=writer, upstream=upstream_url
        ) as gw,
    ):
        yield int(gw.url.rsplit(":", 1)[1])


async def _send(port: int, head: bytes, body: bytes) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head + b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body) + body)
        await writer.drain()
        return await read_response(reader)
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


@_checked
@given(
    model=_json_model,
    segment=_bytes,
    query=_bytes,
    run=_header,
    tag=_header,
    raw_target=st.sampled_from([False, False, False, True]),
)
async def test_gateway_records_any_bytes_and_projections_advance(
    database: Database,
    gateway: int,
    model: bytes,
    segment: bytes,
    query: bytes,
    run: bytes,
    tag: bytes,
    raw_target: bool,
) -> None:
    n = next(_serial)
    refused = b" ?#/\r\n" if raw_target else _NOT_IN_TARGET + b"?#/"  # raw: controls and UTF-8 bytes as they are
    raw_path = b"/v1/" + _escaped(segment, refused) + b"/chat/completions"
    query = _escaped(query, refused.replace(b"?", b"").replace(b"/", b""))
    run_value, tag_value = _escaped(run, b"\r\n") + b"#%d" % n, _escaped(tag, b"\r\n")
    body = b'{"model":' + model + b',"messages":[],"max_tokens":2}'
    head = b"POST %s?%s HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n" % (raw_path, query)
    head += b"x-ledger-run: %s\r\nx-ledger-tag-note: %s\r\n" % (run_value, tag_value)
    before = await _call_count(database)
    status, headers, answer = await _send(gateway, head, body)
    event("recorded" if status == 200 else f"answered {status}: {answer[:60]!r}")  # --hypothesis-show-statistics
    assert status in (200, 400), answer
    if status == 400:  # a request line the parser refuses, or an X-Ledger-* value that is not a tag: nothing recorded
        assert b"header x-ledger-" in answer or b"x-ledger" not in answer, answer
        assert await _call_count(database) == before
        return
    call_id = headers["x-ledger-call-id"]
    started, *_ = [e.body() async for e in iter_events(database) if e.stream == f"call-{call_id}"]
    assert isinstance(started, CallStarted)
    assert started.path.encode("latin-1") == raw_path and started.query.encode("latin-1") == query  # exact bytes
    assert started.run == run_value.decode().strip() and started.tags == {"note": tag_value.decode().strip()}
    try:
        sent_model: str | None = msgspec.json.decode(model, type=str)
    except msgspec.DecodeError:  # lone surrogates, invalid UTF-8: no model read, the body blob holds the bytes
        sent_model = None
    assert started.model == sent_model
    await _follow_then_rebuild(database)
    [row] = await runs_report(database, run=projection_text(started.run), refresh=False)
    assert row.model == (None if sent_model is None else projection_text(sent_model))


async def _call_count(database: Database) -> int:
    return sum([1 async for e in iter_events(database) if e.type == "call.started"])


async def test_a_nul_in_a_json_string_no_longer_stalls_postgresql(database: Database) -> None:
    """The issue's case: one `\\u0000` and every projection stopped at checkpoint 0 (PostgreSQL)."""
    body = CallStarted(call_id="nul", received_at=T0, method="POST", path="/v1/chat/completions", model="m\x00")
    await append(
        database,
        new_event(body, stream="call-nul", occurred_at=T0),
        finished("nul", 0, 1),
        new_event(RunAnnotated(run="r\x00", labels={"k\x00": "v\x00"}), stream="run-r", occurred_at=T0),
    )
    await _follow_then_rebuild(database)
    [row] = await runs_report(database, refresh=False)
    assert row.model == "m\ufffd" and row.wall_s == timedelta(seconds=1).total_seconds()
