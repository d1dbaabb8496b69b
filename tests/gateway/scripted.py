"""A loopback HTTP/1.1 server whose every byte the test writes (for the upstream client and the gateway)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Awaitable, Callable

Respond = Callable[["Request", asyncio.StreamWriter], Awaitable[bool]]
"""Writes the response; returns whether to keep the connection open for another request."""


class Request:
    def __init__(self, head: bytes, server: Server, reader: asyncio.StreamReader) -> None:
        lines = head.decode("latin-1").split("\r\n")
        self.line = lines[0]
        self.headers = [tuple(line.split(": ", 1)) for line in lines[1:] if line]
        self.body = b""
        self.server = server
        self.reader = reader

    async def hang(self) -> bool:
        """Answer no more; note when the client closes the connection."""
        await asyncio.wait_for(self.reader.read(), 10)
        self.server.saw_close()
        return False


class Server:
    """A loopback HTTP/1.1 server: counts connections, sees closes, answers with `respond`."""

    def __init__(self, respond: Respond, *, tls: ssl.SSLContext | None = None) -> None:
        self.respond = respond
        self.tls = tls
        self.accepted = 0
        self.closed_by_peer = 0
        self.peer_closed = asyncio.Event()
        self.received = asyncio.Event()
        self.requests: list[Request] = []
        self.port = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Server:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 1)

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    self.saw_close()
                    return
                request = Request(head, self, reader)
                length = next((int(v) for k, v in request.headers if k.lower() == "content-length"), 0)
                request.body = await reader.readexactly(length)
                self.requests.append(request)
                self.received.set()
                if not await self.respond(request, writer):
                    break
        except (ConnectionError, asyncio.CancelledError):
            self.saw_close()
        finally:
            writer.close()

    def saw_close(self) -> None:
        self.closed_by_peer += 1
        self.peer_closed.set()

    async def wait_peer_close(self, reader_timeout: float = 2.0) -> None:
        await asyncio.wait_for(self.peer_closed.wait(), reader_timeout)
