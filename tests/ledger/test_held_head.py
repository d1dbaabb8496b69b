"""An append lock held by someone else (issue #52, 4): the writer's health says so while its append waits; on
PostgreSQL the append gives up after `pg_lock_timeout_s` and spools, and replays once the lock is free.

Before: health said `ok` however long an append waited, and a PostgreSQL append waited as long as the holder held.
(The holder stopped for real, and the server ending its transaction: tests/reliability/test_frozen_peer.py.)"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import text

from tests._polling import wait_until
from tests.ledger.helpers import build_ledger, call_events
from usage_ledger.ledger.db import Database, open_database
from usage_ledger.ledger.read import iter_events
from usage_ledger.ledger.settings import StorageSettings
from usage_ledger.ledger.spool import Spool
from usage_ledger.ledger.verify import verify_chain
from usage_ledger.ledger.writer import EventWriter


def _waiting(writer: EventWriter) -> bool:
    return any("an append has waited" in problem for problem in writer.problems)


async def test_health_says_degraded_while_an_append_waits_for_the_lock(database: Database, tmp_path: Path) -> None:
    events = call_events(1)
    async with EventWriter(database, Spool(tmp_path / "spool"), retry_interval_s=0.2) as writer:
        assert not writer.problems
        if database.backend == "sqlite":
            path = database.engine.url.database
            assert path is not None
            holder = sqlite3.connect(path, isolation_level=None)
            holder.execute("BEGIN IMMEDIATE")  # SQLite's append lock, held by another process's connection

            async def release() -> None:
                holder.close()

        else:
            conn = await database.engine.connect()
            await conn.execute(text("SELECT position FROM ledger_head WHERE id = 1 FOR UPDATE"))  # in its transaction

            async def release() -> None:
                await conn.close()  # rolled back: the lock is free

        done = writer.submit(events)
        try:
            await wait_until(lambda: _waiting(writer), timeout_s=20, what="health to say the append waits")
        finally:
            await release()
        assert await asyncio.wait_for(done, 60) in ("committed", "spooled")
        await wait_until(lambda: not writer.problems, timeout_s=20, what="health to clear once the lock is free")
    assert [e.event_id async for e in iter_events(database)] == [e.event_id for e in events]
    assert (await verify_chain(database)).ok


async def test_a_postgresql_append_gives_up_on_a_held_head_and_spools(fresh_pg_url: str, tmp_path: Path) -> None:
    await build_ledger(fresh_pg_url)
    database = open_database(fresh_pg_url, null_pool=True, pg_lock_timeout_s=0.5)
    holder = await database.engine.connect()
    batches = [call_events(1), call_events(2)]
    try:
        async with EventWriter(database, Spool(tmp_path / "spool"), retry_interval_s=0.2) as writer:
            await holder.execute(text("SELECT position FROM ledger_head WHERE id = 1 FOR UPDATE"))
            # held for as long as this test likes: the append must not wait that long
            assert await asyncio.wait_for(writer.append(batches[0]), 60) == "spooled"
            assert writer.spooling and any("stayed locked" in p for p in writer.problems), writer.problems
            assert await asyncio.wait_for(writer.append(batches[1]), 60) == "spooled"
            await holder.rollback()
            await wait_until(lambda: not writer.spooling, timeout_s=20, what="the spool replayed once the head is free")
        stored = [e.event_id async for e in iter_events(database)]
        assert stored == [e.event_id for batch in batches for e in batch]
        assert (await verify_chain(database)).ok
    finally:
        await holder.close()
        await database.dispose()


def test_the_timeouts_are_settings_and_refuse_negative_values() -> None:
    assert StorageSettings().pg_lock_timeout_s > 0 and StorageSettings().pg_idle_in_transaction_timeout_s > 0
    with pytest.raises(ValueError, match="LEDGER_PG_LOCK_TIMEOUT_S must not be negative"):
        StorageSettings(pg_lock_timeout_s=-1)
