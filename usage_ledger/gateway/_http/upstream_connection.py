"""One upstream HTTP/1.1 connection: an `asyncio.Protocol` feeding `httptools`' response parser.

    request bytes ─► transport.write (one write)
    data_received ─► httptools ─► status, headers ─► body chunks: buffered for `UpstreamResponse.chunks`
                                                     or handed to a sink once per read (`pipe`)

The read timeout is an idle timeout (no byte for `upstream_read_timeout_s` while reading) kept by
one lazily re-armed timer per connection, not one timer per chunk. Reading pauses when a consumer
lags by more than `HIGH_WATER` bytes, or while a piped consumer holds it (`hold`). A head or trailer section over
`MAX_HEAD_BYTES` is an `UpstreamInvalid` and closes the connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol, cast

import httptools

from usage_ledger.gateway.errors import UpstreamError, UpstreamInvalid, UpstreamReset, UpstreamTimeout
from usage_ledger.gateway.headers import Header
from usage_ledger.gateway.limits import MAX_HEAD_BYTES

__all__ = ("HIGH_WATER", "UpstreamConnection")

HIGH_WATER = 256 * 1024
"""Body bytes buffered for a lagging consumer before reading from the upstream pauses."""

_NO_BODY_STATUS = frozenset({204, 304})
_HEAD_TOO_LARGE = f"the upstream's response head exceeds {MAX_HEAD_BYTES} bytes"
_TRAILER_TOO_LARGE = f"the upstream's trailer fields exceed {MAX_HEAD_BYTES} bytes"


class _Pool(Protocol):
    """What a connection uses of its pool (`_http.client.UpstreamPool`; named here, not imported: no circle)."""

    loop: asyncio.AbstractEventLoop
    read_timeout: float

    def release(self, conn: UpstreamConnection) -> None: ...

    def slot_freed(self, conn: UpstreamConnection) -> None: ...


class UpstreamConnection(asyncio.Protocol):
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
        self.head_bytes = 0
        """Header names and values httptools handed over, interim responses' included."""
        self.head_received = 0
        """Bytes received in reads that ended inside the response's head (interim responses' included) or, handing
        over no body byte, inside its body or trailer section: since the last body byte."""
        self.body_read = False
        """The read being parsed handed over a body byte."""
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
        in_head = not self.headers_done
        self.body_read = False
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            if not self.complete:
                too_large = isinstance(exc.__context__, _HeadTooLarge)
                reason = _HEAD_TOO_LARGE if too_large else f"the upstream sent an invalid HTTP response: {exc}"
                self._fail(UpstreamInvalid(reason))
            self.close()
            self._wake()
            return
        if not self.headers_done if in_head else not (self.complete or self.body_read):
            # counted as it arrives: httptools hands a header or trailer field over only once its line ends, and
            # until then buffers it, copying it again at each read (a hostile upstream's endless line took GBs and
            # seconds; an endless trailer line is never silent, so the read timeout never cut it)
            self.head_received += len(data)
            if self.head_received > MAX_HEAD_BYTES:
                self._fail(UpstreamInvalid(_HEAD_TOO_LARGE if in_head else _TRAILER_TOO_LARGE))
                self.close()
                return
        if self.overflow:  # bytes beyond the response: deliver the response, never reuse the connection
            self.close()
        if self.sink is not None:  # piped: the bytes go to the sink now, no task wake-up per chunk
            if self.body:
                self._to_sink()
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
        # after the head: a chunked body's trailer fields, dropped (never headers: #52)
        if not self.headers_done and self.error is None:
            self.head_bytes += len(name) + len(value)
            if self.head_bytes > MAX_HEAD_BYTES:
                raise _HeadTooLarge(_HEAD_TOO_LARGE)
            self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        if self.complete or self.error is not None:
            return  # bytes after our response, or after one refused: never a response to relay
        status = self.parser.get_status_code()
        if 100 <= status < 200 and status != 101:
            self.headers = []  # an interim response (100 Continue, 103 Early Hints): wait for the real one
            return
        if status < 100 or status > 599 or status == 101:  # no valid answer to a request that asked no upgrade
            self._fail(UpstreamInvalid(f"the upstream answered with status {status:03d}, which cannot be relayed"))
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
        if not self.complete:
            self.body_read = True
            self.head_received = 0
            self.body.append(body)  # piped or not, handed over once the read is parsed (`data_received`)
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
        self.head_bytes = self.head_received = 0
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
    def _to_sink(self) -> None:
        """What one read held of the body, to the sink at once: one hand-over per read, not per chunk of the
        upstream's framing (a saturated upstream's hundreds of small chunks in one read become one write)."""
        assert self.sink is not None
        body = self.body
        data = body[0] if len(body) == 1 else b"".join(body)
        self.body = []
        self.buffered = 0
        if self.sink_error is None:
            try:
                self.sink(data)
            except Exception as exc:  # a bug in the consumer: end this response, never the loop
                self.sink_error = exc

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


class _HeadTooLarge(Exception):
    """Raised from a parser callback; httptools re-raises it as the context of its callback error."""
