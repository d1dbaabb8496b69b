"""Loading the calls read model in bulk, in SQL: a full rebuild without a Python pass over every event.

    plain calls (`call.started`, then at most one `call.finished` / `call.failed`, nothing else)
        ──json fields, typed, derived──► `rebuild_rows` ──INSERT … SELECT──► rows of the new version
    every other call (imports, retags, repeats, out of order, unusual payloads) ──► the Python fold

Both backends (`_bulk_sqlite`, `_bulk_pg`): one scan per event kind parses each payload once into
work tables (starts with the few imports and retags; ends), which are then paired by call id —
through indexes on SQLite, by hash joins on PostgreSQL — instead of grouping every event. On
PostgreSQL they are the session's temp tables; on SQLite files written by a child process with a
current SQLite (`_sqlite_prepare`), attached to the loading connection.

Everything up to `rebuild_rows` only reads the ledger (`prepare_calls`), so the writer transaction
holds the write lock just for the copy and the few folded calls.

The SELECT computes what `fold_call` computes for a plain call, value for value: timestamps only
in the two shapes msgspec writes for UTC (`…:SSZ`, `…:SS.ffffffZ`), tags only when their stored
JSON is already canonical (sorted by `encode_event`, nothing escaped), durations as integer
microseconds / 10⁶ like `timedelta.total_seconds()`. A call with anything else is left out of the
INSERT and folded in Python afterwards; the digest property test holds the two paths together.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from usage_ledger.ledger.errors import LedgerError
from usage_ledger.projections._bulk_pg import PG_STATEMENTS
from usage_ledger.projections._sqlite_prepare import ROWS_FILES
from usage_ledger.projections.tables import calls

__all__ = ("drop_work_tables", "insert_plain_calls", "prepare_calls", "remaining_positions")

# every column of the view but `version`: `rebuild_rows` has one of each name
_COPIED = ", ".join(c.name for c in calls.columns if c.name != "version")

# where this package was imported from: the child process imports the same code
_ROOT = str(Path(__file__).resolve().parents[2])

_SQLITE_ROWS = ("rebuild", "rebuild_upper")
"""The schemas `ROWS_FILES` are attached as, in order."""
_WORK_TABLES = (
    "rebuild_rows",
    "rebuild_rest",
    "rebuild_starts",
    "rebuild_ends",
    "rebuild_repeated_starts",
    "rebuild_repeated_ends",
)


async def drop_work_tables(conn: AsyncConnection) -> None:
    for table in _WORK_TABLES:
        await conn.execute(text(f"DROP TABLE IF EXISTS {table}"))


async def prepare_calls(
    conn: AsyncConnection, head: int, workdir: Path, progress: Callable[[int, int], None] | None = None
) -> None:
    """Compute the row of every plain call up to `head` and the rest's positions, where `conn` reads them.

    Reads the ledger only (no write lock on SQLite); `insert_plain_calls` then copies the rows.
    PostgreSQL: the session's temp tables. SQLite: a child process writes them to two files in
    `workdir` (`_sqlite_prepare`), which `conn` attaches as `_SQLITE_ROWS`; call it outside a
    transaction, and discard `conn` (or detach) before `workdir` goes.

    `progress(events, head)` while SQLite's scans read the ledger (PostgreSQL: not called).
    """
    if conn.dialect.name == "postgresql":
        async with conn.begin():
            await drop_work_tables(conn)
            for statement in PG_STATEMENTS:
                await conn.execute(text(statement), {"head": head} if ":head" in statement else {})
        return
    ledger = conn.engine.url.database
    assert ledger is not None
    await _run_sqlite_prepare(ledger, workdir, head, progress)
    driver = (await conn.get_raw_connection()).driver_connection
    assert driver is not None
    for schema, name in zip(_SQLITE_ROWS, ROWS_FILES, strict=True):
        cursor = await driver.execute(f"ATTACH DATABASE ? AS {schema}", (str(workdir / name),))
        await cursor.close()


async def _run_sqlite_prepare(
    ledger: str, workdir: Path, head: int, progress: Callable[[int, int], None] | None = None
) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p)}
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "usage_ledger.projections._sqlite_prepare",
        ledger,
        str(workdir),
        str(head),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        start_new_session=True,  # its own process group, with the worker processes it starts
    )

    async def relay_progress(lines: asyncio.StreamReader) -> None:
        """The child's `progress EVENTS HEAD` lines, to `progress`."""
        async for line in lines:
            fields = line.split()
            if progress is not None and len(fields) == 3 and fields[0] == b"progress":
                progress(int(fields[1]), int(fields[2]))

    try:
        assert child.stdout is not None and child.stderr is not None
        _, err = await asyncio.gather(relay_progress(child.stdout), child.stderr.read())
        await child.wait()
    finally:
        if child.returncode is None:  # cancelled: neither the child nor its workers may outlive the load
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            await child.wait()
    if child.returncode != 0:
        reason = err.decode(errors="replace").strip().splitlines()[-1:] or [f"exit status {child.returncode}"]
        raise LedgerError(f"rebuild: reading {ledger} for the bulk load failed: {reason[0]}")


async def insert_plain_calls(conn: AsyncConnection, version: int) -> int:
    """Insert the prepared row of every plain call into `version`; returns how many."""
    if conn.dialect.name == "postgresql":
        sources = [("rebuild_rows", "call_id")]
    else:  # SQLite wrote each half in call-id order, the lower half first
        sources = [(f"{schema}.rebuild_rows", "rowid") for schema in _SQLITE_ROWS]
    inserted = 0
    for table, order in sources:
        select_ = f"SELECT :version, {_COPIED} FROM {table} WHERE plain ORDER BY {order}"
        statement = text(f"INSERT INTO {calls.name} (version, {_COPIED}) {select_}")
        inserted += int((await conn.execute(statement, {"version": version})).rowcount or 0)
    return inserted


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
