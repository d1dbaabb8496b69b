"""PostgreSQL appends through `ledger_head`: several appenders, one gap-free chain; bodies committed before it; a
small batch's rows written out in its COMMIT's message, stored as given.

On PostgreSQL only (SQLite's appender has no separate bodies transaction; the head table is
checked on both backends in `test_head_row_is_the_tail_on_both_backends`).
"""

from __future__ import annotations

import asyncio
import sys
import textwrap
from collections.abc import AsyncIterator

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select, text

from tests.ledger.helpers import call_events, migrated
from usage_ledger.ledger import pg_append
from usage_ledger.ledger.append import append_events
from usage_ledger.ledger.blobs import BlobCompressor, blob_hash, read_blob
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.errors import LedgerError
from usage_ledger.ledger.events import CallStarted, NewEvent, encode_event, new_event
from usage_ledger.ledger.migrate import downgrade_database, upgrade_database
from usage_ledger.ledger.read import head_position, iter_events
from usage_ledger.ledger.schema import blobs
from usage_ledger.ledger.verify import verify_chain

APPENDER = textwrap.dedent(
    """
    import asyncio, sys
    from usage_ledger.ledger.append import append_events
    from usage_ledger.ledger.blobs import BlobCompressor, blob_hash
    from usage_ledger.ledger.db import open_database
    from tests.ledger.helpers import call_events

    SHARED = b"the same request body in every process " * 40  # all insert it: ON CONFLICT races

    async def main(url: str, worker: int) -> None:
        database = open_database(url)
        blob = BlobCompressor().prepare(SHARED)
        async def one(task: int) -> None:
            for batch in range(15):
                index = worker * 100_000 + task * 1_000 + batch
                await append_events(database, call_events(index, body_hash=blob_hash(SHARED)), [blob])
        await asyncio.gather(*(one(task) for task in range(3)))  # three appends queued at once per process
        await database.dispose()

    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
    """
)


@pytest.fixture
async def pg_database(fresh_pg_url: str) -> AsyncIterator[Database]:
    async with migrated(fresh_pg_url) as db:
        yield db


async def _head(database: Database) -> tuple[int, str]:
    async with database.engine.connect() as conn:
        row = (await conn.execute(text("SELECT position, hash FROM ledger_head"))).one()
        tail = (
            await conn.execute(text("SELECT position, hash FROM ledger_events ORDER BY position DESC LIMIT 1"))
        ).first()
    assert tail is not None
    assert (row.position, row.hash) == (tail.position, tail.hash), "ledger_head is not the chain's tail"
    return int(row.position), str(row.hash)


async def test_four_processes_append_one_gap_free_chain(pg_database: Database) -> None:
    workers = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-c", APPENDER, pg_database.url, str(worker), stderr=asyncio.subprocess.PIPE
        )
        for worker in range(4)
    ]
    for worker in workers:
        _, stderr = await asyncio.wait_for(worker.communicate(), 180)
        assert worker.returncode == 0, stderr.decode()
    report = await verify_chain(pg_database)
    assert report.ok, report
    assert report.checked == report.head_position == 4 * 3 * 15 * 2
    positions = [e.position async for e in iter_events(pg_database)]
    assert positions == list(range(1, 4 * 3 * 15 * 2 + 1))
    assert (await _head(pg_database))[0] == report.head_position
    async with pg_database.engine.connect() as conn:
        assert await conn.scalar(select(func.count()).select_from(blobs)) == 1


async def test_bodies_of_a_failed_batch_stay_committed_and_its_retry_stores_them_once(pg_database: Database) -> None:
    body = b'{"messages": [{"role": "user", "content": "' + b"MSFT guidance " * 500 + b'"}]}'
    digest = blob_hash(body)
    prepared = BlobCompressor().prepare(body)
    assert prepared is not None
    good = call_events(1, body_hash=digest)
    # a stream longer than the column allows: the events' INSERT fails after the bodies were committed
    started = good[0].body
    assert isinstance(started, CallStarted)
    bad = [new_event(started, stream="call-" + "x" * 300, event_id=good[0].event_id, occurred_at=good[0].occurred_at)]
    await append_events(pg_database, call_events(0))
    with pytest.raises(LedgerError, match="too long"):
        await append_events(pg_database, bad, [prepared])
    async with pg_database.engine.connect() as conn:
        assert await read_blob(conn, digest) == body  # committed before the events' transaction failed
    assert (await _head(pg_database))[0] == 2  # the head did not move
    again = await append_events(pg_database, good, [prepared])  # the retry (from the spool) names the same body
    assert (again.appended, again.duplicates, again.last_position) == (2, 0, 4)
    async with pg_database.engine.connect() as conn:
        assert await conn.scalar(select(func.count()).select_from(blobs)) == 1
        assert await read_blob(conn, digest) == body
    report = await verify_chain(pg_database)
    assert report.ok and report.checked == 4, report


async def test_head_row_is_the_tail_on_both_backends(database: Database) -> None:
    second, third = call_events(2), call_events(3)
    await append_events(database, call_events(1) + second)
    await append_events(database, second + third)  # two already stored: the head moves by two
    assert (await _head(database))[0] == 6
    await append_events(database, third)  # all stored already: nothing moves
    assert (await _head(database))[0] == 6


async def test_upgrade_fills_the_head_from_a_ledger_with_events(database: Database) -> None:
    await append_events(database, call_events(1) + call_events(2))
    await downgrade_database(database, "0004")
    await upgrade_database(database)
    assert (await _head(database))[0] == 4
    await append_events(database, call_events(3))
    report = await verify_chain(database)
    assert report.ok and report.checked == 6, report


