"""What the dashboard reads beyond the reports: filtered call lists, one call with its events and bodies,
and the server's samples over a run.

A body the ledger redacted (or never stored) shows as such: `read_blob` refuses it, and the page says why.
"""

from __future__ import annotations

from datetime import datetime

import msgspec
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import ColumnElement

from usage_ledger.answers import (
    NO_FILTER,
    Body,
    CallFilter,
    filter_clauses,
    live_versions,
    run_filter,
    show_call,
)
from usage_ledger.ledger import Database, ServerSampled
from usage_ledger.projections import CALL_STATUSES, CallView, NotFound, RunRow, load_samples, samples_of_run
from usage_ledger.projections.tables import calls

__all__ = (
    "MAX_BODY_CHARS",
    "BodyView",
    "CallDetail",
    "CallListRow",
    "CallQuery",
    "CallsList",
    "EventRow",
    "Facets",
    "call_detail",
    "call_facets",
    "list_calls",
    "run_samples",
)

MAX_BODY_CHARS = 200_000
"""A body longer than this shows its start only (`ledger show call ID` prints all of it)."""


class CallQuery(msgspec.Struct, frozen=True, kw_only=True):
    """The Calls page's filters: the reports' own (time range, model, status: answers.filters), a run, a ticker."""

    filters: CallFilter = NO_FILTER
    run: str | None = None
    ticker: str | None = None


class CallListRow(msgspec.Struct, frozen=True, kw_only=True):
    call_id: str
    run: str | None
    ticker: str | None
    model: str | None
    status: str
    http_status: int | None
    started_at: datetime
    elapsed_s: float | None
    ttft_s: float | None
    input_tokens: int
    output_tokens: int


class CallsList(msgspec.Struct, frozen=True, kw_only=True):
    items: list[CallListRow]
    total: int
    offset: int
    limit: int
    next_offset: int | None


class Facets(msgspec.Struct, frozen=True, kw_only=True):
    """The values the call filters can take, as the calls projection holds them."""

    models: list[str]
    statuses: list[str]


class EventRow(msgspec.Struct, frozen=True, kw_only=True):
    position: int
    type: str
    occurred_at: datetime
    payload: str


class BodyView(msgspec.Struct, frozen=True, kw_only=True):
    blob: str
    text: str | None = None
    truncated: bool = False
    missing: str | None = None
    """Why there is no text: redacted, or never stored (the ledger's own message)."""


class CallDetail(msgspec.Struct, frozen=True, kw_only=True):
    call: CallView
    events: list[EventRow]
    request: BodyView | None = None
    response: BodyView | None = None
    bodies_shown: bool = True


_LIST_COLUMNS = [calls.c[name] for name in CallListRow.__struct_fields__]


async def _where(conn: AsyncConnection, version: int, wanted: CallQuery, run_gap_s: float) -> list[ColumnElement[bool]]:
    where: list[ColumnElement[bool]] = [calls.c.version == version, *filter_clauses(wanted.filters)]
    if wanted.run is not None:
        clause = await run_filter(conn, version, wanted.run, run_gap_s)
        if clause is None:
            raise NotFound(f"no run {wanted.run!r} in the ledger (see `ledger report runs`)")
        where.append(clause)
    if wanted.ticker is not None:
        where.append(calls.c.ticker == wanted.ticker)
    return where


async def list_calls(
    database: Database, wanted: CallQuery, *, offset: int = 0, limit: int = 100, run_gap_s: float = 900.0
) -> CallsList:
    """The calls matching every filter given, in start order, with how many match in all."""
    version, _, _ = await live_versions(database, refresh=False)
    async with database.engine.connect() as conn:
        where = await _where(conn, version, wanted, run_gap_s)
        total = (await conn.execute(select(func.count()).where(*where))).scalar_one()
        result = await conn.execute(
            select(*_LIST_COLUMNS)
            .where(*where)
            .order_by(calls.c.started_at, calls.c.call_id)
            .offset(offset)
            .limit(limit)
        )
        items = [CallListRow(**row) for row in result.mappings()]
    following = offset + limit
    return CallsList(
        items=items, total=int(total), offset=offset, limit=limit, next_offset=following if following < total else None
    )


async def call_facets(database: Database) -> Facets:
    version, _, _ = await live_versions(database, refresh=False)
    async with database.engine.connect() as conn:
        models = await conn.execute(
            select(calls.c.model).where(calls.c.version == version, calls.c.model.is_not(None)).distinct()
        )
        return Facets(models=sorted(m for m in models.scalars() if m), statuses=list(CALL_STATUSES))


def _pretty(payload: bytes) -> str:
    """The stored JSON indented for reading (the ledger keeps the exact bytes; this is only a view)."""
    try:
        return msgspec.json.format(payload, indent=2).decode()
    except msgspec.DecodeError:
        return payload.decode()


def _clipped(body: Body | None) -> BodyView | None:
    """A body as the page shows it: its start only when longer than MAX_BODY_CHARS."""
    if body is None:
        return None
    if body.text is None:
        return BodyView(blob=body.blob, missing=body.error)
    return BodyView(blob=body.blob, text=body.text[:MAX_BODY_CHARS], truncated=len(body.text) > MAX_BODY_CHARS)


async def call_detail(database: Database, call_id: str, *, bodies: bool) -> CallDetail:
    """A call's row, its ledger events and, when `bodies`, its request and response bodies."""
    shown = await show_call(database, call_id, bodies=bodies, refresh=False)
    history = [
        EventRow(position=e.position, type=e.type, occurred_at=e.occurred_at, payload=_pretty(bytes(e.payload)))
        for e in shown.events
    ]
    if not bodies:
        return CallDetail(call=shown.call, events=history, bodies_shown=False)
    return CallDetail(
        call=shown.call, events=history, request=_clipped(shown.request), response=_clipped(shown.response)
    )


async def run_samples(database: Database, row: RunRow) -> list[ServerSampled]:
    """The server samples of the run's window, as its server block chose them (none where nothing was sampled)."""
    block = row.server
    if block is None or block.window_start is None or block.window_end is None:
        return []
    async with database.engine.connect() as conn:
        samples = samples_of_run(await load_samples(conn), row.run)
    return [s for s in samples if block.window_start <= s.sampled_at <= block.window_end]
