"""Loading the calls read model in bulk, in SQL: a full rebuild without a Python pass over every event.

    plain calls (`call.started`, then at most one `call.finished` / `call.failed`, nothing else)
        ──json fields, typed, derived──► temp `rebuild_rows` ──INSERT … SELECT──► rows of the new version
    every other call (imports, retags, repeats, out of order, unusual payloads) ──► the Python fold

Both backends (`_bulk_sqlite`, `_bulk_pg`): one scan per event kind parses each payload once into
temp tables (starts with the few imports and retags; ends), which are then paired by call id —
through indexes on SQLite, by hash joins on PostgreSQL — instead of grouping every event.

Everything up to `rebuild_rows` only reads the ledger (`prepare_calls`), so the writer transaction
holds the write lock just for the copy and the few folded calls.

The SELECT computes what `fold_call` computes for a plain call, value for value: timestamps only
in the two shapes msgspec writes for UTC (`…:SSZ`, `…:SS.ffffffZ`), tags only when their stored
JSON is already canonical (sorted by `encode_event`, nothing escaped), durations as integer
microseconds / 10⁶ like `timedelta.total_seconds()`. A call with anything else is left out of the
INSERT and folded in Python afterwards; the digest property test holds the two paths together.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from projections._bulk_pg import PG_STATEMENTS
from projections._bulk_sqlite import SQLITE_STATEMENTS
from projections.tables import calls

__all__ = ("drop_work_tables", "insert_plain_calls", "prepare_calls", "remaining_positions")

# every column of the view but `version`: `rebuild_rows` has one of each name
_COPIED = ", ".join(c.name for c in calls.columns if c.name != "version")

_WORK_TABLES = (
    "rebuild_rows",
    "rebuild_rest",
    "rebuild_starts",
    "rebuild_ends",
)


async def drop_work_tables(conn: AsyncConnection) -> None:
    for table in _WORK_TABLES:
        await conn.execute(text(f"DROP TABLE IF EXISTS {table}"))


async def prepare_calls(conn: AsyncConnection, head: int) -> None:
    """Compute, in the session's temp tables, the row of every plain call up to `head` and the rest's positions.

    Reads the ledger only (no write lock on SQLite); `insert_plain_calls` then copies the rows.
    """
    await drop_work_tables(conn)
    for statement in PG_STATEMENTS if conn.dialect.name == "postgresql" else SQLITE_STATEMENTS:
        await conn.execute(text(statement), {"head": head} if ":head" in statement else {})


async def insert_plain_calls(conn: AsyncConnection, version: int) -> int:
    """Insert the prepared row of every plain call into `version`; returns how many."""
    order = "call_id" if conn.dialect.name == "postgresql" else "rowid"  # SQLite wrote them in call-id order
    select_ = f"SELECT :version, {_COPIED} FROM rebuild_rows WHERE plain ORDER BY {order}"
    result = await conn.execute(text(f"INSERT INTO {calls.name} (version, {_COPIED}) {select_}"), {"version": version})
    return int(result.rowcount or 0)


async def remaining_positions(conn: AsyncConnection) -> AsyncIterator[list[int]]:
    """Positions of the events of every call left to the Python fold, 1000 calls at a time."""
    after = 0
    while True:
        rows = (
            await conn.execute(
                text("SELECT k, positions FROM rebuild_rest WHERE k > :after ORDER BY k LIMIT :limit"),
                {"after": after, "limit": 1000},
            )
        ).all()
        if not rows:
            return
        after = rows[-1][0]
        yield sorted(int(p) for r in rows for p in r[1].split(","))
