"""Running projections: checkpointed catch-up, full rebuilds beside the live version, promotion.

    events ──page──► projection.fold(conn, version, page) ──► rows ──► projection.write(conn, rows)
                     (decoding, reading the rows it continues)         + checkpoint(name, version),
                                                                         one writer transaction

Every projection row carries a version. `projection_versions` points at the live one; a rebuild
fills version N+1 in bulk up to the head captured at its start (`load_version`: the calls
projection in SQL, rows and checkpoint in one transaction), catches up what was appended
meanwhile through the incremental path, computes its digest, appends `projection.promoted` and
switches the pointer. Readers always read the live version.
"""

from __future__ import annotations

import asyncio
import sqlite3
import tempfile
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import msgspec
import structlog
from sqlalchemy import func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from usage_ledger.ledger.append import append_events, translate_db_error
from usage_ledger.ledger.db import WRITER_OPTION, Database
from usage_ledger.ledger.errors import DatabaseUnavailable, LedgerError
from usage_ledger.ledger.events import ProjectionPromoted, new_event, utc_now
from usage_ledger.ledger.read import head_position
from usage_ledger.ledger.schema import checkpoints, events, sqlite_time
from usage_ledger.ledger.sqlite_append import SqliteWrite
from usage_ledger.projections.annotations import AnnotationsProjection
from usage_ledger.projections.calls import CallsProjection
from usage_ledger.projections.errors import UnknownProjection
from usage_ledger.projections.formulas import DEFAULT_FORMULA, get_formula
from usage_ledger.projections.tables import versions

__all__ = (
    "PROJECTIONS",
    "Progress",
    "Projection",
    "ProjectionStatus",
    "Stage",
    "catch_up",
    "catch_up_all",
    "follow_projections",
    "live_version",
    "load_version",
    "projection_status",
    "promote_version",
    "rebuild_projection",
    "set_formula",
)

Progress = Callable[[int, int], None]
Stage = Callable[[str], None]
"""Told what a rebuild is doing now, in a few words (`ledger rebuild` shows it beside the bar)."""
_PROMOTED_NS = uuid.UUID("6c1f3e0a-4b1d-5d7e-9a53-2f1d3c0b7e21")


class Projection(Protocol):
    name: str
    handles: frozenset[str]

    async def fold(
        self, conn: AsyncConnection, version: int, page: Sequence[tuple[int, str, str]]
    ) -> list[dict[str, Any]]: ...
    async def write(self, conn: AsyncConnection, rows: list[dict[str, Any]]) -> None: ...
    def sqlite_write(self, rows: list[dict[str, Any]]) -> SqliteWrite: ...
    async def prepare(
        self, conn: AsyncConnection, head: int, workdir: Path, progress: Progress | None = None
    ) -> None: ...
    async def load(self, conn: AsyncConnection, version: int, head: int) -> None: ...
    async def digest(self, conn: AsyncConnection, version: int) -> str: ...
    async def drop(self, conn: AsyncConnection, version: int) -> None: ...


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


class _Moved(Exception):
    """Another runner advanced the checkpoint first; re-read and continue."""


def _projection(name: str) -> Projection:
    try:
        return PROJECTIONS[name]
    except KeyError:
        raise UnknownProjection(f"unknown projection {name!r}; known: {', '.join(sorted(PROJECTIONS))}") from None


def _dialect_insert(conn: AsyncConnection):  # type: ignore[no-untyped-def]
    return (postgresql if conn.dialect.name == "postgresql" else sqlite).insert


async def _pointer(conn: AsyncConnection, name: str) -> tuple[int, str] | None:
    """(live version, formula) of a projection, as its pointer says; None if it has none yet."""
    row = (
        await conn.execute(select(versions.c.live_version, versions.c.formula).where(versions.c.name == name))
    ).first()
    return (row.live_version, row.formula) if row else None


async def live_version(conn: AsyncConnection, name: str) -> tuple[int, str]:
    """(live version, formula) of a projection; version 1 with the default formula if never built."""
    return await _pointer(conn, name) or (1, DEFAULT_FORMULA)


async def _ensure_pointer(database: Database, name: str) -> int:
    """The live version of `name`; its pointer is written first if it has none.

    Read before any write: the follower calls this on every pass, and on SQLite even an INSERT that
    inserts nothing takes the ledger's write lock, which the gateway's appends then wait for.
    """
    async with database.engine.connect() as conn:
        found = await _pointer(conn, name)
    if found is not None:
        return found[0]
    async with database.engine.begin() as conn:
        statement = _dialect_insert(conn)(versions).values(
            name=name, live_version=1, formula=DEFAULT_FORMULA, head_position=0, digest="", promoted_at=utc_now()
        )
        await conn.execute(statement.on_conflict_do_nothing(index_elements=["name"]))
        version, _ = await live_version(conn, name)
        return version


