"""`appending`: many batches in one transaction on both backends — all of them or none, one chain."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection

from tests.gateway.relay import TcpCut
from tests.ledger.helpers import allow_inserts, call_events, refuse_inserts
from usage_ledger.ledger.append import append_events, appending
from usage_ledger.ledger.db import Database, open_database
from usage_ledger.ledger.errors import DatabaseUnavailable, LedgerError
from usage_ledger.ledger.migrate import upgrade_database
from usage_ledger.ledger.read import head_position, iter_events
from usage_ledger.ledger.verify import verify_chain


async def _head(database: Database) -> int:
    async with database.engine.connect() as conn:  # another connection: it sees committed rows only
        return await head_position(conn)


async def _end_the_blocks_connection(conn: AsyncConnection) -> None:
    """The server ends the block's connection, idle between its batches (a restart, a failover)."""
    ended = await conn.exec_driver_sql(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid() AND state = 'idle in transaction'"
    )
    assert ended.scalars().all() == [True]


async def test_the_batches_commit_together_when_the_block_ends(database: Database) -> None:
    await append_events(database, call_events(0))
    async with appending(database) as stream:
        first = await stream.add(call_events(1) + call_events(2))
        second = await stream.add(call_events(3))
        assert (first.appended, first.last_position, second.last_position) == (4, 6, 8)
        assert await _head(database) == 2  # nothing of the block is visible before it commits
    assert (stream.result.appended, stream.result.duplicates, stream.result.last_position) == (6, 0, 8)
    assert await _head(database) == 8
    report = await verify_chain(database)
    assert report.ok and report.checked == 8
    stored = [e.stream async for e in iter_events(database)]
    assert stored == [f"call-call{i:06d}" for i in range(4) for _ in range(2)]


async def test_an_error_in_the_block_appends_none_of_it(database: Database) -> None:
    await append_events(database, call_events(0))
    with pytest.raises(RuntimeError, match="the caller failed"):
        async with appending(database) as stream:
            await stream.add(call_events(1))
            await stream.add(call_events(2))
            raise RuntimeError("the caller failed")
    assert await _head(database) == 2
    again = await append_events(database, call_events(1))  # the appender serves everyone again
    assert (again.appended, again.last_position) == (2, 4)
    assert (await verify_chain(database)).ok


async def test_stored_ids_are_duplicates_and_the_rest_is_chained(database: Database) -> None:
    one, two, three = call_events(1), call_events(2), call_events(3)
    await append_events(database, one)
    async with appending(database) as stream:
        mixed = await stream.add(one + two)  # the optimistic insert is redone
        repeated = await stream.add(two + three)  # stored by this block's own batch
    assert (mixed.appended, mixed.duplicates, repeated.appended, repeated.duplicates) == (2, 2, 2, 2)
    report = await verify_chain(database)
    assert report.ok and report.checked == 6


async def test_a_failed_batch_ends_the_transaction(database: Database) -> None:
    """Once a batch failed, the block's earlier batches are gone too: a later `add` and the commit refuse."""
    await refuse_inserts(database, "call-call000002")
    with pytest.raises(LedgerError, match="has ended"):
        async with appending(database) as stream:
            await stream.add(call_events(1))
            with pytest.raises(LedgerError, match="refused by test"):
                await stream.add(call_events(2))
            with pytest.raises(LedgerError, match="failed earlier"):
                await stream.add(call_events(3))
            # the block swallows its errors: the commit still cannot bring back what was rolled back
    assert await _head(database) == 0
    await allow_inserts(database)
    assert (await append_events(database, call_events(4))).last_position == 2
    assert (await verify_chain(database)).ok


async def test_a_connection_lost_mid_block_appends_none_of_it(fresh_pg_url: str) -> None:
    """PostgreSQL: the server drops the block's connection between two batches (a restart, a failover)."""
    database = open_database(fresh_pg_url, null_pool=True)
    await upgrade_database(database)
    try:
        with pytest.raises(DatabaseUnavailable):
            async with appending(database) as stream:
                await stream.add(call_events(1))
                async with database.engine.connect() as conn:
                    await _end_the_blocks_connection(conn)
                await stream.add(call_events(2))
        assert await _head(database) == 0
        assert (await append_events(database, call_events(3))).last_position == 2  # connects again
        assert (await verify_chain(database)).ok
    finally:
        await database.dispose()


async def test_the_servers_goodbye_read_before_its_eof_is_a_lost_connection_too(fresh_pg_url: str) -> None:
    """The client has read the server's FATAL (57P01) on its idle connection but not yet the EOF behind it: asyncpg
    then fails the next statement with an InternalClientError, and that is the database unavailable, not a fault."""
    parsed = make_url(fresh_pg_url)
    relay = TcpCut(parsed.host or "127.0.0.1", parsed.port or 5432)
    await relay.start()
    database = open_database(parsed.set(port=relay.port).render_as_string(hide_password=False), null_pool=True)
    direct = open_database(fresh_pg_url, null_pool=True)  # not through the relay: its goodbyes are not held
    await upgrade_database(database)
    try:
        with pytest.raises(DatabaseUnavailable):
            async with appending(database) as stream:
                await stream.add(call_events(1))
                relay.hold_server_close = True  # the block's connection is the only one through the relay now
                async with direct.engine.connect() as conn:
                    await _end_the_blocks_connection(conn)
                await asyncio.sleep(0.5)  # the goodbye reaches the block's connection; the relay holds the EOF
                await stream.add(call_events(2))
        relay.hold_server_close = False
        assert await _head(database) == 0
        assert (await append_events(database, call_events(3))).last_position == 2  # connects again
    finally:
        await direct.dispose()
        await database.dispose()
        await relay.cut()


async def test_appends_of_the_same_process_wait_for_the_block(database: Database) -> None:
    async with appending(database) as stream:
        await stream.add(call_events(1))
        waiting = asyncio.create_task(append_events(database, call_events(9)))
        await asyncio.sleep(0)  # the append is queued behind the block: it must not land inside it
        await stream.add(call_events(2))
    other = await waiting
    assert other.last_position == 6
    assert [e.stream async for e in iter_events(database)][-1] == "call-call000009"
    assert (await verify_chain(database)).ok


async def test_another_appender_waits_for_the_block_and_chains_after_it(database: Database) -> None:
    """Another process's appender (a gateway): it waits for the lock and its events follow the block's."""
    gateway = open_database(database.url, null_pool=True)
    try:
        async with appending(database) as stream:
            await stream.add(call_events(1))
            waiting = asyncio.create_task(append_events(gateway, call_events(9)))
            await stream.add(call_events(2))
            assert not waiting.done()
        assert (await waiting).last_position == 6
    finally:
        await gateway.dispose()
    report = await verify_chain(database)
    assert report.ok and report.checked == 6
