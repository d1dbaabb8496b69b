"""The gateway app: the passthrough for upstream paths, Litestar for `/_ledger/`.

Two entries: `handle(request, exchange)` for `gateway.server` (what `ledger serve` runs) and
`__call__` as a plain ASGI app (tests with httpx's ASGITransport, embedding).
"""

from __future__ import annotations

from collections.abc import Sequence

import httpx
from litestar import Litestar, Router

from usage_ledger.gateway.admin import create_admin_app
from usage_ledger.gateway.asgi import run_asgi
from usage_ledger.gateway.fingerprint_key import FingerprintKey
from usage_ledger.gateway.metrics import Metrics
from usage_ledger.gateway.proxy import Proxy, Receive, Scope, Send
from usage_ledger.gateway.recorder import Recorder
from usage_ledger.gateway.server import Exchange, Request
from usage_ledger.gateway.upstream import UpstreamClient, as_upstream
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.settings import Settings
from usage_ledger.ledger.writer import EventWriter

__all__ = ("GatewayApp", "create_app", "is_admin_path")

ADMIN_PREFIX = "/_ledger"


def is_admin_path(path: str) -> bool:
    """`/_ledger` and everything under `/_ledger/` (not `/_ledgerx`)."""
    return path.startswith(ADMIN_PREFIX) and (len(path) == 8 or path[8] == "/")


class GatewayApp:
    """`admin` is the Litestar app, `proxy` the passthrough."""

    def __init__(self, proxy: Proxy, admin: Litestar, metrics: Metrics) -> None:
        self.proxy = proxy
        self.admin = admin
        self.metrics = metrics

    async def handle(self, request: Request, exchange: Exchange) -> None:
        """One request from `gateway.server`: admin paths through the ASGI adapter, the rest proxied."""
        if is_admin_path(request.path):
            await run_asgi(self.admin, request, exchange)  # type: ignore[arg-type]
        else:
            await self.proxy.handle(request, exchange)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not is_admin_path(scope["path"]):
            await self.proxy(scope, receive, send)
            return
        await self.admin(scope, receive, send)  # type: ignore[arg-type]


def create_app(
    settings: Settings,
    *,
    database: Database,
    writer: EventWriter,
    http_client: httpx.AsyncClient | UpstreamClient,
    api_routers: Sequence[Router] = (),
    fingerprint_key: FingerprintKey | None = None,
) -> GatewayApp:
    """Build the gateway. The caller owns `database`, `writer` and `http_client` (opens and closes them).

    `fingerprint_key` is the installation's (`load_fingerprint_key`); without one a random key lives in
    memory, so fingerprints compare only within this app's life (never a public, guessable key).
    """
    metrics = Metrics()
    recorder = Recorder(writer, settings.durability, metrics)
    proxy = Proxy(settings, as_upstream(http_client), recorder, metrics, fingerprint_key=fingerprint_key)
    admin = create_admin_app(settings, database=database, writer=writer, metrics=metrics, api_routers=api_routers)
    return GatewayApp(proxy, admin, metrics)
