"""`ledger verify --read-models`: fold the events again and compare each stored read model with the fold.

The scratch version is folded by `engine.catch_up` (memory stays flat) and dropped afterwards; its digest
is compared with the live one's at one checkpoint, and a full outer join in SQL names the keys that differ."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
from sqlalchemy import and_, func, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from usage_ledger.ledger import Database
from usage_ledger.projections.engine import PROJECTIONS, catch_up, live_version, projection_named, read_checkpoint
from usage_ledger.projections.rebuild import analyze_version, drop_version, next_version, start_version

__all__ = ("ReadModelCheck", "RowDifference", "verify_read_models")

_NAMED = 20
"""Differing rows named per read model (all are counted)."""
_ATTEMPTS = 5
"""Times the scratch version is caught up to a live version the follower moved while the digests were taken."""


class RowDifference(msgspec.Struct, frozen=True, kw_only=True):
    key: str
    problem: str
    """`missing` (the fold has the row, the stored model not), `extra` (the other way), or `differs: a, b`."""


class ReadModelCheck(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    version: int
    checkpoint: int
    ok: bool
    stored_digest: str
    folded_digest: str
    differing_rows: int = 0
    rows: list[RowDifference] = []
    """The first differing rows by key (at most 20)."""
    problem: str | None = None


async def verify_read_models(
    database: Database, names: Sequence[str] = (), *, page_size: int = 50_000
) -> list[ReadModelCheck]:
    """Each read model of `names` (default: all) checked against the events folded again."""
    return [await _check(database, name, page_size) for name in (names or list(PROJECTIONS))]


async def _check(database: Database, name: str, page_size: int) -> ReadModelCheck:
    projection = projection_named(name)
    async with database.engine.connect() as conn:
        live, _ = await live_version(conn, name)
        scratch = await next_version(conn, name, live)
    await start_version(database, name, scratch)
    try:
        for _ in range(_ATTEMPTS):
            async with database.engine.connect() as conn:
                target = await read_checkpoint(conn, name, live)
            await catch_up(database, name, scratch, until=target, page_size=page_size)
            await analyze_version(database, name)
            async with database.engine.connect() as conn:
                stored = await projection.digest(conn, live)
                folded = await projection.digest(conn, scratch)
                if await read_checkpoint(conn, name, live) != target:
                    continue  # the follower applied more events meanwhile: fold those too, digest again
                ok = stored == folded
                count, rows = (0, []) if ok else await _differences(conn, name, live, scratch)
            problem = f"{count} row(s) of version {live} differ from the events folded again up to position {target}"
            return ReadModelCheck(
                name=name,
                version=live,
                checkpoint=target,
                ok=ok,
                stored_digest=stored,
                folded_digest=folded,
                differing_rows=count,
                rows=rows,
                problem=None if ok else problem,
            )
        return ReadModelCheck(
            name=name,
            version=live,
            checkpoint=target,
            ok=False,
            stored_digest="",
            folded_digest="",
            problem=f"the live version kept moving ({_ATTEMPTS} attempts): run it again, or with the follower stopped",
        )
    finally:
        async with database.engine.begin() as conn:
            await drop_version(conn, name, scratch)


async def _differences(conn: AsyncConnection, name: str, live: int, scratch: int) -> tuple[int, list[RowDifference]]:
    """How many rows differ between the two versions, and the first `_NAMED` by key, with what differs."""
    table = projection_named(name).table
    keys = [c.name for c in table.primary_key.columns if c.name != "version"]
    values = [c.name for c in table.columns if c.name != "version"]
    stored = select(table).where(table.c.version == live).subquery("stored")
    folded = select(table).where(table.c.version == scratch).subquery("folded")
    joined = stored.join(folded, and_(*(stored.c[k] == folded.c[k] for k in keys)), full=True)
    differs = or_(*(stored.c[v].is_distinct_from(folded.c[v]) for v in values))
    key = [func.coalesce(stored.c[k], folded.c[k]) for k in keys]
    count = (await conn.execute(select(func.count()).select_from(joined).where(differs))).scalar_one()
    flags = [stored.c[v].is_distinct_from(folded.c[v]).label(v) for v in values]
    first = (
        await conn.execute(
            select(
                *(k.label(f"key_{i}") for i, k in enumerate(key)),
                (stored.c[keys[0]].is_(None)).label("missing"),
                (folded.c[keys[0]].is_(None)).label("extra"),
                *flags,
            )
            .select_from(joined)
            .where(differs)
            .order_by(*key)
            .limit(_NAMED)
        )
    ).all()
    rows = []
    for row in first:
        mapping = row._mapping
        shown = "/".join(str(mapping[f"key_{i}"]) for i in range(len(keys)))
        if mapping["missing"]:
            problem = "missing"
        elif mapping["extra"]:
            problem = "extra"
        else:
            problem = "differs: " + ", ".join(v for v in values if mapping[v])
        rows.append(RowDifference(key=shown, problem=problem))
    return int(count), rows
