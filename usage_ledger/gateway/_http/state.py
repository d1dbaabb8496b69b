"""What every connection of one server shares: its limits and metrics, the open and waiting connections,
the request-body budget, the handler and whether the server is stopping."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol

from usage_ledger.gateway._http.exchange import Exchange, Request
from usage_ledger.gateway.limits import ByteBudget, ServerLimits
from usage_ledger.gateway.metrics import Metrics

__all__ = ("Handler", "ServerState")

Handler = Callable[[Request, Exchange], Awaitable[None]]


class _Connection(Protocol):
    """What the server does to a connection (`_http.connection.HttpConnection`; named, not imported: no circle)."""

    @property
    def idle(self) -> bool: ...

    def shed(self) -> None: ...

    def close(self) -> None: ...

    def abort(self) -> None: ...


class ServerState:
    """One server's shared state; built inside the running loop."""

    def __init__(self, handler: Handler, limits: ServerLimits, metrics: Metrics) -> None:
        self.loop = asyncio.get_running_loop()
        self.handler = handler
        self.limits = limits
        self.metrics = metrics
        self.request_bytes = ByteBudget(limits.max_request_bytes_in_flight)
        """Request-body bytes all connections hold while receiving them (a request over it: 503)."""
        self.connections: set[_Connection] = set()
        self.waiting: dict[_Connection, None] = {}
        """Connections without a request under way (idle, or sending a head), longest waiting first."""
        self.lingering = 0
        self.tasks: set[asyncio.Task[None]] = set()
        self.closing = False
        self.settled = asyncio.Event()
        """Set when stopping and no connection is left (or the grace period is cut short)."""

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

    def connection_closed(self, conn: _Connection) -> None:
        self.connections.discard(conn)
        self.waiting.pop(conn, None)
        if self.closing and not self.connections:
            self.settled.set()
