"""What differs between the ledger's databases, behind one interface; one module per backend.

    backend_sqlite.SQLITE          aiosqlite + a `sqlite3` appender thread (`sqlite_append`)
    backend_postgresql.POSTGRESQL  asyncpg + an appender thread with its own connection (`pg_append`)

Nothing outside those modules (and the migrations) asks which database it is on: a `Database` carries its
backend (`database.backend_ops`), and code holding only a connection asks `db.backend_of(conn)`. Adding a
backend is adding a module that satisfies `Backend` and naming it in `db._BACKENDS`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol

import msgspec
from sqlalchemy import ColumnElement, Delete, Table
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from usage_ledger.ledger.blobs import PreparedBlob
from usage_ledger.ledger.events import NewEvent

__all__ = ("Appender", "AppenderStream", "Backend", "Checkpoint")


class AppenderStream(Protocol):
    """A backend's open append transaction over many batches (`Appender.stream`)."""

    async def add(self, batch: Sequence[NewEvent], recorded_at: datetime) -> tuple[int, int, int]: ...

    async def commit(self) -> None: ...

    def close(self) -> None: ...


class Appender(Protocol):
    """A backend's serialized append path (`SqliteAppender`, `PostgresAppender`)."""

    async def append(
        self, batch: Sequence[NewEvent], blobs: Sequence[PreparedBlob], recorded_at: datetime
    ) -> tuple[int, int, int]: ...

    async def stream(self) -> AppenderStream: ...

    def close(self) -> None: ...


class Checkpoint(msgspec.Struct, frozen=True):
    """A projection's checkpoint moved from `expected` to `last` in the same transaction as its rows."""

    projection: str
    version: int
    expected: int
    last: int


class Backend(Protocol):
    """One database's ways; every method is the one place its difference is written."""

    name: str
    """For messages and logs only: never compared."""

    def ledger_file(self, url: URL) -> str | None:
        """The file the ledger lives in (None: a server, or in memory)."""

    def connect(self, url: str, engine_kwargs: dict[str, Any], options: dict[str, Any]) -> tuple[AsyncEngine, Appender]:
        """The engine and the appender for `url` (no I/O yet); `options`: `open_database`'s tuning keywords."""

    def insert(self, table: Table) -> Any:
        """The dialect's INSERT of `table`, with `on_conflict_do_update` / `on_conflict_do_nothing`."""

    def can_hold(self, text: str) -> bool:
        """Whether a text column can store `text` (PostgreSQL cannot hold U+0000)."""

    async def snapshot(self, conn: AsyncConnection) -> AsyncConnection:
        """`conn` set so that all its statements see one snapshot."""

    async def fetch(self, conn: AsyncConnection, query: str, params: Sequence[object]) -> list[tuple[Any, ...]]:
        """`query` (parameters written `{}`) run by the driver itself, rows as tuples."""

    async def write_rows(
        self,
        engine: AsyncEngine,
        appender: Appender,
        table: Table,
        rows: Sequence[msgspec.Struct],
        checkpoint: Checkpoint | None = None,
    ) -> bool:
        """Upsert `rows` (Structs of `table`'s columns in order) in one writer transaction, moving `checkpoint`
        with them; False (nothing written) if the checkpoint was no longer at `checkpoint.expected`. Not synced
        to disk where the backend allows (read models can be derived again)."""

    async def delete(self, conn: AsyncConnection, statement: Delete) -> None:
        """Run a DELETE of read-model rows (which the ledger can derive again)."""

    async def analyze(self, conn: AsyncConnection, table: Table) -> None:
        """Planner statistics for rows just written, where the planner needs them."""

    async def digest(self, conn: AsyncConnection, table: Table, version: int, checkpoint: str) -> str:
        """SHA-256 over `table`'s rows of `version` in key order: each row the sorted msgspec JSON of its values
        but `version` (datetimes as RFC 3339 UTC), one per line. `checkpoint`: the projection writing them."""

    async def reclaim_blob_space(self, engine: AsyncEngine) -> None:
        """Give the space of erased bodies back (`erasure.reclaim_space`)."""

    def byte_order(self, column: ColumnElement[str]) -> ColumnElement[str]:
        """`column` for ORDER BY in byte order."""

    def epoch_bucket(self, column: ColumnElement[datetime], seconds: int) -> ColumnElement[Any]:
        """floor(epoch seconds of `column` / `seconds`), for every instant a column can hold."""
