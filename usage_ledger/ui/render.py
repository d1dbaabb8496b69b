"""HTML from the package's Jinja templates (Litestar's JinjaTemplateEngine, autoescaping on).

The pages render to a string and return it as a `text/html` Response instead of Litestar's
`Template` response: that one needs the app's `template_config`, and inside `ledger serve` these
routes join the gateway's admin app, whose configuration is not ours to set.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from litestar import Response
from litestar.enums import MediaType
from litestar.plugins.jinja import JinjaTemplateEngine

from usage_ledger.answers import in_zone

__all__ = ("STATIC_DIR", "UPLOT_VERSION", "Renderer")

HERE = Path(__file__).resolve().parent
STATIC_DIR = HERE / "static"
UPLOT_VERSION = "1.6.32"
"""The vendored chart library (static/vendor/uplot-<version>/, with its MIT licence)."""


def _number(value: Any, digits: int = 0) -> str:
    if value is None:
        return "–"
    if isinstance(value, float) and digits:
        return f"{value:,.{digits}f}"
    return f"{round(value):,}" if isinstance(value, float) else f"{value:,}"


def _moment(value: datetime | None, zone: ZoneInfo) -> str:
    return (
        "–" if value is None else in_zone(value, zone).replace(tzinfo=None).isoformat(" ", "seconds")
    )  # strftime drops the zeros of year 1


class Renderer:
    def __init__(self, *, tz: str, auth_enabled: bool, standalone: bool) -> None:
        self.engine = JinjaTemplateEngine(directory=HERE / "templates")
        zone = ZoneInfo(tz)
        env = self.engine.engine
        env.filters["number"] = _number
        env.filters["moment"] = lambda value: _moment(value, zone)
        env.globals.update(
            prefix="/_ledger/ui",
            uplot=f"/_ledger/ui/static/vendor/uplot-{UPLOT_VERSION}",
            tz=tz,
            auth_enabled=auth_enabled,
            standalone=standalone,
        )

    def page(self, name: str, **context: Any) -> Response[str]:
        html = self.engine.get_template(name).render(**context)
        return Response(html, media_type=MediaType.HTML, headers={"Cache-Control": "no-store"})
