"""What a client connection owns to enforce `gateway.limits`: its timeouts, refusal at the cap, closing it for room.

One timer per connection, lazily re-armed (never armed or cancelled per request): it fires at
`timer_at`, then checks the deadline of the phase the connection is in —

    IDLE  no request begun: the keep-alive wait (a new connection: until its first head is due)
    HEAD  a request head begun: due `head_timeout_s` after its start (or the connection's) → 408
    BODY  a body under way: at most `body_timeout_s` between reads, and once `BODY_RATE_GRACE_S` passed
          at least `min_body_rate` bytes a second on average → 408, never handed over (a byte every few
          seconds does not keep a connection, and its slot, forever)
    BUSY  a request is being handled, or the connection is ending: nothing is due

Closing after an error answer lingers (`close_lingering`): the client may still be sending. The guard acts on
its connection through `Guarded`, what it needs of one.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Protocol

import structlog

from usage_ledger.gateway._http.exchange import Request, status_line
from usage_ledger.gateway.errors import GatewayBusy, RequestTimeout
from usage_ledger.gateway.limits import LINGERING_MAX

if TYPE_CHECKING:
    from usage_ledger.gateway._http.state import ServerState
    from usage_ledger.gateway.limits import ServerLimits

__all__ = ("BODY", "BUSY", "HEAD", "IDLE", "REFUSED_LINGER_S", "ConnectionGuard", "Guarded")

log = structlog.get_logger("gateway.server")

REFUSED_LINGER_S = 1.0
"""A connection closed after an error answer is half-closed and read (discarding) this long, so the client
reads the answer instead of a reset; at most `LINGERING_MAX` linger at once, the rest are closed at once."""

# What the connection's parser is waiting for (`ConnectionGuard.phase`), and so which timeout runs.
IDLE = 0  # no request begun: a keep-alive wait (or a new connection's first head)
HEAD = 1  # a request line and headers begun, not complete
BODY = 2  # headers complete, body not
BUSY = 3  # nothing to read for now (a request is being handled, or the connection is ending)


class Guarded(Protocol):
    """What a guard does to its connection (`_http.connection.HttpConnection`; named, not imported: no circle)."""

    transport: asyncio.Transport | None
    closed: bool
    read_paused: bool
    bad_request: str | None
    """Why the connection stops reading (set: nothing more is parsed); answered once the request in progress is."""
    bad_status: int
    parsing: Request | None
    client: tuple[str, int] | None

    @property
    def idle(self) -> bool: ...

    def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...

    def abort(self) -> None: ...

    def malformed(self, reason: str) -> None:
        """Answer `bad_status` with `reason` and close, once any request before it is answered."""

    def dispatch(self) -> None:
        """Start the next request if none is running."""

    def wake(self) -> None:
        """Wake a handler waiting for its body (or for the client to read)."""


class ConnectionGuard:
    """One connection's phase and deadlines on one timer, its refusal at the cap, shedding and lingering close."""

    def __init__(self, conn: Guarded, server: ServerState) -> None:
        self.conn = conn
        self.server = server
        self.limits: ServerLimits = server.limits
        self.loop = server.loop
        self.refused = False
        self.lingering = False
        self.phase = IDLE
        self.deadline = 0.0
        """When the idle or head phase ends (loop time); the body phase's is `body_due`."""
        self.last_read = 0.0
        self.body_since = 0.0
        """When the body's pace began to count (its head's end, or its reading resumed after we paused it)."""
        self.fresh = True
        """No request began yet: the first head's deadline counts from the connection's start."""
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = 0.0

    def wait(self, timeout_s: float) -> float:
        """The connection waits for a request (IDLE) for up to `timeout_s`; returns since when (loop time)."""
        self.phase = IDLE
        now = self.loop.time()
        self.deadline = now + timeout_s
        self.schedule(self.deadline)
        return now

    def head_begun(self) -> None:
        self.phase = HEAD
        if self.fresh:
            self.fresh = False  # the deadline set at the connection's start stands
        else:
            self.deadline = self.loop.time() + self.limits.head_timeout_s

    def body_begun(self) -> None:
        self.phase = BODY
        self.resumed()

    def resumed(self) -> None:
        """A body's pace counts from now: its head ended, or we resumed reading (a pause was not the client's)."""
        self.last_read = self.body_since = self.loop.time()

    def read(self) -> float | None:
        """Bytes arrived: the phase's deadline moves; returns when, in the body phase."""
        if self.phase == BODY:
            now = self.last_read = self.loop.time()
            self.schedule(self.body_due())
            return now
        if self.phase == HEAD:
            self.schedule(self.deadline)
        return None

    def closed(self) -> bool:
        """The connection is gone: the timer stops; True if it was refused (it never held a slot)."""
        self.disarm()
        if self.lingering:
            self.server.lingering -= 1
        return self.refused

    def refuse(self) -> None:
        """At the connection cap with every connection busy: a 503, then closed (after a short linger)."""
        self.server.metrics.connections_refused += 1
        self.refused = True
        cap = self.limits.max_connections
        body = GatewayBusy(
            f"the gateway is at its connection limit ({cap} open, LEDGER_MAX_CONNECTIONS) and every connection "
            "is busy; retry shortly"
        ).body()
        self.answer_and_close(503, body)

    def answer_and_close(self, status: int, body: bytes) -> None:
        """Write an error answer (JSON, `connection: close`) outside any exchange, then close lingering."""
        head = (
            status_line(status) + b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
        )
        self.conn.write(head % len(body) + body)
        self.close_lingering()

    def close_lingering(self) -> None:
        """Close after an answer the client may not have read yet because it is still sending: end our side,
        read (and drop) what it sends for up to `REFUSED_LINGER_S`, then close (a plain close would reset
        the connection over the unread bytes, and the client could lose the answer)."""
        conn, server = self.conn, self.server
        transport = conn.transport
        if transport is None or conn.closed:
            return
        conn.bad_request = conn.bad_request or "closing"  # nothing more is parsed
        self.phase = BUSY
        if server.lingering >= LINGERING_MAX or not transport.can_write_eof():
            transport.close()
            return
        server.lingering += 1
        self.lingering = True
        transport.write_eof()
        if conn.read_paused:
            conn.read_paused = False
            transport.resume_reading()
        self.disarm()
        self.timer = self.loop.call_later(REFUSED_LINGER_S, conn.abort)

    def schedule(self, deadline: float) -> None:
        """Make sure the timer fires by `deadline` (one timer, moved earlier only when it must be)."""
        timer = self.timer
        if timer is not None:
            if self.timer_at <= deadline:
                return
            timer.cancel()
        self.timer_at = deadline
        self.timer = self.loop.call_at(deadline, self._on_timer)

    def disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _on_timer(self) -> None:
        self.timer = None
        if self.conn.closed:
            return
        phase = self.phase
        now = self.loop.time()
        if phase == BODY:
            if self.conn.read_paused:  # we do not read (a pipelined request waits): not the client's delay
                self.last_read = self.body_since = now
            deadline = self.body_due()
        elif phase == BUSY:
            return  # re-armed when the connection waits for a client again
        else:
            deadline = self.deadline
        if now < deadline:
            self.schedule(deadline)
        elif phase == IDLE:
            if self.conn.idle:
                self.conn.close()
        else:
            self._timed_out(phase)

    def body_due(self) -> float:
        """When the body in progress is late: a pause too long, or (after its grace) a pace too slow."""
        limits = self.limits
        due = self.last_read + limits.body_timeout_s
        rate = limits.min_body_rate
        if rate:
            request = self.conn.parsing
            size = request.size if request is not None else 0
            due = min(due, self.body_since + limits.body_rate_grace_s + (size + 1) / rate)
        return due

    def pace(self, now: float) -> float | None:
        """When the body under way would be exactly at `min_body_rate` (its grace not counted): before `now`, it is
        behind by the difference. None: no body whose pace counts (none under way, or no minimum rate)."""
        rate = self.limits.min_body_rate
        conn = self.conn
        request = conn.parsing
        if self.phase != BODY or conn.closed or not rate or request is None:
            return None
        pace = self.body_since + request.size / rate
        return max(pace, now) if conn.read_paused else pace  # a body we do not read is not behind

    def _timed_out(self, phase: int) -> None:
        server = self.server
        server.metrics.requests_timed_out += 1
        self.conn.bad_status = 408
        if phase == HEAD:
            limit, what = self.limits.head_timeout_s, "request line and headers"
            self.conn.malformed(f"the {what} did not arrive within {limit:g} s (LEDGER_HEAD_TIMEOUT_S)")
            return
        request = self.conn.parsing
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
        conn = self.conn
        request = conn.parsing
        size = request.size if request is not None else 0
        conn.bad_status = 408
        conn.parsing = None
        self.phase = BUSY
        conn.bad_request = reason  # nothing more is read
        if conn.transport is not None and not conn.read_paused:
            conn.read_paused = True
            conn.transport.pause_reading()
        if request is not None:
            request.refusal = RequestTimeout(reason)
            request.parts = []
            self.server.release_body(request)
        log.info("request_body_timed_out", client=conn.client, received_bytes=size, reason=reason)
        conn.dispatch()
        conn.wake()

    def shed(self) -> None:
        """Closed to make room for a new connection: an idle one silently, one sending its head or a body behind
        the minimum rate with a 408."""
        self.server.metrics.connections_shed += 1
        conn = self.conn
        if self.phase == HEAD and conn.parsing is not None:
            conn.bad_status = 408
            conn.malformed(
                "the request head was not complete when the gateway reached its connection limit "
                "(LEDGER_MAX_CONNECTIONS); the slowest waiting connection was closed"
            )
        elif self.phase == BODY and conn.parsing is not None:
            size, rate = conn.parsing.size, self.limits.min_body_rate
            elapsed = self.loop.time() - self.body_since
            self._cut_body(
                f"the request body was behind {rate} bytes/s (LEDGER_MIN_BODY_RATE), {size} bytes in {elapsed:.1f} s, "
                "when the gateway reached its connection limit (LEDGER_MAX_CONNECTIONS): the body furthest behind "
                "was closed to make room; the call was not made"
            )
        else:
            conn.close()
