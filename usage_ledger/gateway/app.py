"""The gateway app (ASGI): the raw passthrough for upstream paths, Litestar for `/_ledger/`.

What `ledger serve` runs on uvicorn (`gateway.serve.listening`) and what the tests drive on a loopback port.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

from litestar import Litestar, Router

from usage_ledger.gateway.admin import create_admin_app
from usage_ledger.gateway.fingerprint_key import FingerprintKey
from usage_ledger.gateway.metrics import Metrics
from usage_ledger.gateway.proxy import Proxy
from usage_ledger.gateway.recorder import Recorder
from usage_ledger.gateway.response import Responder
from usage_ledger.gateway.settings import GatewaySettings
from usage_ledger.gateway.upstream import Upstream
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

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[MutableMapping[str, Any]]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        """One request: admin paths to Litestar, the rest proxied (the server runs no lifespan)."""
        if scope["type"] != "http":
            await self.admin(scope, receive, send)  # type: ignore[arg-type]
        elif is_admin_path(scope["path"]):
            await self._admin(scope, receive, send)
        else:
            await self.proxy(scope, receive, send)

    async def _admin(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[MutableMapping[str, Any]]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        """The admin app, its request body read under the proxy's limits first (size, budget, pace)."""
        read = await self.proxy.read_body(scope, receive, Responder(send, scope))
        if read is None:
            return
        body, held = read
        delivered = False

        async def replay() -> MutableMapping[str, Any]:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: the server's `http.disconnect`

        try:
            await self.admin(scope, replay, send)  # type: ignore[arg-type]
        finally:
            self.proxy.request_bytes.give_back(held)


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
