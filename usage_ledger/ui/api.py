"""The dashboard's JSON endpoints, under `/_ledger/ui/api/` (in the admin app's OpenAPI schema when
mounted by `ledger serve`). The pages draw their charts from these and poll them while a run is live.

Errors are Litestar's `{status_code, detail}`: 400 for a parameter that is out of range or unknown,
404 for no such run or call, 401 without the token (when one is set).
"""

from __future__ import annotations

from typing import Annotated
from zoneinfo import ZoneInfo

from litestar import Router, get
from litestar.exceptions import HTTPException, NotAuthorizedException, NotFoundException
from litestar.params import QueryParameter

from usage_ledger.answers import STATUS_PATTERN, WHEN_SCHEMA, ZONE_NAMES, error_response, parse_filter
from usage_ledger.projections import FORMULAS, NotFound, ProjectionError, projection_text_or_none
from usage_ledger.ui.auth import UiAuth
from usage_ledger.ui.queries import CallDetail, CallQuery, CallsList, call_detail, list_calls
from usage_ledger.ui.reader import Reader
from usage_ledger.ui.views import (
    CompareView,
    DailyView,
    ErasView,
    RunsView,
    RunView,
    compare_view,
    daily_view,
    eras_view,
    run_view,
    runs_view,
)

__all__ = ("MAX_OFFSET", "api_router", "call_query")

MAX_LIMIT = 1000
MAX_OFFSET = 10**12
"""Calls to skip at most, on the JSON endpoint and the calls page: past any ledger, and within a 64-bit integer."""

Text = Annotated[str | None, QueryParameter(description="exact value; empty = any")]
# The dashboard's forms send every field, so here an empty formula or zone means the default (the
# `/_ledger/api/` endpoints refuse an empty zone), and the schema says so.
Formula = Annotated[
    str | None,
    QueryParameter(
        description="a throughput formula; empty = the default", schema_extra={"enum": ["", *sorted(FORMULAS)]}
    ),
]
Zone = Annotated[
    str | None,
    QueryParameter(
        description="an IANA time zone; empty = the gateway's LEDGER_TZ",
        schema_extra={"enum": ["", *ZONE_NAMES]},
    ),
]
Moment = Annotated[
    str | None,
    QueryParameter(
        description="ISO date or date-time (by call start); without an offset, local to LEDGER_TZ; empty = any",
        schema_extra=WHEN_SCHEMA,
    ),
]
Statuses = Annotated[
    str | None,
    QueryParameter(
        description="statuses, comma-separated (ok, error, failed, incomplete); empty = any", pattern=STATUS_PATTERN
    ),
]


def call_query(
    reader: Reader,
    *,
    since: str | None,
    until: str | None,
    run: str | None,
    model: str | None,
    ticker: str | None,
    status: str | None,
) -> CallQuery:
    """The Calls filters from query text (empty = any); times as `ledger report --since/--until` read them."""
    filters = parse_filter(
        zone=ZoneInfo(reader.settings.tz),
        since=since or None,
        until=until or None,
        model=model or None,
        status=status or None,
    )
    return CallQuery(
        filters=filters, run=projection_text_or_none(run or None), ticker=projection_text_or_none(ticker or None)
    )


def api_router(reader: Reader, auth: UiAuth) -> Router:
    guarded: list[type[HTTPException]] = [NotAuthorizedException] if auth.enabled else []
    may_miss = [*guarded, NotFoundException]

    @get("/runs", raises=may_miss, summary="Runs, and their throughput over time by a label")
    async def runs(label: Text = None, formula: Formula = None) -> RunsView:
        return await runs_view(reader, label=label or None, formula=formula or None)

    @get("/run", raises=may_miss, summary="One run over time: in flight, output tokens/s, TTFT, TPOT, server")
    async def run(run: Annotated[str, QueryParameter(description="a run name")], formula: Formula = None) -> RunView:
        return await run_view(reader, projection_text_or_none(run) or "", formula=formula or None)

    @get("/eras", raises=may_miss, summary="Runs grouped by a label, under every formula")
    async def eras(by: Text = None, kind: Text = None) -> ErasView:
        return await eras_view(reader, by=by or None, kind=kind or None)

    @get("/daily", raises=may_miss, summary="Tokens per day in a time zone, and the weekday means")
    async def daily(tz: Zone = None, run: Text = None) -> DailyView:
        return await daily_view(reader, tz=tz or None, run=projection_text_or_none(run or None))

    @get("/calls", raises=may_miss, summary="Calls filtered by time range, run, model, ticker and status")
    async def calls(
        since: Moment = None,
        until: Moment = None,
        run: Text = None,
        model: Text = None,
        ticker: Text = None,
        status: Statuses = None,
        offset: Annotated[int, QueryParameter(ge=0, le=MAX_OFFSET)] = 0,
        limit: Annotated[int, QueryParameter(ge=1, le=MAX_LIMIT)] = 100,
    ) -> CallsList:
        wanted = call_query(reader, since=since, until=until, run=run, model=model, ticker=ticker, status=status)
        database = await reader.ready()
        return await list_calls(database, wanted, offset=offset, limit=limit, run_gap_s=reader.settings.run_gap_s)

    @get("/call", raises=may_miss, summary="One call: its row, events and (with the token) bodies")
    async def call(id: Annotated[str, QueryParameter(description="a call id")]) -> CallDetail:
        if not reader.database.backend_ops.can_hold(id):  # its ledger cannot hold such an id
            raise NotFound(f"no call {id!r} in the ledger")
        return await call_detail(await reader.ready(), id, bodies=auth.enabled)

    @get("/compare", raises=may_miss, summary="Runs side by side (ledger compare), metrics as rows")
    async def compare(
        run: Annotated[
            list[str] | None, QueryParameter(description="two or more run names, repeated", min_items=2)
        ] = None,
    ) -> CompareView:
        return await compare_view(reader, [projection_text_or_none(r) or "" for r in run or []])

    return Router(
        path="/api",
        route_handlers=[runs, run, eras, daily, calls, call, compare],
        guards=[auth.guard],
        exception_handlers={ProjectionError: error_response},
        tags=["dashboard"],
    )
