"""A projection's table and how its rows are written: whole rows, upserted on the primary key.

One way for every projection (`engine` applies pages with it, a rebuild's load too): a row is a
msgspec Struct whose fields are the table's columns in order. PostgreSQL through SQLAlchemy
(`INSERT … ON CONFLICT DO UPDATE`, 5,000 rows a statement); SQLite as one plain `sqlite3`
`executemany` of tuples (datetimes in SQLAlchemy's storage text, `sqlite_bind`), which skips
SQLAlchemy's per-row parameter processing (several times faster on big rebuilds) and runs on the
appender's thread inside its transaction (`sqlite_write`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
from sqlalchemy import Table, delete
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncConnection

from usage_ledger.ledger.schema import sqlite_bind
from usage_ledger.ledger.sqlite_append import SqliteWrite

__all__ = ("RowTable",)

_PG_ROWS_PER_STATEMENT = 5000
_SECURE_DELETE = ("OFF", "ON", "FAST")  # PRAGMA secure_delete's values, by what it reads back


class RowTable:
    """`table`, whose primary key includes `version`, and the writing of its rows."""

    def __init__(self, table: Table) -> None:
        self.table = table
        self.columns = tuple(c.name for c in table.columns)
        key = [c.name for c in table.primary_key.columns]
        rest = [name for name in self.columns if name not in key]
        self._sqlite_upsert = (
            f"INSERT INTO {table.name} ({', '.join(self.columns)}) VALUES ({', '.join('?' * len(self.columns))}) "
            f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET " + ", ".join(f"{name} = excluded.{name}" for name in rest)
        )
        statement = postgresql.insert(table)
        self._pg_upsert = statement.on_conflict_do_update(
            index_elements=key, set_={name: statement.excluded[name] for name in rest}
        )

    def _sqlite_params(self, rows: Sequence[msgspec.Struct]) -> list[tuple[Any, ...]]:
        astuple = msgspec.structs.astuple
        return [tuple(map(sqlite_bind, astuple(row))) for row in rows]

    async def write(self, conn: AsyncConnection, rows: Sequence[msgspec.Struct]) -> None:
        """Insert or replace `rows` on `conn` (inside the caller's transaction)."""
        if not rows:
            return
        if conn.dialect.name == "sqlite":
            await conn.exec_driver_sql(self._sqlite_upsert, self._sqlite_params(rows))
            return
        columns, astuple = self.columns, msgspec.structs.astuple
        for start in range(0, len(rows), _PG_ROWS_PER_STATEMENT):
            chunk = rows[start : start + _PG_ROWS_PER_STATEMENT]
            await conn.execute(self._pg_upsert, [dict(zip(columns, astuple(row), strict=True)) for row in chunk])

    def sqlite_write(self, rows: Sequence[msgspec.Struct]) -> SqliteWrite:
        """`write` as plain `sqlite3` statements for the SQLite appender's transaction; rows converted now,
        before its lock is taken."""
        params, upsert = self._sqlite_params(rows), self._sqlite_upsert
        return lambda conn: conn.executemany(upsert, params) if params else None

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
