"""The client side of one proxied request, over ASGI: the response as it goes out, and cutting it short.

Responder.start ─► `http.response.start` (uvicorn frames it: Content-Length or chunked)
Responder.send  ─► `http.response.body` with more body (waits while the client is not reading)
Responder.end   ─► the last bytes; `abort` drops the connection instead (`AbortResponse`)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from usage_ledger.gateway.headers import Header

__all__ = ("ABORT_EXTENSION", "AbortResponse", "AsgiSend", "Responder", "json_headers")

AsgiSend = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ABORT_EXTENSION = "ledger.abort"
"""The scope extension (`gateway.connections`) that drops the client connection at once."""


class AbortResponse(Exception):
    """The response cannot be completed (the upstream failed mid-body, or the call could not be recorded).

    A clean end would tell the client the body was complete: the connection is dropped instead.
    """


def json_headers(body: bytes, extra: list[Header]) -> list[Header]:
    return [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *extra]


class Responder:
    """`start`, any number of `send`, then `end`, or `abort`; `json` for a whole error answer."""

    __slots__ = ("_abort", "_linger", "_send", "ended", "started")

    def __init__(self, send: AsgiSend, scope: MutableMapping[str, Any]) -> None:
        self._send = send
        extension = scope.get("extensions", {}).get(ABORT_EXTENSION)
        self._abort: Callable[[], None] | None = extension["abort"] if extension else None
        self._linger: Callable[[], None] | None = extension["linger"] if extension else None
        self.started = False
        self.ended = False

    async def start(self, status: int, headers: list[Header]) -> None:
        self.started = True
        await self._send({"type": "http.response.start", "status": status, "headers": headers})

    async def send(self, data: bytes) -> None:
        await self._send({"type": "http.response.body", "body": data, "more_body": True})

    async def end(self, data: bytes = b"") -> None:
        self.ended = True
        await self._send({"type": "http.response.body", "body": data, "more_body": False})

    async def json(self, status: int, body: bytes, extra: list[Header] = [], *, close: bool = False) -> None:  # noqa: B006
        headers = json_headers(body, extra)
        if close:  # the request's body is not read: close after the answer, lingering so the client reads it
            headers.append((b"connection", b"close"))
            if self._linger is not None:
                self._linger()
        await self.start(status, headers)
        await self.end(body)

    def abort(self) -> bool:
        """Drop the client connection now; False if the server offers no way to (the caller raises instead)."""
        self.ended = True
        if self._abort is None:
            return False
        self._abort()
        return True
