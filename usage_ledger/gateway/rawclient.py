"""A lean HTTP/1.1 upstream client: asyncio protocols + `httptools`, for the per-chunk hot path.

httpx (httpcore, h11, anyio) costs tens of µs per received chunk; a streamed completion is
thousands of small chunks. This client does what the gateway needs and nothing else:

    RawUpstream.send ─► _Pool.acquire (LIFO keep-alive, ≤ max connections, waiters)
                     ─► _Connection: one write (request line, headers, body) ─► await headers
    RawResponse.iter_raw ◄─ body bytes (de-chunked) handed over per `data_received`, joined
                            when the consumer lags; reading pauses above `HIGH_WATER` bytes
    RawResponse.pipe     ◄─ or: each body chunk handed to a sink from `on_body` (no task wake-up
                            per chunk); the sink's consumer pauses reading with `hold`

A connection goes back to the pool only when its response was complete on the wire and
keep-alive is allowed; anything else (closed early, cancelled, timed out) closes it. The read
timeout is an idle timeout (no byte for `upstream_read_timeout_s` while reading) kept by one
lazily re-armed timer per connection, not one timer per chunk. Failures come out as
`UpstreamUnreachable` / `UpstreamTimeout` / `UpstreamReset`, like `HttpxUpstream`. Plain
`http://` only; `serve` keeps httpx for `https://` upstreams.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import cast
from urllib.parse import urlsplit

import httptools

from usage_ledger.gateway.errors import UpstreamError, UpstreamReset, UpstreamTimeout, UpstreamUnreachable
from usage_ledger.gateway.headers import Header
from usage_ledger.ledger.settings import Settings

__all__ = ("HIGH_WATER", "KEEPALIVE_EXPIRY_S", "RawResponse", "RawUpstream")

HIGH_WATER = 256 * 1024
"""Body bytes buffered for a lagging consumer before reading from the upstream pauses."""
KEEPALIVE_EXPIRY_S = 4.0
"""An idle pooled connection older than this is closed instead of reused (servers drop idle ones at ~5 s)."""

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_NO_BODY_STATUS = frozenset({204, 304})


class _Connection(asyncio.Protocol):
    """One upstream connection and the state of the response being received on it."""

    def __init__(self, pool: _Pool) -> None:
        self.pool = pool
        self.loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.slot_freed = False
        self.idle_since = 0.0
        # the response in progress
        self.busy = False
        self.head_only = False
        self.status = 0
        self.headers: list[Header] = []
        self.headers_done = False
        self.until_close = False
        self.body: list[bytes] = []
        self.buffered = 0
        self.complete = False
        self.overflow = False
        self.keep_alive = False
        self.error: UpstreamError | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.paused = False
        self.held = False
        self.sink: Callable[[bytes], None] | None = None
        self.sink_error: Exception | None = None
        self.last_read = 0.0
        self.timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol ----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # TCP_NODELAY: asyncio (TCP sockets from create_connection) and uvloop (every transport) set it
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's

    def data_received(self, data: bytes) -> None:
        if not self.busy:  # bytes on an idle connection: nothing can be trusted on it any more
            self.close()
            return
        self.last_read = self.loop.time()
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            if not self.complete:
                self._fail(UpstreamReset(f"the upstream sent an invalid HTTP response: {exc}"))
            self.close()
            self._wake()
            return
        if self.overflow:  # bytes beyond the response: deliver the response, never reuse the connection
            self.close()
        if self.sink is not None:  # piped: on_body handed the bytes over, no task wake-up per chunk
            if self.sink_error is not None:
                self.close()
            if self.complete or self.closed or self.error is not None or self.sink_error is not None:
                self._wake()
            return
        if self.buffered > HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool | None:
        return None  # let the transport close; connection_lost decides complete or reset

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._disarm()
        if self.busy and not self.complete:
            if self.headers_done and self.until_close:
                self.complete = True  # a body delimited by the end of the connection
            elif self.error is None:
                stage = "a complete message body" if self.headers_done else "a response"
                detail = f": {exc}" if exc else ""
                self.error = UpstreamReset(f"the upstream closed the connection without sending {stage}{detail}")
        self._wake()
        self.pool.slot_freed(self)

    # -- httptools callbacks -------------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self.complete:
            self.overflow = True

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.complete:
            self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        if self.complete:
            return
        status = self.parser.get_status_code()
        if 100 <= status < 200 and status != 101:
            self.headers = []  # an interim response (100 Continue, 103 Early Hints): wait for the real one
            return
        self.status = status
        self.headers_done = True
        delimited = False
        for name, value in self.headers:
            if name == b"content-length" or (name == b"transfer-encoding" and b"chunked" in value.lower()):
                delimited = True
                break
        self.until_close = not delimited and status not in _NO_BODY_STATUS and not self.head_only

    def on_body(self, body: bytes) -> None:
        if self.complete:
            return
        sink = self.sink
        if sink is not None:
            if self.sink_error is None:
                try:
                    sink(body)
                except Exception as exc:  # a bug in the consumer: end this response, never the loop
                    self.sink_error = exc
            return
        self.body.append(body)
        self.buffered += len(body)

    def on_message_complete(self) -> None:
        if not self.headers_done or self.complete:
            return  # the end of an interim response, or of bytes beyond ours
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive() and not self.until_close
        self._disarm()

    # -- requests ------------------------------------------------------------------------------
    def start(self, request: bytes, *, head_only: bool) -> None:
        assert self.transport is not None
        self.busy = True
        self.head_only = head_only
        self.status = 0
        self.headers = []
        self.headers_done = self.until_close = self.complete = self.overflow = self.keep_alive = False
        self.body = []
        self.buffered = 0
        self.error = None
        self.sink = None
        self.sink_error = None
        self.held = False
        self.last_read = self.loop.time()
        self.timer = self.loop.call_at(self.last_read + self.pool.read_timeout, self._on_timer)
        self.transport.write(request)

    async def wait(self) -> None:
        """Until something changed: body bytes, completion, an error or the end of the connection."""
        waiter = self.loop.create_future()
        self.waiter = waiter
        try:
            await waiter
        finally:
            self.waiter = None

    async def wait_headers(self) -> None:
        while not self.headers_done:
            if self.error is not None:
                raise self.error
            if self.closed:
                raise UpstreamReset("the upstream closed the connection without sending a response")
            await self.wait()
        if self.head_only:
            self.complete = True
            self.keep_alive = False  # llhttp cannot be told the body is absent: never reuse
            self._disarm()

    def hold(self, held: bool) -> None:
        """Pause (True) or resume (False) reading for a piped consumer that cannot take more now."""
        if held == self.held or self.transport is None or self.closed:
            return
        self.held = held
        if held:
            if not self.paused:
                self.transport.pause_reading()
        elif not self.paused:
            self.last_read = self.loop.time()
            self.transport.resume_reading()

    def take_body(self) -> bytes:
        body = self.body
        data = body[0] if len(body) == 1 else b"".join(body)
        self.body = []
        self.buffered = 0
        if self.paused and self.transport is not None and not self.closed:
            self.paused = False
            if not self.held:
                self.last_read = self.loop.time()
                self.transport.resume_reading()
        return data

    def finish(self) -> None:
        """The consumer is done with the response: pool the connection if that is safe, else close it."""
        if not self.busy:
            return
        self.busy = False
        self.sink = None
        self._disarm()
        if self.complete and self.keep_alive and self.error is None and not self.closed:
            self.body = []
            self.buffered = 0
            if (self.paused or self.held) and self.transport is not None:
                self.paused = self.held = False
                self.transport.resume_reading()
            self.pool.release(self)
        else:
            self.close()

    def close(self) -> None:
        self.busy = False
        self._disarm()
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.abort()  # connection_lost follows and frees the pool slot
        elif self.transport is None:
            self.closed = True
            self.pool.slot_freed(self)

    # -- internals -----------------------------------------------------------------------------
    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: UpstreamError) -> None:
        if self.error is None:
            self.error = error
        self._wake()

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _on_timer(self) -> None:
        self.timer = None
        if not self.busy or self.complete or self.closed:
            return
        now = self.loop.time()
        timeout = self.pool.read_timeout
        if self.paused or self.held:  # the consumer lags, the upstream is not idle
            self.last_read = now
        elif now - self.last_read >= timeout:
            stage = "body" if self.headers_done else "headers"
            self._fail(UpstreamTimeout(f"the upstream did not answer in time ({stage}): no bytes for {timeout:g} s"))
            self.close()
            return
        self.timer = self.loop.call_at(self.last_read + timeout, self._on_timer)


class _Pool:
    """Keep-alive connections to one upstream: LIFO reuse, at most `max_connections` open."""

    def __init__(self, host: str, port: int, settings: Settings) -> None:
        self.loop = asyncio.get_running_loop()
        self.host = host
        self.port = port
        self.connect_timeout = settings.upstream_connect_timeout_s
        self.read_timeout = settings.upstream_read_timeout_s
        self.max_connections = settings.upstream_max_connections
        self.idle: list[_Connection] = []
        self.count = 0
        self.waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self.closing = False

    async def acquire(self) -> _Connection:
        while True:
            if self.closing:
                raise UpstreamUnreachable("the upstream client is closed")
            now = self.loop.time()
            while self.idle:
                conn = self.idle.pop()
                if not conn.closed and now - conn.idle_since < KEEPALIVE_EXPIRY_S:
                    return conn
                conn.close()
            if self.count < self.max_connections:
                return await self._connect()
            await self._wait_for_slot()

    async def _connect(self) -> _Connection:
        self.count += 1
        conn = _Connection(self)
        try:
            async with asyncio.timeout(self.connect_timeout):
                await self.loop.create_connection(lambda: conn, self.host, self.port)
        except BaseException as exc:
            conn.close()
            self.slot_freed(conn)
            if isinstance(exc, TimeoutError):
                raise UpstreamTimeout(
                    f"the upstream did not answer in time (connect): no connection to {self.host}:{self.port} "
                    f"within {self.connect_timeout:g} s"
                ) from exc
            if isinstance(exc, OSError):
                raise UpstreamUnreachable(
                    f"cannot connect to the upstream at {self.host}:{self.port}: {exc.strerror or exc}"
                ) from exc
            raise
        return conn

    async def _wait_for_slot(self) -> None:
        waiter = self.loop.create_future()
        self.waiters.append(waiter)
        try:
            async with asyncio.timeout(self.connect_timeout):
                await waiter
        except TimeoutError as exc:
            raise UpstreamTimeout(
                f"the upstream did not answer in time (pool): all {self.max_connections} connections stayed busy "
                f"for {self.connect_timeout:g} s"
            ) from exc
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._wake_one()  # we were handed a slot we will not use: pass it on
            raise
        finally:
            with contextlib.suppress(ValueError):
                self.waiters.remove(waiter)

    def _wake_one(self) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def release(self, conn: _Connection) -> None:
        if self.closing:
            conn.close()
            return
        conn.idle_since = self.loop.time()
        self.idle.append(conn)
        self._wake_one()

    def slot_freed(self, conn: _Connection) -> None:
        if conn.slot_freed:
            return
        conn.slot_freed = True
        self.count -= 1
        with contextlib.suppress(ValueError):
            self.idle.remove(conn)
        self._wake_one()

    def close(self) -> None:
        self.closing = True
        idle, self.idle = self.idle, []
        for conn in idle:
            conn.close()
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # they re-check and see `closing`


class RawResponse:
    """A response whose status and headers arrived; the body is read with `iter_raw` (once)."""

    __slots__ = ("_conn", "_done", "headers", "status")

    def __init__(self, conn: _Connection) -> None:
        self._conn = conn
        self._done = False
        self.status = conn.status
        self.headers: list[Header] = conn.headers

    def _release(self) -> None:
        """Once per response: the connection may already serve another request after this."""
        if not self._done:
            self._done = True
            self._conn.finish()

    async def _next(self) -> bytes | None:
        """The body bytes buffered since the last call (waiting for some), None at the end of the body."""
        conn = self._conn
        while True:
            if conn.sink_error is not None:
                raise conn.sink_error
            if conn.body:  # when piped: only what arrived before `pipe` began
                return conn.take_body()
            if conn.error is not None:
                raise conn.error
            if conn.complete:
                return None
            if conn.closed:
                raise UpstreamReset("the upstream connection was closed mid-body")
            await conn.wait()

    async def iter_raw(self) -> AsyncIterator[bytes]:
        try:
            while (chunk := await self._next()) is not None:
                yield chunk
        finally:
            self._release()  # pooled if complete on the wire, else closed (cancelled, abandoned, failed)

    async def pipe(self, sink: Callable[[bytes], None]) -> None:
        """Hand every body chunk to `sink` from the protocol callback as it arrives (instead of `iter_raw`).

        Returns once the body is complete; raises `UpstreamError` like `iter_raw`. `hold(True)` pauses
        reading from the upstream while the consumer cannot take more (backpressure), `hold(False)` resumes.
        """
        conn = self._conn
        try:
            conn.sink = sink  # from now on body bytes go to `sink` from `on_body`; `_next` wakes at the end
            while (chunk := await self._next()) is not None:
                sink(chunk)
        finally:
            conn.sink = None
            self._release()

    def hold(self, held: bool) -> None:
        if not self._done:
            self._conn.hold(held)

    async def aclose(self) -> None:
        self._release()


class RawUpstream:
    """The `UpstreamClient` for plain-HTTP upstreams. Build inside the running loop; `aclose` closes the pool."""

    def __init__(self, settings: Settings) -> None:
        url = urlsplit(settings.upstream)
        if url.scheme != "http" or not url.hostname:
            raise ValueError(f"RawUpstream speaks plain http:// only, not {settings.upstream!r}")
        self.base_url = settings.upstream.rstrip("/")
        self._prefix = url.path.rstrip("/").encode("latin-1")
        port = url.port or 80
        host = url.hostname
        netloc = f"[{host}]" if ":" in host else host
        self._host_header = (netloc if url.port is None else f"{netloc}:{port}").encode("idna")
        self._pool = _Pool(host, port, settings)

    def _request(self, method: str, target: str, headers: Sequence[Header], body: bytes) -> bytes:
        parts = [method.encode("ascii"), b" ", self._prefix, target.encode("latin-1"), b" HTTP/1.1\r\n"]
        has_host = has_length = False
        for name, value in headers:
            if b"\r" in value or b"\n" in value or b"\r" in name or b"\n" in name or b":" in name:
                raise ValueError(f"invalid header for the upstream: {name.decode('latin-1')!r}")
            low = name.lower()
            if low == b"host":
                has_host = True
            elif low == b"content-length" or low == b"transfer-encoding":
                has_length = True
            parts += (name, b": ", value, b"\r\n")
        if not has_host:
            parts[5:5] = (b"host: ", self._host_header, b"\r\n")
        if not has_length and (body or method in _BODY_METHODS):
            parts += (b"content-length: ", str(len(body)).encode("ascii"), b"\r\n")
        parts += (b"\r\n", body)
        return b"".join(parts)

    async def send(
        self,
        method: str,
        target: str,
        headers: Sequence[Header],
        body: bytes,
        *,
        on_sent: Callable[[], None] | None = None,
    ) -> RawResponse:
        request = self._request(method, target, headers, body)
        conn = await self._pool.acquire()
        try:
            conn.start(request, head_only=method == "HEAD")
            if on_sent is not None:
                on_sent()
            await conn.wait_headers()
        except BaseException:
            conn.close()
            raise
        return RawResponse(conn)

    async def aclose(self) -> None:
        self._pool.close()
