"""Full rebuilds beside the live version, and promotion (`ledger rebuild`, `ledger recompute`).

A rebuild fills version N+1 in bulk up to the head captured at its start (`load_version`: the calls
projection in SQL, rows and checkpoint in one transaction), catches up what was appended meanwhile
through the incremental path (`engine.catch_up`), computes its digest, appends `projection.promoted`
and switches the pointer.
"""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path

import structlog
from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from usage_ledger.ledger.append import append_events, translate_db_error
from usage_ledger.ledger.db import WRITER_OPTION, Database
from usage_ledger.ledger.errors import LedgerError
from usage_ledger.ledger.events import ProjectionPromoted, new_event, utc_now
from usage_ledger.ledger.read import head_position
from usage_ledger.ledger.schema import checkpoints, events
from usage_ledger.projections.engine import (
    BulkLoad,
    Moved,
    Progress,
    Projection,
    Stage,
    catch_up,
    ensure_pointer,
    live_version,
    projection_named,
    read_checkpoint,
    write_checkpoint,
)
from usage_ledger.projections.formulas import get_formula
from usage_ledger.projections.tables import versions

__all__ = ("drop_version", "load_version", "promote_version", "rebuild_projection", "set_formula")

_PROMOTED_NS = uuid.UUID("6c1f3e0a-4b1d-5d7e-9a53-2f1d3c0b7e21")


# The bulk load's own SQLite connection: a bounded page cache for the ledger and its temp store (memory
# stays flat however long the ledger; the work file it attaches is read once, in order, through
# SQLite's default small cache). Connection-local: the ledger's durability settings are untouched.
_SQLITE_LOAD_PRAGMAS = ("PRAGMA cache_size = -65536", "PRAGMA temp.cache_size = -65536")
_TYPE_PAGE = 5000


async def load_version(
    database: Database,
    name: str,
    version: int,
    head: int,
    progress: Progress | None = None,
    stage: Stage | None = None,
) -> None:
    """Fill the empty `version` of `name` with every event up to `head` in bulk; checkpoint = `head`.

    A `BulkLoad` projection first reads what it needs (`prepare`, outside any transaction, no write
    lock; work files in a scratch directory that lives until the load ends), then writes every row
    and the checkpoint in one writer transaction; any other folds the events of its types, read
    through the type index (`_load_by_type`), in that transaction. Raises `Moved` if the version is
    not empty. On SQLite the connection is discarded afterwards, with what it attached and its pragmas.
    """
    projection = projection_named(name)
    bulk = projection if isinstance(projection, BulkLoad) else None
    with tempfile.TemporaryDirectory(prefix="ledger-rebuild-") as workdir:
        conn = await database.engine.connect()
        sqlite_ = conn.dialect.name == "sqlite"
        try:
            if sqlite_:
                for pragma in _SQLITE_LOAD_PRAGMAS:
                    await conn.exec_driver_sql(pragma)
                await conn.commit()
            if bulk is not None:
                await bulk.prepare(conn, head, Path(workdir), progress)
            if stage is not None:
                stage(f"writing version {version}")
            await conn.execution_options(**{WRITER_OPTION: True})
            async with conn.begin():
                if await read_checkpoint(conn, name, version, lock=True) != 0:
                    raise Moved
                if bulk is not None:
                    await bulk.load(conn, version, head)
                else:
                    await _load_by_type(conn, projection, version, head)
                await write_checkpoint(conn, name, version, head)
        finally:
            if sqlite_:
                await conn.invalidate()
            await conn.close()


async def _load_by_type(conn: AsyncConnection, projection: Projection, version: int, head: int) -> None:
    """Every event of the projection's types up to `head`, folded and written a page at a time."""
    after = 0
    while True:
        result = await conn.execute(
            select(events.c.position, events.c.type, events.c.payload)
            .where(events.c.type.in_(sorted(projection.handles)), events.c.position > after, events.c.position <= head)
            .order_by(events.c.position)
            .limit(_TYPE_PAGE)
        )
        page = [(r[0], r[1], r[2]) for r in result]
        if not page:
            return
        await projection.table.write(conn, await projection.fold(conn, version, page))
        after = page[-1][0]


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
    projection = projection_named(name)
    say = stage or (lambda _text: None)

    def reading(done: int, total: int) -> None:
        if progress is not None:
            progress(done, total)
        if done >= total:
            say("preparing rows")  # every event read; what the load does with them takes a while yet

    if formula is not None:
        get_formula(formula)
    live = await ensure_pointer(database, name)
    async with database.engine.begin() as conn:
        known = (
            await conn.execute(select(func.max(checkpoints.c.version)).where(checkpoints.c.projection == name))
        ).scalar_one_or_none()
        current_formula = (await live_version(conn, name))[1]
        new_version = max(live, int(known or 0)) + 1
        await projection.table.drop(conn, new_version)
        await write_checkpoint(conn, name, new_version, 0)
        head = await head_position(conn)
    say("reading events")
    try:
        await load_version(database, name, new_version, head, reading, say)
    except Moved:  # another runner is filling this version already; catch up alongside it
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
                await drop_version(conn, name, old)
    return promoted


async def drop_version(conn: AsyncConnection, name: str, version: int) -> None:
    """Remove `version` of projection `name`: its rows and its checkpoint."""
    await projection_named(name).table.drop(conn, version)
    await conn.execute(checkpoints.delete().where(checkpoints.c.projection == name, checkpoints.c.version == version))


async def promote_version(database: Database, name: str, version: int, formula: str) -> ProjectionPromoted:
    """Make `version` live: catch it up, digest it, append `projection.promoted`, switch the pointer.

    The event id is derived from (name, version, formula, position, digest), so a retry after a
    crash between the append and the pointer switch appends nothing twice.
    """
    projection = projection_named(name)
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
    version = await ensure_pointer(database, "calls")
    return await promote_version(database, "calls", version, formula)
