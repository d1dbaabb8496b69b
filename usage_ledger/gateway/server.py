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

`HttpServer.shutdown()` stops accepting, closes idle connections, lets requests in flight finish
(up to a grace period), then closes the rest (their calls are recorded as client disconnects).
"""

from __future__ import annotations

import asyncio
import collections
import http
import socket
import time
from collections.abc import Awaitable, Callable
from typing import cast
from urllib.parse import unquote

import httptools
import structlog

from usage_ledger.gateway.errors import BodyTooLarge, GatewayError, error_body
from usage_ledger.gateway.headers import Header
from usage_ledger.ledger.waiting import wait_up_to

__all__ = (
    "KEEPALIVE_TIMEOUT_S",
    "MAX_HEAD_BYTES",
    "AbortSignal",
    "Exchange",
    "HttpConnection",
    "HttpServer",
    "Request",
)

log = structlog.get_logger("gateway.server")

KEEPALIVE_TIMEOUT_S = 5.0
"""An idle keep-alive connection is closed after this long (uvicorn's default)."""

MAX_HEAD_BYTES = 64 * 1024
"""Request line plus headers; more is answered 431 (httptools alone would buffer them without end)."""

Handler = Callable[["Request", "Exchange"], Awaitable[None]]

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_LAST_CHUNK = b"0\r\n\r\n"
_STATUS_LINES: dict[int, bytes] = {}


def _status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    if line is None:
        try:
            phrase = http.HTTPStatus(status).phrase.encode("ascii")
        except ValueError:
            phrase = b""
        line = b"HTTP/1.1 %d %s\r\n" % (status, phrase)
        _STATUS_LINES[status] = line
    return line


class Request:
    """One parsed request. `body` is complete when the handler runs."""

    __slots__ = (
        "body",
        "complete",
        "expect_continue",
        "headers",
        "http_version",
        "keep_alive",
        "method",
        "parts",
        "path",
        "query",
        "raw_path",
        "received",
        "size",
        "too_large",
    )

    def __init__(self) -> None:
        self.method = ""
        self.raw_path = b""
        self.path = ""
        self.query = b""
        self.headers: list[Header] = []
        self.http_version = "1.1"
        self.keep_alive = True
        self.expect_continue = False
        self.parts: list[bytes] = []
        self.body = b""
        self.size = 0
        self.complete = False
        self.too_large = False
        self.received = 0.0


class Exchange:
    """The response side of one request, written straight to the connection's transport.

    `start_now`, then any number of `send` (or `push` from a protocol callback), then `end_now` (or all at once: `respond_json`) — or `abort`.
    `on_disconnect` is called once if the client goes away before the response ended.
    """

    __slots__ = ("_chunked", "_conn", "_head_only", "_hold", "ended", "keep_alive", "on_disconnect", "started")

    def __init__(self, conn: HttpConnection, request: Request) -> None:
        self._conn = conn
        self._head_only = request.method == "HEAD"
        self._chunked = False
        self._hold: Callable[[bool], None] | None = None
        self.keep_alive = request.keep_alive
        self.started = False
        self.ended = False
        self.on_disconnect: Callable[[], None] | None = None

    def start_now(self, status: int, headers: list[Header]) -> None:
        """Write the status line and headers (hop-by-hop ones already removed by the caller)."""
        conn = self._conn
        self.started = True
        has_length = False
        for name, _ in headers:
            if name == b"content-length" or name.lower() == b"content-length":
                has_length = True
                break
        no_body = self._head_only or status in (204, 304) or status < 200
        self._chunked = not has_length and not no_body and conn.http11
        if not (has_length or self._chunked or no_body) or conn.server.closing:
            self.keep_alive = False  # the body ends when the connection does (HTTP/1.0), or we are stopping
        out = [_status_line(status)]
        for name, value in headers:
            out += (name, b": ", value, b"\r\n")
        if self._chunked:
            out += (b"transfer-encoding: chunked\r\n",)
        if not self.keep_alive:
            out += (b"connection: close\r\n",)
        elif not conn.http11:
            out += (b"connection: keep-alive\r\n",)  # an HTTP/1.0 client that asked for keep-alive
        out.append(b"\r\n")
        conn.write(b"".join(out))

    def push(self, data: bytes) -> None:
        """Write body bytes now (from any callback); a no-op once the client is gone."""
        conn = self._conn
        if not data or self._head_only or conn.closed or conn.transport is None:
            return
        conn.transport.write(b"%x\r\n%b\r\n" % (len(data), data) if self._chunked else data)

    async def send(self, data: bytes) -> None:
        """Write body bytes, then wait while the client is not reading (transport above its high-water mark)."""
        self.push(data)
        await self._conn.drain()

    def end_now(self, data: bytes = b"") -> None:
        """The last body bytes: the response is complete and the connection serves the next request."""
        if self.ended:
            return
        self.ended = True
        if self._chunked and not self._head_only:
            self._conn.write((b"%x\r\n%b\r\n" % (len(data), data) if data else b"") + _LAST_CHUNK)
        else:
            self.push(data)

    def respond_json(self, status: int, body: bytes) -> None:
        """A whole JSON response at once (the gateway's own error answers)."""
        self.start_now(status, [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())])
        self.end_now(body)

    def abort(self) -> None:
        """Drop the connection: the client must not take a cut body for a complete one."""
        self.ended = True
        self.keep_alive = False
        self._conn.abort()

    @property
    def connection(self) -> HttpConnection:
        return self._conn

    def flow(self, hold: Callable[[bool], None] | None) -> None:
        """Who to pause (`hold(True)`) while the client is not reading, and resume (`hold(False)`) after."""
        self._hold = hold
        if hold is not None and self._conn.write_paused:
            hold(True)

    def paused(self, paused: bool) -> None:
        if self._hold is not None:
            self._hold(paused)


