"""How a call ends a response it cannot complete (`AbortResponse`), and the head of its JSON errors."""

from __future__ import annotations

from usage_ledger.gateway.headers import Header
from usage_ledger.gateway.server_connection import AbortSignal

__all__ = ("AbortResponse", "json_headers")


class AbortResponse(AbortSignal):
    """Raised after the response started to make the server drop the client connection.

    The upstream failed mid-body; a clean end would tell the client the body was complete.
    """


def json_headers(body: bytes, extra: list[Header]) -> list[Header]:
    return [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *extra]
