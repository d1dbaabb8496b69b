"""Running an ASGI app (the Litestar admin app) for one request of `_http.server`.

    scope   from the parsed request (type http, ASGI 3.0, spec 2.3, raw_path, client, server)
    receive the whole body once (`more_body: False`), then waits and says `http.disconnect`
    send    `http.response.start` writes the head, `http.response.body` the body (streamed when
            `more_body`), through the connection's `Exchange` (Content-Length or chunked framing)

An app that returns without finishing its response has the connection dropped; one that fails
before starting it gets a 500 from the server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from usage_ledger.gateway._http.exchange import Exchange, Request

__all__ = ("AsgiApp", "run_asgi")

Message = MutableMapping[str, Any]
AsgiApp = Callable[
    [MutableMapping[str, Any], Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]],
    Awaitable[None],
]


async def run_asgi(app: AsgiApp, request: Request, exchange: Exchange) -> None:
    conn = exchange.connection
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": request.http_version,
        "method": request.method,
        "scheme": "http",
        "path": request.path,
        "raw_path": request.raw_path,
        "query_string": request.query,
        "root_path": "",
        "headers": request.headers,
        "client": conn.client,
        "server": conn.local,
        "state": {},
    }
    body_sent = False
    disconnected = asyncio.get_running_loop().create_future()

    def on_disconnect() -> None:
        if not disconnected.done():
            disconnected.set_result(None)

    exchange.on_disconnect = on_disconnect

    async def receive() -> Message:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": request.body, "more_body": False}
        await disconnected
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            if exchange.started:
                raise RuntimeError("ASGI: http.response.start sent twice")
            headers = [(bytes(name).lower(), bytes(value)) for name, value in message.get("headers", ())]
            exchange.start_now(int(message["status"]), headers)
        elif kind == "http.response.body":
            if not exchange.started:
                raise RuntimeError("ASGI: http.response.body before http.response.start")
            if exchange.ended or disconnected.done():
                return
            data = bytes(message.get("body", b""))
            if message.get("more_body", False):
                await exchange.send(data)
            else:
                exchange.end_now(data)
        else:
            raise RuntimeError(f"ASGI: unexpected message type {kind!r}")

    try:
        await app(scope, receive, send)
    finally:
        exchange.on_disconnect = None
    if exchange.started and not exchange.ended and not disconnected.done():
        exchange.abort()  # the app stopped mid-body: the client must not take it for complete
