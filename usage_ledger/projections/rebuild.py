"""Full rebuilds beside the live version, and promotion (`ledger rebuild`, `ledger recompute`).

A rebuild fills version N+1 through the follower's own path (`engine.catch_up`), optionally first folded
by worker processes each taking a range of call streams (docs/scaling.md), then digests, appends
`projection.promoted` and switches the pointer."""

from __future__ import annotations

import asyncio
import multiprocessing
import uuid
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing.synchronize import Event as EventType

import msgspec
import structlog
from sqlalchemy import delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from usage_ledger.ledger import (
    Database,
    ProjectionPromoted,
    append_events,
    backend_of,
    head_position,
    new_event,
    open_database,
    utc_now,
)
from usage_ledger.ledger.schema import checkpoints, events
from usage_ledger.projections.engine import (
    Progress,
    Stage,
    catch_up,
    ensure_pointer,
    live_version,
    projection_named,
    read_streams_page,
    write_checkpoint,
    write_rows,
)
from usage_ledger.projections.formulas import get_formula
from usage_ledger.projections.tables import versions

__all__ = (
    "analyze_version",
    "drop_version",
    "fold_in_workers",
    "next_version",
    "promote_version",
    "rebuild_projection",
    "set_formula",
    "start_version",
)

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
        current_formula = (await live_version(conn, name))[1]
        new_version = await next_version(conn, name, live)
    await start_version(database, name, new_version)
    if workers > 1 and projection.partition_key is not None:
        say(f"folding events into version {new_version} in {workers} worker processes")
        if await fold_in_workers(database, name, new_version, workers, page_size=page_size, progress=progress):
            say(f"folding events appended meanwhile into version {new_version}")
        else:
            say(f"an event outside its key's stream: folding events into version {new_version} in this process")
            async with database.engine.begin() as conn:
                await _drop_rows(conn, name, new_version)
    else:
        say(f"folding events into version {new_version}")
    await catch_up(database, name, new_version, page_size=page_size, progress=progress)
    await analyze_version(database, name)
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


async def next_version(conn: AsyncConnection, name: str, live: int) -> int:
    """The number a new version of `name` gets: above the live one and every one with a checkpoint."""
    known = (
        await conn.execute(select(func.max(checkpoints.c.version)).where(checkpoints.c.projection == name))
    ).scalar_one_or_none()
    return max(live, int(known or 0)) + 1


async def start_version(database: Database, name: str, version: int) -> None:
    """`version` of `name` empty, at checkpoint 0 (ready for `catch_up` from the first event)."""
    async with database.engine.begin() as conn:
        await _drop_rows(conn, name, version)
        await write_checkpoint(conn, name, version, 0)


async def analyze_version(database: Database, name: str) -> None:
    """Statistics for the rows just written, before a digest. PostgreSQL: without them (autovacuum off, or not
    yet round) it planned each of the digest's pages by call id as a scan and sort of the rest of the version."""
    async with database.engine.begin() as conn:
        await database.backend_ops.analyze(conn, projection_named(name).table)


async def fold_in_workers(
    database: Database, name: str, version: int, workers: int, *, page_size: int, progress: Progress | None = None
) -> int | None:
    """Fold every event up to the head into `version` (empty, checkpoint 0) in `workers` processes, then set
    its checkpoint to that head; returns it, or None (checkpoint left at 0, rows to be dropped) if an event
    is not in its key's stream. A worker that fails fails the rebuild (the version is left unpromoted; the
    next rebuild starts another). Either way the other workers stop at their next page (`_stop`), not at the
    end of their range, and this returns or raises once every worker has ended."""
    async with database.engine.connect() as conn:
        head = await head_position(conn)
        bounds = await _stream_bounds(conn, workers)
    ranges = list(zip([None, *bounds], [*bounds, None], strict=True))
    loop = asyncio.get_running_loop()
    # spawn: a fork would copy this process's event loop, threads and open connections
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    with ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_given, initargs=(stop,)) as pool:
        parts = [
            loop.run_in_executor(pool, _fold_part, database.url, name, version, head, low, high, page_size)
            for low, high in ranges
        ]
        try:
            for done, finished in enumerate(asyncio.as_completed(parts), start=1):
                await finished
                if progress is not None:
                    progress(head * done // workers, head)
        except BaseException as exc:
            stop.set()
            await asyncio.gather(*parts, return_exceptions=True)  # each stops at its next page
            if isinstance(exc, _OutsideItsStream):
                return None
            raise
    async with database.engine.begin() as conn:
        await write_checkpoint(conn, name, version, head)
    return head


async def _stream_bounds(conn: AsyncConnection, parts: int) -> list[str]:
    """`parts - 1` streams that split the events in `parts` about equal ranges of streams, in the database's
    order of them (the one its comparisons use): the k-th range is [bound k-1, bound k)."""
    count = (await conn.execute(select(func.count()).select_from(events))).scalar_one()
    bounds: list[str] = []
    for k in range(1, parts):
        query = select(events.c.stream).order_by(events.c.stream).limit(1).offset(count * k // parts)
        bound = (await conn.execute(query)).scalar_one_or_none()
        if bound is not None:
            bounds.append(bound)
    return bounds


class _OutsideItsStream(Exception):
    """A worker read an event whose key's stream is not the one it was appended to."""


class _Stopped(Exception):
    """A worker was told to stop: another one failed, or the rebuild was interrupted."""


_stop: EventType | None = None
"""In a worker: the rebuild's stop event (given by the pool's initializer), which `fold_in_workers` sets when a
worker fails or the rebuild is interrupted; read between pages."""


def _given(stop: EventType) -> None:
    """A worker's initializer: keep the rebuild's stop event."""
    global _stop
    _stop = stop


def _fold_part(url: str, name: str, version: int, head: int, low: str | None, high: str | None, page_size: int) -> int:
    """A worker process: fold the events up to `head` whose stream is in [`low`, `high`)."""
    return asyncio.run(_fold_part_async(url, name, version, head, low, high, page_size))


async def _fold_part_async(
    url: str, name: str, version: int, head: int, low: str | None, high: str | None, page_size: int
) -> int:
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
        reading = asyncio.create_task(read_streams_page(database, 0, min(page_size, head), low, high))
        for after in range(0, head, page_size):
            if _stop is not None and _stop.is_set():
                raise _Stopped
            page = await reading
            if after + page_size < head:  # the next page is read while this one is folded and written
                until = min(after + 2 * page_size, head)
                reading = asyncio.create_task(read_streams_page(database, after + page_size, until, low, high))
            mine = [(position, type_, payload) for position, type_, stream, payload in page if type_ in handles]
            if any(key_of(payload) != stream for _, type_, stream, payload in page if type_ in handles):
                raise _OutsideItsStream
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
        if not reading.done():
            reading.cancel()
        await database.dispose()


async def drop_version(conn: AsyncConnection, name: str, version: int) -> None:
    """Remove `version` of projection `name`: its rows and its checkpoint."""
    await _drop_rows(conn, name, version)
    await conn.execute(checkpoints.delete().where(checkpoints.c.projection == name, checkpoints.c.version == version))


async def _drop_rows(conn: AsyncConnection, name: str, version: int) -> None:
    table = projection_named(name).table
    await backend_of(conn).delete(conn, delete(table).where(table.c.version == version))


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
