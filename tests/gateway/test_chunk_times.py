"""Chunk arrival times on `call.finished` / `call.failed` (`chunk_gaps_us`), the input of `ledger compare`'s ITL."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from tests.gateway.conftest import Rig
from tests.gateway.scripted import Request, Server
from tests.gateway.test_errors import events, gateway_with
from tests.gateway.upstream import sse_chunks
from usage_ledger.gateway import observed
from usage_ledger.gateway.metrics import Metrics
from usage_ledger.gateway.observed import Observed
from usage_ledger.gateway.sse import SseScanner
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.events import CallFailed, CallFinished, decode_event, encode_event


class Clock:
    """`time.time_ns` that says what the test sets."""

    def __init__(self) -> None:
        self.us = 1_770_000_000_000_000

    def time_ns(self) -> int:
        return self.us * 1000


def _us(moment: datetime | None) -> int:
    assert moment is not None
    return (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


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


def test_a_long_stream_keeps_its_first_gaps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(observed, "MAX_CHUNK_GAPS", 4)
    _, *content, _ = sse_chunks(10, include_usage=False)
    seen = _observe_reads([[c] for c in content], [10 * (i + 1) for i in range(10)], monkeypatch)
    assert seen.chunk_gaps_us == [20, 30, 40, 50]
    assert seen.deltas == 10  # counting goes on past the cap


@pytest.mark.parametrize("split", [1, 5])
async def test_a_recorded_stream_gaps_add_up_to_its_token_interval(rig: Rig, split: int) -> None:
    rig.upstream.split = split
    rig.upstream.delay_s = 0.001
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":12}'
    resp = await rig.client.post("/v1/chat/completions", content=body)
    assert resp.status_code == 200
    _, finished = await rig.events()
    assert isinstance(finished, CallFinished)
    gaps = finished.chunk_gaps_us
    assert len(gaps) == 12 - 1 and all(g >= 0 for g in gaps)
    timings = finished.timings
    assert sum(gaps) == _us(timings.last_token) - _us(timings.first_token)
    stored = decode_event(encode_event(finished))  # the stored payload keeps them (a new field with a default)
    assert isinstance(stored, CallFinished) and stored.chunk_gaps_us == gaps


async def test_a_body_has_no_gaps_and_old_events_still_decode(rig: Rig) -> None:
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":3}'
    assert (await rig.client.post("/v1/chat/completions", content=body)).status_code == 200
    _, finished = await rig.events()
    assert isinstance(finished, CallFinished) and finished.chunk_gaps_us == []
    old = encode_event(finished).replace(b',"chunk_gaps_us":[]', b"")
    assert b"chunk_gaps_us" not in old
    assert decode_event(old) == finished


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
    assert len(failed.chunk_gaps_us) == 2
    assert sum(failed.chunk_gaps_us) == _us(failed.timings.last_token) - _us(failed.timings.first_token)
