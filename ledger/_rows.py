"""Turning new events into ledger rows: positions, canonical payloads and the hash chain.

Shared by both backends' appenders; each row is a tuple in `EVENT_COLUMNS` order, with the
event id and times in the form the backend's driver takes (SQLite: hex and ISO text, exactly as
SQLAlchemy's `Uuid` and `UTCDateTime` types store them; PostgreSQL: UUID and aware datetimes).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

from ledger.chain import chain_digest
from ledger.events import NewEvent, encode_event, event_type

__all__ = ("EVENT_COLUMNS", "build_rows", "sqlite_time")

EVENT_COLUMNS = ("position", "event_id", "type", "stream", "occurred_at", "recorded_at", "payload", "hash")


def sqlite_time(moment: datetime) -> str:
    return moment.astimezone(UTC).replace(tzinfo=None).isoformat(" ", "microseconds")


def build_rows(
    batch: Sequence[NewEvent],
    existing: set[uuid.UUID],
    position: int,
    previous: bytes,
    recorded_at: datetime,
    *,
    sqlite: bool,
) -> tuple[list[tuple[object, ...]], int]:
    """Rows for the events not in `existing` (nor repeated in the batch), chained after `previous`."""
    rows: list[tuple[object, ...]] = []
    seen = set(existing)
    recorded: object = sqlite_time(recorded_at) if sqlite else recorded_at
    for new in batch:
        if new.event_id in seen:
            continue
        seen.add(new.event_id)
        position += 1
        type_ = event_type(new.body)
        payload = encode_event(new.body).decode()
        occurred_at = new.occurred_at.astimezone(UTC)
        previous = chain_digest(previous, position, new.event_id, occurred_at, type_, new.stream, payload)
        if sqlite:
            rows.append(
                (
                    position,
                    new.event_id.hex,
                    type_,
                    new.stream,
                    sqlite_time(occurred_at),
                    recorded,
                    payload,
                    previous.hex(),
                )
            )
        else:
            rows.append((position, new.event_id, type_, new.stream, occurred_at, recorded, payload, previous.hex()))
    return rows, position
