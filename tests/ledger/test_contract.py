"""The ledger contract, run on SQLite and PostgreSQL: append, read, idempotency, order, blobs."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import func, select

from tests.ledger.helpers import call_events
from usage_ledger.ledger.append import append_events
from usage_ledger.ledger.blobs import BlobCompressor, blob_hash, read_blob
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.errors import BlobNotFound
from usage_ledger.ledger.read import follow_events, head_position, iter_events, read_events
from usage_ledger.ledger.schema import blobs
from usage_ledger.ledger.verify import verify_chain
from usage_ledger.ledger.writer import EventWriter


async def test_positions_are_gap_free_in_append_order(database: Database) -> None:
    first = call_events(1) + call_events(2)
    second = call_events(3)
    await append_events(database, first)
    await append_events(database, second)
    stored = [e async for e in iter_events(database, page_size=2)]
    assert [e.position for e in stored] == [1, 2, 3, 4, 5, 6]
    assert [e.event_id for e in stored] == [e.event_id for e in first + second]
    assert [e.type for e in stored] == ["call.started", "call.finished"] * 3
    assert stored[0].body() == first[0].body


async def test_appending_the_same_event_id_twice_is_a_no_op(database: Database) -> None:
    batch = call_events(1)
    assert (await append_events(database, batch)).appended == 2
    again = await append_events(database, batch + call_events(2))
    assert (again.appended, again.duplicates, again.last_position) == (2, 2, 4)
    doubled = await append_events(database, call_events(3) * 2)  # duplicates inside one batch too
    assert (doubled.appended, doubled.duplicates) == (2, 2)
    assert (await verify_chain(database)).checked == 6


async def test_read_events_after_a_checkpoint_pages(database: Database) -> None:
    for index in range(5):
        await append_events(database, call_events(index))
    async with database.engine.connect() as conn:
        assert await head_position(conn) == 10
        page = await read_events(conn, after=3, limit=4)
    assert [e.position for e in page] == [4, 5, 6, 7]


async def test_concurrent_appenders_produce_one_valid_chain(database: Database) -> None:
    async def appender(worker: int) -> None:
        for batch in range(5):
            await append_events(database, call_events(worker * 1000 + batch))

    await asyncio.gather(*(appender(worker) for worker in range(4)))
    report = await verify_chain(database)
    assert report.ok, report
    assert report.checked == report.head_position == 40


async def test_blobs_are_stored_once_compressed_and_read_back(database: Database) -> None:
    body = b'{"messages": [{"role": "user", "content": "' + b"AAPL quarterly revenue " * 2000 + b'"}]}'
    digest = blob_hash(body)
    compressor = BlobCompressor()
    prepared = compressor.prepare(body)
    assert prepared is not None and prepared.codec == "zstd" and len(prepared.content) < len(body) // 10
    await append_events(database, call_events(1, body_hash=digest), [prepared])
    await append_events(database, call_events(2, body_hash=digest), [prepared])  # the same bytes again
    async with database.engine.connect() as conn:
        assert await read_blob(conn, digest) == body
        assert (await conn.execute(select(func.count()).select_from(blobs))).scalar_one() == 1
        with pytest.raises(BlobNotFound):
            await read_blob(conn, "0" * 64)


async def test_writer_group_commits_and_follow_sees_them(database: Database) -> None:
    seen: list[int] = []

    async def follow() -> None:
        async for stored in follow_events(database, 0, poll_interval_s=0.02):
            seen.append(stored.position)
            if len(seen) == 200:
                return

    follower = asyncio.create_task(follow())
    async with EventWriter(database, batch_max_events=500) as writer:
        outcomes = await asyncio.gather(*(writer.append(call_events(i)) for i in range(100)))
    assert set(outcomes) == {"committed"}
    await asyncio.wait_for(follower, 10)
    assert seen == list(range(1, 201))
    assert (await verify_chain(database)).ok


async def test_writer_keeps_submissions_whole_and_in_order_across_batches(database: Database) -> None:
    # batches of at most 7 events: submissions of 1–3 events, one larger than a batch, one empty,
    # one cancelled by its caller; every other one commits whole, in submission order
    sizes = [1 + (i % 3) for i in range(60)] + [12, 0, 2]
    submissions = [[e for k in range(size) for e in call_events(i * 10 + k)][:size] for i, size in enumerate(sizes)]
    async with EventWriter(database, batch_max_events=7) as writer:
        futures = [writer.submit(events) for events in submissions]
        assert writer.queue_depth == len(submissions)
        futures[5].cancel()
        outcomes = await asyncio.gather(*(f for i, f in enumerate(futures) if i != 5))
        assert writer.queue_depth == 0
    assert set(outcomes) == {"committed"}
    stored = [e.event_id async for e in iter_events(database)]
    assert stored == [e.event_id for events in submissions for e in events]  # the cancelled one too: it was queued
    report = await verify_chain(database)
    assert report.ok and report.checked == sum(sizes)


async def test_writer_resolves_thousands_of_submissions_in_one_batch(database: Database) -> None:
    async with EventWriter(database, batch_max_events=5000) as writer:
        outcomes = await asyncio.gather(*(writer.submit(call_events(i)[:1]) for i in range(1200)))
        assert writer.last_position == 1200
    assert outcomes == ["committed"] * 1200
    assert (await verify_chain(database)).checked == 1200


async def test_a_batch_with_a_stored_event_id_still_stores_its_new_events_and_bodies(database: Database) -> None:
    # the optimistic insert fails on the stored id; the retry must keep everything else of the batch
    first = call_events(1)
    await append_events(database, first)
    body = b"a body first seen in the retried batch" * 10
    prepared = BlobCompressor().prepare(body)
    assert prepared is not None
    fresh = call_events(2, body_hash=prepared.hash)
    result = await append_events(database, [fresh[0], first[1], fresh[1], first[0]], [prepared])
    assert (result.appended, result.duplicates, result.last_position) == (2, 2, 4)
    assert [e.event_id async for e in iter_events(database)] == [e.event_id for e in first + fresh]
    async with database.engine.connect() as conn:
        assert await read_blob(conn, prepared.hash) == body
    assert (await verify_chain(database)).ok
