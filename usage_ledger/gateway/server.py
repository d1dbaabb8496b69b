"""The gateway's own HTTP/1.1 server: an `asyncio.Protocol` with the `httptools` request parser.

    client ─► HttpConnection.data_received ─► httptools ─► Request (headers, whole body)
                     │ one request at a time per connection, in order (pipelined ones wait, reading paused)
                     ▼
              handler(request, Exchange) ─► proxy: upstream bytes written to the transport from the
                                                   upstream's protocol callback (no task hop per chunk)
                                          └► /_ledger/: the Litestar app through `gateway.asgi`

Keep-alive, Content-Length and chunked request bodies, `Expect: 100-continue`, responses framed by
Content-Length or chunked (HTTP/1.0 clients: by closing). Backpressure both ways: a client that
stops reading pauses the upstream (`Exchange.flow`), a client that sends more than one request
ahead is not read until its turn. A malformed request gets a 400 and the connection is closed.

Slow and large traffic is bounded (`gateway.limits.ServerLimits`): a request head must be complete
within `head_timeout_s` (else 408), a body may pause at most `body_timeout_s` (else 408; the call
was never handed over, so nothing is recorded), an idle keep-alive connection closes after
`keepalive_idle_s`. At `max_connections` the connection that has waited longest without a
request in progress (idle, or still sending its head) is closed to make room; if every one is
busy the new connection gets a 503 and is closed. Request bodies held at once are bounded by
`max_request_bytes_in_flight` (a request over it: 503). The timeouts and the cap's closing are
`gateway.guard`'s (one lazily re-armed timer per connection, none armed or cancelled per request).

`HttpServer.shutdown()` stops accepting, closes idle connections, lets requests in flight finish
(up to a grace period), then closes the rest (their calls are recorded as client disconnects).
"""

from __future__ import annotations

import asyncio
import socket

from usage_ledger.gateway.exchange import Request
from usage_ledger.gateway.limits import ByteBudget, ServerLimits
from usage_ledger.gateway.metrics import Metrics
from usage_ledger.gateway.server_connection import Handler, HttpConnection
from usage_ledger.gateway.settings import GatewaySettings
from usage_ledger.ledger.waiting import wait_up_to

__all__ = ("HttpServer",)


class HttpServer:
    """Accepts connections on a bound socket and runs `handler` for each request."""

    def __init__(
        self,
        handler: Handler,
        *,
        max_body_bytes: int | None = None,
        limits: ServerLimits | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.handler = handler
        if limits is None:
            settings = GatewaySettings() if max_body_bytes is None else GatewaySettings(max_body_bytes=max_body_bytes)
            limits = ServerLimits.from_settings(settings)
        self.limits = limits
        self.metrics = metrics or Metrics()
        self.request_bytes = ByteBudget(limits.max_request_bytes_in_flight)
        self.connections: set[HttpConnection] = set()
        self.waiting: dict[HttpConnection, None] = {}
        """Connections without a request under way (idle, or sending a head), longest waiting first."""
        self.lingering = 0
        self.tasks: set[asyncio.Task[None]] = set()
        self.closing = False
        self._settled = asyncio.Event()  # set when stopping and no connection is left, or forced
        self._server: asyncio.AbstractServer | None = None

    async def start(self, sock: socket.socket) -> None:
        """Serve on `sock`, bound and listening (`gateway.serve.bind_socket`)."""
        self._server = await self.loop.create_server(lambda: HttpConnection(self), sock=sock, backlog=2048)

    def force_close(self) -> None:
        """End a graceful shutdown now: connections still busy are closed."""
        self._settled.set()

    def make_room(self) -> bool:
        """At the cap: close the connection that has waited longest without a request under way, if any."""
        for conn in self.waiting:
            del self.waiting[conn]
            self.connections.discard(conn)  # its slot is the new connection's now (it closes in a moment)
            conn.shed()
            return True
        return False

    def release_body(self, request: Request) -> None:
        if request.held:
            self.request_bytes.give_back(request.held)
            request.held = 0

    def connection_closed(self, conn: HttpConnection) -> None:
        self.connections.discard(conn)
        self.waiting.pop(conn, None)
        if self.closing and not self.connections:
            self._settled.set()

    async def shutdown(self, grace_s: float = 30.0) -> None:
        """Stop accepting; idle connections close now, busy ones after their response or after `grace_s`."""
        self.closing = True
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            if conn.idle:
                conn.close()
        if self.connections:
            await wait_up_to(self._settled.wait(), grace_s)
        for conn in list(self.connections):
            conn.abort()  # calls still running see their client gone and record that
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=5)
        if self._server is not None:
            await self._server.wait_closed()
