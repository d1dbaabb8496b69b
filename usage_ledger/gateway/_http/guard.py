"""The part of a client connection that enforces `gateway.limits`: its timeouts, and closing it for room.

One timer per connection, lazily re-armed (never armed or cancelled per request): it fires at
`timer_at`, then checks the deadline of the phase the connection is in —

    IDLE  no request begun: the keep-alive wait (a new connection: until its first head is due)
    HEAD  a request head begun: due `head_timeout_s` after its start (or the connection's) → 408
    BODY  a body under way: at most `body_timeout_s` between reads, and once `BODY_RATE_GRACE_S` passed
          at least `min_body_rate` bytes a second on average → 408, never handed over (a byte every few
          seconds does not keep a connection, and its slot, forever)
    BUSY  a request is being handled, or the connection is ending: nothing is due

Closing after an error answer lingers (`close_lingering`): the client may still be sending.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import structlog

from usage_ledger.gateway._http.exchange import Request, status_line
from usage_ledger.gateway.errors import GatewayBusy, RequestTimeout
from usage_ledger.gateway.limits import LINGERING_MAX

if TYPE_CHECKING:
    from usage_ledger.gateway._http.state import ServerState
    from usage_ledger.gateway.limits import ServerLimits

__all__ = ("BODY", "BUSY", "HEAD", "IDLE", "REFUSED_LINGER_S", "GuardedConnection")

log = structlog.get_logger("gateway.server")

REFUSED_LINGER_S = 1.0
"""A connection closed after an error answer is half-closed and read (discarding) this long, so the client
reads the answer instead of a reset; at most `LINGERING_MAX` linger at once, the rest are closed at once."""

# What the connection's parser is waiting for (`HttpConnection.phase`), and so which timeout runs.
IDLE = 0  # no request begun: a keep-alive wait (or a new connection's first head)
HEAD = 1  # a request line and headers begun, not complete
BODY = 2  # headers complete, body not
BUSY = 3  # nothing to read for now (a request is being handled, or the connection is ending)


class GuardedConnection(asyncio.Protocol):
    """Timeouts, refusal at the cap and shedding for room; `HttpConnection` provides the rest."""

    server: ServerState
    limits: ServerLimits
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport | None
    closed: bool
    read_paused: bool
    bad_request: str | None
    bad_status: int
    parsing: Request | None
    client: tuple[str, int] | None

    def __init__(self) -> None:
        self.refused = False
        self.lingering = False
        self.phase = IDLE
        self.deadline = 0.0
        """When the idle or head phase ends (loop time); the body phase's is `_body_due`."""
        self.last_read = 0.0
        self.body_since = 0.0
        """When the body's pace began to count (its head's end, or its reading resumed after we paused it)."""
        self.fresh = True
        """No request began yet: the first head's deadline counts from the connection's start."""
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = 0.0
        self.body_ticket: int | None = None
        """The body under way's entry in `ServerState.bodies` (by its pace), once it took more than one read."""

    # provided by HttpConnection
    @property
    def idle(self) -> bool:
        raise NotImplementedError

    def write(self, data: bytes) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        raise NotImplementedError

    def _malformed(self, reason: str) -> None:
        raise NotImplementedError

    def _dispatch(self) -> None:
        raise NotImplementedError

    def _wake(self) -> None:
        raise NotImplementedError

    def _refuse(self) -> None:
        """At the connection cap with every connection busy: a 503, then closed (after a short linger)."""
        self.server.metrics.connections_refused += 1
        self.refused = True
        cap = self.limits.max_connections
        body = GatewayBusy(
            f"the gateway is at its connection limit ({cap} open, LEDGER_MAX_CONNECTIONS) and every connection "
            "is busy; retry shortly"
        ).body()
        head = status_line(503) + b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
        self.write(head % len(body) + body)
        self._close_lingering()

    def _close_lingering(self) -> None:
        """Close after an answer the client may not have read yet because it is still sending: end our side,
        read (and drop) what it sends for up to `REFUSED_LINGER_S`, then close (a plain close would reset
        the connection over the unread bytes, and the client could lose the answer)."""
        transport = self.transport
        server = self.server
        if transport is None or self.closed:
            return
        self.bad_request = self.bad_request or "closing"  # nothing more is parsed
        self.phase = BUSY
        if server.lingering >= LINGERING_MAX or not transport.can_write_eof():
            transport.close()
            return
        server.lingering += 1
        self.lingering = True
        transport.write_eof()
        if self.read_paused:
            self.read_paused = False
            transport.resume_reading()
        self._disarm()
        self.timer = self.loop.call_later(REFUSED_LINGER_S, self.abort)

    def _schedule(self, deadline: float) -> None:
        """Make sure the timer fires by `deadline` (one timer, moved earlier only when it must be)."""
        timer = self.timer
        if timer is not None:
            if self.timer_at <= deadline:
                return
            timer.cancel()
        self.timer_at = deadline
        self.timer = self.loop.call_at(deadline, self._on_timer)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _on_timer(self) -> None:
        self.timer = None
        if self.closed:
            return
        phase = self.phase
        now = self.loop.time()
        if phase == BODY:
            if self.read_paused:  # we do not read (a pipelined request waits): not the client's delay
                self.last_read = self.body_since = now
            deadline = self._body_due()
        elif phase == BUSY:
            return  # re-armed when the connection waits for a client again
        else:
            deadline = self.deadline
        if now < deadline:
            self._schedule(deadline)
        elif phase == IDLE:
            if self.idle:
                self.close()
        else:
            self._timed_out(phase)

    def _body_due(self) -> float:
        """When the body in progress is late: a pause too long, or (after its grace) a pace too slow."""
        limits = self.limits
        due = self.last_read + limits.body_timeout_s
        rate = limits.min_body_rate
        if rate:
            size = self.parsing.size if self.parsing is not None else 0
            due = min(due, self.body_since + limits.body_rate_grace_s + (size + 1) / rate)
        return due

    def pace(self, now: float) -> float | None:
        """When the body under way would be exactly at `min_body_rate` (its grace not counted): before `now`, it is
        behind by the difference. None: no body whose pace counts (none under way, or no minimum rate)."""
        rate = self.limits.min_body_rate
        request = self.parsing
        if self.phase != BODY or self.closed or not rate or request is None:
            return None
        pace = self.body_since + request.size / rate
        return max(pace, now) if self.read_paused else pace  # a body we do not read is not behind

    def _timed_out(self, phase: int) -> None:
        server = self.server
        server.metrics.requests_timed_out += 1
        self.bad_status = 408
        if phase == HEAD:
            limit, what = self.limits.head_timeout_s, "request line and headers"
            self._malformed(f"the {what} did not arrive within {limit:g} s (LEDGER_HEAD_TIMEOUT_S)")
            return
        request = self.parsing
        limits = self.limits
        size = request.size if request is not None else 0
        now = self.loop.time()
        if now - self.last_read >= limits.body_timeout_s:
            limit = limits.body_timeout_s
            reason = (
                f"the request body stalled: no bytes for {limit:g} s (LEDGER_BODY_TIMEOUT_S); the call was not made"
            )
        else:
            reason = (
                f"the request body arrived slower than {limits.min_body_rate} bytes/s (LEDGER_MIN_BODY_RATE): "
                f"{size} bytes in {now - self.body_since:.0f} s; the call was not made"
            )
        server.metrics.bodies_too_slow += 1
        self._cut_body(reason)

    def _cut_body(self, reason: str) -> None:
        """The body under way is not read further: its request is answered 408 with `reason`, then closed."""
        server = self.server
        request = self.parsing
        size = request.size if request is not None else 0
        self.bad_status = 408
        self.parsing = None
        self.phase = BUSY
        self.bad_request = reason  # nothing more is read
        if self.transport is not None and not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()
        if request is not None:
            request.refusal = RequestTimeout(reason)
            request.parts = []
            server.release_body(request)
        log.info("request_body_timed_out", client=self.client, received_bytes=size, reason=reason)
        self._dispatch()
        self._wake()

    def shed(self) -> None:
        """Closed to make room for a new connection: an idle one silently, one sending its head or a body behind
        the minimum rate with a 408."""
        self.server.metrics.connections_shed += 1
        if self.phase == HEAD and self.parsing is not None:
            self.bad_status = 408
            self._malformed(
                "the request head was not complete when the gateway reached its connection limit "
                "(LEDGER_MAX_CONNECTIONS); the slowest waiting connection was closed"
            )
        elif self.phase == BODY and self.parsing is not None:
            size, rate = self.parsing.size, self.limits.min_body_rate
            elapsed = self.loop.time() - self.body_since
            self._cut_body(
                f"the request body was behind {rate} bytes/s (LEDGER_MIN_BODY_RATE), {size} bytes in {elapsed:.1f} s, "
                "when the gateway reached its connection limit (LEDGER_MAX_CONNECTIONS): the body furthest behind "
                "was closed to make room; the call was not made"
            )
        else:
            self.close()
