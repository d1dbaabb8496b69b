"""Which bodies a retention rule selects: the request and response bodies of the calls of a run and/or
started before a moment, less the bodies a call outside the selection also references (bodies are stored
once by content), unless those are asked for too.

One pass over the calls read model (both body columns, grouped by hash: a hash whose references are all
selected goes, one with a reference outside is shared) is written to a scratch SQLite file, so memory holds
one batch however many bodies a year leaves and no read snapshot stays open while the bodies are erased.
Calls the read model has not folded yet are outside the selection: `ErasurePlan.referenced_since` reads the
events appended after the plan's checkpoint, so a body a new call reuses is kept. This module only reads;
the erasing is `ledger.erase_bodies`.
"""

from __future__ import annotations

import sqlite3
import tempfile
from collections.abc import AsyncIterator, Iterable
from datetime import datetime
from pathlib import Path

import msgspec
from sqlalchemy import ColumnElement, and_, case, func, select, true, union_all
from sqlalchemy.ext.asyncio import AsyncConnection

from usage_ledger.ledger import CallFailed, CallFinished, CallStarted, Database, decode_event
from usage_ledger.ledger.schema import blobs, events
from usage_ledger.projections import catch_up_all, live_version, read_checkpoint
from usage_ledger.projections.tables import calls

__all__ = ("BodySelection", "ErasurePlan", "plan_erasure")

_WRITE_CHUNK = 5000
_REFERENCING = ("call.started", "call.finished", "call.failed")
"""The events that name a body (`request_blob`, `response_blob`)."""


class BodySelection(msgspec.Struct, frozen=True, kw_only=True):
    """The calls whose bodies go: of `run`, started before `before` (both when both are given)."""

    run: str | None = None
    before: datetime | None = None
    include_shared: bool = False
    """Also the bodies calls outside the selection reference."""

    def __post_init__(self) -> None:
        if self.run is None and self.before is None:
            raise ValueError("a body selection names a run, a moment, or both")
        if self.before is not None and self.before.tzinfo is None:
            raise ValueError("`before` must be timezone-aware")


class ErasurePlan:
    """What a selection erases, counted, with its bodies in a scratch file (`close` removes it)."""

    def __init__(self, directory: tempfile.TemporaryDirectory[str], checkpoint: int) -> None:
        self._directory = directory
        self._db = sqlite3.connect(Path(directory.name) / "bodies.db")
        self._db.execute("CREATE TABLE bodies (hash TEXT PRIMARY KEY, size INTEGER, stored INTEGER)")
        self.checkpoint = checkpoint
        """The calls read model's position when planned: later events are read by `referenced_since`."""
        self.calls = 0
        self.bodies = 0
        self.raw_bytes = 0
        self.stored_bytes = 0
        self.kept_shared = 0
        """Bodies left because a call outside the selection references them (0 with include_shared)."""
        self.already_erased = 0
        self._seen = checkpoint
        self._referenced: set[str] = set()

    def _add(self, rows: Iterable[tuple[str, int, int, int, bool]], include_shared: bool) -> None:
        keep: list[tuple[str, int, int]] = []
        for digest, only_selected, size, stored, erased in rows:
            if erased:
                self.already_erased += 1
            elif not only_selected and not include_shared:
                self.kept_shared += 1
            else:
                keep.append((digest, size, stored))
                self.raw_bytes += size
                self.stored_bytes += stored
        self.bodies += len(keep)
        self._db.executemany("INSERT INTO bodies VALUES (?, ?, ?)", keep)

    def batches(self, size: int) -> Iterable[list[str]]:
        """The selected bodies' hashes, `size` at a time, in hash order."""
        after = ""
        while True:
            rows = self._db.execute(
                "SELECT hash FROM bodies WHERE hash > ? ORDER BY hash LIMIT ?", (after, size)
            ).fetchall()
            if not rows:
                return
            yield [row[0] for row in rows]
            after = rows[-1][0]

    async def referenced_since(self, database: Database, digests: Iterable[str]) -> set[str]:
        """Which of `digests` a call recorded after the plan references (it is outside the selection)."""
        async with database.engine.connect() as conn:
            while True:
                page = (
                    await conn.execute(
                        select(events.c.position, events.c.payload)
                        .where(events.c.position > self._seen, events.c.type.in_(_REFERENCING))
                        .order_by(events.c.position)
                        .limit(_WRITE_CHUNK)
                    )
                ).all()
                for position, payload in page:
                    body = decode_event(payload)
                    if isinstance(body, CallStarted) and body.request_blob:
                        self._referenced.add(body.request_blob)
                    elif isinstance(body, (CallFinished, CallFailed)) and body.response_blob:
                        self._referenced.add(body.response_blob)
                    self._seen = position
                if len(page) < _WRITE_CHUNK:
                    return self._referenced.intersection(digests)

    def close(self) -> None:
        self._db.close()
        self._directory.cleanup()


async def plan_erasure(database: Database, selection: BodySelection, *, refresh: bool = True) -> ErasurePlan:
    """The selection's bodies counted and written to a scratch file, after catching the read models up when
    `refresh` (the gateway does not: its follower child keeps them, and folding would stall its calls)."""
    if refresh:
        await catch_up_all(database)
    directory = tempfile.TemporaryDirectory(prefix="ledger-erase-")
    try:
        async with database.engine.connect() as conn:
            version, _ = await live_version(conn, "calls")
            plan = ErasurePlan(directory, await read_checkpoint(conn, "calls", version))
    except BaseException:
        directory.cleanup()
        raise
    try:
        async with database.engine.connect() as conn:
            chosen = _chosen(selection)
            plan.calls = int(
                (
                    await conn.execute(
                        select(func.count()).select_from(calls).where(calls.c.version == version, chosen)
                    )
                ).scalar_one()
            )
            async for rows in _bodies(conn, version, chosen):
                plan._add(rows, selection.include_shared)
        plan._db.commit()
    except BaseException:
        plan.close()
        raise
    return plan


def _chosen(selection: BodySelection) -> ColumnElement[bool]:
    clauses: list[ColumnElement[bool]] = []
    if selection.run is not None:
        clauses.append(calls.c.run == selection.run)
    if selection.before is not None:
        clauses.append(calls.c.started_at < selection.before)
    return and_(true(), *clauses)


async def _bodies(
    conn: AsyncConnection, version: int, chosen: ColumnElement[bool]
) -> AsyncIterator[list[tuple[str, int, int, int, bool]]]:
    """(hash, 1 if every call referencing it is selected, size, stored size, erased) of each body a selected
    call references, `_WRITE_CHUNK` at a time: one grouping pass over both body columns."""
    picked = case((chosen, 1), else_=0)
    references = union_all(
        *(
            select(column.label("digest"), picked.label("picked")).where(
                calls.c.version == version, column.is_not(None)
            )
            for column in (calls.c.request_blob, calls.c.response_blob)
        )
    ).subquery()
    grouped = (
        select(references.c.digest, func.min(references.c.picked).label("only"))
        .group_by(references.c.digest)
        .having(func.max(references.c.picked) == 1)
        .subquery()
    )
    query = select(
        grouped.c.digest, grouped.c.only, blobs.c.size, blobs.c.stored_size, blobs.c.redacted_at.is_not(None)
    ).join(blobs, blobs.c.hash == grouped.c.digest)
    result = await conn.stream(query)
    async for chunk in result.partitions(_WRITE_CHUNK):
        yield [(row[0], int(row[1]), int(row[2]), int(row[3]), bool(row[4])) for row in chunk]