async def _checkpoint(conn: AsyncConnection, name: str, version: int, *, lock: bool = False) -> int:
    query = select(checkpoints.c.position).where(checkpoints.c.projection == name, checkpoints.c.version == version)
    if lock and conn.dialect.name == "postgresql":
        query = query.with_for_update()
    value = (await conn.execute(query)).scalar_one_or_none()
    return int(value) if value is not None else 0


async def _write_checkpoint(conn: AsyncConnection, name: str, version: int, position: int) -> None:
    statement = _dialect_insert(conn)(checkpoints).values(
        projection=name, version=version, position=position, updated_at=utc_now()
    )
    await conn.execute(
        statement.on_conflict_do_update(
            index_elements=["projection", "version"],
            set_={"position": statement.excluded.position, "updated_at": statement.excluded.updated_at},
        )
    )


async def _read_page(database: Database, after: int, limit: int) -> list[tuple[int, str, str]]:
    async with database.engine.connect() as conn:
        result = await conn.execute(
            select(events.c.position, events.c.type, events.c.payload)
            .where(events.c.position > after)
            .order_by(events.c.position)
            .limit(limit)
        )
        return [(r[0], r[1], r[2]) for r in result]


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
    projection = _projection(name)
    try:
        if version is None:
            version = await _ensure_pointer(database, name)
        async with database.engine.connect() as conn:
            position = await _checkpoint(conn, name, version)
            head = await head_position(conn) if until is None else until
        while position < head:
            page = await _read_page(database, position, min(page_size, head - position))
            if not page:
                break
            try:
                await _apply_page(database, projection, version, position, page)
            except _Moved:
                async with database.engine.connect() as conn:
                    position = await _checkpoint(conn, name, version)
                continue
            position = page[-1][0]
            if progress is not None:
                progress(position, head)
        return position
    except LedgerError:
        raise
    except Exception as exc:
        raise translate_db_error(exc, database) from exc


async def _apply_page(
    database: Database, projection: Projection, version: int, expected: int, page: Sequence[tuple[int, str, str]]
) -> None:
    # The fold runs before the write lock is taken: on SQLite that lock is also the ledger's append
    # lock, and the gateway's commits waited behind this Python work (BEGIN IMMEDIATE waits of
    # up to ≈ 80 ms seen in `bench/gateway.py`). Rows read here are still current under the lock if
    # the checkpoint is: every write to a version's rows advances its checkpoint in the same
    # transaction.
    async with database.engine.connect() as conn:
        rows = await projection.fold(conn, version, page)
    if database.sqlite_appender is not None:
        # The whole write in one call on the appender's thread, rows converted before the lock is
        # taken: through aiosqlite its four statements held the lock 3-6 ms, and strict-mode appends
        # waited that out (the gateway's p99). Not synced: see `transaction(durable=False)`.
        write = projection.sqlite_write(rows)
        last = page[-1][0]
        await database.sqlite_appender.transaction(
            lambda sqlite_conn: _write_sqlite(sqlite_conn, projection.name, version, expected, write, last),
            durable=False,
        )
        return
    conn = await database.writer()
    try:
        async with conn.begin():
            if await _checkpoint(conn, projection.name, version, lock=True) != expected:
                raise _Moved
            await projection.write(conn, rows)
            await _write_checkpoint(conn, projection.name, version, page[-1][0])
    finally:
        await conn.close()


_SQLITE_CHECKPOINT = f"SELECT position FROM {checkpoints.name} WHERE projection = ? AND version = ?"
_SQLITE_SET_CHECKPOINT = (
    f"INSERT INTO {checkpoints.name} (projection, version, position, updated_at) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (projection, version) DO UPDATE SET position = excluded.position, updated_at = excluded.updated_at"
)


def _write_sqlite(
    conn: sqlite3.Connection, name: str, version: int, expected: int, write: SqliteWrite, last: int
) -> None:
    """`_apply_page`'s writer transaction, on the SQLite appender's thread (inside its transaction)."""
    found = conn.execute(_SQLITE_CHECKPOINT, (name, version)).fetchone()
    if (int(found[0]) if found else 0) != expected:
        raise _Moved
    write(conn)
    conn.execute(_SQLITE_SET_CHECKPOINT, (name, version, last, sqlite_time(utc_now())))


# The bulk load's own SQLite connection: a bounded page cache for the ledger and its temp store (memory
# stays flat however long the ledger; the work file it attaches is read once, in order, through
# SQLite's default small cache). Connection-local: the ledger's durability settings are untouched.
_SQLITE_LOAD_PRAGMAS = ("PRAGMA cache_size = -65536", "PRAGMA temp.cache_size = -65536")


