"""The gateway as `ledger serve` runs it, in the test's loop: its server (`gateway.serve.listening`) on a
loopback port in front of an upstream ASGI app that uvicorn serves on another (real sockets both sides, one path).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import uvicorn

from tests.gateway.upstream import read_body
from usage_ledger.gateway import GatewayApp, GatewaySettings, Upstream, bind_socket, create_app, listening
from usage_ledger.gateway._http import HttpServer
from usage_ledger.ledger.db import Database
from usage_ledger.ledger.spool import Spool
from usage_ledger.ledger.writer import EventWriter

__all__ = ("EchoGateway", "EchoUpstream", "LiveGateway", "echo_gateway", "live_gateway", "serving")


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
    server: HttpServer
    url: str
    """The gateway's base URL (`http://127.0.0.1:PORT`)."""
    settings: GatewaySettings
    """What it runs with: `upstream` is the real upstream's URL."""


@contextlib.asynccontextmanager
async def live_gateway(
    settings: GatewaySettings, *, database: Database, writer: EventWriter, upstream: str, **create: Any
) -> AsyncIterator[LiveGateway]:
    """`create_app` behind the gateway's server on 127.0.0.1, forwarding to `upstream` (a URL) with `Upstream`.

    `settings.upstream` is replaced by `upstream`; `create` goes to `create_app` (api_routers, fingerprint_key…).
    """
    settings = msgspec.structs.replace(settings, upstream=upstream)
    client = Upstream(settings)
    app = create_app(settings, database=database, writer=writer, upstream=client, **create)
    sock = bind_socket("127.0.0.1", 0)
    try:
        async with listening(app, settings, sock, grace_s=5) as server:
            yield LiveGateway(app, server, f"http://127.0.0.1:{sock.getsockname()[1]}", settings)
    finally:
        await client.aclose()
        sock.close()


class EchoUpstream:
    """An upstream ASGI app answering each request with what it received, as JSON.

    `/stream…` answers "one " then "two" without a length; `/slow…` waits until the gateway leaves
    (`left` is set when it does). `handled` holds every request body that reached it.
    """

    def __init__(self) -> None:
        self.handled: list[bytes] = []
        self.left = asyncio.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        body = await read_body(receive)
        self.handled.append(body)
        path = scope["path"]
        if path.startswith("/slow"):
            while (await receive())["type"] != "http.disconnect":
                pass
            self.left.set()
            return
        if path.startswith("/stream"):
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"one ", "more_body": True})
            await send({"type": "http.response.body", "body": b"two"})
            return
        answer = msgspec.json.encode(
            {
                "method": scope["method"],
                "path": path,
                "query": scope["query_string"].decode(),
                "body": body.decode("latin-1"),
                "headers": {name.decode(): value.decode("latin-1") for name, value in scope["headers"]},
            }
        )
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(answer))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})


@contextlib.asynccontextmanager
async def echo_gateway(settings: GatewaySettings, database: Database, spool: Any) -> AsyncIterator[EchoGateway]:
    """The real gateway in front of an `EchoUpstream`; yields it with its port."""
    upstream = EchoUpstream()
    async with (
        serving(upstream) as upstream_url,
        EventWriter(database, Spool(spool)) as writer,
        live_gateway(settings, database=database, writer=writer, upstream=upstream_url) as gateway,
    ):
        yield EchoGateway(gateway, upstream, int(gateway.url.rsplit(":", 1)[1]))


class EchoGateway(msgspec.Struct, frozen=True):
    live: LiveGateway
    upstream: EchoUpstream
    port: int
