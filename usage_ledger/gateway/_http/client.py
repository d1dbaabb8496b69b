"""The gateway's upstream client: lean HTTP/1.1 over asyncio protocols + `httptools`, TLS included.

It does what the gateway needs and nothing else (why it is not aiohttp or httpx: `_http`'s docstring):

    Upstream.send ─► UpstreamPool.acquire (LIFO keep-alive, ≤ max connections, waiters)
                  ─► UpstreamConnection: one write (request line, headers, body) ─► await headers
    UpstreamResponse.chunks ◄─ body bytes (de-chunked) handed over per `data_received`, joined
                               when the consumer lags (`_http.upstream_connection`)
    UpstreamResponse.pipe   ◄─ or: the body bytes of each read handed to a sink from `data_received`
                               (no task wake-up per chunk); the sink's consumer pauses reading with `hold`

Nothing is added to the request but `Host` and `Content-Length` when the client sent none, and nothing
is decoded from the response: bytes in = bytes out.

A connection goes back to the pool only when its response was complete on the wire and
keep-alive is allowed; anything else (closed early, cancelled, timed out) closes it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ssl
from collections.abc import AsyncIterator, Callable, Sequence
from urllib.parse import urlsplit

from usage_ledger.gateway._http.upstream_connection import UpstreamConnection
from usage_ledger.gateway.errors import UpstreamError, UpstreamReset, UpstreamTimeout, UpstreamUnreachable
from usage_ledger.gateway.headers import Header
from usage_ledger.gateway.settings import GatewaySettings
from usage_ledger.ledger import ConfigError

__all__ = ("KEEPALIVE_EXPIRY_S", "Upstream", "UpstreamResponse", "tls_context")

KEEPALIVE_EXPIRY_S = 4.0
"""An idle pooled connection older than this is closed instead of reused (servers drop idle ones at ~5 s)."""

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_DEFAULT_PORTS = {"http": 80, "https": 443}


def tls_context(settings: GatewaySettings) -> ssl.SSLContext:
    """Verifying TLS for an `https://` upstream: the system's CAs, or only those of `upstream_ca_file`."""
    try:
        context = ssl.create_default_context(cafile=settings.upstream_ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"LEDGER_UPSTREAM_CA_FILE {settings.upstream_ca_file!r}: {exc}") from exc
    context.set_alpn_protocols(["http/1.1"])
    return context


class UpstreamPool:
    """Keep-alive connections to one upstream: LIFO reuse, at most `max_connections` open."""

    def __init__(self, host: str, port: int, settings: GatewaySettings, tls: ssl.SSLContext | None) -> None:
        self.loop = asyncio.get_running_loop()
        self.host = host
        self.port = port
        self.tls = tls
        self.connect_timeout = settings.upstream_connect_timeout_s
        self.read_timeout = settings.upstream_read_timeout_s
        self.max_connections = settings.upstream_max_connections
        self.idle: list[UpstreamConnection] = []
        self.count = 0
        self.waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self.closing = False

    async def acquire(self) -> UpstreamConnection:
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

    async def _connect(self) -> UpstreamConnection:
        self.count += 1
        conn = UpstreamConnection(self)
        try:
            async with asyncio.timeout(self.connect_timeout):
                await self.loop.create_connection(
                    lambda: conn, self.host, self.port, ssl=self.tls, server_hostname=self.host if self.tls else None
                )
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

    def release(self, conn: UpstreamConnection) -> None:
        if self.closing:
            conn.close()
            return
        conn.idle_since = self.loop.time()
        self.idle.append(conn)
        self._wake_one()

    def slot_freed(self, conn: UpstreamConnection) -> None:
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


class UpstreamResponse:
    """A response whose status and headers arrived; the body is read once, with `chunks` or `pipe`."""

    __slots__ = ("_conn", "_done", "headers", "status")

    def __init__(self, conn: UpstreamConnection) -> None:
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

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body bytes as they come: each read hands over everything buffered (de-chunked, not decoded).

        Bytes that arrived before a failure are handed over before it is raised (the client gets every
        byte the upstream sent, as it would directly)."""
        try:
            while (chunk := await self._next()) is not None:
                yield chunk
        finally:
            self._release()  # pooled if complete on the wire, else closed (cancelled, abandoned, failed)

    async def pipe(self, sink: Callable[[bytes], None]) -> None:
        """Hand the body bytes to `sink` from the protocol callback as they arrive, once per read (instead of `chunks`).

        Returns once the body is complete; raises `UpstreamError` like `chunks`. `hold(True)` pauses
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


class Upstream:
    """The client of the one upstream (`settings.upstream`). Build inside the running loop; `aclose` closes the pool."""

    def __init__(self, settings: GatewaySettings) -> None:
        url = urlsplit(settings.upstream)
        if url.scheme not in _DEFAULT_PORTS or not url.hostname:
            raise ConfigError(f"LEDGER_UPSTREAM must be an http:// or https:// URL, not {settings.upstream!r}")
        self.base_url = settings.upstream.rstrip("/")
        self._prefix = url.path.rstrip("/").encode("latin-1")
        port = url.port or _DEFAULT_PORTS[url.scheme]
        host = url.hostname
        netloc = f"[{host}]" if ":" in host else host
        self._host_header = (netloc if url.port is None else f"{netloc}:{port}").encode("idna")
        tls = tls_context(settings) if url.scheme == "https" else None
        self._pool = UpstreamPool(host, port, settings, tls)

    def _request(self, method: str, target: str, headers: Sequence[Header], body: bytes) -> bytes:
        parts = [method.encode("ascii"), b" ", self._prefix, target.encode("latin-1"), b" HTTP/1.1\r\n"]
        has_host = has_length = False
        for name, value in headers:
            if b"\r" in value or b"\n" in value or b"\r" in name or b"\n" in name or b":" in name:
                raise UpstreamError(f"invalid request for the upstream: a header with CR, LF or ':' in it ({name!r})")
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
    ) -> UpstreamResponse:
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
        return UpstreamResponse(conn)

    async def aclose(self) -> None:
        self._pool.close()
