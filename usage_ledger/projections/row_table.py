"""A projection's table and how its rows are written: whole rows, upserted on the primary key.

One way for every projection (`engine` applies pages with it, the follower's and a rebuild's alike): a
row is a msgspec Struct whose fields are the table's columns in order, written as tuples through the
driver by the database's backend (`Backend.write_rows`), skipping SQLAlchemy's per-row parameter
processing (most of the fold's time when it was used).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
from sqlalchemy import Table, delete
from sqlalchemy.ext.asyncio import AsyncConnection

from usage_ledger.ledger import Checkpoint, Database, backend_of

__all__ = ("RowTable",)


class RowTable:
    """`table`, whose primary key includes `version`, and the writing of its rows."""

    def __init__(self, table: Table) -> None:
        self.table = table

    async def write(
        self, database: Database, rows: Sequence[msgspec.Struct], checkpoint: Checkpoint | None = None
    ) -> bool:
        """Upsert `rows` in one writer transaction, moving `checkpoint` with them (`Backend.write_rows`)."""
        ops = database.backend_ops
        return await ops.write_rows(database.engine, database.appender, self.table, rows, checkpoint)

    async def drop(self, conn: AsyncConnection, version: int) -> None:
        """Delete every row of `version`."""
        await backend_of(conn).delete(conn, delete(self.table).where(self.table.c.version == version))
