"""Appending events: one transaction per batch, serialized, gap-free, idempotent, hash-chained.

Serialization: PostgreSQL takes a transaction-scoped advisory lock; SQLite begins with
`BEGIN IMMEDIATE`. Under that lock the tail (last position and hash) is read, already-stored
event ids are dropped, and the rest get consecutive positions — so commit order = position order
and a reader at `position > checkpoint` never skips an event.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import msgspec
from sqlalchemy import insert, select
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection

from ledger.blobs import PreparedBlob, write_blobs
from ledger.chain import GENESIS_HASH, chain_hash
from ledger.db import Database
from ledger.errors import DatabaseUnavailable, LedgerError
from ledger.events import NewEvent, encode_event, event_type, utc_now
from ledger.schema import events

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
    if conn.dialect.name == "postgresql":
        await conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({APPEND_LOCK_KEY})")
    await write_blobs(conn, blobs)
    existing = await _existing_ids(conn, [e.event_id for e in batch])
    tail = (
        await conn.execute(select(events.c.position, events.c.hash).order_by(events.c.position.desc()).limit(1))
    ).first()
    position, previous = (tail.position, tail.hash) if tail else (0, GENESIS_HASH)
    recorded_at = utc_now()
    rows = []
    for new in batch:
        if new.event_id in existing:
            continue
        existing.add(new.event_id)
        position += 1
        type_ = event_type(new.body)
        payload = encode_event(new.body).decode()
        previous = chain_hash(previous, position, new.event_id, new.occurred_at, type_, new.stream, payload)
        rows.append(
            {
                "position": position,
                "event_id": new.event_id,
                "type": type_,
                "stream": new.stream,
                "occurred_at": new.occurred_at,
                "recorded_at": recorded_at,
                "payload": payload,
                "hash": previous,
            }
        )
    if rows:
        await conn.execute(insert(events), rows)
    return AppendResult(appended=len(rows), duplicates=len(batch) - len(rows), last_position=position)


async def _existing_ids(conn: AsyncConnection, ids: list[object]) -> set[object]:
    found: set[object] = set()
    for start in range(0, len(ids), 5000):
        chunk = ids[start : start + 5000]
        result = await conn.execute(select(events.c.event_id).where(events.c.event_id.in_(chunk)))
        found.update(result.scalars())
    return found


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _safe(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)
