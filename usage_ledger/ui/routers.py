"""The dashboard as Litestar routers under `/_ledger/ui/`: pages, the token form, JSON endpoints
(`/_ledger/ui/api/…`) and the static files (app.js, style.css, the vendored uPlot).

`build_ui_routers(database, settings, admin_token=…)` is what `ledger serve` adds to its admin app (the
composition root hands it to the gateway, which never imports this package); `create_ui_app`
is the same routers alone, for `ledger ui`.
"""

from __future__ import annotations

from typing import Any

from litestar import Litestar, Router, get
from litestar.openapi.config import OpenAPIConfig
from litestar.openapi.plugins import JsonRenderPlugin
from litestar.openapi.spec import Components, SecurityScheme
from litestar.response import Redirect
from litestar.static_files import create_static_files_router

from usage_ledger.ledger import Database
from usage_ledger.projections import ReportSettings
from usage_ledger.ui.api import api_router
from usage_ledger.ui.auth import UI_PREFIX, UiAuth
from usage_ledger.ui.pages import pages_router
from usage_ledger.ui.reader import Reader
from usage_ledger.ui.render import STATIC_DIR, Renderer

__all__ = ("build_ui_routers", "create_ui_app")


def _routers(reader: Reader, *, standalone: bool) -> tuple[Router, UiAuth]:
    """The dashboard's router, and its door (one session store for every guard)."""
    renderer = Renderer(tz=reader.settings.tz, auth_enabled=reader.admin_token is not None, standalone=standalone)
    auth = UiAuth(reader.admin_token, renderer)
    static = create_static_files_router(path="/static", directories=[STATIC_DIR], name="ledger-ui-static")
    ui = Router(
        path=UI_PREFIX,
        route_handlers=[pages_router(reader, auth, renderer), *auth.handlers(), api_router(reader, auth), static],
    )
    return ui, auth


def build_ui_routers(database: Database, settings: ReportSettings, *, admin_token: str | None) -> list[Router]:
    """The dashboard inside `ledger serve`: its follower keeps the projections current, so no catch-up here."""
    ui, _ = _routers(Reader(database, settings, admin_token=admin_token, refresh=False), standalone=False)
    return [ui]


def create_ui_app(
    database: Database, settings: ReportSettings, *, admin_token: str | None, refresh: bool = True
) -> Litestar:
    """The dashboard alone (`ledger ui`): reads the ledger, appends nothing to it (`refresh`: catches the projections up)."""
    reader = Reader(database, settings, admin_token=admin_token, refresh=refresh)

    @get("/", include_in_schema=False, sync_to_thread=False)
    def home() -> Redirect:
        return Redirect(f"{UI_PREFIX}/")

    ui, auth = _routers(reader, standalone=True)
    openapi = OpenAPIConfig(
        title="usage-ledger dashboard API",
        version="1",
        path=f"{UI_PREFIX}/api/schema",
        render_plugins=[JsonRenderPlugin()],
        openapi_router=Router(
            path=f"{UI_PREFIX}/api/schema", route_handlers=[], guards=[auth.guard], include_in_schema=False
        ),
        components=Components(security_schemes={"bearer": SecurityScheme(type="http", scheme="bearer")}),
        security=[{"bearer": []}] if admin_token else None,
    )
    handlers: list[Any] = [home, ui]
    return Litestar(route_handlers=handlers, openapi_config=openapi, debug=False, logging_config=None)
