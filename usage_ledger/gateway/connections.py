"""What slow clients may hold of the gateway's connections: uvicorn's httptools protocol, with limits.

uvicorn parses and frames; this adds what it lacks for a server facing the open network
(`gateway.limits.ServerLimits`, defaults in docs/configuration.md):

    head     a request line and headers must be complete `head_timeout_s` after the connection's
             start or the request's first byte (else 408); at most `MAX_HEAD_BYTES` (else 431)
    idle     a new connection that sends nothing is closed after `head_timeout_s`; a kept-alive
             one after `keepalive_idle_s` (uvicorn's `timeout_keep_alive`)
    the cap  at `max_connections` the connection waiting longest without a request under way
             (idle, or still sending its head) is closed to make room; if every one is busy the
             new connection gets a 503 `gateway_busy`
    errors   malformed requests get the gateway's JSON error (400) instead of uvicorn's text

The body's pace is the app's to enforce (`gateway.body`): uvicorn hands it over as it arrives.
An error answer is followed by a lingering close: the client may still be sending, and a plain
close would reset the connection over its unread bytes and lose the answer.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httptools
import structlog
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from usage_ledger.gateway.errors import GatewayBusy, error_body
from usage_ledger.gateway.limits import LINGERING_MAX, MAX_HEAD_BYTES, ServerLimits
from usage_ledger.gateway.metrics import Metrics
from usage_ledger.gateway.response import ABORT_EXTENSION

__all__ = ("REFUSED_LINGER_S", "ConnectionGuard", "GuardedHttpProtocol")

log = structlog.get_logger("gateway.server")

REFUSED_LINGER_S = 1.0
"""A connection closed after an error answer is half-closed and read (discarding) this long."""

_CODES = {400: "bad_request", 408: "request_timeout", 431: "headers_too_large", 503: "gateway_busy"}
_PHRASES = {
    400: b"Bad Request",
    408: b"Request Timeout",
    431: b"Request Header Fields Too Large",
    503: b"Service Unavailable",
}


class ConnectionGuard:
    """The state every connection of one server shares: its limits, the open and the waiting ones."""

    def __init__(self, limits: ServerLimits, metrics: Metrics) -> None:
        self.limits = limits
        self.metrics = metrics
        self.open: set[GuardedHttpProtocol] = set()
        self.waiting: dict[GuardedHttpProtocol, None] = {}
        """Connections without a request under way (idle, or sending a head), longest waiting first."""
        self.lingering = 0

    def make_room(self) -> bool:
        """At the cap: close the connection that has waited longest without a request under way, if any."""
        for conn in self.waiting:
            del self.waiting[conn]
            self.open.discard(conn)  # its slot is the new connection's now (it closes in a moment)
            conn.shed()
            return True
        return False


class _LingeringClose:
    """The transport as one response's cycle sees it: its `close` lingers (`_close_lingering`)."""

    def __init__(self, transport: asyncio.Transport, protocol: GuardedHttpProtocol) -> None:
        self._transport = transport
        self._protocol = protocol

    def close(self) -> None:
        self._protocol._close_lingering()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _HeadTooLarge(Exception):
    """Raised from a parser callback; httptools re-raises it as the context of its callback error."""


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol under the `ConnectionGuard`'s limits (build with `guard=`)."""

    def __init__(self, *args: Any, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.guard = guard
        self.head_timer: asyncio.TimerHandle | None = None
        self.head_deadline = 0.0
        self.head_bytes = 0
        self.in_head = False
        self.answered = False  # an error answer went out: nothing more is read
        self.refused = False
        self.lingering = False

    # -- connections ---------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        guard = self.guard
        if len(guard.open) >= guard.limits.max_connections and not guard.make_room():
            self.transport = transport
            self.refused = True
            guard.metrics.connections_refused += 1
            cap = guard.limits.max_connections
            self._answer(
                503,
                GatewayBusy(
                    f"the gateway is at its connection limit ({cap} open, LEDGER_MAX_CONNECTIONS) and every "
                    "connection is busy; retry shortly"
                ).message,
            )
            return
        super().connection_made(transport)
        guard.open.add(self)
        guard.waiting[self] = None
        self._head_due(self.loop.time() + guard.limits.head_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        guard = self.guard
        if self.lingering:
            self.lingering = False
            guard.lingering -= 1
        if self.refused:
            return
        guard.open.discard(self)
        guard.waiting.pop(self, None)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.answered:
            return  # lingering after an error answer: what the client still sends is dropped
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._answer(400, "protocol upgrades (e.g. WebSocket) are not supported by the gateway")
        except httptools.HttpParserError as exc:
            if isinstance(exc.__context__, _HeadTooLarge):
                self._answer(431, str(exc.__context__))
            else:
                self._answer(400, f"malformed HTTP request: {exc}")

    # -- parser callbacks ----------------------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope["extensions"] = {ABORT_EXTENSION: {"abort": self._abort, "linger": self._linger_after_response}}
        self.head_bytes = 0
        if not self.in_head:
            self.in_head = True
            if self.head_timer is None:  # not the connection's first request: its head is due from now
                self._head_due(self.loop.time() + self.guard.limits.head_timeout_s)

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value))
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self.in_head = False
        self._cancel_head_timer()
        self.guard.waiting.pop(self, None)  # a request is under way: no longer the first to close for room
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.cycle is not None and self.cycle.response_complete:
            waiting = self.guard.waiting
            waiting.pop(self, None)
            waiting[self] = None  # the most recent to wait: the last to be closed for room

    def _count_head(self, size: int) -> None:
        self.head_bytes += size
        if self.head_bytes > MAX_HEAD_BYTES:
            raise _HeadTooLarge(f"the request line and headers exceed {MAX_HEAD_BYTES} bytes")

    # -- limits --------------------------------------------------------------------------------
    def _head_due(self, deadline: float) -> None:
        self.head_deadline = deadline
        self.head_timer = self.loop.call_at(deadline, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def _head_timed_out(self) -> None:
        self.head_timer = None
        if self.transport.is_closing() or self.answered:
            return
        if not self.in_head:  # a new connection that never began a request
            self.transport.close()
            return
        self.guard.metrics.requests_timed_out += 1
        limit = self.guard.limits.head_timeout_s
        self._answer(408, f"the request line and headers did not arrive within {limit:g} s (LEDGER_HEAD_TIMEOUT_S)")

    def shed(self) -> None:
        """Closed to make room for a new connection: an idle one silently, one sending its head with a 408."""
        self.guard.metrics.connections_shed += 1
        if self.in_head:
            self._answer(
                408,
                "the request head was not complete when the gateway reached its connection limit "
                "(LEDGER_MAX_CONNECTIONS); the slowest waiting connection was closed",
            )
        else:
            self.transport.close()

    def _abort(self) -> None:
        if not self.transport.is_closing():
            self.transport.abort()

    def _answer(self, status: int, reason: str) -> None:
        """The gateway's JSON error, then a lingering close (nothing more is parsed)."""
        self.answered = True
        self._cancel_head_timer()
        self.guard.waiting.pop(self, None)
        body = error_body(reason, kind="invalid_request_error", code=_CODES[status])
        head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
        self.transport.write(head % (status, _PHRASES[status], len(body)) + body)
        self._close_lingering()

    def _linger_after_response(self) -> None:
        """The app answers before reading the whole body: once its response is written, close lingering."""
        if self.cycle is not None:
            self.cycle.transport = _LingeringClose(self.transport, self)  # type: ignore[assignment]

    def _close_lingering(self) -> None:
        """End our side, read (and drop) what the client still sends for up to `REFUSED_LINGER_S`, then close:
        a plain close would reset the connection over its unread bytes, and the client could lose the answer."""
        self.answered = True
        transport = self.transport
        guard = self.guard
        if transport.is_closing():
            return
        if guard.lingering >= LINGERING_MAX or not transport.can_write_eof():
            transport.close()
            return
        guard.lingering += 1
        self.lingering = True
        transport.write_eof()
        transport.resume_reading()
        self.loop.call_later(REFUSED_LINGER_S, self._abort)
