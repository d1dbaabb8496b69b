"""Small builders shared by the ledger tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta

from usage_ledger.ledger.db import Database, open_database
from usage_ledger.ledger.events import CallFinished, CallStarted, NewEvent, Timings, Usage, new_event
from usage_ledger.ledger.migrate import upgrade_database
from usage_ledger.ledger.read import head_position

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def call_events(index: int, *, body_hash: str | None = None) -> list[NewEvent]:
    call_id = f"call{index:06d}"
    start = T0 + timedelta(seconds=index)
    started = CallStarted(
        call_id=call_id,
        received_at=start,
        method="POST",
        path="/v1/chat/completions",
        run="r1",
        tags={"ticker": f"T{index % 100:03d}"},
        request_blob=body_hash,
        model="m",
    )
    finished = CallFinished(
        call_id=call_id,
        status=200,
        usage=Usage(prompt_tokens=100, completion_tokens=10, total_tokens=110),
        usage_source="reported",
        timings=Timings(received=start, finished=start + timedelta(seconds=2)),
    )
    stream = f"call-{call_id}"
    return [new_event(started, stream=stream, occurred_at=start), new_event(finished, stream=stream, occurred_at=start)]


def head_of(url: str) -> int:
    """The ledger's head position at `url` (a CLI test's check that nothing was appended)."""

    async def run() -> int:
        database = open_database(url, null_pool=True)
        try:
            async with database.engine.connect() as conn:
                return await head_position(conn)
        finally:
            await database.dispose()

    return asyncio.run(run())


@contextlib.asynccontextmanager
async def migrated(url: str) -> AsyncIterator[Database]:
    """The ledger at `url`, migrated, open (no pool: each test's own connections) until the block ends."""
    database = open_database(url, null_pool=True)
    try:
        await upgrade_database(database)
        yield database
    finally:
        await database.dispose()


async def build_ledger(url: str, *fill: Callable[[Database], Awaitable[object]]) -> str:
    """Migrate the ledger at `url` and run each of `fill` on it (a seed), for code under test that opens the
    database itself (the CLI, a server process); returns `url`."""
    async with migrated(url) as database:
        for step in fill:
            await step(database)
    return url


async def refuse_inserts(database: Database, stream: str) -> None:
    """A trigger refusing the events of `stream`: a database error in the middle of a transaction."""
    async with database.engine.begin() as conn:
        for statement in _REFUSE[database.backend]:
            await conn.exec_driver_sql(statement.replace("STREAM", stream))


async def allow_inserts(database: Database) -> None:
    async with database.engine.begin() as conn:
        for statement in _ALLOW[database.backend]:
            await conn.exec_driver_sql(statement)


_REFUSE = {
    "sqlite": [
        "CREATE TRIGGER t_refuse BEFORE INSERT ON ledger_events WHEN NEW.stream = 'STREAM' "
        "BEGIN SELECT RAISE(ABORT, 'refused by test'); END"
    ],
    "postgresql": [
        "CREATE FUNCTION t_refuse() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN RAISE EXCEPTION 'refused by test'; END $$",
        "CREATE TRIGGER t_refuse BEFORE INSERT ON ledger_events FOR EACH ROW WHEN (NEW.stream = 'STREAM') "
        "EXECUTE FUNCTION t_refuse()",
    ],
}
_ALLOW = {
    "sqlite": ["DROP TRIGGER t_refuse"],
    "postgresql": ["DROP TRIGGER t_refuse ON ledger_events", "DROP FUNCTION t_refuse()"],
}
