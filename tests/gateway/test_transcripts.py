"""The gateway replaying recorded real-vLLM responses: what the client gets, and what the ledger records.

Each transcript (tests/fixtures/vllm-*/CONFIG/CASE.json) is served by a loopback-free ASGI
upstream, as vLLM sent it, one SSE event per piece (or split anywhere). When the gateway asks a
stream for usage, the upstream answers with the same case recorded with `include_usage` (what vLLM
would have sent): the client must still get exactly the bytes of the case it asked for.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import re
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import brotli
import httpx
import pytest
import zstandard

from tests.gateway.live import live_gateway, serving
from tests.gateway.transcripts import (
    Transcript,
    expected_fingerprint,
    expected_metrics,
    expected_usage,
    load_transcripts,
)
from tests.gateway.upstream import read_body
from usage_ledger.gateway.settings import GatewaySettings
from usage_ledger.ledger.db import Database, open_database
from usage_ledger.ledger.events import CallFailed, CallFinished, Event
from usage_ledger.ledger.migrate import upgrade_database
from usage_ledger.ledger.read import iter_events
from usage_ledger.ledger.spool import Spool
from usage_ledger.ledger.writer import EventWriter

TRANSCRIPTS = load_transcripts()
BY_NAME = {t.name: t for t in TRANSCRIPTS}
_IDS = re.compile(rb'"(id|created|created_at)":("[^"]*"|\d+)')
_TIMINGS = re.compile(
    rb'"(time_to_first_token_ms|generation_time_ms|queue_time_ms|mean_itl_ms|tokens_per_second)":[-\d.e]+'
)

if not TRANSCRIPTS:
    pytest.skip("no recorded transcripts under tests/fixtures/vllm-*/ (see docs/real-vllm.md)", allow_module_level=True)


def normalise(body: bytes) -> bytes:
    """Ids, creation times and timing values differ between two recordings of the same request."""
    return _TIMINGS.sub(rb'"\1":0', _IDS.sub(rb'"\1":0', body))


def _asks_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and bool(options.get("include_usage"))


class ReplayUpstream:
    """Answers every request with a transcript's response (the `_usage` twin when the request asks usage)."""

    def __init__(self, transcript: Transcript, *, encoding: str | None = None, split: int = 0) -> None:
        self.transcript = transcript
        self.encoding = encoding
        self.split = split
        self.requests: list[bytes] = []

    def pick(self, forwarded: bytes) -> Transcript:
        t = self.transcript
        try:
            asked = _asks_usage(json.loads(forwarded))
        except ValueError:
            return t
        twin = BY_NAME.get(t.name + "_usage")
        if asked and expected_usage(t) is None and twin is not None:
            return twin  # vLLM asked for usage; a server that forces usage sends it anyway
        return t

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        self.requests.append(body)
        t = self.pick(body)
        payload = t.body
        headers = [(k.encode(), v.encode()) for k, v in t.headers if k not in ("content-length", "date")]
        if self.encoding:
            payload = encode(payload, self.encoding)
            headers.append((b"content-encoding", self.encoding.encode()))
        if not t.is_sse:
            headers.append((b"content-length", str(len(payload)).encode()))
        await send({"type": "http.response.start", "status": t.status, "headers": headers})
        for piece in pieces(payload, self.split, sse=t.is_sse and not self.encoding):
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def encode(body: bytes, encoding: str) -> bytes:
    if encoding == "gzip":
        return gzip.compress(body)
    if encoding == "deflate":
        return zlib.compress(body)
    if encoding == "br":
        return bytes(brotli.compress(body))
    if encoding == "zstd":
        return zstandard.ZstdCompressor().compress(body)
    raise ValueError(encoding)


def pieces(payload: bytes, split: int, *, sse: bool) -> list[bytes]:
    if split:
        return [payload[i : i + split] for i in range(0, len(payload), split)]
    if sse:
        return [event + b"\n\n" for event in payload.split(b"\n\n") if event]
    return [payload]


