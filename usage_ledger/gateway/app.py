"""The gateway app: the passthrough for upstream paths, Litestar for `/_ledger/`.

One entry, `handle(request, exchange)`, for the gateway's server (`gateway._http`): what `ledger serve`
runs and what the tests drive on a loopback port.
"""

from __future__ import annotations

from collections.abc import Sequence

from litestar import Litestar, Router

from usage_ledger.gateway._http import Exchange, Request, Upstream, run_asgi
from usage_ledger.gateway.admin import create_admin_app
from usage_ledger.gateway.fingerprint_key import FingerprintKey
from usage_ledger.gateway.metrics import Metrics
from usage_ledger.gateway.proxy import Proxy
from usage_ledger.gateway.recorder import Recorder
from usage_ledger.gateway.settings import GatewaySettings
from usage_ledger.ledger import Database, EventWriter

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
        """One request from the server (its body complete and within the limits): admin paths through
        the ASGI adapter, the rest proxied."""
        if is_admin_path(request.path):
            await run_asgi(self.admin, request, exchange)  # type: ignore[arg-type]
        else:
            await self.proxy.handle(request, exchange)


def create_app(
    settings: GatewaySettings,
    *,
    database: Database,
    writer: EventWriter,
    upstream: Upstream,
    api_routers: Sequence[Router] = (),
    fingerprint_key: FingerprintKey | None = None,
    ui_routers: Sequence[Router] = (),
) -> GatewayApp:
    """Build the gateway. The caller owns `database`, `writer` and `upstream` (opens and closes them).

    `fingerprint_key` is the installation's (`load_fingerprint_key`); without one a random key lives in
    memory, so fingerprints compare only within this app's life (never a public, guessable key).
    `ui_routers` (the dashboard, under `/_ledger/ui/`) join the admin app with their own guard.
    """
    metrics = Metrics()
    recorder = Recorder(writer, settings.durability, metrics)
    proxy = Proxy(settings, upstream, recorder, metrics, fingerprint_key=fingerprint_key)
    admin = create_admin_app(settings, database=database, writer=writer, metrics=metrics, api_routers=api_routers)
    for router in ui_routers:
        admin.register(router)
    return GatewayApp(proxy, admin, metrics)
