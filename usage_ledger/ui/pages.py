"""The dashboard's HTML pages: tables rendered on the server, charts drawn by static/app.js from the
JSON endpoints (ui.api). A page the token does not open redirects to the token form."""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Request, Response, Router, get
from litestar.params import FromQuery, QueryParameter
from litestar.status_codes import HTTP_400_BAD_REQUEST, HTTP_404_NOT_FOUND

from usage_ledger.answers import ZONE_NAMES, runs_report
from usage_ledger.projections import NotFound, ProjectionError, projection_text_or_none
from usage_ledger.ui.api import MAX_OFFSET, call_query
from usage_ledger.ui.auth import LoginRequired, UiAuth
from usage_ledger.ui.decide import decide_handlers
from usage_ledger.ui.queries import call_detail, call_facets, list_calls
from usage_ledger.ui.reader import Reader
from usage_ledger.ui.render import Renderer
from usage_ledger.ui.views import compare_view, daily_view, eras_view, runs_view

__all__ = ("CALLS_PER_PAGE", "pages_router")

CALLS_PER_PAGE = 50


def pages_router(reader: Reader, auth: UiAuth, renderer: Renderer) -> Router:
    def error_page(_: Request[Any, Any, Any], exc: Exception) -> Response[str]:
        page = renderer.page("error.html", title="Not shown", detail=str(exc))
        page.status_code = HTTP_404_NOT_FOUND if isinstance(exc, NotFound) else HTTP_400_BAD_REQUEST
        return page

    @get("/", include_in_schema=False)
    async def runs(label: FromQuery[str] = "", formula: FromQuery[str] = "") -> Response[str]:
        view = await runs_view(reader, label=label or None, formula=formula or None)
        return renderer.page("runs.html", title="Runs", view=view, query={"label": view.chart.label})

    @get("/run", include_in_schema=False)
    async def run(run: FromQuery[str]) -> Response[str]:
        # the charts come from the JSON endpoint, polled while the run is live (which updates these figures too)
        database = await reader.ready()
        name = projection_text_or_none(run) or ""
        (row,) = await runs_report(database, run=name, run_gap_s=reader.settings.run_gap_s, refresh=False)
        return renderer.page("run.html", title=f"Run {run}", run=run, row=row)

    @get("/eras", include_in_schema=False)
    async def eras(by: FromQuery[str] = "", kind: FromQuery[str] = "") -> Response[str]:
        view = await eras_view(reader, by=by or None, kind=kind or None)
        return renderer.page("eras.html", title="Eras", view=view, query={"by": view.by, "kind": kind})

    @get("/daily", include_in_schema=False)
    async def daily(tz: FromQuery[str] = "") -> Response[str]:
        view = await daily_view(reader, tz=tz or None)
        return renderer.page("daily.html", title="Daily", view=view, zones=ZONE_NAMES, query={"tz": view.tz})

    @get("/calls", include_in_schema=False)
    async def calls(
        since: FromQuery[str] = "",
        until: FromQuery[str] = "",
        run: FromQuery[str] = "",
        model: FromQuery[str] = "",
        ticker: FromQuery[str] = "",
        status: FromQuery[str] = "",
        offset: Annotated[int, QueryParameter(le=MAX_OFFSET)] = 0,  # past it: 400, not an overflow in SQL
    ) -> Response[str]:
        wanted = call_query(reader, since=since, until=until, run=run, model=model, ticker=ticker, status=status)
        database = await reader.ready()
        found = await list_calls(
            database, wanted, offset=max(0, offset), limit=CALLS_PER_PAGE, run_gap_s=reader.settings.run_gap_s
        )
        query = {"since": since, "until": until, "run": run, "model": model, "ticker": ticker, "status": status}
        return renderer.page("calls.html", title="Calls", found=found, facets=await call_facets(database), query=query)

    @get("/call", include_in_schema=False)
    async def call(id: FromQuery[str]) -> Response[str]:
        if not reader.database.backend_ops.can_hold(id):
            raise NotFound(f"no call {id!r} in the ledger")
        detail = await call_detail(await reader.ready(), projection_text_or_none(id) or id, bodies=auth.enabled)
        return renderer.page("call.html", title=f"Call {id}", detail=detail)

    @get("/compare", include_in_schema=False)
    async def compare(run: FromQuery[list[str] | None] = None) -> Response[str]:
        view = await compare_view(reader, [projection_text_or_none(r) or "" for r in run or []])
        return renderer.page("compare.html", title="Compare runs", view=view)

    return Router(
        path="/",
        route_handlers=[runs, run, eras, daily, calls, call, compare, *decide_handlers(reader, auth, renderer)],
        guards=[auth.guard],
        exception_handlers={LoginRequired: auth.to_login, ProjectionError: error_page},
        include_in_schema=False,
    )
