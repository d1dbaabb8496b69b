"""Appending events: one transaction per batch, serialized, gap-free, idempotent, hash-chained.

Serialization: PostgreSQL takes a transaction-scoped advisory lock; SQLite begins with
`BEGIN IMMEDIATE`. Under that lock the tail (last position and hash) is read, already-stored
event ids are dropped, and the rest get consecutive positions — so commit order = position order
and a reader at `position > checkpoint` never skips an event.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence

import msgspec
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from usage_ledger.ledger._rows import EVENT_COLUMNS, build_rows
from usage_ledger.ledger.blobs import PreparedBlob, write_blobs
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.errors import DatabaseUnavailable, LedgerError
from usage_ledger.ledger.events import NewEvent, utc_now

__all__ = ("AppendResult", "append_events", "translate_db_error")

# Key of the PostgreSQL advisory lock that serializes appends across processes ("LEDG" in ASCII).
APPEND_LOCK_KEY = 0x4C454447


class AppendResult(msgspec.Struct, frozen=True):
    appended: int
    duplicates: int
    last_position: int


async def append_events(
    database: Database, batch: Sequence[NewEvent], blobs: Sequence[PreparedBlob] = ()
) -> AppendResult:
    """Append `batch` (and the bodies it references) in one transaction."""
    try:
        if database.sqlite_appender is not None:
            appended, duplicates, last = await database.sqlite_appender.append(batch, blobs, utc_now())
            return AppendResult(appended=appended, duplicates=duplicates, last_position=last)
        try:
            return await _append_postgres(database, batch, blobs, check_existing=False)
        except Exception as exc:
            # Optimistic first try: COPY as if no event id were stored yet (the unique index checks
            # each one anyway). One was — a spool replay, a re-import: again, dropping stored ids.
            if not _is_unique_violation(exc):
                raise
            return await _append_postgres(database, batch, blobs, check_existing=True)
    except Exception as exc:
        raise translate_db_error(exc, database) from exc


def translate_db_error(exc: BaseException, database: Database) -> LedgerError:
    """Map driver and network failures to the ledger's errors (once, at this boundary)."""
    if isinstance(exc, LedgerError):
        return exc
    if isinstance(exc, OperationalError | InterfaceError | OSError | ConnectionError | asyncio.TimeoutError):
        return DatabaseUnavailable(f"database {database.safe_url} unavailable: {_first_line(exc)}")
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return DatabaseUnavailable(f"database {database.safe_url} connection lost: {_first_line(exc)}")
    return LedgerError(f"append to {database.safe_url} failed: {_first_line(exc)}")


async def _append_postgres(
    database: Database, batch: Sequence[NewEvent], blobs: Sequence[PreparedBlob], *, check_existing: bool
) -> AppendResult:
    conn = await database.writer()
    try:
        async with conn.begin():
            await conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({APPEND_LOCK_KEY})")
            await write_blobs(conn, blobs)
            existing: set[uuid.UUID] = set()
            if check_existing:
                ids = [e.event_id for e in batch]
                found = await conn.exec_driver_sql(
                    "SELECT event_id FROM ledger_events WHERE event_id = ANY($1::uuid[])", (ids,)
                )
                existing = {uuid.UUID(str(row[0])) for row in found}
            tail = (
                await conn.exec_driver_sql("SELECT position, hash FROM ledger_events ORDER BY position DESC LIMIT 1")
            ).first()
            position, previous = (int(tail.position), bytes.fromhex(tail.hash)) if tail is not None else (0, bytes(32))
            rows, last = build_rows(batch, existing, position, previous, utc_now(), sqlite=False)
            if rows:
                # COPY: SQLAlchemy's per-row parameter processing cost more than the insert itself
                raw = (await conn.get_raw_connection()).driver_connection
                assert raw is not None
                await raw.copy_records_to_table("ledger_events", records=rows, columns=list(EVENT_COLUMNS))
            return AppendResult(appended=len(rows), duplicates=len(batch) - len(rows), last_position=last)
    finally:
        await conn.close()


def _is_unique_violation(exc: BaseException) -> bool:
    """asyncpg's UniqueViolationError, raw (from COPY) or wrapped by SQLAlchemy."""
    return "23505" in (getattr(exc, "sqlstate", None), getattr(getattr(exc, "orig", None), "sqlstate", None))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
