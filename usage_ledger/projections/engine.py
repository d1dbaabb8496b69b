"""Running projections: checkpointed catch-up, the follower, status (rebuilds: `projections.rebuild`).

    events ──page──► projection.fold(conn, version, page, unwritten) ──► rows ──► write_rows(table, rows)
    (a position      (decoding, reading the rows it continues)                   + checkpoint(name, version),
     range)                                                                        one writer transaction

Every projection row carries a version. `projection_versions` points at the live one; readers
always read it. The follower and a rebuild both apply pages here (`catch_up`), in a pipeline: page
N+1 is read and folded while page N is written (the database's work runs in its own threads, without
Python's lock); rows page N+1 continues are taken from page N's (`unwritten`), not read back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import msgspec
import structlog
from sqlalchemy import Table, select
from sqlalchemy.ext.asyncio import AsyncConnection

from usage_ledger.ledger import (
    Checkpoint,
    Database,
    DatabaseUnavailable,
    LedgerError,
    backend_of,
    head_position,
    translate_db_error,
    utc_now,
)
from usage_ledger.ledger.schema import checkpoints
from usage_ledger.projections.annotations import AnnotationsProjection
from usage_ledger.projections.calls import CallsProjection
from usage_ledger.projections.errors import UnknownProjection
from usage_ledger.projections.formulas import DEFAULT_FORMULA
from usage_ledger.projections.tables import versions

__all__ = (
    "PROJECTIONS",
    "Moved",
    "Page",
    "Progress",
    "Projection",
    "ProjectionStatus",
    "Stage",
    "catch_up",
    "catch_up_all",
    "ensure_pointer",
    "follow_projections",
    "live_version",
    "projection_named",
    "projection_status",
    "read_checkpoint",
    "read_page",
    "read_streams_page",
    "write_checkpoint",
    "write_rows",
)

Progress = Callable[[int, int], None]
Stage = Callable[[str], None]
"""Told what a rebuild is doing now, in a few words (`ledger rebuild` shows it beside the bar)."""


Page = Sequence[tuple[int, str, str]]
"""Events as read for projections: (position, type, payload), in position order."""


class Projection(Protocol):
    """A read model: the event types it reads, its table, its fold, its digest."""

    name: str
    handles: frozenset[str]
    table: Table
    """Its rows, whose primary key includes `version`: msgspec Structs of its columns in order, upserted whole."""

    @property
    def partition_key(self) -> Callable[[str], str] | None:
        """The key an event's payload belongs to, when rows of different keys never read each other's events:
        the name of the stream every event of that key is appended to (a rebuild's workers each fold a range
        of streams, which the database selects); None: folded in one process."""
        ...

    async def fold(
        self, conn: AsyncConnection, version: int, page: Page, unwritten: Sequence[msgspec.Struct] = ()
    ) -> Sequence[msgspec.Struct]:
        """The rows `page` changes, whole, folded onto their stored state (reads, never writes).

        `unwritten`: the previous page's rows, whose write may not have committed yet; a row among them is
        continued from there (never changed in place), not read from the table.
        """
        ...

    async def digest(self, conn: AsyncConnection, version: int) -> str:
        """SHA-256 over every row of `version` in key order: equal for equal events, however built."""
        ...


PROJECTIONS: dict[str, Projection] = {p.name: p for p in (CallsProjection(), AnnotationsProjection())}


class ProjectionStatus(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    version: int
    live: bool
    checkpoint: int
    head: int
    lag: int
    formula: str | None = None
    digest: str | None = None


class Moved(Exception):
    """Another runner advanced the checkpoint first; re-read and continue."""


def projection_named(name: str) -> Projection:
    try:
        return PROJECTIONS[name]
    except KeyError:
        raise UnknownProjection(f"unknown projection {name!r}; known: {', '.join(sorted(PROJECTIONS))}") from None


async def _pointer(conn: AsyncConnection, name: str) -> tuple[int, str] | None:
    """(live version, formula) of a projection, as its pointer says; None if it has none yet."""
    row = (
        await conn.execute(select(versions.c.live_version, versions.c.formula).where(versions.c.name == name))
    ).first()
    return (row.live_version, row.formula) if row else None


async def live_version(conn: AsyncConnection, name: str) -> tuple[int, str]:
    """(live version, formula) of a projection; version 1 with the default formula if never built."""
    return await _pointer(conn, name) or (1, DEFAULT_FORMULA)


async def ensure_pointer(database: Database, name: str) -> int:
    """The live version of `name`; its pointer is written first if it has none.

    Read before any write: the follower calls this on every pass, and on SQLite even an INSERT that
    inserts nothing takes the ledger's write lock, which the gateway's appends then wait for.
    """
    async with database.engine.connect() as conn:
        found = await _pointer(conn, name)
    if found is not None:
        return found[0]
    async with database.engine.begin() as conn:
        statement = database.backend_ops.insert(versions).values(
            name=name, live_version=1, formula=DEFAULT_FORMULA, head_position=0, digest="", promoted_at=utc_now()
        )
        await conn.execute(statement.on_conflict_do_nothing(index_elements=["name"]))
        version, _ = await live_version(conn, name)
        return version


async def read_checkpoint(conn: AsyncConnection, name: str, version: int) -> int:
    query = select(checkpoints.c.position).where(checkpoints.c.projection == name, checkpoints.c.version == version)
    value = (await conn.execute(query)).scalar_one_or_none()
    return int(value) if value is not None else 0


async def write_checkpoint(conn: AsyncConnection, name: str, version: int, position: int) -> None:
    statement = (
        backend_of(conn)
        .insert(checkpoints)
        .values(projection=name, version=version, position=position, updated_at=utc_now())
    )
    await conn.execute(
        statement.on_conflict_do_update(
            index_elements=["projection", "version"],
            set_={"position": statement.excluded.position, "updated_at": statement.excluded.updated_at},
        )
    )


async def read_page(database: Database, after: int, until: int) -> list[tuple[int, str, str]]:
    """The events at positions (`after`, `until`], as (position, type, payload), through the driver (no
    per-row SQLAlchemy processing).

    A position range, never `type IN (…) … LIMIT`: PostgreSQL plans that as a scan of every remaining event
    and a sort per page; a range of the primary key is read in order on both backends.
    """
    query = "SELECT position, type, payload FROM ledger_events WHERE position > {} AND position <= {} ORDER BY position"
    return await _fetch(database, query, [after, until])


async def read_streams_page(
    database: Database, after: int, until: int, low: str | None, high: str | None
) -> list[tuple[int, str, str, str]]:
    """`read_page` of the events whose stream is in [`low`, `high`) (None: unbounded), as (position, type,
    stream, payload): the database compares the streams, in its own order (a rebuild's worker reads so).

    `stream || ''`: the same comparison, but not one the stream's index can serve; PostgreSQL otherwise
    ANDed that index's scan of every stream past `low` into each page's read of a position range.
    """
    where, params = ["position > {} AND position <= {}"], list[int | str]([after, until])
    for bound, op in ((low, ">="), (high, "<")):
        if bound is not None:
            where.append(f"stream || '' {op} {{}}")
            params.append(bound)
    query = f"SELECT position, type, stream, payload FROM ledger_events WHERE {' AND '.join(where)} ORDER BY position"
    return await _fetch(database, query, params)


async def _fetch(database: Database, query: str, params: list[int | str]) -> list[Any]:
    """`query` (its parameters written `{}`) run by the driver itself, rows as tuples, on either backend."""
    async with database.engine.connect() as conn:
        return await database.backend_ops.fetch(conn, query, params)


async def catch_up(
    database: Database,
    name: str,
    version: int | None = None,
    *,
    page_size: int = 20_000,
    until: int | None = None,
    progress: Progress | None = None,
) -> int:
    """Apply every event after the checkpoint of `name`@`version` (default: live); returns the new checkpoint."""
    projection = projection_named(name)
    reading: asyncio.Task[list[tuple[int, str, str]]] | None = None
    writing: asyncio.Task[None] | None = None
    try:
        if version is None:
            version = await ensure_pointer(database, name)
        async with database.engine.connect() as conn:
            position = await read_checkpoint(conn, name, version)
            head = await head_position(conn) if until is None else until
        applied, written = position, position  # folded up to; committed up to
        unwritten: Sequence[msgspec.Struct] = ()
        while applied < head or writing is not None:
            page: list[tuple[int, str, str]] = []
            if applied < head:
                if reading is None:
                    reading = asyncio.create_task(read_page(database, applied, min(applied + page_size, head)))
                page = await reading
                reading = None
                if page and page[-1][0] < head:  # the next page is read while this one is folded and written
                    after = page[-1][0]
                    reading = asyncio.create_task(read_page(database, after, min(after + page_size, head)))
            rows: Sequence[msgspec.Struct] = ()
            if page:
                async with database.engine.connect() as conn:
                    rows = await projection.fold(conn, version, page, unwritten)
            try:
                if writing is not None:
                    await writing
                    writing = None
                    if progress is not None:
                        progress(applied, head)
                    written = applied
            except Moved:
                writing = None
                if reading is not None:
                    reading.cancel()
                    reading = None
                async with database.engine.connect() as conn:
                    applied = written = await read_checkpoint(conn, name, version)
                unwritten = ()
                continue
            if not page:
                break
            writing = asyncio.create_task(_apply_page(database, projection, version, written, page[-1][0], rows))
            applied, unwritten = page[-1][0], rows
        return written
    except LedgerError:
        raise
    except Exception as exc:
        raise translate_db_error(exc, database) from exc
    finally:
        for task in (reading, writing):
            if task is not None and not task.done():
                task.cancel()


async def _apply_page(
    database: Database, projection: Projection, version: int, expected: int, last: int, rows: Sequence[msgspec.Struct]
) -> None:
    """Write `rows` with checkpoint `last`, if the checkpoint is still `expected` (else `Moved`).

    The fold ran before the write lock is taken: on SQLite that lock is also the ledger's append lock,
    and the gateway's commits waited behind this Python work (BEGIN IMMEDIATE waits of up to ≈ 80 ms
    seen in `bench/gateway.py`). Rows it read are still current under the lock if the checkpoint is:
    every write to a version's rows advances its checkpoint in the same transaction.
    """
    moved = Checkpoint(projection.name, version, expected, last)
    if not await database.backend_ops.write_rows(database.engine, database.appender, projection.table, rows, moved):
        raise Moved


async def write_rows(database: Database, projection: Projection, version: int, rows: Sequence[msgspec.Struct]) -> None:
    """Write `rows` of `version` without touching its checkpoint: a rebuild's worker writes its share of the
    rows so, and the rebuild sets the checkpoint once every worker is done (`rebuild.fold_in_workers`)."""
    await database.backend_ops.write_rows(database.engine, database.appender, projection.table, rows)


async def catch_up_all(database: Database) -> dict[str, int]:
    """Bring every live projection up to the head; returns the checkpoints."""
    return {name: await catch_up(database, name) for name in PROJECTIONS}


async def projection_status(database: Database) -> list[ProjectionStatus]:
    async with database.engine.connect() as conn:
        head = await head_position(conn)
        pointers = {r.name: r for r in await conn.execute(select(versions))}
        rows = (
            await conn.execute(
                select(checkpoints.c.projection, checkpoints.c.version, checkpoints.c.position).order_by(
                    checkpoints.c.projection, checkpoints.c.version
                )
            )
        ).all()
    out: list[ProjectionStatus] = []
    seen: set[tuple[str, int]] = set()
    for r in rows:
        if r.projection not in PROJECTIONS:
            continue
        pointer = pointers.get(r.projection)
        live = pointer is not None and pointer.live_version == r.version
        seen.add((r.projection, r.version))
        out.append(
            ProjectionStatus(
                name=r.projection,
                version=r.version,
                live=live,
                checkpoint=r.position,
                head=head,
                lag=head - r.position,
                formula=pointer.formula if live and pointer else None,
                digest=(pointer.digest or None) if live and pointer else None,
            )
        )
    for name in PROJECTIONS:
        pointer = pointers.get(name)
        version = pointer.live_version if pointer else 1
        if (name, version) not in seen:
            out.append(ProjectionStatus(name=name, version=version, live=True, checkpoint=0, head=head, lag=head))
    return out


async def follow_projections(database: Database, *, poll_interval_s: float = 0.5) -> None:
    """Keep every live projection caught up, forever (`ledger projections run --follow`, which
    `ledger serve` runs as a child process): a pass every `poll_interval_s`; an unreachable database
    is retried with a back-off, never fatal."""
    delay = poll_interval_s
    while True:
        try:
            await catch_up_all(database)
            delay = poll_interval_s
        except DatabaseUnavailable as exc:
            structlog.get_logger("projections.engine").warning("projections_database_unavailable", error=str(exc))
            delay = min(delay * 2, 30.0)
        except LedgerError as exc:
            structlog.get_logger("projections.engine").error("projections_catch_up_failed", error=str(exc))
            delay = min(delay * 2, 30.0)
        await asyncio.sleep(delay)
