"""Calls as views: one call, a page of calls, or every call in start order (for export).

`in_flight`: calls running when this one started, itself included: start not later than its start, end later
(calls that never finished count only for themselves). Export counts it with a sweep (a heap of end times);
single calls and pages count in SQL."""

from __future__ import annotations

import heapq
from collections.abc import AsyncIterator, Mapping
from datetime import datetime
from typing import Any

import msgspec
from sqlalchemy import and_, case, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from usage_ledger.answers.filters import NO_FILTER, CallFilter, calls_where, filter_clauses
from usage_ledger.answers.reports import live_versions
from usage_ledger.ledger import Database
from usage_ledger.projections import CallsPage, CallView, NotFound, decode_rate_note
from usage_ledger.projections.tables import calls

__all__ = ("calls_page", "get_call", "iter_calls")

_tags = msgspec.json.Decoder(dict[str, str])
_VIEW_COLUMNS = [c for c in calls.columns if c.name != "version"]


def _view(row: Any, in_flight: int) -> CallView:
    fields = {k: row[k] for k in CallView.__struct_fields__ if k in row and k != "tags"}
    note = decode_rate_note(row["decode_tps"], row["output_tokens"], row["first_token_at"], row["last_token_at"])
    return CallView(**fields, tags=_tags.decode(row["tags"]), in_flight=in_flight, decode_tps_note=note)


async def _in_flight(conn: AsyncConnection, version: int, row: Any) -> int:
    started: datetime = row["started_at"]
    others = (
        await conn.execute(
            select(func.count()).where(
                calls.c.version == version,
                calls.c.started_at <= started,
                calls.c.ended_at > started,
                calls.c.call_id != row["call_id"],
            )
        )
    ).scalar_one()
    return int(others) + 1


async def get_call(database: Database, call_id: str, *, refresh: bool = True) -> CallView:
    version, _, _ = await live_versions(database, refresh=refresh)
    async with database.engine.connect() as conn:
        row = (
            (await conn.execute(select(*_VIEW_COLUMNS).where(calls.c.version == version, calls.c.call_id == call_id)))
            .mappings()
            .first()
        )
        if row is None:
            raise NotFound(f"no call {call_id!r} in the ledger")
        return _view(row, await _in_flight(conn, version, row))


async def calls_page(
    database: Database,
    *,
    run: str | None = None,
    offset: int = 0,
    limit: int = 100,
    run_gap_s: float = 900.0,
    refresh: bool = True,
    filters: CallFilter = NO_FILTER,
) -> CallsPage:
    """Calls in start order (those matching `filters`), `limit` at a time (at most 1000), and how many match."""
    limit = max(1, min(limit, 1000))
    offset = max(0, offset)
    version, _, _ = await live_versions(database, refresh=refresh)
    async with database.engine.connect() as conn:
        where = await calls_where(conn, version, run, run_gap_s, filters)
        total = int((await conn.execute(select(func.count()).select_from(calls).where(*where))).scalar_one())
        result = await conn.execute(
            select(*_VIEW_COLUMNS)
            .where(*where)
            .order_by(calls.c.started_at, calls.c.call_id)
            .offset(offset)
            .limit(limit + 1)
        )
        rows = list(result.mappings())
        items = [_view(r, await _in_flight(conn, version, r)) for r in rows[:limit]]
    return CallsPage(
        items=items, offset=offset, limit=limit, next_offset=offset + limit if len(rows) > limit else None, total=total
    )


async def iter_calls(
    database: Database,
    *,
    run: str | None = None,
    run_gap_s: float = 900.0,
    refresh: bool = True,
    filters: CallFilter = NO_FILTER,
    since_position: int | None = None,
) -> AsyncIterator[CallView]:
    """Every call (or every call of `run`, matching `filters`, changed after `since_position`) in start order,
    `in_flight` swept over all calls."""
    version, _, _ = await live_versions(database, refresh=refresh)
    async with database.engine.connect() as conn:
        query = select(*_VIEW_COLUMNS).where(calls.c.version == version).order_by(calls.c.started_at, calls.c.call_id)
        wanted: set[str] | None = None
        if run is not None:
            ids = await conn.execute(select(calls.c.call_id).where(*await calls_where(conn, version, run, run_gap_s)))
            wanted = set(ids.scalars())
        selected = filter_clauses(filters)
        if since_position is not None:
            selected.append(calls.c.last_position > since_position)
        if selected:  # every call still feeds the sweep; the flag says which are written
            query = query.add_columns(case((and_(*selected), 1), else_=0).label("selected_by_filter"))
        ends: list[datetime] = []
        group: list[Any] = []
        result = await conn.stream(query)
        async for part in result.mappings().partitions(2000):
            for row in part:
                if group and row["started_at"] != group[0]["started_at"]:
                    for view in _flush(group, ends, wanted):
                        yield view
                    group = []
                group.append(row)
        for view in _flush(group, ends, wanted):
            yield view


def _flush(group: list[Mapping[str, Any]], ends: list[datetime], wanted: set[str] | None) -> list[CallView]:
    if not group:
        return []
    started: datetime = group[0]["started_at"]
    while ends and ends[0] <= started:
        heapq.heappop(ends)
    for row in group:
        if row["ended_at"] is not None and row["ended_at"] > started:
            heapq.heappush(ends, row["ended_at"])
    out = []
    for row in group:
        if wanted is not None and row["call_id"] not in wanted:
            continue
        if not row.get("selected_by_filter", 1):
            continue
        counted = row["ended_at"] is not None and row["ended_at"] > started
        out.append(_view(row, len(ends) + (0 if counted else 1)))
    return out
