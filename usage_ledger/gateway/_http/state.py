"""What every connection of one server shares: its limits and metrics, the open and waiting connections, the
bodies under way by their pace, the request-body budget, the handler and whether the server is stopping.

At the connection cap `make_room` closes the connection that has held its slot longest without doing its part
(the rule: docs/configuration.md, "Limits for slow and large traffic"); when none has, the new one gets a 503.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Awaitable, Callable
from typing import Protocol

from usage_ledger.gateway._http.exchange import Exchange, Request
from usage_ledger.gateway.limits import ByteBudget, ServerLimits
from usage_ledger.gateway.metrics import Metrics

__all__ = ("Handler", "ServerState")

Handler = Callable[[Request, Exchange], Awaitable[None]]


class _Connection(Protocol):
    """What the server does to a connection (`_http.connection.HttpConnection`; named, not imported: no circle)."""

    body_ticket: int | None
    """The connection's entry in `ServerState.bodies`, if it has a live one."""

    @property
    def idle(self) -> bool: ...

    def pace(self, now: float) -> float | None:
        """When the body under way would be exactly at the minimum rate; None: no body whose pace counts."""

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
        self.waiting: dict[_Connection, float] = {}
        """Connections without a request under way (idle, or sending a head), longest waiting first: since when."""
        self.bodies: list[tuple[float, int, _Connection]] = []
        """Connections receiving a body, a heap by pace (`_Connection.pace`), kept lazily: a key is pushed once and
        only ever lags the connection's (its pace only moves later), so it is refreshed when it reaches the top."""
        self._tickets = itertools.count()
        self.lingering = 0
        self.tasks: set[asyncio.Task[None]] = set()
        self.closing = False
        self.settled = asyncio.Event()
        """Set when stopping and no connection is left (or the grace period is cut short)."""

    def make_room(self) -> bool:
        """At the cap: close the connection that has held its slot longest without doing its part, if any (a
        slowloris, an idle keep-alive one, or a body behind the minimum rate: a trickle that reconnects whenever it is
        cut must not keep every slot); the new connection gets its slot."""
        now = self.loop.time()
        waited = -1.0
        for since in self.waiting.values():
            waited = now - since
            break
        behind = self._most_behind(now)
        if behind is not None and behind[0] > 0 and behind[0] > waited:
            conn = behind[1]
            heapq.heappop(self.bodies)
            conn.body_ticket = None
        elif waited >= 0:
            conn = next(iter(self.waiting))
            del self.waiting[conn]
        else:
            return False
        self.connections.discard(conn)  # its slot is the new connection's now (it closes in a moment)
        conn.shed()
        return True

    def body_begun(self, conn: _Connection, pace: float) -> None:
        """`conn` is receiving a body over more than one read: listed by its pace, so it can be closed for room."""
        bodies = self.bodies
        if len(bodies) > 2 * len(self.connections) + 64:  # entries of bodies that ended (or closed): drop them
            now = self.loop.time()
            bodies[:] = [e for e in bodies if e[2].body_ticket == e[1] and e[2].pace(now) is not None]
            heapq.heapify(bodies)
        ticket = conn.body_ticket = next(self._tickets)
        heapq.heappush(bodies, (pace, ticket, conn))

    def _most_behind(self, now: float) -> tuple[float, _Connection] | None:
        """The body furthest behind the minimum rate and by how many seconds (at the top of `bodies` after)."""
        bodies = self.bodies
        while bodies:
            key, ticket, conn = bodies[0]
            pace = conn.pace(now) if conn.body_ticket == ticket else None
            if pace is None:  # its body ended (or it was listed again)
                heapq.heappop(bodies)
                if conn.body_ticket == ticket:
                    conn.body_ticket = None
            elif pace > key:  # it read more since: its true place is lower
                ticket = conn.body_ticket = next(self._tickets)
                heapq.heapreplace(bodies, (pace, ticket, conn))
            else:
                return now - pace, conn
        return None

    def release_body(self, request: Request) -> None:
        if request.held:
            self.request_bytes.give_back(request.held)
            request.held = 0

    def connection_closed(self, conn: _Connection) -> None:
        self.connections.discard(conn)
        self.waiting.pop(conn, None)
        if self.closing and not self.connections:
            self.settled.set()
