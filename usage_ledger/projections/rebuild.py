"""Full rebuilds beside the live version, and promotion (`ledger rebuild`, `ledger recompute`).

A rebuild fills version N+1 from position 0 through the follower's own path (`engine.catch_up`: events
read by position range in large pages, folded, rows written a page per transaction with the
checkpoint), computes its digest, appends `projection.promoted` and switches the pointer.
"""

from __future__ import annotations

import uuid

import structlog
from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from usage_ledger.ledger.append import append_events
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.events import ProjectionPromoted, new_event, utc_now
from usage_ledger.ledger.schema import checkpoints
from usage_ledger.projections.engine import (
    Progress,
    Stage,
    catch_up,
    ensure_pointer,
    live_version,
    projection_named,
    write_checkpoint,
)
from usage_ledger.projections.formulas import get_formula
from usage_ledger.projections.tables import versions

__all__ = ("drop_version", "promote_version", "rebuild_projection", "set_formula")

_PROMOTED_NS = uuid.UUID("6c1f3e0a-4b1d-5d7e-9a53-2f1d3c0b7e21")


_REBUILD_PAGE = 50_000
"""Events a rebuild reads, folds and writes at a time (each page one short writer transaction, so appends
go on meanwhile; the follower's pages are smaller, its catch-ups being short)."""


async def rebuild_projection(
    database: Database,
    name: str,
    *,
    formula: str | None = None,
    page_size: int = _REBUILD_PAGE,
    progress: Progress | None = None,
    stage: Stage | None = None,
    keep_old: bool = False,
) -> ProjectionPromoted:
    """Rebuild `name` from position 0 into a new version beside the live one, then promote it.

    `progress(position, head)` as the pages are applied; `stage(text)` as each step begins.
    """
    projection = projection_named(name)
    say = stage or (lambda _text: None)
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
    say(f"folding events into version {new_version}")
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
