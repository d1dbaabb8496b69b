"""The read API (Litestar): GET /runs, /tickers, /daily, /calls, /calls/{call_id}.

Handlers are thin: they call the same report functions as the CLI, with `refresh=False` because
`follow_projections` keeps the projections current inside `ledger serve`. The gateway mounts
these routers under `/_ledger/api` behind its auth guard.
"""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, Router, get
from litestar.params import FromPath, FromQuery
from litestar.status_codes import HTTP_400_BAD_REQUEST, HTTP_404_NOT_FOUND

from usage_ledger.ledger.db import Database
from usage_ledger.ledger.settings import Settings
from usage_ledger.projections.callviews import calls_page, get_call
from usage_ledger.projections.errors import NotFound, ProjectionError
from usage_ledger.projections.reports import daily_report, runs_report, tickers_report, weekday_mean
from usage_ledger.projections.rows import CallsPage, CallView, DailyRow, RunRow, TickerRow, WeekdayRow

__all__ = ("build_api_routers",)


def _error(_: Request[Any, Any, Any], exc: Exception) -> Response[dict[str, str]]:
    status = HTTP_404_NOT_FOUND if isinstance(exc, NotFound) else HTTP_400_BAD_REQUEST
    return Response({"error": str(exc)}, status_code=status)


def build_api_routers(database: Database, settings: Settings | None = None) -> list[Router]:
    """Routers for the projections read API, bound to `database`."""
    settings = settings or Settings()
    gap = settings.run_gap_s

    @get("/runs")
    async def runs(formula: FromQuery[str | None] = None, run: FromQuery[str | None] = None) -> list[RunRow]:
        return await runs_report(database, formula=formula, run=run, run_gap_s=gap, refresh=False)

    @get("/tickers")
    async def tickers(run: FromQuery[str | None] = None) -> list[TickerRow]:
        return await tickers_report(database, run=run, run_gap_s=gap, refresh=False)

    @get("/daily")
    async def daily(tz: FromQuery[str | None] = None, run: FromQuery[str | None] = None) -> list[DailyRow]:
        return await daily_report(database, tz=tz or settings.tz, run=run, run_gap_s=gap, refresh=False)

    @get("/daily/weekday-mean")
    async def daily_weekday_mean(
        tz: FromQuery[str | None] = None, run: FromQuery[str | None] = None
    ) -> list[WeekdayRow]:
        rows = await daily_report(database, tz=tz or settings.tz, run=run, run_gap_s=gap, refresh=False)
        return weekday_mean(rows)

    @get("/calls")
    async def calls(
        run: FromQuery[str | None] = None, offset: FromQuery[int] = 0, limit: FromQuery[int] = 100
    ) -> CallsPage:
        return await calls_page(database, run=run, offset=offset, limit=limit, run_gap_s=gap, refresh=False)

    @get("/calls/{call_id:str}")
    async def call(call_id: FromPath[str]) -> CallView:
        return await get_call(database, call_id, refresh=False)

    return [
        Router(
            path="/",
            route_handlers=[runs, tickers, daily, daily_weekday_mean, calls, call],
            exception_handlers={ProjectionError: _error},
            tags=["projections"],
        )
    ]
