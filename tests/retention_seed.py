"""Ledgers with old and new runs whose calls have bodies, one of them shared (issue #55's retention tests)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

from usage_ledger.ledger import (
    BlobNotFound,
    CallFinished,
    CallStarted,
    Database,
    NewEvent,
    Timings,
    Usage,
    append_events,
    new_event,
    open_database,
    read_blob,
)
from usage_ledger.ledger.blobs import BlobCompressor, PreparedBlob

DAY0 = datetime(2026, 6, 1, 9, 0, tzinfo=UTC)
SHARED = b'{"model": "m", "messages": [{"role": "user", "content": "the same prompt in two runs"}]}' * 4


def _body(text: str) -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": text * 40}]}).encode()


class Seeded:
    """Calls of runs `old` (day 0) and `new` (day 10), each with a request and a response body; the first call
    of each run sends the same request (`SHARED`): one stored body both runs reference."""

    def __init__(self) -> None:
        self.events: list[NewEvent] = []
        self.blobs: list[PreparedBlob] = []
        self.bodies: dict[str, list[str]] = {"old": [], "new": []}
        self.calls: dict[str, list[str]] = {"old": [], "new": []}
        self.shared = ""
        compressor = BlobCompressor()
        for run, day in (("old", 0), ("new", 10)):
            for i in range(6):
                call_id = f"{run}-{i}"
                start = DAY0 + timedelta(days=day, seconds=30 * i)
                request = SHARED if i == 0 else _body(f"{run} prompt {i} ")
                response = _body(f"{run} answer {i} ")
                hashes = []
                for data in (request, response):
                    prepared = compressor.prepare(data)
                    if prepared is not None:
                        self.blobs.append(prepared)
                        compressor.remember([prepared.hash])
                    hashes.append(prepared.hash if prepared is not None else self.shared)
                if i == 0 and run == "old":
                    self.shared = hashes[0]
                if i != 0:
                    self.bodies[run].append(hashes[0])
                self.bodies[run].append(hashes[1])
                self.calls[run].append(call_id)
                started = CallStarted(
                    call_id=call_id,
                    received_at=start,
                    method="POST",
                    path="/v1/chat/completions",
                    run=run,
                    tags={"ticker": f"T{i}"},
                    request_blob=hashes[0],
                    model="m",
                )
                finished = CallFinished(
                    call_id=call_id,
                    status=200,
                    response_blob=hashes[1],
                    usage=Usage(prompt_tokens=1000 + i, completion_tokens=100 + i, total_tokens=1100 + 2 * i),
                    usage_source="reported",
                    timings=Timings(received=start, finished=start + timedelta(seconds=20)),
                )
                stream = f"call-{call_id}"
                self.events += [
                    new_event(started, stream=stream, occurred_at=start),
                    new_event(finished, stream=stream, occurred_at=start + timedelta(seconds=20)),
                ]

    async def __call__(self, database: Database) -> None:
        await append_events(database, self.events, self.blobs)


async def gone(url: str, digests: list[str]) -> list[bool]:
    """For each of `digests`: True if its body is gone (erased, or never stored)."""
    database = open_database(url, null_pool=True)
    found = []
    try:
        async with database.engine.connect() as conn:
            for digest in digests:
                try:
                    await read_blob(conn, digest)
                    found.append(False)
                except BlobNotFound:
                    found.append(True)
    finally:
        await database.dispose()
    return found


def bodies_gone(url: str, digests: list[str]) -> list[bool]:
    """`gone`, for a test without a running loop."""
    return asyncio.run(gone(url, digests))