class HttpConnection(asyncio.Protocol):
    """One client connection: parses requests, runs them one at a time, writes their responses."""

    def __init__(self, server: HttpServer) -> None:
        self.server = server
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
        self.idle_timer: asyncio.TimerHandle | None = None
        self.client: tuple[str, int] | None = None
        self.local: tuple[str, int] | None = None

    # -- asyncio.Protocol ----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # TCP_NODELAY: inherited from the listening socket (`bind_socket`), and uvloop sets it on every transport
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's
        self.client = _address(transport.get_extra_info("peername"))
        self.local = _address(transport.get_extra_info("sockname"))
        self.server.connections.add(self)
        self._arm_idle()

    def data_received(self, data: bytes) -> None:
        if self.bad_request is not None:
            return  # the connection closes after the answer in progress; nothing more is read
        self._disarm_idle()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._malformed("protocol upgrades (e.g. WebSocket) are not supported by the gateway")
            return
        except httptools.HttpParserError as exc:
            if isinstance(exc.__context__, _HeadTooLarge):
                self.bad_status = 431
                self._malformed(str(exc.__context__))
            else:
                self._malformed(f"malformed HTTP request: {exc}")
            return
        if len(self.requests) > 1 and not self.read_paused and self.transport is not None:
            self.read_paused = True  # a pipelined request waits for its turn: read no further ahead
            self.transport.pause_reading()
        self._dispatch()

    def eof_received(self) -> bool | None:
        return None  # the transport closes; a response in progress is abandoned (as uvicorn does)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._disarm_idle()
        self.server.connection_closed(self)
        self._wake()
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
        self._wake()

    # -- httptools callbacks -------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.parsing = Request()
        self.url = b""
        self.head_bytes = 0

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.parsing is not None
        self._count_head(len(name) + len(value))
        self.parsing.headers.append((name.lower(), value))

    def _count_head(self, size: int) -> None:
        self.head_bytes += size
        if self.head_bytes > MAX_HEAD_BYTES:
            raise _HeadTooLarge(f"the request line and headers exceed {MAX_HEAD_BYTES} bytes")

    def on_headers_complete(self) -> None:
        request = self.parsing
        assert request is not None
        parser = self.parser
        request.received = time.time()
        request.method = parser.get_method().decode("ascii")
        request.http_version = parser.get_http_version()
        self.http11 = request.http_version == "1.1"
        request.keep_alive = parser.should_keep_alive()
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
        limit = self.server.max_body_bytes
        for name, value in request.headers:
            if name == b"expect" and value.lower() == b"100-continue":
                request.expect_continue = True
            elif name == b"content-length" and value.isdigit() and int(value) > limit:
                request.too_large = True
        self.requests.append(request)

    def on_body(self, body: bytes) -> None:
        request = self.parsing
        assert request is not None
        request.size += len(body)
        if request.too_large or request.size > self.server.max_body_bytes:
            request.too_large = True
            request.parts = []
            return
        request.parts.append(body)

    def on_message_complete(self) -> None:
        request = self.parsing
        assert request is not None
        parts = request.parts
        request.body = parts[0] if len(parts) == 1 else b"".join(parts)
        request.parts = []
        request.complete = True
        self.parsing = None
        if self.requests and self.requests[0] is request and self.task is not None and self.exchange is None:
            self._wake()

    # -- requests ------------------------------------------------------------------------------
    def _dispatch(self) -> None:
        """Start the next request if none is running."""
        if self.task is None and self.requests and not self.closed:
            task = self.task = self.loop.create_task(self._run(self.requests[0]))
            tasks = self.server.tasks
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    def _wake(self) -> None:
        """Wake `_wait`: the body arrived, the client reads again, or the connection is gone."""
        waiter = self.drain_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _run(self, request: Request) -> None:
        exchange: Exchange | None = None
        try:
            if not request.complete:
                if request.expect_continue and not request.too_large:
                    self.write(_CONTINUE)
                while not request.complete and not request.too_large and not self.closed:
                    await self._wait()
            if self.closed:
                return
            exchange = Exchange(self, request)
            self.exchange = exchange
            if request.too_large:
                limit = self.server.max_body_bytes
                error = BodyTooLarge(f"the request body exceeds {limit} bytes (LEDGER_MAX_BODY_BYTES)")
                exchange.keep_alive = False  # the rest of the body is not read
                exchange.respond_json(error.status, error.body())
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
        if self.requests and self.requests[0] is request:
            self.requests.popleft()
        if self.closed:
            return
        if exchange is None or not exchange.ended:
            self.abort()  # the handler returned without a complete response
            return
        if not exchange.keep_alive or not request.complete:
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
            self.transport.resume_reading()
        if self.requests:
            self._dispatch()
        else:
            self._arm_idle()

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

    # -- errors and timers ---------------------------------------------------------------------
    def _malformed(self, reason: str) -> None:
        self.bad_request = reason
        if self.transport is not None and not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()
        if self.parsing is not None and self.requests and self.requests[-1] is self.parsing:
            self.requests.pop()  # the request that failed to parse is never handled
        self.parsing = None
        if self.task is not None:
            return  # answered once the request in progress is
        if self.requests:
            self._dispatch()  # complete requests that came before the bad bytes are answered first
        else:
            self._answer_bad_request()

    def _answer_bad_request(self) -> None:
        reason = self.bad_request or "malformed HTTP request"
        status, code = (431, "headers_too_large") if self.bad_status == 431 else (400, "bad_request")
        body = error_body(reason, kind="invalid_request_error", code=code)
        head = (
            _status_line(status) + b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
        )
        self.write(head % len(body) + body)
        self.close()

    def _arm_idle(self) -> None:
        if self.idle_timer is None and not self.closed:
            self.idle_timer = self.loop.call_later(KEEPALIVE_TIMEOUT_S, self._idle_timeout)

    def _disarm_idle(self) -> None:
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None

    def _idle_timeout(self) -> None:
        self.idle_timer = None
        if self.idle:
            self.close()


class _HeadTooLarge(Exception):
    """Raised from a parser callback; httptools re-raises it as the context of its callback error."""


class AbortSignal(Exception):
    """Base for exceptions a handler raises to drop the connection without a server error log."""


def _address(value: object) -> tuple[str, int] | None:
    if isinstance(value, tuple) and len(value) >= 2:
        return str(value[0]), int(value[1])
    return None


class HttpServer:
    """Accepts connections on a bound socket and runs `handler` for each request."""

    def __init__(self, handler: Handler, *, max_body_bytes: int) -> None:
        self.loop = asyncio.get_running_loop()
        self.handler = handler
        self.max_body_bytes = max_body_bytes
        self.connections: set[HttpConnection] = set()
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

    def connection_closed(self, conn: HttpConnection) -> None:
        self.connections.discard(conn)
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
