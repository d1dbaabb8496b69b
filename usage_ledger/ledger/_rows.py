"""Turning new events into ledger rows: positions, canonical payloads and the hash chain.

Shared by both backends' appenders; each row is a tuple in `EVENT_COLUMNS` order, with the
event id and times in the form the backend's driver takes (SQLite: hex and ISO text, exactly as
SQLAlchemy's `Uuid` and `UTCDateTime` types store them; PostgreSQL: UUID and aware datetimes).

This is the append path's hot loop (one pass per event, under the GIL), so it computes what
`chain.chain_hash` computes with fewer Python objects: the payload is encoded once and hashed
as those bytes, the type's length-prefixed bytes are cached per event class, the id's bytes and
hex come from its integer, and SQLite times reuse the formatted minute. A test pins the rows'
hashes to `chain.chain_hash`.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from usage_ledger.ledger.chain import HEAD_STRUCT, LENGTH_STRUCT, epoch_micros
from usage_ledger.ledger.events import Event, NewEvent, encode_event, event_type
from usage_ledger.ledger.schema import sqlite_time

__all__ = ("EVENT_COLUMNS", "build_rows")

EVENT_COLUMNS = ("position", "event_id", "type", "stream", "occurred_at", "recorded_at", "payload", "hash")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MINUTE_US = 60_000_000
# event class → (dotted type, its length-prefixed UTF-8 bytes as hashed)
_TYPES: dict[type[Event], tuple[str, bytes]] = {}


def _type_of(body: Event) -> tuple[str, bytes]:
    cached = _TYPES.get(type(body))
    if cached is None:
        tag = event_type(body)
        encoded = tag.encode()
        cached = _TYPES[type(body)] = (tag, LENGTH_STRUCT.pack(len(encoded)) + encoded)
    return cached


def build_rows(
    batch: Sequence[NewEvent],
    existing: set[uuid.UUID],
    position: int,
    previous: bytes,
    recorded_at: datetime,
    *,
    as_text: bool,
) -> tuple[list[tuple[object, ...]], int]:
    """Rows for the events not in `existing` (nor repeated in the batch), chained after `previous`; `as_text`:
    the id as hex and the times as `sqlite_time` text (else a UUID and aware datetimes)."""
    rows: list[tuple[object, ...]] = []
    append = rows.append
    seen = {event_id.int for event_id in existing}
    recorded: object = sqlite_time(recorded_at) if as_text else recorded_at
    minutes: dict[int, str] = {}  # as text: "YYYY-MM-DD HH:MM:" by minute since the epoch
    sha256 = hashlib.sha256
    pack_head = HEAD_STRUCT.pack
    pack_length = LENGTH_STRUCT.pack
    for new in batch:
        event_id = new.event_id
        id_int = event_id.int
        if id_int in seen:
            continue
        seen.add(id_int)
        position += 1
        type_, type_block = _type_of(new.body)
        payload_bytes = encode_event(new.body)
        payload = payload_bytes.decode()
        occurred_at = new.occurred_at
        if occurred_at.tzinfo is not UTC:
            occurred_at = occurred_at.astimezone(UTC)
        micros = epoch_micros(occurred_at)
        id_bytes = id_int.to_bytes(16, "big")
        stream_bytes = new.stream.encode()
        previous = sha256(
            b"".join(
                (
                    previous,
                    pack_head(position, id_bytes, micros),
                    type_block,
                    pack_length(len(stream_bytes)),
                    stream_bytes,
                    payload_bytes,
                )
            )
        ).digest()
        if as_text:
            minute, within = divmod(micros, _MINUTE_US)
            prefix = minutes.get(minute)
            if prefix is None:
                start = _EPOCH + timedelta(microseconds=minute * _MINUTE_US)
                prefix = minutes[minute] = (
                    f"{start.year:04d}-{start.month:02d}-{start.day:02d} {start.hour:02d}:{start.minute:02d}:"
                )
            seconds, fraction = divmod(within, 1_000_000)
            append(
                (
                    position,
                    id_bytes.hex(),
                    type_,
                    new.stream,
                    f"{prefix}{seconds:02d}.{fraction:06d}",
                    recorded,
                    payload,
                    previous.hex(),
                )
            )
        else:
            append((position, event_id, type_, new.stream, occurred_at, recorded, payload, previous.hex()))
    return rows, position
