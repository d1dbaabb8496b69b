"""One client connection of `_http.server`: an `asyncio.Protocol` with the `httptools` request parser.

    data_received ─► httptools ─► Request (head, whole body within the limits) ─► handler(request, Exchange)
    one request at a time, in order: a pipelined one waits with reading paused until its turn

`Expect: 100-continue` is answered when the body is wanted; a malformed request gets a 400 and the
connection closes; the head, body and idle timeouts are `_http.guard`'s.
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import cast
from urllib.parse import unquote

import httptools
import structlog

from usage_ledger.gateway._http.exchange import Exchange, Request
from usage_ledger.gateway._http.guard import BUSY, HEAD, ConnectionGuard
from usage_ledger.gateway._http.state import ServerState
from usage_ledger.gateway.errors import BodyTooLarge, GatewayBusy, GatewayError, error_body
from usage_ledger.gateway.limits import MAX_HEAD_BYTES

__all__ = ("AbortSignal", "HttpConnection")

log = structlog.get_logger("gateway.server")

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_HEAD_TOO_LARGE = f"the request line and headers exceed {MAX_HEAD_BYTES} bytes"
_ERROR_CODES = {400: "bad_request", 408: "request_timeout", 431: "headers_too_large", 503: "gateway_busy"}


class HttpConnection(asyncio.Protocol):
    """One client connection: parses requests, runs them one at a time, writes their responses."""

    def __init__(self, server: ServerState) -> None:
        self.server = server
        self.limits = server.limits
        self.loop = server.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.http11 = True
        self.closed = False
        self.write_paused = False
        self.read_paused = False
        self.drain_waiter: asyncio.Future[None] | None = None
        self.requests: collections.deque[Request] = collections.deque()
        self.parsing: Request | None = None
        self.url = b""
        self.exchange: Exchange | None = None
        self.task: asyncio.Task[None] | None = None
        self.bad_request: str | None = None
        self.bad_status = 400
        self.head_bytes = 0
        """Of the head being parsed: the bytes httptools handed over (request target, header names and values)."""
        self.head_received = 0
        """Of the head or trailer section not yet complete: the bytes of the reads that ended inside it."""
        self.steps = 0
        """Heads completed and body pieces handed over on this connection (tells whether a read made no step)."""
        self.client: tuple[str, int] | None = None
        self.local: tuple[str, int] | None = None
        self.body_ticket: int | None = None
        """The body under way's entry in `ServerState.bodies` (by its pace), once it took more than one read."""
        self.guard = ConnectionGuard(self, server)
        """Its phase, timeouts and closing (for room, after an error answer)."""

    # -- asyncio.Protocol ----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # TCP_NODELAY: inherited from the listening socket (`bind_socket`), and uvloop sets it on every transport
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's
        server = self.server
        if len(server.connections) >= self.limits.max_connections and not server.make_room():
            self.guard.refuse()
            return
        self.client = _address(transport.get_extra_info("peername"))
        self.local = _address(transport.get_extra_info("sockname"))
        server.connections.add(self)
        server.waiting[self] = self.guard.wait(self.limits.head_timeout_s)

    def data_received(self, data: bytes) -> None:
        if self.bad_request is not None:
            return  # the connection closes after the answer in progress; nothing more is read
        steps = self.steps
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.malformed("protocol upgrades (e.g. WebSocket) and CONNECT are not supported by the gateway")
            return
        except httptools.HttpParserError as exc:
            if isinstance(exc.__context__, _HeadTooLarge):
                self._head_too_large()
            else:
                self.malformed(f"malformed HTTP request: {exc}")
            return
        if self.parsing is not None and self.steps == steps:
            # a read that ends inside a request without completing its head or handing over a body byte: all of it
            # was head or trailer section (or a chunk's size line), counted as it arrives: httptools hands a field
            # over only once its line ends, and until then buffers it, copying it again at each read (one line
            # that never ends held the loop for seconds)
            self.head_received += len(data)
            if self.head_received > MAX_HEAD_BYTES:
                self._head_too_large()
                return
        now = self.guard.read()
        if now is not None and self.body_ticket is None and (pace := self.guard.pace(now)) is not None:
            self.server.body_begun(self, pace)
        if len(self.requests) > 1 and not self.read_paused and self.transport is not None:
            self.read_paused = True  # a pipelined request waits for its turn: read no further ahead
            self.transport.pause_reading()
        self.dispatch()

    def eof_received(self) -> bool | None:
        return None  # the transport closes; a response in progress is abandoned (as uvicorn does)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.guard.closed():
            return
        server = self.server
        server.connection_closed(self)
        for request in self.requests:
            server.release_body(request)
        if self.parsing is not None:
            server.release_body(self.parsing)
        self.wake()
        exchange = self.exchange
        if exchange is not None and not exchange.ended:
            exchange.paused(False)
            callback = exchange.on_disconnect
            if callback is not None:
                exchange.on_disconnect = None
                callback()

    def pause_writing(self) -> None:
        self.write_paused = True
        if self.exchange is not None:
            self.exchange.paused(True)

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.exchange is not None:
            self.exchange.paused(False)
        self.wake()

    # -- httptools callbacks -------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.parsing = Request()
        self.url = b""
        self.head_bytes = 0
        self.guard.head_begun()

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.parsing is not None
        self._count_head(len(name) + len(value))
        if self.guard.phase == HEAD:  # after the head: a chunked body's trailer fields, dropped (never headers: #52)
            self.parsing.headers.append((name.lower(), value))

    def _count_head(self, size: int) -> None:
        self.head_bytes += size
        if self.head_bytes > MAX_HEAD_BYTES:
            raise _HeadTooLarge(_HEAD_TOO_LARGE)

    def on_headers_complete(self) -> None:
        request = self.parsing
        assert request is not None
        parser = self.parser
        self.steps += 1
        self.head_received = 0
        self.body_ticket = None  # a new body: listed by its pace if it takes more than this read
        request.received = time.time()
        self.guard.body_begun()
        self.server.waiting.pop(self, None)  # a request is under way: no longer the first to close for room
        request.method = parser.get_method().decode("ascii")
        request.http_version = parser.get_http_version()
        self.http11 = request.http_version == "1.1"
        request.keep_alive = parser.should_keep_alive()
        if parser.should_upgrade():
            return  # Upgrade or CONNECT: never handled; the parser stops here and `data_received` answers 400
        url = self.url
        if url.startswith(b"/") or url == b"*":
            qmark = url.find(b"?")
            raw_path = url if qmark < 0 else url[:qmark]
            request.query = b"" if qmark < 0 else url[qmark + 1 :]
            if b"#" in request.query:
                request.query = request.query.split(b"#", 1)[0]
        else:  # absolute form (a proxy request line)
            parsed = httptools.parse_url(url)
            raw_path = parsed.path or b"/"
            request.query = parsed.query or b""
        request.raw_path = raw_path
        text = raw_path.decode("latin-1")
        request.path = unquote(text) if "%" in text else text
        limit = self.limits.max_body_bytes
        for name, value in request.headers:
            if name == b"expect" and value.lower() == b"100-continue":
                request.expect_continue = True
            elif name == b"content-length" and value.isdigit() and int(value) > limit:
                request.refusal = _too_large(limit)
        self.requests.append(request)

    def on_body(self, body: bytes) -> None:
        request = self.parsing
        assert request is not None
        self.steps += 1
        self.head_received = 0
        if request.refusal is not None:
            return
        size = len(body)
        request.size += size
        server = self.server
        if request.size > self.limits.max_body_bytes:
            request.refusal = _too_large(self.limits.max_body_bytes)
        elif server.request_bytes.take(size):
            request.held += size
            request.parts.append(body)
            return
        else:
            server.metrics.requests_refused_busy += 1
            limit = server.request_bytes.limit
            request.refusal = GatewayBusy(
                f"the gateway holds {limit} bytes of request bodies already (LEDGER_MAX_REQUEST_BYTES_IN_FLIGHT); "
                "retry shortly"
            )
        request.parts = []
        server.release_body(request)
        self.wake()  # a handler waiting for this body answers the refusal now

    def on_message_complete(self) -> None:
        request = self.parsing
        assert request is not None
        parts = request.parts
        request.body = parts[0] if len(parts) == 1 else b"".join(parts)
        request.parts = []
        request.complete = True
        self.parsing = None
        self.guard.phase = BUSY
        if self.requests and self.requests[0] is request and self.task is not None and self.exchange is None:
            self.wake()

    # -- requests ------------------------------------------------------------------------------
    def dispatch(self) -> None:
        """Start the next request if none is running."""
        if self.task is None and self.requests and not self.closed:
            task = self.task = self.loop.create_task(self._run(self.requests[0]))
            tasks = self.server.tasks
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    def wake(self) -> None:
        """Wake `_wait`: the body arrived, the client reads again, or the connection is gone."""
        waiter = self.drain_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _run(self, request: Request) -> None:
        exchange: Exchange | None = None
        try:
            if not request.complete:
                if request.expect_continue and request.refusal is None:
                    self.write(_CONTINUE)
                while not request.complete and request.refusal is None and not self.closed and self.bad_request is None:
                    await self._wait()
            if self.closed or (not request.complete and request.refusal is None):
                return  # closed, or its body turned out malformed (or its trailer section too large): `_finish`
            exchange = Exchange(self, request)
            self.exchange = exchange
            if request.refusal is not None:
                exchange.keep_alive = False  # the rest of the body is not read
                exchange.respond_json(request.refusal.status, request.refusal.body())
                return
            try:
                await self.server.handler(request, exchange)
            except Exception as exc:
                if not isinstance(exc, AbortSignal):
                    log.exception("gateway_server_error", path=request.path)
                if not exchange.started and not self.closed:
                    exchange.keep_alive = False
                    failure = GatewayError(f"the gateway failed to answer: {type(exc).__name__}")
                    exchange.respond_json(500, failure.body())
                elif not exchange.ended:
                    exchange.abort()
        except asyncio.CancelledError:
            if not self.closed:
                raise
        finally:
            self._finish(request, exchange)

    def _finish(self, request: Request, exchange: Exchange | None) -> None:
        self.task = None
        self.exchange = None
        self.server.release_body(request)
        if self.requests and self.requests[0] is request:
            self.requests.popleft()
        if self.closed:
            return
        if exchange is None and self.bad_request is not None and not request.complete and request.refusal is None:
            self._answer_bad_request()
            return
        if exchange is None or not exchange.ended:
            self.abort()  # the handler returned without a complete response
            return
        if not request.complete:
            self.guard.close_lingering()  # the client may still be sending the body: let it read the answer
            return
        if not exchange.keep_alive:
            self.close()
            return
        if self.bad_request is not None and not self.requests:
            self._answer_bad_request()
            return
        if self.server.closing and not self.requests:
            self.close()
            return
        if self.read_paused and len(self.requests) <= 1 and self.transport is not None:
            self.read_paused = False
            self.guard.resumed()
            self.transport.resume_reading()
        if self.requests:
            self.dispatch()
        elif self.parsing is None:
            waiting = self.server.waiting
            waiting.pop(self, None)
            waiting[self] = self.guard.wait(self.limits.keepalive_idle_s)  # the last to be closed for room

    async def _wait(self) -> None:
        waiter = self.loop.create_future()
        self.drain_waiter = waiter
        try:
            await waiter
        finally:
            self.drain_waiter = None

    # -- writing -------------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        if not self.closed and self.transport is not None:
            self.transport.write(data)

    async def drain(self) -> None:
        while self.write_paused and not self.closed:
            await self._wait()

    def close(self) -> None:
        if not self.closed and self.transport is not None:
            self.transport.close()  # flushes what was written, then connection_lost

    def abort(self) -> None:
        if not self.closed and self.transport is not None:
            self.transport.abort()

    @property
    def idle(self) -> bool:
        return self.task is None and not self.requests and self.parsing is None

    def pace(self, now: float) -> float | None:
        """`ServerState` asks when the body under way would be at the minimum rate (`ConnectionGuard.pace`)."""
        return self.guard.pace(now)

    def shed(self) -> None:
        """`ServerState` closes it for room (`ConnectionGuard.shed`)."""
        self.guard.shed()

    @property
    def stopping(self) -> bool:
        """The server is shutting down: responses close their connection."""
        return self.server.closing

    # -- errors, limits and timers -------------------------------------------------------------
    def malformed(self, reason: str) -> None:
        self.bad_request = reason
        self.guard.phase = BUSY
        if self.transport is not None and not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()
        if self.parsing is not None and self.requests and self.requests[-1] is self.parsing:
            self.requests.pop()  # the request that failed to parse is never handled
            self.server.release_body(self.parsing)
        self.parsing = None
        if self.task is not None:
            self.wake()  # a handler waiting for the body of the request that failed answers now
            return  # else answered once the request in progress is
        if self.requests:
            self.dispatch()  # complete requests that came before the bad bytes are answered first
        else:
            self._answer_bad_request()

    def _head_too_large(self) -> None:
        self.bad_status = 431
        self.malformed(_HEAD_TOO_LARGE)

    def _answer_bad_request(self) -> None:
        reason = self.bad_request or "malformed HTTP request"
        status = self.bad_status
        body = error_body(reason, kind="invalid_request_error", code=_ERROR_CODES.get(status, "bad_request"))
        self.guard.answer_and_close(status, body)


class _HeadTooLarge(Exception):
    """Raised from a parser callback; httptools re-raises it as the context of its callback error."""


class AbortSignal(Exception):
    """Base for exceptions a handler raises to drop the connection without a server error log."""


def _address(value: object) -> tuple[str, int] | None:
    if isinstance(value, tuple) and len(value) >= 2:
        return str(value[0]), int(value[1])
    return None


def _too_large(limit: int) -> BodyTooLarge:
    return BodyTooLarge(f"the request body exceeds {limit} bytes (LEDGER_MAX_BODY_BYTES)")
