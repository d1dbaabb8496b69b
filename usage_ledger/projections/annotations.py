"""The annotations read model: `run.annotated` labels on a run or a time range, in position order."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import datetime

import msgspec
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from usage_ledger.ledger import RunAnnotated
from usage_ledger.projections._slim import decode_slim
from usage_ledger.projections.tables import annotations_table
from usage_ledger.projections.text import projection_tags, projection_text_or_none

__all__ = ("REPLAY_LABEL", "Annotation", "AnnotationRow", "AnnotationsProjection", "labels_for_run", "load_annotations")

REPLAY_LABEL = "replay_of"
"""The label `ledger replay` puts on the new run: the run whose requests it sent again."""

_labels_encoder = msgspec.json.Encoder(order="sorted")
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


class AnnotationRow(msgspec.Struct, kw_only=True, gc=False):
    """One row of `projection_annotations`: the fields are its columns, in order."""

    version: int
    position: int
    run: str | None
    start_at: datetime | None
    end_at: datetime | None
    labels: str
    """The labels as sorted JSON."""


class AnnotationsProjection:
    """Annotations: one row per `run.annotated` event and version."""

    name = "annotations"
    handles = frozenset({"run.annotated"})
    partition_key = None
    table = annotations_table

    async def fold(
        self,
        conn: AsyncConnection,
        version: int,
        page: Sequence[tuple[int, str, str]],
        unwritten: Sequence[msgspec.Struct] = (),
    ) -> list[AnnotationRow]:
        """A row per `run.annotated` event (each its own: nothing continues an earlier row)."""
        rows = []
        for position, type_, payload in page:
            if type_ != "run.annotated":
                continue
            ev: RunAnnotated = decode_slim(type_, payload)
            rows.append(
                AnnotationRow(
                    version=version,
                    position=position,
                    run=projection_text_or_none(ev.run),  # the rule of `projections.text`, as on calls
                    start_at=ev.start,
                    end_at=ev.end,
                    labels=_labels_encoder.encode(projection_tags(ev.labels)).decode(),
                )
            )
        return rows

    async def digest(self, conn: AsyncConnection, version: int) -> str:
        columns = [c for c in annotations_table.columns if c.name != "version"]
        result = await conn.execute(
            select(*columns).where(annotations_table.c.version == version).order_by(annotations_table.c.position)
        )
        return hashlib.sha256(_labels_encoder.encode_lines([tuple(r) for r in result])).hexdigest()


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