@pytest.fixture
async def database(tmp_path: Path) -> AsyncIterator[Database]:
    db = open_database(f"sqlite:///{tmp_path / 'ledger.db'}", null_pool=True)
    await upgrade_database(db)
    try:
        yield db
    finally:
        await db.dispose()


async def replay(
    database: Database, tmp_path: Path, upstream: ReplayUpstream, settings: GatewaySettings | None = None
) -> tuple[httpx.Response, list[Event]]:
    settings = settings or GatewaySettings(upstream="http://vllm.test")
    t = upstream.transcript
    async with (
        serving(upstream) as upstream_url,
        EventWriter(database, Spool(tmp_path / "spool")) as writer,
        live_gateway(settings, database=database, writer=writer, upstream=upstream_url) as gateway,
        httpx.AsyncClient(base_url=gateway.url, trust_env=False) as http,
    ):
        resp = await http.request(t.method, t.path, content=t.request_body)
    return resp, [stored.body() async for stored in iter_events(database)]


def final_event(events: list[Event]) -> CallFinished | CallFailed:
    final = [e for e in events if isinstance(e, CallFinished | CallFailed)]
    assert len(final) == 1
    return final[0]


@pytest.mark.parametrize("transcript", TRANSCRIPTS, ids=lambda t: t.name)
async def test_the_client_gets_what_vllm_sent_and_the_ledger_its_usage(
    database: Database, tmp_path: Path, transcript: Transcript
) -> None:
    upstream = ReplayUpstream(transcript)
    resp, events = await replay(database, tmp_path, upstream)
    assert resp.status_code == transcript.status
    if transcript.method != "POST":  # `GET /v1/models`: proxied, not a call
        assert resp.content == transcript.body and events == []
        return
    served = upstream.pick(upstream.requests[-1])
    if served is transcript:
        assert resp.content == transcript.body
    else:  # the gateway asked for usage: the client still gets exactly the stream it asked for
        assert normalise(resp.content) == normalise(transcript.body)
    final = final_event(events)
    assert isinstance(final, CallFinished) and final.status == transcript.status
    expected = expected_usage(served)
    if expected is None:
        assert final.usage is None and final.usage_source == "absent"
    else:
        assert final.usage is not None
        assert (final.usage.prompt_tokens, final.usage.completion_tokens) == expected
        assert final.usage_source == ("reported" if served is transcript else "injected")
    assert final.request_metrics == expected_metrics(served)
    assert final.system_fingerprint == expected_fingerprint(served)
    # each finish reason with the choice it came from: the calls row takes choice 0's
    assert len(final.finish_choices) == len(final.finish_reasons)
    assert not final.finish_reasons or 0 in final.finish_choices


STREAMS = [t for t in TRANSCRIPTS if t.is_sse]


