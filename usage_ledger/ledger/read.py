"""Reading events in position order: pages after a position, and a follow mode."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import datetime

import msgspec
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from usage_ledger.ledger.db import Database
from usage_ledger.ledger.events import Event, decode_event
from usage_ledger.ledger.schema import events

__all__ = (
    "STORED_COLUMNS",
    "StoredEvent",
    "follow_events",
    "head_position",
    "iter_events",
    "read_events",
    "read_stream",
)


class StoredEvent(msgspec.Struct, frozen=True):
    """A stored row; its fields are the ledger's columns in order (`STORED_COLUMNS`), so a row builds one."""

    position: int
    event_id: uuid.UUID
    type: str
    stream: str
    occurred_at: datetime
    recorded_at: datetime
    payload: str
    hash: str

    def body(self) -> Event:
        return decode_event(self.payload)


STORED_COLUMNS = tuple(events.c[name] for name in StoredEvent.__struct_fields__)
"""The ledger columns a `StoredEvent` holds, in its field order."""


async def read_events(conn: AsyncConnection, after: int = 0, limit: int = 1000) -> list[StoredEvent]:
    """Up to `limit` events with position > `after`, in position order."""
    result = await conn.execute(
        select(*STORED_COLUMNS).where(events.c.position > after).order_by(events.c.position).limit(limit)
    )
    return [StoredEvent(*row) for row in result]


async def read_stream(conn: AsyncConnection, stream: str) -> list[StoredEvent]:
    """Every event of `stream` (a call's: `call_stream(call_id)`), in position order."""
    result = await conn.execute(select(*STORED_COLUMNS).where(events.c.stream == stream).order_by(events.c.position))
    return [StoredEvent(*row) for row in result]


async def head_position(conn: AsyncConnection) -> int:
    return int((await conn.execute(select(func.coalesce(func.max(events.c.position), 0)))).scalar_one())


async def iter_events(database: Database, after: int = 0, page_size: int = 5000) -> AsyncIterator[StoredEvent]:
    """Every event after `after`, page by page (memory stays flat however long the ledger)."""
    while True:
        async with database.engine.connect() as conn:
            page = await read_events(conn, after, page_size)
        for stored in page:
            yield stored
        if len(page) < page_size:
            return
        after = page[-1].position


async def follow_events(
    database: Database,
    after: int = 0,
    *,
    poll_interval_s: float = 0.5,
    page_size: int = 5000,
) -> AsyncIterator[StoredEvent]:
    """Every event after `after`, then new ones as they are committed (read every `poll_interval_s`), forever."""
    while True:
        caught_up = True
        async for stored in iter_events(database, after, page_size):
            after = stored.position
            caught_up = False
            yield stored
        if caught_up:
            await asyncio.sleep(poll_interval_s)
