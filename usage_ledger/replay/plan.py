"""What `ledger replay` sends: the recorded requests of a run, in start order, and why some are skipped.

What is sent and what is skipped: docs/decide.md ("Replay"). Bodies are read when their request is
dispatched (`load_body`), not all up front: the seed run (1,700 calls, ~10.8k-token prompts, DESIGN §7)
holds some 70 MB of them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import datetime

import msgspec
from sqlalchemy import select

from usage_ledger.answers import iter_calls
from usage_ledger.gateway import is_secret_name
from usage_ledger.ledger import (
    BlobNotFound,
    CallStarted,
    Database,
    Erasure,
    blob_erasures,
    call_stream,
    decode_event,
    read_blob,
)
from usage_ledger.ledger.schema import blobs, events
from usage_ledger.projections import CallView

__all__ = (
    "REPLAYED_HEADERS",
    "ReplayPlan",
    "ReplayRequest",
    "SkipReason",
    "load_body",
    "max_in_flight",
    "plan_replay",
    "with_model",
)

REPLAYED_HEADERS = frozenset({"content-type", "content-encoding", "accept"})
"""Recorded request headers sent again: how to read the body and what to answer with. Nothing else
(user agents, request ids, forwarded-for) says anything about the workload."""

SkipReason = str
IMPORTED = "imported call (history has no request)"
NO_BODY = "request without a body"
REDACTED = "request body redacted"
NOT_STORED = "request body not in the blob store"
COMPRESSED = "compressed body (--model cannot rewrite it)"
NOT_JSON = "body is not a JSON object (--model cannot rewrite it)"
_CHUNK = 500


class ReplayRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One recorded request to send again (its body is read at dispatch: `load_body`)."""

    call_id: str
    """The original call."""
    method: str
    path: str
    query: str
    headers: list[tuple[str, str]]
    body_blob: str
    tags: dict[str, str]
    model: str | None = None
    """The model the recorded request named (`call.started`)."""


class ReplayPlan(msgspec.Struct, frozen=True, kw_only=True):
    run: str
    calls: int
    """Calls of the run examined (all of them, or until `--limit` requests were found)."""
    requests: list[ReplayRequest]
    skipped: dict[SkipReason, int]
    max_in_flight: int
    """The run's most calls at once, from their start and end times (at least 1)."""


def max_in_flight(spans: Sequence[tuple[datetime, datetime | None]]) -> int:
    """Most calls running at one moment; a call ending exactly when another starts does not overlap it."""
    moments: list[tuple[datetime, int]] = []
    for start, end in spans:
        moments.append((start, 1))
        if end is not None:
            moments.append((end, -1))
    moments.sort()  # at one moment the ends (-1) come first
    running = peak = 0
    for _, step in moments:
        running += step
        peak = max(peak, running)
    return max(peak, 1)


async def plan_replay(
    database: Database, run: str, *, limit: int | None = None, model: str | None = None, run_gap_s: float = 900.0
) -> ReplayPlan:
    """The requests of `run` in start order (`NotFound` for an unknown run)."""
    views = [view async for view in iter_calls(database, run=run, run_gap_s=run_gap_s)]
    peak = max_in_flight([(view.started_at, view.ended_at) for view in views])
    skipped: Counter[str] = Counter()
    requests: list[ReplayRequest] = []
    examined = 0
    for start in range(0, len(views), _CHUNK):
        chunk = views[start : start + _CHUNK]
        found = await _started_events(database, [v.call_id for v in chunk if v.origin == "gateway"])
        stored = await _stored_blobs(database, [e.request_blob for e in found.values() if e.request_blob])
        for view in chunk:
            if limit is not None and len(requests) >= limit:
                break
            examined += 1
            request, reason = _request(view, found.get(view.call_id), stored, model)
            if request is not None:
                requests.append(request)
            else:
                skipped[reason] += 1
    return ReplayPlan(run=run, calls=examined, requests=requests, skipped=dict(skipped), max_in_flight=peak)


def _request(
    view: CallView, started: CallStarted | None, stored: dict[str, SkipReason | None], model: str | None
) -> tuple[ReplayRequest | None, SkipReason]:
    if started is None:
        return None, IMPORTED
    if started.request_blob is None:
        return None, NO_BODY
    if started.request_blob not in stored:
        return None, NOT_STORED
    gone = stored[started.request_blob]
    if gone is not None:
        return None, gone
    headers = [
        (name, value)
        for name, value in started.request_headers
        if name.lower() in REPLAYED_HEADERS and not is_secret_name(name)
    ]
    if model is not None and any(name.lower() == "content-encoding" for name, _ in headers):
        return None, COMPRESSED
    request = ReplayRequest(
        call_id=view.call_id,
        method=started.method,
        path=started.path,
        query=_without_secrets(started.query),
        headers=headers,
        body_blob=started.request_blob,
        tags=view.tags,
        model=started.model,
    )
    return request, ""


