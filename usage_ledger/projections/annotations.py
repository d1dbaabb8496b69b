"""The annotations read model: `run.annotated` labels on a run or a time range, in position order."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec
from sqlalchemy import delete, insert, select
from sqlalchemy.ext.asyncio import AsyncConnection

from usage_ledger.ledger.events import RunAnnotated
from usage_ledger.ledger.schema import events, sqlite_bind
from usage_ledger.ledger.sqlite_append import SqliteWrite
from usage_ledger.projections._slim import decode_slim
from usage_ledger.projections.tables import annotations_table
from usage_ledger.projections.text import projection_tags, projection_text_or_none

__all__ = ("Annotation", "AnnotationsProjection", "labels_for_run", "load_annotations")

_labels_encoder = msgspec.json.Encoder(order="sorted")
_COLUMNS = [column.name for column in annotations_table.columns]
_SQLITE_INSERT = (
    f"INSERT INTO {annotations_table.name} ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})"
)
_labels_decoder = msgspec.json.Decoder(dict[str, str])


class Annotation(msgspec.Struct, frozen=True, kw_only=True):
    position: int
    labels: dict[str, str]
    run: str | None = None
    start: datetime | None = None
    end: datetime | None = None

    def matches(self, run: str, started_at: datetime | None) -> bool:
        if self.run is not None:
            return self.run == run
        if started_at is None:
            return False
        return (self.start is None or self.start <= started_at) and (self.end is None or started_at < self.end)


class AnnotationsProjection:
    name = "annotations"
    handles = frozenset({"run.annotated"})

    async def apply(self, conn: AsyncConnection, version: int, page: Sequence[tuple[int, str, str]]) -> None:
        await self.write(conn, await self.fold(conn, version, page))

    async def fold(
        self, conn: AsyncConnection, version: int, page: Sequence[tuple[int, str, str]]
    ) -> list[dict[str, Any]]:
        rows = []
        for position, type_, payload in page:
            if type_ != "run.annotated":
                continue
            ev: RunAnnotated = decode_slim(type_, payload)
            rows.append(
                {
                    "version": version,
                    "position": position,
                    "run": projection_text_or_none(ev.run),  # the rule of `projections.text`, as on calls
                    "start_at": ev.start,
                    "end_at": ev.end,
                    "labels": _labels_encoder.encode(projection_tags(ev.labels)).decode(),
                }
            )
        return rows

    async def write(self, conn: AsyncConnection, rows: list[dict[str, Any]]) -> None:
        if rows:
            await conn.execute(insert(annotations_table), rows)

    def sqlite_write(self, rows: list[dict[str, Any]]) -> SqliteWrite:
        """`write` as plain `sqlite3` statements for the caller's transaction; rows converted now."""
        params = [tuple(sqlite_bind(row[name]) for name in _COLUMNS) for row in rows]
        return lambda conn: conn.executemany(_SQLITE_INSERT, params) if params else None

    async def prepare(
        self, conn: AsyncConnection, head: int, workdir: Path, progress: Callable[[int, int], None] | None = None
    ) -> None:
        return None

    async def load(self, conn: AsyncConnection, version: int, head: int) -> None:
        """Fill an empty `version` with every `run.annotated` up to `head` (read through the type index)."""
        after = 0
        while True:
            result = await conn.execute(
                select(events.c.position, events.c.type, events.c.payload)
                .where(events.c.type == "run.annotated", events.c.position > after, events.c.position <= head)
                .order_by(events.c.position)
                .limit(5000)
            )
            page = [(r[0], r[1], r[2]) for r in result]
            if not page:
                return
            await self.apply(conn, version, page)
            after = page[-1][0]

    async def digest(self, conn: AsyncConnection, version: int) -> str:
        digest = hashlib.sha256()
        columns = [c for c in annotations_table.columns if c.name != "version"]
        result = await conn.execute(
            select(*columns).where(annotations_table.c.version == version).order_by(annotations_table.c.position)
        )
        for r in result:
            digest.update(_labels_encoder.encode(tuple(r)) + b"\n")
        return digest.hexdigest()

    async def drop(self, conn: AsyncConnection, version: int) -> None:
        await conn.execute(delete(annotations_table).where(annotations_table.c.version == version))


async def load_annotations(conn: AsyncConnection, version: int) -> list[Annotation]:
    result = await conn.execute(
        select(annotations_table).where(annotations_table.c.version == version).order_by(annotations_table.c.position)
    )
    return [
        Annotation(
            position=r.position,
            labels=_labels_decoder.decode(r.labels),
            run=r.run,
            start=r.start_at,
            end=r.end_at,
        )
        for r in result
    ]


def labels_for_run(notes: Sequence[Annotation], run: str, started_at: datetime | None) -> dict[str, str]:
    """Labels of a run: every matching annotation merged in position order (later wins)."""
    labels: dict[str, str] = {}
    for note in notes:
        if note.matches(run, started_at):
            labels.update(note.labels)
    return labels
