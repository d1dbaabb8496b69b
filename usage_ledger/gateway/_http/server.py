"""The gateway's HTTP/1.1 server: `asyncio` protocols with the `httptools` request parser.

    client ─► HttpConnection.data_received ─► httptools ─► Request (headers, whole body)
                     │ one request at a time per connection, in order (pipelined ones wait, reading paused)
                     ▼
              handler(request, Exchange) ─► proxy: upstream bytes written to the transport from the
                                                   upstream's protocol callback (no task hop per chunk)
                                          └► /_ledger/: the Litestar app through `_http.asgi`

Keep-alive, Content-Length and chunked request bodies, `Expect: 100-continue`, responses framed by
Content-Length or chunked (HTTP/1.0 clients: by closing). Backpressure both ways: a client that
stops reading pauses the upstream (`Exchange.flow`), a client that sends more than one request
ahead is not read until its turn. A malformed request gets a 400 and the connection is closed.

Slow and large traffic is bounded (`gateway.limits.ServerLimits`, `_http.guard`, `_http.state`): what each
limit does and answers is docs/configuration.md, "Limits for slow and large traffic".
"""

from __future__ import annotations

import asyncio
import socket

from usage_ledger.gateway._http.connection import HttpConnection
from usage_ledger.gateway._http.state import Handler, ServerState
from usage_ledger.gateway.limits import ByteBudget, ServerLimits
from usage_ledger.gateway.metrics import Metrics
from usage_ledger.ledger import wait_up_to

__all__ = ("HttpServer",)


class HttpServer:
    """Accepts connections on a bound socket and runs `handler` for each request. Build inside the running loop."""

    def __init__(self, handler: Handler, limits: ServerLimits, metrics: Metrics) -> None:
        self._state = ServerState(handler, limits, metrics)
        self._server: asyncio.AbstractServer | None = None

    @property
    def limits(self) -> ServerLimits:
        return self._state.limits

    @property
    def connections(self) -> int:
        """Client connections open now."""
        return len(self._state.connections)

    @property
    def request_bytes(self) -> ByteBudget:
        """Request-body bytes held by all connections while receiving them."""
        return self._state.request_bytes

    async def start(self, sock: socket.socket) -> None:
        """Serve on `sock`, bound and listening (`gateway.serve.bind_socket`)."""
        state = self._state
        self._server = await state.loop.create_server(lambda: HttpConnection(state), sock=sock, backlog=2048)

    def force_close(self) -> None:
        """End a graceful shutdown now: connections still busy are closed."""
        self._state.settled.set()

    async def shutdown(self, grace_s: float) -> None:
        """Stop accepting; idle connections close now, busy ones after their response or after `grace_s`."""
        state = self._state
        state.closing = True
        if self._server is not None:
            self._server.close()
        for conn in list(state.connections):
            if conn.idle:
                conn.close()
        if state.connections:
            await wait_up_to(state.settled.wait(), grace_s)
        for conn in list(state.connections):
            conn.abort()  # calls still running see their client gone and record that
        if state.tasks:
            await asyncio.wait(list(state.tasks), timeout=5)
        if self._server is not None:
            await self._server.wait_closed()
