"""The read API (Litestar): GET /runs, /tickers, /daily, /calls, /calls/{call_id}, /decide (docs/operations.md).

Handlers call the CLI's report functions with `refresh=False`: inside `ledger serve` the follower keeps
the projections current. A `run` filter is read under the rule of `projections.text`."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from litestar import Request, Response, Router, get
from litestar.di import NamedDependency, Provide
from litestar.exceptions import HTTPException, NotAuthorizedException, NotFoundException
from litestar.openapi.spec import OpenAPIFormat, OpenAPIType, Schema
from litestar.params import FromPath, QueryParameter
from litestar.status_codes import HTTP_400_BAD_REQUEST, HTTP_404_NOT_FOUND

from usage_ledger.answers.callviews import calls_page, get_call
from usage_ledger.answers.decide import Decision, decide
from usage_ledger.answers.filters import (
    CALL_STATUSES,
    STATUS_PATTERN,
    WHEN_SCHEMA,
    ZONE_NAMES,
    CallFilter,
    InvalidFilter,
    parse_filter,
)
from usage_ledger.answers.reports import daily_report, runs_report, tickers_report, weekday_mean
from usage_ledger.answers.zones import parse_zone
from usage_ledger.ledger import Database
from usage_ledger.projections import (
    FORMULAS,
    CallsPage,
    CallView,
    DailyRow,
    NotFound,
    ProjectionError,
    ReportSettings,
    RunRow,
    TickerRow,
    WeekdayRow,
    parse_as_of,
    projection_text_or_none,
)

__all__ = ("MAX_LIMIT", "MAX_OFFSET", "build_api_routers", "error_response", "split_runs")

MAX_LIMIT = 1000
"""Calls per page at most (`limit` 1..MAX_LIMIT, default 100)."""
MAX_OFFSET = 10**12
"""`offset` 0..MAX_OFFSET: far past any ledger, and `offset + limit` always fits a 64-bit integer."""

Run = Annotated[str | None, QueryParameter(description="a run name (`X-Ledger-Run`, or `auto-…` from `/runs`)")]
Formula = Annotated[
    str | None, QueryParameter(description="a throughput formula", schema_extra={"enum": sorted(FORMULAS)})
]
Zone = Annotated[
    str | None,
    QueryParameter(
        description="an IANA time zone (default: the gateway's LEDGER_TZ)",
        schema_extra={"enum": list(ZONE_NAMES)},
    ),
]
_WHEN = "an ISO date or date-time, e.g. 2026-03-01, 2026-03-01T09:00 (local in `tz`) or 2026-03-01T09:00+09:00"
Since = Annotated[
    str | None, QueryParameter(description=f"calls started at or after {_WHEN}", schema_extra=WHEN_SCHEMA)
]
Until = Annotated[
    str | None,
    QueryParameter(
        description=f"calls started before {_WHEN}; a bare date includes that day", schema_extra=WHEN_SCHEMA
    ),
]
Model = Annotated[str | None, QueryParameter(description="only calls of this model")]
Status = Annotated[
    str | None,
    QueryParameter(
        description=f"only calls with these statuses, comma-separated: {', '.join(CALL_STATUSES)}",
        pattern=STATUS_PATTERN,
    ),
]
Group = Annotated[str, QueryParameter(description="a group's runs, comma-separated (`ledger decide --a`/`--b`)")]
Scale = Annotated[str, QueryParameter(description="the ordered labels, lowest first, comma-separated")]
AsOf = Annotated[
    str | None,
    QueryParameter(
        description="returns as of this date, YYYY-MM-DD (default, or empty: the latest)",
        schema_extra={
            "one_of": [
                Schema(type=OpenAPIType.STRING, format=OpenAPIFormat.DATE),
                Schema(type=OpenAPIType.STRING, max_length=0),
            ]
        },
    ),
]
Offset = Annotated[int, QueryParameter(ge=0, le=MAX_OFFSET, description=f"calls to skip, 0..{MAX_OFFSET}")]
Limit = Annotated[int, QueryParameter(ge=1, le=MAX_LIMIT, description=f"calls per page, 1..{MAX_LIMIT}")]


class _Picked(msgspec.Struct, frozen=True, kw_only=True):
    """A list's shared query parameters as read: the run under the rule of `projections.text`, the zone's name."""

    run: str | None
    tz: str
    filters: CallFilter


def split_runs(text: str) -> list[str]:
    """`a=R1,R2` as its runs, each read under the rule of `projections.text` (empty entries dropped)."""
    return [projection_text_or_none(part.strip()) or "" for part in text.split(",") if part.strip()]


def error_response(_: Request[Any, Any, Any], exc: Exception) -> Response[dict[str, Any]]:
    """A `ProjectionError` as the API answers it: 404 for what is not there, else 400; a filter that cannot be
    read names its parameter in `extra`, as the schema's own validation errors do."""
    status = HTTP_404_NOT_FOUND if isinstance(exc, NotFound) else HTTP_400_BAD_REQUEST
    body: dict[str, Any] = {"status_code": status, "detail": str(exc)}
    if isinstance(exc, InvalidFilter):
        body["extra"] = [{"message": str(exc), "key": exc.parameter, "source": "query"}]
    return Response(body, status_code=status)


