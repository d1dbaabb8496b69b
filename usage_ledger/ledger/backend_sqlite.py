"""The SQLite backend: aiosqlite for reads, WAL, `BEGIN IMMEDIATE` for writers, and every write that shares the
ledger's write lock (appends, read-model rows) on the appender's `sqlite3` thread (`sqlite_append`)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Sequence
from datetime import datetime
from typing import Any, cast

import msgspec
from sqlalchemy import BigInteger, ColumnElement, Delete, Table, event, func
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler

from usage_ledger.ledger.backend import Appender, Checkpoint
from usage_ledger.ledger.events import utc_now
from usage_ledger.ledger.schema import UTCDateTime, checkpoints, seconds_between, sqlite_bind, sqlite_time
from usage_ledger.ledger.sqlite_append import SqliteAppender
from usage_ledger.ledger.sqlite_digest import digest_rows

__all__ = ("SQLITE", "WRITER_OPTION")

# execution option a writer sets on its connection: SQLite then begins with BEGIN IMMEDIATE
WRITER_OPTION = "ledger_writer"
_SECURE_DELETE = ("OFF", "ON", "FAST")  # PRAGMA secure_delete's values, by what it reads back
_TIME_FUNCTION = "ledger_sqlite_time"
_READ_CHECKPOINT = f"SELECT position FROM {checkpoints.name} WHERE projection = ? AND version = ?"
_SET_CHECKPOINT = (
    f"INSERT INTO {checkpoints.name} (projection, version, position, updated_at) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (projection, version) DO UPDATE SET position = excluded.position, updated_at = excluded.updated_at"
)


def _time_sql(param: str) -> str:
    """SQL: the RFC 3339 text msgspec writes for a datetime (`?N`) as `UTCDateTime` stores it on SQLite.

    msgspec writes UTC as `YYYY-MM-DDTHH:MM:SS[.ffffff]Z` (27 or 20 characters; any other offset, or none,
    makes it another length): rewritten here; anything else by `_time_text`, called from SQL.
    """
    return (
        f"CASE length({param}) WHEN 27 THEN replace(substr({param}, 1, 26), 'T', ' ') "
        f"WHEN 20 THEN replace(substr({param}, 1, 19), 'T', ' ') || '.000000' "
        f"ELSE {_TIME_FUNCTION}({param}) END"
    )


def _time_text(text: str | None) -> str | None:
    return None if text is None else sqlite_bind(datetime.fromisoformat(text))


def _upsert_sql(table: Table) -> str:
    """INSERT … ON CONFLICT DO UPDATE of whole rows; datetimes taken as RFC 3339 text and rewritten in SQL
    (`isoformat` per value in Python was the largest part of a fold's time)."""
    key = [c.name for c in table.primary_key.columns]
    values = ", ".join(
        _time_sql(f"?{i}") if isinstance(c.type, UTCDateTime) else f"?{i}" for i, c in enumerate(table.columns, 1)
    )
    update = ", ".join(f"{c.name} = excluded.{c.name}" for c in table.columns if c.name not in key)
    columns = ", ".join(c.name for c in table.columns)
    return (
        f"INSERT INTO {table.name} ({columns}) VALUES ({values}) ON CONFLICT ({', '.join(key)}) DO UPDATE SET {update}"
    )


class _Sqlite:
    name = "sqlite"

    def __init__(self) -> None:
        self._upserts: dict[str, str] = {}

    def ledger_file(self, url: URL) -> str | None:
        return url.database if url.database not in (None, "", ":memory:") else None

    def connect(self, url: str, engine_kwargs: dict[str, Any], options: dict[str, Any]) -> tuple[AsyncEngine, Appender]:
        synchronous = str(options["sqlite_synchronous"]).upper()
        engine_kwargs.setdefault("connect_args", {}).setdefault("timeout", 30)
        driver_url = make_url(url).set(drivername="sqlite+aiosqlite").render_as_string(hide_password=False)
        engine = create_async_engine(driver_url, **engine_kwargs)
        _install_hooks(engine, synchronous)
        return engine, SqliteAppender(make_url(driver_url).database or ":memory:", synchronous)

    def insert(self, table: Table) -> Any:
        return sqlite.insert(table)

    def can_hold(self, text: str) -> bool:
        return True

    async def snapshot(self, conn: AsyncConnection) -> AsyncConnection:
        return conn  # BEGIN holds the WAL snapshot from the first read

    async def fetch(self, conn: AsyncConnection, query: str, params: Sequence[object]) -> list[tuple[Any, ...]]:
        driver = (await conn.get_raw_connection()).driver_connection
        assert driver is not None
        cursor = await driver.execute(query.format(*("?" * len(params))), params)
        try:
            return list(await cursor.fetchall())
        finally:
            await cursor.close()

    async def write_rows(
        self,
        engine: AsyncEngine,
        appender: Appender,
        table: Table,
        rows: Sequence[msgspec.Struct],
        checkpoint: Checkpoint | None = None,
    ) -> bool:
        # One call on the appender's thread, rows converted before the lock is taken (why, and why not
        # synced: `SqliteAppender.transaction`).
        upsert = self._upserts.get(table.name) or self._upserts.setdefault(table.name, _upsert_sql(table))
        to_builtins, astuple = msgspec.to_builtins, msgspec.structs.astuple
        params = [to_builtins(astuple(row)) for row in rows]  # datetimes as RFC 3339 text, rewritten in SQL

        def write(conn: sqlite3.Connection) -> bool:
            if checkpoint is not None:
                found = conn.execute(_READ_CHECKPOINT, (checkpoint.projection, checkpoint.version)).fetchone()
                if (int(found[0]) if found else 0) != checkpoint.expected:
                    return False
            if params:
                conn.create_function(_TIME_FUNCTION, 1, _time_text, deterministic=True)
                conn.executemany(upsert, params)
            if checkpoint is not None:
                moved = (checkpoint.projection, checkpoint.version, checkpoint.last, sqlite_time(utc_now()))
                conn.execute(_SET_CHECKPOINT, moved)
            return True

        return await cast(SqliteAppender, appender).transaction(write, durable=False)

    async def delete(self, conn: AsyncConnection, statement: Delete) -> None:
        # Debian's SQLite is built with SECURE_DELETE on: every deleted row zeroed, every page of
        # the version written to the WAL and checkpointed back. FAST zeroes what the delete
        # rewrites anyway and no more (1M calls, by hand: 360 -> 211 MB of WAL). Rows of a read model hold
        # nothing the ledger does not keep; restored afterwards, the connection goes back to a pool.
        previous = (await conn.exec_driver_sql("PRAGMA secure_delete")).scalar_one()
        await conn.exec_driver_sql("PRAGMA secure_delete = FAST")
        try:
            await conn.execute(statement)
        finally:
            await conn.exec_driver_sql(f"PRAGMA secure_delete = {_SECURE_DELETE[int(previous)]}")

    async def analyze(self, conn: AsyncConnection, table: Table) -> None:
        return None  # its planner reads the version's rows by the primary key without statistics

    async def digest(self, conn: AsyncConnection, table: Table, version: int, checkpoint: str) -> str:
        return await digest_rows(conn, table, version, checkpoint)

    async def reclaim_blob_space(self, engine: AsyncEngine) -> None:
        # VACUUM rewrites the file (every other writer waits; it needs free disk of the database's size), on a
        # connection of its own: the engine's begin hook would put it in a transaction, which refuses it
        await asyncio.to_thread(_vacuum, engine.url.database or ":memory:")

    def byte_order(self, column: ColumnElement[str]) -> ColumnElement[str]:
        return column  # BINARY, SQLite's default collation

    def epoch_bucket(self, column: ColumnElement[datetime], seconds: int) -> ColumnElement[Any]:
        # SQLite's `/` and `%` truncate toward zero: subtracting the floored remainder first makes the division
        # exact, so an instant before 1970 lands in its own bucket (not the one after it)
        epoch_s = sql_cast(func.strftime("%s", column), BigInteger)
        return (epoch_s - (epoch_s % seconds + seconds) % seconds) / seconds


def _vacuum(path: str) -> None:
    conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    try:
        conn.execute("VACUUM")
    finally:
        conn.close()


def _install_hooks(engine: AsyncEngine, synchronous: str) -> None:
    # SQLAlchemy's documented recipe: let the driver leave transactions to us, then emit BEGIN
    # ourselves, IMMEDIATE for writers so appends are serialized from their first statement.
    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA synchronous={synchronous}")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Connection) -> None:
        immediate = conn.get_execution_options().get(WRITER_OPTION, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


SQLITE = _Sqlite()


@compiles(seconds_between, "sqlite")
def _sqlite_seconds_between(element: seconds_between, compiler: SQLCompiler, **kw: Any) -> str:
    later, earlier = (_sqlite_microseconds(compiler.process(arg, **kw)) for arg in element.clauses)
    return f"(({later}) - ({earlier})) / 1000000.0"


def _sqlite_microseconds(text: str) -> str:
    """`sqlite_time`'s text as integer microseconds since 1970: whole seconds by `strftime`, then the fraction
    (SQLite's own arithmetic on times keeps milliseconds only). `text` is rendered twice: a column, not a value."""
    whole = f"CAST(strftime('%s', substr({text}, 1, 19)) AS INTEGER)"
    return f"{whole} * 1000000 + CAST(round(CAST(substr({text}, 20) AS REAL) * 1000000) AS INTEGER)"
