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
from datetime import UTC, datetime

import msgspec
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection

from ledger.blobs import PreparedBlob, write_blobs
from ledger.chain import chain_digest
from ledger.db import Database
from ledger.errors import DatabaseUnavailable, LedgerError
from ledger.events import NewEvent, encode_event, event_type, utc_now

__all__ = ("AppendResult", "append_events", "translate_db_error")

# Key of the PostgreSQL advisory lock that serializes appends across processes ("LEDGER" in hex-ish).
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
        conn = await database.writer()
        try:
            async with conn.begin():
                return await _append_locked(conn, batch, blobs)
        finally:
            await conn.close()
    except Exception as exc:
        raise translate_db_error(exc, database) from exc


def translate_db_error(exc: BaseException, database: Database) -> LedgerError:
    """Map driver and network failures to the ledger's errors (once, at this boundary)."""
    if isinstance(exc, LedgerError):
        return exc
    if isinstance(exc, OperationalError | InterfaceError | OSError | ConnectionError | asyncio.TimeoutError):
        return DatabaseUnavailable(f"database {_safe(database.url)} unavailable: {_first_line(exc)}")
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return DatabaseUnavailable(f"database {_safe(database.url)} connection lost: {_first_line(exc)}")
    return LedgerError(f"append to {_safe(database.url)} failed: {_first_line(exc)}")


async def _append_locked(
    conn: AsyncConnection, batch: Sequence[NewEvent], blobs: Sequence[PreparedBlob]
) -> AppendResult:
    postgres = conn.dialect.name == "postgresql"
    if postgres:
        await conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({APPEND_LOCK_KEY})")
    await write_blobs(conn, blobs)
    existing = await _existing_ids(conn, [e.event_id for e in batch], postgres)
    tail = (
        await conn.exec_driver_sql("SELECT position, hash FROM ledger_events ORDER BY position DESC LIMIT 1")
    ).first()
    position, previous = (0, bytes(32))
    if tail is not None:
        position, previous = int(tail.position), bytes.fromhex(tail.hash)
    recorded_at = utc_now()
    rows: list[tuple[object, ...]] = []
    for new in batch:
        if new.event_id in existing:
            continue
        existing.add(new.event_id)
        position += 1
        type_ = event_type(new.body)
        payload = encode_event(new.body).decode()
        occurred_at = new.occurred_at.astimezone(UTC)
        previous = chain_digest(previous, position, new.event_id, occurred_at, type_, new.stream, payload)
        if postgres:
            rows.append((position, new.event_id, type_, new.stream, occurred_at, recorded_at, payload, previous.hex()))
        else:
            rows.append(
                (
                    position,
                    new.event_id.hex,
                    type_,
                    new.stream,
                    _sqlite_time(occurred_at),
                    _sqlite_time(recorded_at),
                    payload,
                    previous.hex(),
                )
            )
    if rows:
        await _insert_rows(conn, rows, postgres)
    return AppendResult(appended=len(rows), duplicates=len(batch) - len(rows), last_position=position)


# The hot path speaks the driver's language directly: SQLAlchemy's per-row parameter processing
# cost more than the inserts themselves. Formats match the `ledger.schema` column types.
_COLUMNS = "position, event_id, type, stream, occurred_at, recorded_at, payload, hash"


def _sqlite_time(moment: datetime) -> str:
    return moment.replace(tzinfo=None).isoformat(" ", "microseconds")


async def _insert_rows(conn: AsyncConnection, rows: list[tuple[object, ...]], postgres: bool) -> None:
    if postgres:
        raw = (await conn.get_raw_connection()).driver_connection
        assert raw is not None
        await raw.copy_records_to_table("ledger_events", records=rows, columns=_COLUMNS.split(", "))
    else:
        await conn.exec_driver_sql(f"INSERT INTO ledger_events ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)


async def _existing_ids(conn: AsyncConnection, ids: list[uuid.UUID], postgres: bool) -> set[uuid.UUID]:
    found: set[uuid.UUID] = set()
    if postgres:
        result = await conn.exec_driver_sql(
            "SELECT event_id FROM ledger_events WHERE event_id = ANY($1::uuid[])", (ids,)
        )
        found.update(uuid.UUID(str(row[0])) for row in result)
        return found
    for start in range(0, len(ids), 500):
        chunk = [i.hex for i in ids[start : start + 500]]
        marks = ", ".join("?" * len(chunk))
        result = await conn.exec_driver_sql(
            f"SELECT event_id FROM ledger_events WHERE event_id IN ({marks})", tuple(chunk)
        )
        found.update(uuid.UUID(row[0]) for row in result)
    return found


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _safe(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)
