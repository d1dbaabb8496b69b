"""One request and its response, as the server (`_http.server`) hands them to a handler.

Request    the parsed request line, headers and (when the handler runs) the whole body
Exchange   the response side: written straight to the connection's transport, Content-Length
           or chunked framing, backpressure (`flow`), `abort` for a response cut short
"""

from __future__ import annotations

import asyncio
import http
from collections.abc import Callable, Sequence
from typing import Protocol

from usage_ledger.gateway.errors import GatewayError
from usage_ledger.gateway.headers import Header

__all__ = ("Connection", "Exchange", "Request", "status_line")

_LAST_CHUNK = b"0\r\n\r\n"
_STATUS_LINES: dict[int, bytes] = {}


def status_line(status: int) -> bytes:
    """`HTTP/1.1 <status> <phrase>` and CRLF, built once per status."""
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
        "held",
        "http_version",
        "keep_alive",
        "method",
        "parts",
        "path",
        "query",
        "raw_path",
        "received",
        "refusal",
        "size",
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
        self.refusal: GatewayError | None = None
        """Why the request is answered with an error instead of being handled (the rest of its body is not read)."""
        self.held = 0
        """Body bytes counted against the server's request-body budget."""
        self.received = 0.0


class Connection(Protocol):
    """What an exchange writes to (`_http.connection.HttpConnection`; named here, not imported: no circle)."""

    transport: asyncio.Transport | None
    closed: bool
    http11: bool
    write_paused: bool
    client: tuple[str, int] | None
    local: tuple[str, int] | None

    @property
    def stopping(self) -> bool: ...

    def write(self, data: bytes) -> None: ...

    def abort(self) -> None: ...

    async def drain(self) -> None: ...


class Exchange:
    """The response side of one request, written straight to the connection's transport.

    `start_now`, then any number of `send` (or `push` from a protocol callback), then `end_now` (or all at once: `respond_json`) — or `abort`.
    `on_disconnect` is called once if the client goes away before the response ended.
    """

    __slots__ = ("_chunked", "_conn", "_head_only", "_hold", "ended", "keep_alive", "on_disconnect", "started")

    def __init__(self, conn: Connection, request: Request) -> None:
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
        if not (has_length or self._chunked or no_body) or conn.stopping:
            self.keep_alive = False  # the body ends when the connection does (HTTP/1.0), or we are stopping
        out = [status_line(status)]
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

    def respond_json(self, status: int, body: bytes, extra: Sequence[Header] = ()) -> None:
        """A whole JSON response at once (the gateway's own error answers), with `extra` headers."""
        length = str(len(body)).encode()
        self.start_now(status, [(b"content-type", b"application/json"), (b"content-length", length), *extra])
        self.end_now(body)

    def abort(self) -> None:
        """Drop the connection: the client must not take a cut body for a complete one."""
        self.ended = True
        self.keep_alive = False
        self._conn.abort()

    @property
    def connection(self) -> Connection:
        return self._conn

    def flow(self, hold: Callable[[bool], None] | None) -> None:
        """Who to pause (`hold(True)`) while the client is not reading, and resume (`hold(False)`) after."""
        self._hold = hold
        if hold is not None and self._conn.write_paused:
            hold(True)

    def paused(self, paused: bool) -> None:
        if self._hold is not None:
            self._hold(paused)