@pytest.mark.parametrize("split", [1, 7, 100])
@pytest.mark.parametrize("transcript", STREAMS[:: max(1, len(STREAMS) // 6)], ids=lambda t: t.name)
async def test_any_split_of_a_stream_gives_the_same_bytes_and_usage(
    database: Database, tmp_path: Path, transcript: Transcript, split: int
) -> None:
    upstream = ReplayUpstream(transcript, split=split)
    resp, events = await replay(database, tmp_path, upstream)
    served = upstream.pick(upstream.requests[-1])
    assert normalise(resp.content) == normalise(transcript.body)
    final = final_event(events)
    usage = final.usage
    got = (usage.prompt_tokens, usage.completion_tokens) if usage else None
    assert got == expected_usage(served)


COMPRESSIBLE = [t for t in TRANSCRIPTS if t.status == 200 and expected_usage(t) is not None]


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br", "zstd"])
@pytest.mark.parametrize("transcript", COMPRESSIBLE[:: max(1, len(COMPRESSIBLE) // 4)], ids=lambda t: t.name)
async def test_a_compressed_response_reaches_the_client_unchanged_and_its_usage_is_read(
    database: Database, tmp_path: Path, transcript: Transcript, encoding: str
) -> None:
    upstream = ReplayUpstream(transcript, encoding=encoding)
    resp, events = await replay(database, tmp_path, upstream)
    served = upstream.pick(upstream.requests[-1])
    final = final_event(events)
    assert final.usage is not None
    assert (final.usage.prompt_tokens, final.usage.completion_tokens) == expected_usage(served)
    if upstream.requests[-1] == transcript.request_body:  # nothing to cut: the bytes as they were sent
        assert resp.headers["content-encoding"] == encoding
        assert resp.content == transcript.body  # httpx decoded what the gateway passed on unchanged
    else:  # a cut may be needed in a compressed stream: the client gets the decoded stream, minus the cut
        assert "content-encoding" not in resp.headers
        assert normalise(resp.content) == normalise(transcript.body)


async def test_an_encoding_the_gateway_cannot_undo_is_recorded_as_unreadable(
    database: Database, tmp_path: Path
) -> None:
    transcript = next(t for t in COMPRESSIBLE if not t.is_sse)
    t = dataclasses.replace(transcript, headers=[*transcript.headers, ("content-encoding", "compress")])
    upstream = ReplayUpstream(t)
    resp, events = await replay(database, tmp_path, upstream)
    assert resp.content == t.body
    final = final_event(events)
    assert final.usage is None and final.usage_source == "unreadable"
    assert "compress" in final.usage_detail


async def test_a_stream_that_arrives_in_one_read_has_no_decode_interval(database: Database, tmp_path: Path) -> None:
    transcript = BY_NAME["defaults/chat_stream_usage"]
    upstream = ReplayUpstream(transcript, split=len(transcript.body))
    _, events = await replay(database, tmp_path, upstream)
    final = final_event(events)
    assert final.timings.first_token is not None
    assert final.timings.first_token == final.timings.last_token  # one moment: no rate can be made up


async def test_once_the_upstream_forces_usage_streams_are_no_longer_rewritten(
    database: Database, tmp_path: Path
) -> None:
    transcript = BY_NAME["force_usage_metrics/chat_stream"]
    upstream = ReplayUpstream(transcript)
    settings = GatewaySettings(upstream="http://vllm.test")
    async with (
        serving(upstream) as upstream_url,
        EventWriter(database, Spool(tmp_path / "spool")) as writer,
        live_gateway(settings, database=database, writer=writer, upstream=upstream_url) as gateway,
        httpx.AsyncClient(base_url=gateway.url, trust_env=False) as http,
    ):
        first = await http.post(transcript.path, content=transcript.request_body)
        second = await http.post(transcript.path, content=transcript.request_body)
    assert first.content == second.content == transcript.body  # the usage chunk the client gets directly, too
    assert upstream.requests[0] != transcript.request_body  # asked once ...
    assert upstream.requests[1] == transcript.request_body  # ... then known: forwarded as sent
    finals = [e for e in [s.body() async for s in iter_events(database)] if isinstance(e, CallFinished)]
    assert [e.usage_source for e in finals] == ["reported", "reported"]


@pytest.mark.parametrize("transcript", [t for t in STREAMS if t.path.endswith("/responses")], ids=lambda t: t.name)
def test_a_responses_stream_is_held_from_its_closing_event(transcript: Transcript) -> None:
    from usage_ledger.gateway.relay import SseRelay
    from usage_ledger.gateway.usage import inspect_chunk

    def observe(events: list[Any]) -> int | None:
        for event in events:
            if event.data and inspect_chunk(event.data).terminal:
                return int(event.start)
        return None

    relay = SseRelay([], observe, cutting=False)
    sent = b"".join(relay.feed(piece) for piece in pieces(transcript.body, 0, sse=True))
    held = relay.close()
    assert sent + held == transcript.body
    assert held.startswith(b"event: response.completed\n") or b'"type":"response.completed"' in held
    assert b"response.completed" not in sent