async def test_a_head_behind_the_events_is_refused_and_the_documented_repair_restores_appends(
    pg_database: Database,
) -> None:
    await append_events(pg_database, call_events(1) + call_events(2))
    async with pg_database.engine.begin() as conn:  # what an older gateway's append after the upgrade leaves
        await conn.execute(
            text("UPDATE ledger_head SET position = 2, hash = (SELECT hash FROM ledger_events WHERE position = 2)")
        )
    with pytest.raises(LedgerError, match="the head is behind the events"):
        await append_events(pg_database, call_events(3))
    async with pg_database.engine.begin() as conn:  # docs/operations.md, Several gateways
        await conn.execute(
            text(
                "UPDATE ledger_head SET (position, hash) = "
                "(SELECT position, hash FROM ledger_events ORDER BY position DESC LIMIT 1) WHERE id = 1"
            )
        )
    assert (await append_events(pg_database, call_events(3))).last_position == 6
    report = await verify_chain(pg_database)
    assert report.ok and report.checked == 6, report


def _named(events: list[NewEvent], stream: str, run: str) -> list[NewEvent]:
    """`events` in `stream`, their `call.started` with `run` (text that reaches the payload)."""
    started = events[0].body
    assert isinstance(started, CallStarted)
    return [
        new_event(
            msgspec.structs.replace(started, run=run),
            stream=stream,
            occurred_at=events[0].occurred_at,
            event_id=events[0].event_id,
        ),
        new_event(events[1].body, stream=stream, occurred_at=events[1].occurred_at, event_id=events[1].event_id),
    ]


async def _stored_as_given(url: str, texts: list[str]) -> None:
    """Each text as a run (in the payload) and a stream name (without NUL, which PostgreSQL's text refuses): what is
    stored is what was given, and the chain computed in Python over it verifies from the stored rows."""
    async with migrated(url) as database:
        async with database.engine.connect() as conn:
            before = await head_position(conn)
        batch = [
            event
            for index, value in enumerate(texts)
            for event in _named(call_events(before + index), value[:255].replace("\x00", ""), value)
        ]
        await append_events(database, batch)
        stored = [e async for e in iter_events(database, before)]
        assert [(e.stream, e.payload) for e in stored] == [(e.stream, encode_event(e.body).decode()) for e in batch]
        report = await verify_chain(database)
        assert report.ok, report


_ANY_TEXT = st.text(alphabet=st.characters(codec="utf-8"), min_size=1)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    texts=st.lists(
        _ANY_TEXT | st.sampled_from(["$$", "$q$", "'", "\\'", "$q0$x$q0$", "E'\\x27'"]), min_size=1, max_size=4
    )
)
def test_text_written_out_in_the_insert_reaches_the_ledger_unchanged(fresh_pg_url: str, texts: list[str]) -> None:
    """The appender writes a batch's values out in its INSERT, dollar-quoted (`pg_append._written_out`)."""
    asyncio.run(_stored_as_given(fresh_pg_url, texts))


async def test_a_batch_beyond_the_written_out_size_is_stored_the_same(pg_database: Database) -> None:
    """Beyond `_WRITTEN_OUT_MAX` events an append's rows go as binary arrays, then COMMIT."""
    texts = ["$$", "$q$", "'", "\\'", "\u00e9\u2603\U0001f600", '"}]', "\n\t"] * 6
    assert 2 * len(texts) > pg_append._WRITTEN_OUT_MAX
    await _stored_as_given(pg_database.url, texts)


async def test_a_quoting_tag_found_in_the_text_is_drawn_again(
    pg_database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    drawn = iter(["0001", "0002"])
    monkeypatch.setattr("secrets.token_hex", lambda _n: next(drawn))  # pg_append draws its tags from it
    await _stored_as_given(pg_database.url, ["ends in $q0001$; DROP TABLE ledger_events; --"])
    assert next(drawn, None) is None  # the first tag was in the text: a second one was drawn


async def test_an_append_returns_only_once_the_wal_holds_its_commit(pg_database: Database) -> None:
    """The events' COMMIT does not wait for the WAL flush (the head is released before it); the append returns only
    after the second transaction of `pg_append._COMMIT`, whose COMMIT does. Read from the WAL itself (pg_walinspect):
    each append's commit record lies below the flushed end as soon as the append returns (without that transaction,
    the WAL writer flushes an asynchronous commit within 200 ms: most would not)."""
    async with pg_database.engine.begin() as conn:
        await conn.execute(text("CREATE EXTENSION IF NOT EXISTS pg_walinspect"))
        start = (await conn.execute(text("SELECT pg_current_wal_insert_lsn()"))).scalar_one()
    for index in range(1, 21):
        await append_events(pg_database, call_events(index))
        async with pg_database.engine.connect() as conn:
            flushed = (await conn.execute(text("SELECT pg_current_wal_flush_lsn()"))).scalar_one()
            committed = await conn.scalar(
                text(
                    "SELECT count(*) FROM pg_get_wal_records_info(CAST(:start AS pg_lsn), CAST(:flushed AS pg_lsn)) "
                    "WHERE resource_manager = 'Transaction' AND record_type = 'COMMIT' "
                    "AND xid = (SELECT xmin FROM ledger_events WHERE position = :position)"
                ),
                {"start": start, "flushed": flushed, "position": 2 * index},
            )
        assert committed == 1, f"append {index}: its commit is not in the WAL flushed when it returned"
    report = await verify_chain(pg_database)
    assert report.ok and report.checked == 40, report
