"""The gateway as `ledger serve` runs it, in the test's loop: `gateway.server` on a loopback port in
front of an upstream ASGI app that uvicorn serves on another (real sockets both sides, one path).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import uvicorn

from usage_ledger.gateway.app import GatewayApp, create_app
from usage_ledger.gateway.limits import ServerLimits
from usage_ledger.gateway.rawclient import RawUpstream
from usage_ledger.gateway.serve import bind_socket
from usage_ledger.gateway.server import HttpServer
from usage_ledger.gateway.settings import GatewaySettings
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.writer import EventWriter

__all__ = ("LiveGateway", "live_gateway", "serving")


@contextlib.asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    """`app` (ASGI) served by uvicorn on 127.0.0.1; yields its base URL."""
    sock = bind_socket("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()  # raises what stopped it
            await asyncio.sleep(0.005)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task
        sock.close()


class LiveGateway(msgspec.Struct, frozen=True):
    app: GatewayApp
    url: str
    """The gateway's base URL (`http://127.0.0.1:PORT`)."""
    settings: GatewaySettings
    """What it runs with: `upstream` is the real upstream's URL."""


@contextlib.asynccontextmanager
async def live_gateway(
    settings: GatewaySettings, *, database: Database, writer: EventWriter, upstream: str, **create: Any
) -> AsyncIterator[LiveGateway]:
    """`create_app` behind `HttpServer` on 127.0.0.1, forwarding to `upstream` (a URL) with `RawUpstream`.

    `settings.upstream` is replaced by `upstream`; `create` goes to `create_app` (api_routers, fingerprint_key…).
    """
    settings = msgspec.structs.replace(settings, upstream=upstream)
    client = RawUpstream(settings)
    app = create_app(settings, database=database, writer=writer, upstream=client, **create)
    sock = bind_socket("127.0.0.1", 0)
    server = HttpServer(app.handle, limits=ServerLimits.from_settings(settings), metrics=app.metrics)
    await server.start(sock)
    try:
        yield LiveGateway(app, f"http://127.0.0.1:{sock.getsockname()[1]}", settings)
    finally:
        await server.shutdown(grace_s=5)
        await client.aclose()
