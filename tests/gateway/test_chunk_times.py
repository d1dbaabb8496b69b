"""Chunk arrival gaps of `call.finished` / `call.failed`, in the blob `chunk_gaps_blob` names: `ledger compare`'s ITL."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from tests.gateway.conftest import Rig
from tests.gateway.scripted import Request, Server
from tests.gateway.test_errors import events, gateway_with
from tests.gateway.upstream import sse_chunks
from usage_ledger.gateway import observed
from usage_ledger.gateway.metrics import Metrics
from usage_ledger.gateway.observed import Observed
from usage_ledger.gateway.sse import SseScanner
from usage_ledger.ledger.blobs import blob_hash, read_blob
from usage_ledger.ledger.chunk_gaps import decode_chunk_gaps
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.events import CallFailed, CallFinished, CallStarted, decode_event, encode_event
from usage_ledger.ledger.read import iter_events
from usage_ledger.ledger.schema import blobs


class Clock:
    """`time.time_ns` that says what the test sets."""

    def __init__(self) -> None:
        self.us = 1_770_000_000_000_000

    def time_ns(self) -> int:
        return self.us * 1000


def _us(moment: datetime | None) -> int:
    assert moment is not None
    return (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


async def _stored_gaps(database: Database, event: CallFinished | CallFailed) -> list[int]:
    """The gaps in the blob the event names, as stored (the blob's name is its content's hash)."""
    assert event.chunk_gaps_blob is not None
    async with database.engine.connect() as conn:
        data = await read_blob(conn, event.chunk_gaps_blob)
    assert blob_hash(data) == event.chunk_gaps_blob
    return decode_chunk_gaps(data)


async def _stored_blobs(database: Database) -> set[str | None]:
    async with database.engine.connect() as conn:
        return set((await conn.execute(select(blobs.c.hash))).scalars())


def _observe_reads(reads: list[list[bytes]], steps_us: list[int], monkeypatch: pytest.MonkeyPatch) -> Observed:
    """Feed each read's chunks to one `Observed`, the clock advancing by `steps_us[i]` before read i."""
    clock = Clock()
    monkeypatch.setattr(observed, "time", clock)
    seen = Observed(Metrics(), injected=False, on_forced_usage=lambda: True)
    scanner = SseScanner()
    for chunks, step in zip(reads, steps_us, strict=True):
        clock.us += step
        seen.events(scanner.feed(b"".join(chunks)))
    return seen


def test_gaps_are_the_clock_steps_between_reads_and_zero_inside_one(monkeypatch: pytest.MonkeyPatch) -> None:
    role, *content, done = sse_chunks(6, include_usage=False)
    reads = [[role], [content[0]], [content[1], content[2]], [content[3]], [content[4], content[5], done]]
    seen = _observe_reads(reads, [100, 2_000, 1_500, 40_000, 7], monkeypatch)
    # the role chunk carries no text: the first gap is from content chunk 0 (read 2) to read 3
    assert seen.chunk_gaps_us == [1_500, 0, 40_000, 7, 0]
    assert seen.first_token is not None and seen.last_token is not None
    assert round((seen.last_token - seen.first_token) * 1_000_000) == sum(seen.chunk_gaps_us)
    digest, data = seen.gaps_blob()
    assert data == b"[1500,0,40000,7,0]" and digest == blob_hash(data)


def test_one_content_chunk_has_no_gap_blob(monkeypatch: pytest.MonkeyPatch) -> None:
    role, first, done = sse_chunks(1, include_usage=False)
    seen = _observe_reads([[role], [first, done]], [100, 2_000], monkeypatch)
    assert seen.first_token is not None and seen.chunk_gaps_us == []
    assert seen.gaps_blob() == (None, None)


