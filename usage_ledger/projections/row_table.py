"""A projection's table and how its rows are written: whole rows, upserted on the primary key.

One way for every projection (`engine` applies pages with it, the follower's and a rebuild's alike): a
row is a msgspec Struct whose fields are the table's columns in order, written as tuples through the
driver, skipping SQLAlchemy's per-row parameter processing (most of the fold's time when it was used):

- SQLite: one `sqlite3` `executemany` of `INSERT … ON CONFLICT DO UPDATE` on the appender's thread inside
  its transaction (`sqlite_write`); datetimes go in as the RFC 3339 text `msgspec.to_builtins` makes of
  them in C and the statement rewrites it to SQLAlchemy's storage text (`isoformat` per value in Python
  was the largest part of the fold's time);
- PostgreSQL: one `INSERT … SELECT * FROM unnest($1::integer[], …) ON CONFLICT DO UPDATE`, a binary array
  per column (asyncpg), one statement for a page of any size; a few rows as asyncpg's pipelined
  `executemany` of the same upsert row by row (`_PG_ARRAYS_FROM`). (COPY into a temp table and an upsert
  from it took two more round trips and its truncation at commit: 46-85 against 33-37 ms a small write.)
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import datetime

import msgspec
from sqlalchemy import Table, delete
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncConnection

from usage_ledger.ledger import SqliteWrite
from usage_ledger.ledger.schema import UTCDateTime, sqlite_bind

__all__ = ("RowTable",)

_SECURE_DELETE = ("OFF", "ON", "FAST")  # PRAGMA secure_delete's values, by what it reads back


_SQLITE_TIME_FUNCTION = "ledger_sqlite_time"
_PG_ARRAYS_FROM = 500
"""Rows from which PostgreSQL gets them as arrays: asyncpg looks up array types once per connection
(60-80 ms here), which a follower's few rows on a fresh connection would pay every page."""


def _sqlite_time_sql(param: str) -> str:
    """SQL: the RFC 3339 text msgspec writes for a datetime (`?N`) as `UTCDateTime` stores it on SQLite.

    msgspec writes UTC as `YYYY-MM-DDTHH:MM:SS[.ffffff]Z` (27 or 20 characters; any other offset, or none,
    makes it another length): rewritten here; anything else by `_sqlite_time_text`, called from SQL.
    """
    return (
        f"CASE length({param}) WHEN 27 THEN replace(substr({param}, 1, 26), 'T', ' ') "
        f"WHEN 20 THEN replace(substr({param}, 1, 19), 'T', ' ') || '.000000' "
        f"ELSE {_SQLITE_TIME_FUNCTION}({param}) END"
    )


def _sqlite_time_text(text: str | None) -> str | None:
    return None if text is None else sqlite_bind(datetime.fromisoformat(text))


class RowTable:
    """`table`, whose primary key includes `version`, and the writing of its rows."""

    def __init__(self, table: Table) -> None:
        self.table = table
        self.columns = tuple(c.name for c in table.columns)
        self._times = tuple(i for i, c in enumerate(table.columns) if isinstance(c.type, UTCDateTime))
        key = [c.name for c in table.primary_key.columns]
        columns = ", ".join(self.columns)
        on_conflict = f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET " + ", ".join(
            f"{name} = excluded.{name}" for name in self.columns if name not in key
        )
        values = ", ".join(
            _sqlite_time_sql(f"?{i}") if isinstance(c.type, UTCDateTime) else f"?{i}"
            for i, c in enumerate(table.columns, start=1)
        )
        self._sqlite_upsert = f"INSERT INTO {table.name} ({columns}) VALUES ({values}) {on_conflict}"
        pg = postgresql.dialect()  # type: ignore[no-untyped-call]
        arrays = ", ".join(f"${i}::{c.type.compile(dialect=pg)}[]" for i, c in enumerate(table.columns, start=1))
        self._pg_upsert = f"INSERT INTO {table.name} ({columns}) SELECT * FROM unnest({arrays}) {on_conflict}"
        params = ", ".join(f"${i}" for i in range(1, len(self.columns) + 1))
        self._pg_upsert_row = f"INSERT INTO {table.name} ({columns}) VALUES ({params}) {on_conflict}"

    async def write(self, conn: AsyncConnection, rows: Sequence[msgspec.Struct]) -> None:
        """Insert or replace `rows` on PostgreSQL `conn` (inside the caller's transaction); SQLite: `sqlite_write`."""
        if not rows:
            return
        assert conn.dialect.name == "postgresql", "SQLite writes on the appender's thread (sqlite_write)"
        driver = (await conn.get_raw_connection()).driver_connection
        assert driver is not None
        values = list(map(msgspec.structs.astuple, rows))
        if len(values) < _PG_ARRAYS_FROM:
            await driver.executemany(self._pg_upsert_row, values)
        else:
            await driver.execute(self._pg_upsert, *zip(*values, strict=True))

    def sqlite_write(self, rows: Sequence[msgspec.Struct]) -> SqliteWrite:
        """`write` as plain `sqlite3` statements for the SQLite appender's transaction; rows converted now,
        before its lock is taken."""
        to_builtins, astuple = msgspec.to_builtins, msgspec.structs.astuple
        params = [to_builtins(astuple(row)) for row in rows]  # datetimes as RFC 3339 text, rewritten in SQL
        upsert = self._sqlite_upsert

        def write(conn: sqlite3.Connection) -> None:
            if params:
                conn.create_function(_SQLITE_TIME_FUNCTION, 1, _sqlite_time_text, deterministic=True)
                conn.executemany(upsert, params)

        return write

    async def drop(self, conn: AsyncConnection, version: int) -> None:
        """Delete every row of `version`."""
        where = self.table.c.version == version
        if conn.dialect.name != "sqlite":
            await conn.execute(delete(self.table).where(where))
            return
        # Debian's SQLite is built with SECURE_DELETE on: every deleted row zeroed, every page of
        # the version written to the WAL and checkpointed back. FAST zeroes what the delete
        # rewrites anyway and no more (1M calls, by hand: 360 -> 211 MB of WAL). Rows of a read model hold
        # nothing the ledger does not keep; restored afterwards, the connection goes back to a pool.
        previous = (await conn.exec_driver_sql("PRAGMA secure_delete")).scalar_one()
        await conn.exec_driver_sql("PRAGMA secure_delete = FAST")
        try:
            await conn.execute(delete(self.table).where(where))
        finally:
            await conn.exec_driver_sql(f"PRAGMA secure_delete = {_SECURE_DELETE[int(previous)]}")
