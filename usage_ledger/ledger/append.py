"""Appending events: one transaction per batch, serialized, gap-free, idempotent, hash-chained.

Serialization: each backend's appender runs the whole batch on its own thread (`sqlite_append`,
`pg_append`). SQLite begins with `BEGIN IMMEDIATE`; PostgreSQL locks the one-row `ledger_head` with
`SELECT … FOR UPDATE`. Under that lock the tail (last position and hash) is read, already-stored
event ids are dropped, the rest get consecutive positions and the head moves with them — so commit
order = position order and a reader at `position > checkpoint` never skips an event.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import msgspec
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from usage_ledger.ledger.blobs import PreparedBlob
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.errors import DatabaseUnavailable, LedgerError
from usage_ledger.ledger.events import NewEvent, utc_now

__all__ = ("AppendResult", "append_events", "translate_db_error")


class AppendResult(msgspec.Struct, frozen=True):
    appended: int
    duplicates: int
    last_position: int


async def append_events(
    database: Database, batch: Sequence[NewEvent], blobs: Sequence[PreparedBlob] = ()
) -> AppendResult:
    """Append `batch` (and the bodies it references) in one transaction."""
    appender = database.sqlite_appender or database.postgres_appender
    assert appender is not None, "open_database gives every database an appender"
    try:
        appended, duplicates, last = await appender.append(batch, blobs, utc_now())
    except Exception as exc:
        raise translate_db_error(exc, database) from exc
    return AppendResult(appended=appended, duplicates=duplicates, last_position=last)


def translate_db_error(exc: BaseException, database: Database) -> LedgerError:
    """Map driver and network failures to the ledger's errors (once, at this boundary)."""
    if isinstance(exc, LedgerError):
        return exc
    if isinstance(exc, OperationalError | InterfaceError | OSError | ConnectionError | asyncio.TimeoutError):
        return DatabaseUnavailable(f"database {database.safe_url} unavailable: {_first_line(exc)}")
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return DatabaseUnavailable(f"database {database.safe_url} connection lost: {_first_line(exc)}")
    return LedgerError(f"append to {database.safe_url} failed: {_first_line(exc)}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