def test_a_long_stream_keeps_its_first_gaps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(observed, "MAX_CHUNK_GAPS", 4)
    _, *content, _ = sse_chunks(10, include_usage=False)
    seen = _observe_reads([[c] for c in content], [10 * (i + 1) for i in range(10)], monkeypatch)
    assert seen.chunk_gaps_us == [20, 30, 40, 50]
    assert seen.deltas == 10  # counting goes on past the cap
    assert decode_chunk_gaps(seen.gaps_blob()[1] or b"") == [20, 30, 40, 50]


@pytest.mark.parametrize("split", [1, 5])
async def test_a_recorded_stream_gaps_add_up_to_its_token_interval(rig: Rig, split: int) -> None:
    rig.upstream.split = split
    rig.upstream.delay_s = 0.001
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":12}'
    resp = await rig.client.post("/v1/chat/completions", content=body)
    assert resp.status_code == 200
    _, finished = await rig.events()
    assert isinstance(finished, CallFinished)
    gaps = await _stored_gaps(rig.database, finished)
    assert len(gaps) == 12 - 1 and all(g >= 0 for g in gaps)
    timings = finished.timings
    assert sum(gaps) == _us(timings.last_token) - _us(timings.first_token)


async def test_a_long_streams_gaps_are_in_a_blob_and_its_event_stays_small(rig: Rig) -> None:
    rig.upstream.delay_s = 0.0002
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":1000}'
    resp = await rig.client.post("/v1/chat/completions", content=body)
    assert resp.status_code == 200
    payloads = [stored.payload async for stored in iter_events(rig.database) if stored.type == "call.finished"]
    (payload,) = payloads
    finished = decode_event(payload)
    assert isinstance(finished, CallFinished) and finished.chunk_count == 1 + 1000  # the role chunk, 1,000 tokens
    assert len(payload.encode()) < 2_000  # 1,000 gaps in the payload were ≈ 6 KB
    gaps = await _stored_gaps(rig.database, finished)
    assert len(gaps) == 1000 - 1
    assert finished.chunk_gaps_blob in await _stored_blobs(rig.database)
    assert sum(gaps) == _us(finished.timings.last_token) - _us(finished.timings.first_token)


async def test_a_body_has_no_gaps_and_older_events_still_decode(rig: Rig) -> None:
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":3}'
    assert (await rig.client.post("/v1/chat/completions", content=body)).status_code == 200
    started, finished = await rig.events()
    assert isinstance(started, CallStarted) and isinstance(finished, CallFinished)
    assert finished.chunk_gaps_blob is None
    assert await _stored_blobs(rig.database) == {started.request_blob, finished.response_blob}  # the bodies only
    old = encode_event(finished).replace(b',"chunk_gaps_blob":null', b"")
    assert b"chunk_gaps_blob" not in old
    assert decode_event(old) == finished
    # written by the unreleased list field (the gaps in the payload): decodes, without gaps
    listed = old.replace(b',"timings"', b',"chunk_gaps_us":[1500,0],"timings"')
    assert listed != old and decode_event(listed) == finished


async def three_chunks_then_gone(request: Request, writer: asyncio.StreamWriter) -> bool:
    """A stream's head and three content events, a little apart, then the connection closes mid-body."""
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
    for text in (b"a", b"b", b"c"):
        event = b'data: {"choices":[{"delta":{"content":"%s"}}]}\n\n' % text
        writer.write(b"%x\r\n%s\r\n" % (len(event), event))
        await writer.drain()
        await asyncio.sleep(0.005)
    return False


async def test_a_failed_stream_keeps_the_gaps_it_saw(database: Database, tmp_path: Path) -> None:
    async with Server(three_chunks_then_gone) as server, gateway_with(database, tmp_path, server.url) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.post(
                "/v1/chat/completions", content=b'{"stream":true,"stream_options":{"include_usage":true}}'
            )
    _, failed = await events(database)
    assert isinstance(failed, CallFailed) and failed.reason == "upstream_reset"
    gaps = await _stored_gaps(database, failed)
    assert len(gaps) == 2
    assert sum(gaps) == _us(failed.timings.last_token) - _us(failed.timings.first_token)