async def _started_events(database: Database, call_ids: list[str]) -> dict[str, CallStarted]:
    if not call_ids:
        return {}
    query = select(events.c.payload).where(
        events.c.stream.in_([call_stream(call_id) for call_id in call_ids]), events.c.type == "call.started"
    )
    async with database.engine.connect() as conn:
        payloads = (await conn.execute(query)).scalars().all()
    found = (decode_event(payload) for payload in payloads)
    return {event.call_id: event for event in found if isinstance(event, CallStarted)}


async def _stored_blobs(database: Database, digests: list[str]) -> dict[str, SkipReason | None]:
    """For each stored blob: None if its content is still there, else why not (when and why it was erased)."""
    if not digests:
        return {}
    query = select(blobs.c.hash, blobs.c.redacted_at).where(blobs.c.hash.in_(sorted(set(digests))))
    async with database.engine.connect() as conn:
        rows = (await conn.execute(query)).all()
        erasures = await blob_erasures(conn, [digest for digest, redacted_at in rows if redacted_at is not None])
    return {digest: None if redacted_at is None else _redacted(erasures.get(digest)) for digest, redacted_at in rows}


def _redacted(erasure: Erasure | None) -> SkipReason:
    """`REDACTED`, with the day and the reason of its `blob.redacted` event (`ledger redact`, retention)."""
    if erasure is None:
        return REDACTED
    return f"{REDACTED} on {erasure.recorded_at.date().isoformat()} ({erasure.reason})"


async def load_body(database: Database, request: ReplayRequest, model: str | None) -> bytes | SkipReason:
    """The body to send, or why it cannot be (redacted since the plan was made, or not rewritable)."""
    try:
        async with database.engine.connect() as conn:
            body = await read_blob(conn, request.body_blob)
    except BlobNotFound:
        return (await _stored_blobs(database, [request.body_blob])).get(request.body_blob) or NOT_STORED
    if model is None:
        return body
    rewritten = with_model(body, model)
    return NOT_JSON if rewritten is None else rewritten


def _without_secrets(query: str) -> str:
    """The recorded query minus parameters with secret names (their stored values are fingerprints)."""
    kept = [part for part in query.split("&") if not is_secret_name(part.partition("=")[0])]
    return "&".join(kept)


def with_model(body: bytes, model: str) -> bytes | None:
    """`body` with the value of its top-level `model` member(s) replaced, every other byte as recorded;
    a body without one gets `"model":…` after its opening brace. None when it is not a JSON object."""
    try:
        if not isinstance(msgspec.json.decode(body), dict):
            return None
    except msgspec.DecodeError:
        return None
    value = msgspec.json.encode(model)
    spans = _model_spans(body)
    if not spans:
        brace = body.index(b"{")
        rest = body[brace + 1 :]
        return body[: brace + 1] + b'"model":' + value + (b"," if rest.strip() != b"}" else b"") + rest
    out, last = [], 0
    for start, end in spans:
        out += [body[last:start], value]
        last = end
    out.append(body[last:])
    return b"".join(out)


_SPACE = b" \t\r\n"


def _skip_space(body: bytes, i: int) -> int:
    while body[i] in _SPACE:
        i += 1
    return i


def _string_end(body: bytes, i: int) -> int:
    """Index after the JSON string that starts at `i` (UTF-8 continuation bytes never equal `"` or `\\`)."""
    i += 1
    while body[i] != 0x22:
        i += 2 if body[i] == 0x5C else 1
    return i + 1


def _value_end(body: bytes, i: int) -> int:
    if body[i] == 0x22:
        return _string_end(body, i)
    if body[i] in b"{[":
        depth = 0
        while True:
            if body[i] == 0x22:
                i = _string_end(body, i)
                continue
            if body[i] in b"{[":
                depth += 1
            elif body[i] in b"}]":
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
    while body[i] not in b",}]" and body[i] not in _SPACE:
        i += 1
    return i


def _model_spans(body: bytes) -> list[tuple[int, int]]:
    """Byte spans of the values of the top-level `model` members of a valid JSON object."""
    spans: list[tuple[int, int]] = []
    i = _skip_space(body, 0) + 1
    while True:
        i = _skip_space(body, i)
        if body[i] == 0x7D:  # }
            return spans
        key_end = _string_end(body, i)
        is_model = msgspec.json.decode(body[i:key_end]) == "model"  # also `"mod\u0065l"`
        i = _skip_space(body, _skip_space(body, key_end) + 1)  # past the colon
        end = _value_end(body, i)
        if is_model:
            spans.append((i, end))
        i = _skip_space(body, end)
        if body[i] == 0x2C:  # ,
            i += 1
