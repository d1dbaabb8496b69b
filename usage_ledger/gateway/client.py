"""Where a call's response goes (`Client`: the server's `Exchange`, or an ASGI `send`), and its JSON errors."""

from __future__ import annotations

from collections.abc import Callable

from usage_ledger.gateway.headers import Header
from usage_ledger.gateway.server import AbortSignal

__all__ = ("AbortResponse", "Client", "json_headers")


class AbortResponse(AbortSignal):
    """Raised after the response started to make the server drop the client connection.

    The upstream failed mid-body; a clean end would tell the client the body was complete.
    """


def json_headers(body: bytes, extra: list[Header]) -> list[Header]:
    return [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *extra]


class Client:
    """Where a call's response goes: the server's `Exchange`, or an ASGI `send` (see `gateway.proxy`)."""

    push: Callable[[bytes], None] | None = None
    """Write body bytes synchronously (from the upstream's protocol callback); None when not possible."""

    async def start(self, status: int, headers: list[Header]) -> None:
        raise NotImplementedError

    async def send(self, data: bytes) -> None:
        raise NotImplementedError

    async def end(self, data: bytes) -> None:
        raise NotImplementedError

    def flow(self, hold: Callable[[bool], None] | None) -> None:
        """Register who to pause while the client is not reading (only where `push` is used)."""
