"""Full rebuilds beside the live version, and promotion (`ledger rebuild`, `ledger recompute`).

A rebuild fills version N+1 from position 0 through the follower's own path (`engine.catch_up`: events
read by position range in large pages, folded, rows written a page per transaction with the
checkpoint), computes its digest, appends `projection.promoted` and switches the pointer.

With `workers=N` (N > 1, for a projection whose rows each read only their own key's events: calls, by
call id) the events up to the head are first folded by N worker processes, each reading every page and
keeping a hash range of the keys (`zlib.crc32(key) % N`), writing its rows without a checkpoint; once all
are done the checkpoint is set to that head and `catch_up` folds whatever was appended meanwhile. The fold
is the same code either way (the digest says so); the workers only split it. How a rebuild grows to 1B
calls: docs/scaling.md.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import uuid
import zlib
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor

import msgspec
import structlog
from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from usage_ledger.ledger import (
    Database,
    ProjectionPromoted,
    append_events,
    head_position,
    new_event,
    open_database,
    utc_now,
)
from usage_ledger.ledger.schema import checkpoints
from usage_ledger.projections.engine import (
    Progress,
    Stage,
    catch_up,
    ensure_pointer,
    live_version,
    projection_named,
    read_page,
    write_checkpoint,
    write_rows,
)
from usage_ledger.projections.formulas import get_formula
from usage_ledger.projections.tables import versions

__all__ = ("drop_version", "fold_in_workers", "promote_version", "rebuild_projection", "set_formula")

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
    workers: int = 1,
) -> ProjectionPromoted:
    """Rebuild `name` from position 0 into a new version beside the live one, then promote it.

    `progress(position, head)` as the pages are applied; `stage(text)` as each step begins. `workers`: worker
    processes that fold the events up to the head between them (a projection without a `partition_key`
    is folded in this process whatever it says).
    """
    if workers < 1:
        raise ValueError(f"workers must be 1 or more, not {workers}")
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
    if workers > 1 and projection.partition_key is not None:
        say(f"folding events into version {new_version} in {workers} worker processes")
        await fold_in_workers(database, name, new_version, workers, page_size=page_size, progress=progress)
        say(f"folding events appended meanwhile into version {new_version}")
    else:
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


async def fold_in_workers(
    database: Database, name: str, version: int, workers: int, *, page_size: int, progress: Progress | None = None
) -> int:
    """Fold every event up to the head into `version` (empty, checkpoint 0) in `workers` processes, then set
    its checkpoint to that head; returns it. A worker that fails fails the rebuild (the version is left
    unpromoted; the next rebuild starts another)."""
    async with database.engine.connect() as conn:
        head = await head_position(conn)
    loop = asyncio.get_running_loop()
    # spawn: a fork would copy this process's event loop, threads and open connections
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        parts = [
            loop.run_in_executor(pool, _fold_part, database.url, name, version, head, part, workers, page_size)
            for part in range(workers)
        ]
        try:
            for done, finished in enumerate(asyncio.as_completed(parts), start=1):
                await finished
                if progress is not None:
                    progress(head * done // workers, head)
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    async with database.engine.begin() as conn:
        await write_checkpoint(conn, name, version, head)
    return head


def _fold_part(url: str, name: str, version: int, head: int, part: int, parts: int, page_size: int) -> int:
    """A worker process: fold the events up to `head` whose key falls in hash range `part` of `parts`."""
    return asyncio.run(_fold_part_async(url, name, version, head, part, parts, page_size))


async def _fold_part_async(url: str, name: str, version: int, head: int, part: int, parts: int, page_size: int) -> int:
    projection = projection_named(name)
    key_of = projection.partition_key
    assert key_of is not None
    handles = projection.handles
    if head == 0:
        return 0
    database = open_database(url)
    try:
        writing: asyncio.Task[None] | None = None
        unwritten: Sequence[msgspec.Struct] = ()
        folded = 0
        reading = asyncio.create_task(read_page(database, 0, min(page_size, head)))
        for after in range(0, head, page_size):
            page = await reading
            if after + page_size < head:  # the next page is read while this one is folded and written
                reading = asyncio.create_task(read_page(database, after + page_size, min(after + 2 * page_size, head)))
            mine = [e for e in page if e[1] in handles and zlib.crc32(key_of(e[2]).encode()) % parts == part]
            async with database.engine.connect() as conn:
                rows = await projection.fold(conn, version, mine, unwritten)
            if writing is not None:
                await writing
            writing = asyncio.create_task(write_rows(database, projection, version, rows)) if rows else None
            unwritten, folded = rows, folded + len(mine)
        if writing is not None:
            await writing
        return folded
    finally:
        await database.dispose()


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
