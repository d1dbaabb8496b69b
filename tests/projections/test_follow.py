"""The follower coroutine (for `ledger serve`): applies events as they commit."""

from __future__ import annotations

import asyncio
import contextlib

from sqlalchemy import event, insert, select

from tests.projections.helpers import append, finished, started
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.events import CallRetagged, new_event, utc_now
from usage_ledger.ledger.schema import checkpoints
from usage_ledger.projections.engine import PROJECTIONS, catch_up, catch_up_all, follow_projections, projection_status
from usage_ledger.projections.tables import calls as calls_table


async def test_follow_applies_new_events(database: Database) -> None:
    task = asyncio.create_task(follow_projections(database, poll_interval_s=0.05))
    try:
        await append(database, started("a", 0, run="r"), finished("a", 0, 3))
        for _ in range(200):
            status = {s.name: s for s in await projection_status(database)}
            if status["calls"].checkpoint == 2:
                break
            await asyncio.sleep(0.05)
        assert status["calls"].lag == 0 and status["calls"].live
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_pass_with_nothing_new_writes_nothing(database: Database) -> None:
    """The follower passes every half second: once each projection has its pointer and is caught
    up, a pass only reads (on SQLite any write statement takes the lock the gateway appends with)."""
    await append(database, started("a", 0, run="r"), finished("a", 0, 3))
    await catch_up_all(database)
    statements: list[str] = []

    def record(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        statements.append(statement)

    event.listen(database.engine.sync_engine, "before_cursor_execute", record)
    try:
        assert await catch_up_all(database) == {name: 2 for name in PROJECTIONS}
    finally:
        event.remove(database.engine.sync_engine, "before_cursor_execute", record)
    assert statements, "the pass read nothing: the recorder saw no statement"
    writes = [s for s in statements if s.split()[0].upper() in ("INSERT", "UPDATE", "DELETE") or "IMMEDIATE" in s]
    assert writes == []


async def test_runners_at_once_fold_outside_the_lock_and_agree_with_one(database: Database) -> None:
    """Runners with different page sizes catch up one version at once, so pages overlap and most
    calls start in one page and finish or get retagged in another. Each folds a page before taking
    the write lock; one that finds the checkpoint moved meanwhile folds again from there. A retag
    counts (`retags`), so a page applied twice would show. The rows equal a single runner's."""
    events = []
    for i in range(12):
        c, t = f"c{i}", float(i)
        events += [started(c, t, run="r", ticker=f"T{i % 3}"), finished(c, t, t + 5, completion=10 + i)]
        events.append(new_event(CallRetagged(call_id=c, reason="fix", tags={"n": str(i)}), stream=f"call-{c}"))
    await append(database, *events)
    async with database.engine.begin() as conn:  # two fresh versions of `calls`, both from position 0
        for version in (7, 8):
            await conn.execute(
                insert(checkpoints).values(projection="calls", version=version, position=0, updated_at=utc_now())
            )
    positions = await asyncio.gather(*(catch_up(database, "calls", 7, page_size=size) for size in (2, 3, 5, 7)))
    assert positions == [len(events)] * 4
    await catch_up(database, "calls", 8)
    projection = PROJECTIONS["calls"]
    async with database.engine.connect() as conn:
        assert await projection.digest(conn, 7) == await projection.digest(conn, 8)
        rows = (
            await conn.execute(
                select(calls_table.c.output_tokens, calls_table.c.retags).where(calls_table.c.version == 7)
            )
        ).all()
    assert sorted(tuple(r) for r in rows) == [(10 + i, 1) for i in range(12)]


async def test_a_catch_up_writes_its_checkpoint_as_the_schema_reads_it(database: Database) -> None:
    """On SQLite the write runs as plain `sqlite3` statements on the appender's thread: its
    timestamp must read back through `UTCDateTime` like one SQLAlchemy wrote."""
    before = utc_now()
    await append(database, started("a", 0, run="r"), finished("a", 0, 3))
    assert await catch_up(database, "calls") == 2
    async with database.engine.connect() as conn:
        position, updated_at = (
            await conn.execute(
                select(checkpoints.c.position, checkpoints.c.updated_at).where(checkpoints.c.projection == "calls")
            )
        ).one()
    assert position == 2
    assert before <= updated_at <= utc_now()
