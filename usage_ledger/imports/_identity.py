"""Imported rows' identity: event ids from content, and a row's call id checked against the ledger.

See `imports.importer` for the rules; this module holds the parts that read the ledger.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
from sqlalchemy import select

from usage_ledger.ledger import CallImported, Database, NewEvent, decode_event
from usage_ledger.ledger.schema import events

__all__ = ("NAMESPACE", "content_event_id", "reconcile_with_ledger")

NAMESPACE = uuid.UUID("0b5d7c56-6a1e-5b8e-8f0e-4c2a7d9e1f30")
"""Of every imported event id (never change it: ids already stored were made with it)."""


def content_event_id(content: bytes, occurrence: int) -> uuid.UUID:
    """The event id of a row: its canonical content and its occurrence among identical rows of the file."""
    return uuid.uuid5(NAMESPACE, f"{occurrence}\n{content.decode()}")


def _chunks(items: list[Any], size: int = 500) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _same_call(stored: CallImported, body: CallImported) -> bool:
    return msgspec.structs.replace(stored, source=body.source, line=body.line) == body


async def reconcile_with_ledger(
    database: Database, path: Path, batch: list[NewEvent], legacy: dict[uuid.UUID, uuid.UUID]
) -> tuple[set[uuid.UUID], set[uuid.UUID], list[str]]:
    """(ids of the batch's rows already stored, ids of rows whose call_id is stored with other content, their
    `file:line` errors). `legacy`: content id -> the pre-content id (source-scoped), generated call ids only."""
    found: dict[str, list[tuple[uuid.UUID, str, str, int]]] = {}
    legacy_stored: set[uuid.UUID] = set()
    async with database.engine.connect() as conn:
        for chunk in _chunks(list(legacy.values())):
            result = await conn.execute(select(events.c.event_id).where(events.c.event_id.in_(chunk)))
            legacy_stored.update(row[0] for row in result)
        for chunk in _chunks([event.stream for event in batch]):
            result = await conn.execute(
                select(events.c.stream, events.c.event_id, events.c.type, events.c.payload, events.c.position)
                .where(events.c.stream.in_(chunk), events.c.type.in_(("call.started", "call.imported")))
                .order_by(events.c.position)
            )
            for stream, event_id, type_, payload, position in result:
                found.setdefault(stream, []).append((event_id, type_, payload, position))
    stored: set[uuid.UUID] = set()
    conflicting: set[uuid.UUID] = set()
    errors: list[str] = []
    for event in batch:
        body = event.body
        assert isinstance(body, CallImported)
        earlier = found.get(event.stream, [])
        if legacy.get(event.event_id) in legacy_stored or any(
            event_id == event.event_id or (type_ == "call.imported" and _same_call(_imported(payload), body))
            for event_id, type_, payload, _ in earlier
        ):
            stored.add(event.event_id)
        elif earlier:
            conflicting.add(event.event_id)
            _, type_, payload, position = earlier[0]
            if type_ == "call.imported":
                first = _imported(payload)
                where = f"{first.source}:{first.line} (imported earlier, position {position})"
            else:
                where = f"a gateway call (position {position})"
            errors.append(
                f"{path}:{body.line}: call_id {body.call_id!r} is already in the ledger with different content, "
                f"from {where}; give this row its own call_id, or drop it if it is the same call"
            )
    return stored, conflicting, errors


def _imported(payload: str) -> CallImported:
    body = decode_event(payload)
    assert isinstance(body, CallImported)
    return body