async def load_version(
    database: Database,
    name: str,
    version: int,
    head: int,
    progress: Progress | None = None,
    stage: Stage | None = None,
) -> None:
    """Fill the empty `version` of `name` with every event up to `head` in bulk; checkpoint = `head`.

    The projection first reads what it needs (`prepare`, outside any transaction, no write lock;
    work files in a scratch directory that lives until the load ends), then writes every row and
    the checkpoint in one writer transaction. Raises `_Moved` if the version is not empty. On SQLite
    the connection is discarded afterwards, with what it attached and its pragmas.
    """
    projection = _projection(name)
    with tempfile.TemporaryDirectory(prefix="ledger-rebuild-") as workdir:
        conn = await database.engine.connect()
        sqlite_ = conn.dialect.name == "sqlite"
        try:
            if sqlite_:
                for pragma in _SQLITE_LOAD_PRAGMAS:
                    await conn.exec_driver_sql(pragma)
                await conn.commit()
            await projection.prepare(conn, head, Path(workdir), progress)
            if stage is not None:
                stage(f"writing version {version}")
            await conn.execution_options(**{WRITER_OPTION: True})
            async with conn.begin():
                if await _checkpoint(conn, name, version, lock=True) != 0:
                    raise _Moved
                await projection.load(conn, version, head)
                await _write_checkpoint(conn, name, version, head)
        finally:
            if sqlite_:
                await conn.invalidate()
            await conn.close()


async def catch_up_all(database: Database) -> dict[str, int]:
    """Bring every live projection up to the head; returns the checkpoints."""
    return {name: await catch_up(database, name) for name in PROJECTIONS}


async def rebuild_projection(
    database: Database,
    name: str,
    *,
    formula: str | None = None,
    page_size: int = 20_000,
    progress: Progress | None = None,
    stage: Stage | None = None,
    keep_old: bool = False,
) -> ProjectionPromoted:
    """Rebuild `name` from position 0 into a new version beside the live one, then promote it.

    `progress(events, head)` while the events are read; `stage(text)` as each step begins.
    """
    projection = _projection(name)
    say = stage or (lambda _text: None)

    def reading(done: int, total: int) -> None:
        if progress is not None:
            progress(done, total)
        if done >= total:
            say("preparing rows")  # every event read; what the load does with them takes a while yet

    if formula is not None:
        get_formula(formula)
    live = await _ensure_pointer(database, name)
    async with database.engine.begin() as conn:
        known = (
            await conn.execute(select(func.max(checkpoints.c.version)).where(checkpoints.c.projection == name))
        ).scalar_one_or_none()
        current_formula = (await live_version(conn, name))[1]
        new_version = max(live, int(known or 0)) + 1
        await projection.drop(conn, new_version)
        await _write_checkpoint(conn, name, new_version, 0)
        head = await head_position(conn)
    say("reading events")
    try:
        await load_version(database, name, new_version, head, reading, say)
    except _Moved:  # another runner is filling this version already; catch up alongside it
        pass
    except LedgerError:
        raise
    except Exception as exc:
        raise translate_db_error(exc, database) from exc
    if progress is not None:
        progress(head, head)
    say("catching up")
    await catch_up(database, name, new_version, page_size=page_size, progress=progress)
    say(f"digest and promotion of version {new_version}")
    promoted = await promote_version(database, name, new_version, formula or current_formula)
    if not keep_old:
        async with database.engine.begin() as conn:
            stale = (
                await conn.execute(
                    select(checkpoints.c.version).where(
                        checkpoints.c.projection == name, checkpoints.c.version != new_version
                    )
                )
            ).scalars()
            for old in list(stale):
                say(f"removing version {old}")
                await projection.drop(conn, old)
                await conn.execute(
                    checkpoints.delete().where(checkpoints.c.projection == name, checkpoints.c.version == old)
                )
    return promoted


async def promote_version(database: Database, name: str, version: int, formula: str) -> ProjectionPromoted:
    """Make `version` live: catch it up, digest it, append `projection.promoted`, switch the pointer.

    The event id is derived from (name, version, formula, position, digest), so a retry after a
    crash between the append and the pointer switch appends nothing twice.
    """
    projection = _projection(name)
    get_formula(formula)
    position = await catch_up(database, name, version)
    async with database.engine.connect() as conn:
        digest = await projection.digest(conn, version)
    body = ProjectionPromoted(name=name, version=version, formula=formula, head_position=position, digest=digest)
    event_id = uuid.uuid5(_PROMOTED_NS, f"{name}\n{version}\n{formula}\n{position}\n{digest}")
    await append_events(database, [new_event(body, stream=f"projection-{name}", event_id=event_id)])
    async with database.engine.begin() as conn:
        await conn.execute(
            update(versions)
            .where(versions.c.name == name)
            .values(live_version=version, formula=formula, head_position=position, digest=digest, promoted_at=utc_now())
        )
    structlog.get_logger("projections.engine").info(
        "projection_promoted", name=name, version=version, formula=formula, position=position, digest=digest
    )
    return body


async def set_formula(database: Database, formula: str) -> ProjectionPromoted:
    """Make `formula` the default of the calls projection (a promotion of the live version)."""
    version = await _ensure_pointer(database, "calls")
    return await promote_version(database, "calls", version, formula)


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