def build_api_routers(
    database: Database, settings: ReportSettings | None = None, *, admin_token: str | None = None
) -> list[Router]:
    """Routers for the projections read API, bound to `database` (behind the gateway's guard of `admin_token`)."""
    settings = settings or ReportSettings()
    gap = settings.run_gap_s
    # the gateway's guard answers 401 on these routes when a token is set: the schema says so
    guarded: list[type[HTTPException]] = [NotAuthorizedException] if admin_token else []
    may_miss = [*guarded, NotFoundException]

    def picked(
        run: Run = None,
        tz: Zone = None,
        since: Since = None,
        until: Until = None,
        model: Model = None,
        status: Status = None,
    ) -> _Picked:
        """The query parameters every list takes, read once: a dependency, so the schema lists them for each."""
        zone = settings.tz if tz is None else tz
        # empty = no filter, as the schema says (a form sends every field)
        filters = parse_filter(
            zone=parse_zone(zone), since=since or None, until=until or None, model=model or None, status=status or None
        )
        return _Picked(run=projection_text_or_none(run), tz=zone, filters=filters)

    @get("/runs", raises=may_miss)
    async def runs(formula: Formula = None, *, picked: NamedDependency[_Picked]) -> list[RunRow]:
        return await runs_report(
            database, formula=formula, run=picked.run, run_gap_s=gap, refresh=False, filters=picked.filters
        )

    @get("/tickers", raises=may_miss)
    async def tickers(picked: NamedDependency[_Picked]) -> list[TickerRow]:
        return await tickers_report(database, run=picked.run, run_gap_s=gap, refresh=False, filters=picked.filters)

    async def days(picked: _Picked) -> list[DailyRow]:
        return await daily_report(
            database, tz=picked.tz, run=picked.run, run_gap_s=gap, refresh=False, filters=picked.filters
        )

    @get("/daily", raises=may_miss)
    async def daily(picked: NamedDependency[_Picked]) -> list[DailyRow]:
        return await days(picked)

    @get("/daily/weekday-mean", raises=may_miss)
    async def daily_weekday_mean(picked: NamedDependency[_Picked]) -> list[WeekdayRow]:
        return weekday_mean(await days(picked))

    @get("/calls", raises=may_miss)
    async def calls(picked: NamedDependency[_Picked], offset: Offset = 0, limit: Limit = 100) -> CallsPage:
        return await calls_page(
            database, run=picked.run, offset=offset, limit=limit, run_gap_s=gap, refresh=False, filters=picked.filters
        )

    @get("/calls/{call_id:str}", raises=may_miss)
    async def call(call_id: FromPath[str]) -> CallView:
        if not database.backend_ops.can_hold(call_id):  # its ledger cannot hold such an id
            raise NotFound(f"no call {call_id!r} in the ledger")
        return await get_call(database, call_id, refresh=False)

    @get("/decide", raises=may_miss)
    async def decision(a: Group, b: Group, scale: Scale, as_of: AsOf = None) -> Decision:
        """`ledger decide --a … --b … --scale … --format json`: the same object."""
        try:
            when = parse_as_of(as_of or "")
        except ValueError as exc:
            raise InvalidFilter("as_of", str(exc)) from exc
        return await decide(database, split_runs(a), split_runs(b), scale, as_of=when, run_gap_s=gap, refresh=False)

    return [
        Router(
            path="/",
            route_handlers=[runs, tickers, daily, daily_weekday_mean, calls, call, decision],
            dependencies={"picked": Provide(picked, sync_to_thread=False)},
            exception_handlers={ProjectionError: error_response},
            tags=["projections"],
        )
    ]
